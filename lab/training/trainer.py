"""Supervised fine-tuning on transformers' ``Trainer``, with the lab's events and per-epoch calibration.

The shared training machinery; each method's trainer lives beside its loss. ``finetune`` picks
one per ``cfg.objective``: the plain ``Trainer`` (``sft``: cross-entropy, i.e. fine-tuning, and CFT
with completion-only labels), :class:`lab.training.cft.LabelSmoothingTrainer` (``label_smoothing``:
smoothed targets over the option letters) or :class:`lab.training.cft.RCFTTrainer` (``rcft``:
cross-entropy + λ·ECE regulariser with its E-step). FIRST's
:class:`lab.training.distill.DistillTrainer` (top-k KL to a teacher's stored distribution) goes
through ``run_training`` from :mod:`lab.kinds.first.run`.

After every epoch (and every ``eval_steps`` steps if set) the model scores the validation
questions (letter scoring, no gradients) and an ``eval`` event carries their ECE and accuracy —
REFERENCE.md §4: ECE grows with fine-tuning epochs, and users should see it happen. A ``STOP``
request ends training after the current step, saving what it has.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from transformers import Trainer, TrainerCallback, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from lab.calibration.summary import compute_metrics
from lab.core.errors import DataError, DiskFull, Stopped
from lab.core.events import EventWriter
from lab.core.layout import ADAPTER_DIR, CHECKPOINTS_DIR, MODEL_DIR, SNAPSHOTS_DIR, TRACKER_DIR
from lab.data import load_records
from lab.data.record import MCQRecord
from lab.data.templates import get_template
from lab.models import distributed
from lab.models.loading import load_model, peft_quietly, select_device, select_dtype
from lab.models.scoring import score_letter
from lab.models.weights import ALL_LINEAR, local_model_shape, size_text, unknown_targets
from lab.training.cft import LabelSmoothingTrainer, RCFTTrainer
from lab.training.config import KEPT_CHECKPOINTS, TrainConfig, trackers_online
from lab.training.data import build_examples, pad_batch, pad_option_batch
from lab.training.estimates import (MEMORY_EVENT, Precision, TrainingMemory, checkpoint_bytes, describe, memory_advice,
                                    training_memory)
from lab.training.sharding import (MEASURED_EVENT, fsdp_launched, fsdp_memory_event, load_device, measured_peaks,
                                   save_consolidated)
from lab.training.snapshots import save_snapshot

STATE_FILE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME: the last file of a checkpoint
OPTIMIZER_FILE = "optimizer.pt"  # transformers' OPTIMIZER_NAME: absent from a weights-only checkpoint
TRACKED = ("accuracy", "ece", "nll", "brier")  # validation metrics a tracker plots beside the loss
PART_PREFIXES = ("loss_", "rank_")  # a method trainer's loss components and RCFT's rank-violation share
MTIME_NOTICE = "mtime may not be reliable"


class _QuietCheckpointOrder(logging.Filter):
    """transformers orders checkpoints by mtime before removing the oldest (``save_total_limit``),
    and where two were saved within a second (a small model's epochs) it says "mtime may not be
    reliable on this filesystem" and orders them by step instead: right here (checkpoints are named
    by step), and no fault of the filesystem, so in a job's log it is only noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return MTIME_NOTICE not in record.getMessage()


logging.getLogger("transformers.trainer_utils").addFilter(_QuietCheckpointOrder())


def letter_probs(model, tokenizer, records: Sequence[MCQRecord], template: str) -> list:
    """Option probabilities of ``records`` under ``model`` in eval mode, restoring its mode after.

    Under a multi-process launch each rank scores its share and every rank gets them all, in order (under
    FSDP every rank scores them all: each forward pass is a collective)."""
    render = get_template(template).render

    def score(share: list[MCQRecord]) -> list:
        was_training = model.training
        model.eval()
        scores = score_letter(model, tokenizer, [render(r, tokenizer) for r in share])
        model.train(was_training)
        return [s.probs for s in scores]

    return distributed.map_sharded(score, records, lockstep=distributed.in_lockstep(model))


def validation_metrics(model, tokenizer, records: Sequence[MCQRecord], template: str, bins: int,
                       bin_edges: str = "right") -> dict[str, Any]:
    """Letter-scoring accuracy and calibration of ``model`` on ``records`` (no bootstrap: cheap)."""
    probs = letter_probs(model, tokenizer, records, template)
    rows = [{"probs": p, "answer": r.answer} for r, p in zip(records, probs)]
    m = compute_metrics(rows, bins, n_boot=0, seed=0, edges=bin_edges)
    return {k: m[k] for k in ("n", "accuracy", "ece", "cw_ece", "nll", "brier", "trust")}


def tracked(metrics: dict[str, Any]) -> dict[str, float]:
    """What a validation gives the trackers: ``eval_<metric>`` of its headline figures and, for a
    stage measuring several calibration tasks (``tasks``: sft, dpo), ``eval_<task>_<metric>`` of each,
    so a tracker plots every task's ECE beside the loss, not the first task's only."""
    logged = {f"eval_{k}": float(v) for k, v in metrics.items() if k in TRACKED and v is not None}
    for key, task in (metrics.get("tasks") or {}).items():
        logged.update({f"eval_{key}_{k}": float(v) for k, v in task.items() if k in TRACKED and v is not None})
    return logged


class LabCallback(TrainerCallback):
    """Training progress and per-epoch validation as events (and to the trackers of ``report_to``,
    through ``log``: the Trainer's own); stops at the user's request, every rank at the same step."""

    def __init__(self, events: EventWriter, stage: str, validate: Optional[Callable[[Any, int], dict]],
                 should_stop: Callable[[], bool], eval_steps: Optional[int] = None, at_start: bool = False) -> None:
        self.events, self.stage, self.validate, self.should_stop = events, stage, validate, should_stop
        self.eval_steps, self.at_start = eval_steps, at_start
        self.history: list[dict[str, Any]] = []
        self.stopping = False  # agreed by every rank
        self.log: Callable[[dict[str, float]], None] = lambda logs: None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            parts = {k: float(v) for k, v in logs.items() if k.startswith(PART_PREFIXES)}
            self.events.emit(self.stage, step=state.global_step, total=state.max_steps, epoch=round(state.epoch or 0, 3),
                             loss=float(logs["loss"]), lr=float(logs.get("learning_rate", 0.0)), **parts)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.at_start and state.global_step == 0:  # the model before training: where the curve starts
            self._validate(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.stopping = distributed.agree(self.should_stop())
        if self.stopping:
            control.should_training_stop = True
            control.should_save = True
        elif self.eval_steps and state.global_step % self.eval_steps == 0:
            self._validate(state, model)

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.stopping and not (self.eval_steps and state.global_step % self.eval_steps == 0):
            self._validate(state, model)

    def on_train_end(self, args, state, control, **kwargs):
        """End the W&B run with the stage (transformers' callback leaves it open until the process
        exits): a job of several stages (FIRST's teacher and students) gets a run each, in its own
        folder (W&B reads ``WANDB_DIR`` once per process: teardown makes the next stage read it again),
        and an offline run's file is whole when the stage is done. MLflow's callback ends its own run."""
        wandb = sys.modules.get("wandb")
        if "wandb" in (args.report_to or []) and wandb is not None and wandb.run is not None:
            wandb.finish()
            wandb.teardown()

    def _validate(self, state, model) -> None:
        if self.validate is None:
            return
        metrics = self.validate(model, state.global_step)
        record = {"epoch": round(state.epoch or 0, 3), "step": state.global_step, **metrics}
        self.history.append(record)
        self.events.emit(f"{self.stage}_eval", **record)
        self.log(tracked(metrics))


# Trackers run offline by default: every file each writes lands in the stage's folder, nothing goes online, and
# their telemetry is off. Each is pointed there through the variables it reads (checked in the installed
# packages): TensorBoard's logging folder; W&B offline (no API key needed, and an operator's login never used
# for a user's job), its run, config, cache, data and artifact folders; an MLflow file store, with MLflow's
# telemetry off (it would write ~/.config/mlflow/telemetry.json and report usage) and DO_NOT_TRACK, which
# other tools honour too. The operator turns the trackers online for the server (``app.py --trackers-online``,
# or :data:`lab.training.config.TRACKERS_ONLINE_ENV` set where ``python -m jobs`` runs): then the W&B mode and folder and the MLflow tracking URI
# set where the lab started are theirs, read once, when the worker imports this, before any stage sets them.
OPERATOR_TRACKER_ENV = frozenset(name for name in ("WANDB_DIR", "WANDB_MODE", "MLFLOW_TRACKING_URI")
                                 if name in os.environ)
MLFLOW_DIR = "mlruns"
WANDB_DIR = "wandb"


def tracker_env(out_dir: Path, online: bool = False) -> dict[str, str]:
    """The variables that point every tracker at ``out_dir`` (offline, telemetry off); ``online``: those the
    operator set (:data:`OPERATOR_TRACKER_ENV`) are left to them, and W&B uses its own config folder (its login)."""
    out = out_dir.resolve()
    wandb = out / WANDB_DIR
    env = {"TENSORBOARD_LOGGING_DIR": str(out / TRACKER_DIR), "WANDB_DIR": str(out), "WANDB_MODE": "offline",
           "WANDB_CONFIG_DIR": str(wandb / "config"), "WANDB_CACHE_DIR": str(wandb / "cache"),
           "WANDB_DATA_DIR": str(wandb / "data"), "WANDB_ARTIFACT_DIR": str(wandb / "artifacts"),
           "WANDB_ERROR_REPORTING": "false", "MLFLOW_TRACKING_URI": (out / MLFLOW_DIR).as_uri(),
           "MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
    if online:
        env.pop("WANDB_CONFIG_DIR")
        for name in OPERATOR_TRACKER_ENV:
            env.pop(name)
    return env


def point_trackers(out_dir: Path) -> None:
    """Each tracker's folder and mode for this stage (the callbacks read them from the environment when the
    Trainer makes them): offline unless the operator turned them online (:func:`trackers_online`)."""
    os.environ.update(tracker_env(out_dir, trackers_online()))


def free_bytes(folder: Path) -> int:
    """Free bytes on the disk ``folder`` is (or will be) on: its nearest existing ancestor's."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``: a checkpoint as written, beside its estimate."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def ensure_room(folder: Path, need: float, what: str, hint: str = "") -> None:
    """Raise :class:`DiskFull` on every rank when rank 0 (which writes) sees less than ``need``
    bytes free where ``folder`` goes: a clear failure before writing, not a disk filled mid-file."""
    free = free_bytes(folder) if distributed.is_main() else 0
    if distributed.agree(distributed.is_main() and free < need):
        raise DiskFull(f"disk full: {what} needs {size_text(need)}, {size_text(free)} free in {folder}; "
                       f"free space{hint}, then resume the job")


class CheckpointCallback(TrainerCallback):
    """Checkpoints that fit, and resuming from one without the optimizer's state.

    Before each save (``should_save`` is set by then: transformers' flow callback and
    :class:`LabCallback` run first) the disk must hold a whole new checkpoint — the larger of
    ``checkpoint`` (the estimate) and the last one written — beside the one it replaces;
    ``weights_only`` (the size without the optimizer's state, when it is saved) is offered as the
    way out. A weights-only checkpoint has no scheduler state either, so a run resumed from one would
    restart the learning-rate schedule: it is stepped on to where the run was."""

    def __init__(self, folder: Path, checkpoint: float, weights_only: Optional[float]) -> None:
        self.folder, self.checkpoint, self.weights_only = folder, checkpoint, weights_only

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if lr_scheduler is None or not state.global_step or lr_scheduler.last_epoch >= state.global_step:
            return
        with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": on purpose here
            warnings.simplefilter("ignore")
            for _ in range(state.global_step - lr_scheduler.last_epoch):
                lr_scheduler.step()

    def on_step_end(self, args, state, control, **kwargs):
        self._ensure_room(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._ensure_room(control)

    def _ensure_room(self, control) -> None:
        if not control.should_save:
            return
        last = last_checkpoint(self.folder)
        need = max(self.checkpoint, folder_bytes(last) if last else 0)
        hint = "" if self.weights_only is None else \
            f" (or set save_optimizer: false: {size_text(self.weights_only)} a checkpoint, weights only)"
        ensure_room(self.folder, need, "the checkpoint", hint)


class SnapshotCallback(TrainerCallback):
    """With ``snapshots`` on, the weights of every save kept in ``snapshots/step-N/``
    (:mod:`lab.training.snapshots`): the checkpoints themselves are pruned to the last one."""

    def __init__(self, folder: Path, tokenizer, lora: bool, weights: float) -> None:
        self.folder, self.tokenizer, self.lora, self.weights = folder, tokenizer, lora, weights

    def on_save(self, args, state, control, model=None, **kwargs):
        ensure_room(self.folder, self.weights, "a snapshot", " (or train without snapshots)")
        if distributed.is_main():
            save_snapshot(model, self.tokenizer, self.folder, state.global_step, self.lora)


def training_arguments(cfg: TrainConfig, out_dir: Path, device: torch.device, run_name: str,
                       args_class: type[TrainingArguments] = TrainingArguments, **extra: Any) -> TrainingArguments:
    """transformers' arguments for ``cfg``: checkpoints every ``save_steps`` (else every epoch), with
    the optimizer's state or (``save_optimizer`` off: ``save_only_model``) without, the last
    :data:`KEPT_CHECKPOINTS` kept — transformers removes the older one only after the new one is
    whole, so a kill during a save leaves one; trackers as ``report_to`` says. ``args_class`` and
    ``extra``: a trainer's own subclass and its fields (TRL's ``SFTConfig``: ``completion_only_loss`` …)."""
    return args_class(
        output_dir=str(out_dir / CHECKPOINTS_DIR), num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        lr_scheduler_type=cfg.lr_scheduler, warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_epsilon=cfg.adam_epsilon,
        logging_steps=1, save_strategy="steps" if cfg.save_steps else "epoch", save_steps=cfg.save_steps or 500,
        save_total_limit=KEPT_CHECKPOINTS, save_only_model=not cfg.save_optimizer, report_to=cfg.report_to,
        run_name=run_name, seed=cfg.seed,
        use_cpu=device.type == "cpu", bf16=device.type == "cuda" and torch.cuda.is_bf16_supported(),
        remove_unused_columns=False, dataloader_num_workers=0, disable_tqdm=True,
        ddp_find_unused_parameters=False,  # every trainable weight takes part in each forward: no graph walk per step
        **extra,
    )


def prepare_model(cfg: TrainConfig):
    """The model to train: fp32 weights (bf16 autocast on a GPU) for full training; a LoRA
    wrapper around frozen weights (bf16 on a GPU) for LoRA; around 4-bit NF4 weights for QLoRA."""
    device = select_device(cfg.device)
    # The dtype is the training device's even where the weights load elsewhere (FSDP: host memory first)
    dtype = "float32" if cfg.method == "full" or device.type == "cpu" else \
        str(select_dtype(cfg.dtype, device)).removeprefix("torch.")
    loaded = load_model(cfg.model, device=load_device(cfg.device), dtype=dtype, quantize_4bit=cfg.method == "qlora")
    model = loaded.model
    if cfg.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if cfg.method == "qlora":
            model = prepare_model_for_kbit_training(model)
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=lora_target_modules(model, cfg.lora_targets), task_type="CAUSAL_LM")
        with peft_quietly():
            model = get_peft_model(model, lora)
    model.train()
    return model, loaded.tokenizer, device


def lora_target_modules(model, targets: list[str]) -> str | list[str]:
    """peft's ``target_modules`` for ``targets``, each module name checked against ``model``'s linear
    layers first (:func:`lab.models.weights.unknown_targets`)."""
    if targets == [ALL_LINEAR]:
        return ALL_LINEAR
    output = model.get_output_embeddings()
    problem = unknown_targets((name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                               if isinstance(module, torch.nn.Linear) and module is not output), targets)
    if problem:
        raise DataError(f"lora_targets: the model has {problem}")
    return list(targets)


def saved_sizes(model, lora: bool) -> tuple[int, int]:
    """(bytes of the weights a checkpoint writes, trainable parameters): the whole model as it is
    held (fp32 for full training), or LoRA's adapters alone."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    written = trainable if lora else list(model.parameters())
    return sum(p.numel() * p.element_size() for p in written), sum(p.numel() for p in trainable)


def memory_estimate(cfg: TrainConfig, model, longest: int, args: TrainingArguments,
                    device: torch.device, **terms: Any) -> Optional[TrainingMemory]:
    """:func:`lab.training.estimates.training_memory` of this run at its ``longest`` example (a batch
    pads to its longest), or None for a model without a local folder and Llama-type config. ``terms``:
    the trainer's own (TRL's: ``trainer``, ``precompute_ref``)."""
    shape = local_model_shape(cfg.model)
    if shape is None or not longest:
        return None
    frozen = [p.element_size() for p in model.parameters() if not p.requires_grad]
    return training_memory(shape, cfg.method, cfg.batch_size, longest, run_precision(args, device),
                           frozen[0] if frozen else 4, cfg.lora_r, cfg.lora_dropout, lora_targets=cfg.lora_targets,
                           **terms)


def run_precision(args: TrainingArguments, device: torch.device) -> Precision:
    """How this run computes, for the estimates: bf16 autocast or fp32, and a CUDA device's bool
    dropout masks and Triton-fused head (a CPU keeps masks in the input's dtype and folds in torch)."""
    cuda = device.type == "cuda"
    return Precision(compute=2 if args.bf16 else 4, mask=1 if cuda else 4, triton=cuda)


def out_of_memory_advice(cfg: TrainConfig, args: TrainingArguments, device: torch.device, longest: int,
                         terms: dict[str, Any]) -> str:
    """What to lower for a run that ran out of memory (:func:`lab.training.estimates.memory_advice`),
    with the estimated peak before and after each change when the model's shape can be read; the
    weights' dtype is the job's (bf16 under autocast on a GPU, fp32 on a CPU), as LoRA would load them."""
    return memory_advice(vars(cfg), local_model_shape(cfg.model), longest or None, run_precision(args, device),
                         2 if args.bf16 else 4, **terms)


def load_split_records(cfg: TrainConfig, split: str, files: list[str], limit: Optional[int]) -> list[MCQRecord]:
    return load_records(cfg.dataset, split, files or cfg.data_files or None, seed=cfg.seed, limit=limit).records


def last_checkpoint(folder: Path) -> Optional[Path]:
    """The newest whole checkpoint in ``folder``: the Trainer writes its state file last, so a
    checkpoint a kill interrupted has none and the one before it (still there: transformers deletes
    it only after the new one's state file is written) is used."""
    if not folder.is_dir():
        return None
    steps = {int(p.name.rsplit("-", 1)[1]): p for p in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
             if p.name.rsplit("-", 1)[1].isdigit() and (p / STATE_FILE).is_file()}
    return steps[max(steps)] if steps else None


def _has_optimizer(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` holds AdamW's state: one file, or FSDP's sharded folder (``optimizer_0``)."""
    return (checkpoint / OPTIMIZER_FILE).is_file() or any(checkpoint.glob(f"{OPTIMIZER_FILE.removesuffix('.pt')}_*"))


def _sequence_length(row: dict[str, Any]) -> int:
    """The tokens one example feeds the model: its ``input_ids``, or a TRL preference row's prompt and
    its longer response (DPO: ``prompt_ids`` + ``chosen_ids`` / ``rejected_ids``); 0 for neither."""
    if "input_ids" in row:
        return len(row["input_ids"])
    return len(row.get("prompt_ids") or []) + max(len(row.get("chosen_ids") or []), len(row.get("rejected_ids") or []))


def run_training(trainer_cls: type[Trainer], cfg: TrainConfig, out_dir: Path, examples: list[dict], model, tokenizer,
                 device: torch.device, events: EventWriter, stage: str, should_stop: Callable[[], bool],
                 val_records: Sequence[MCQRecord], collator: Optional[Callable], *,
                 validate: Optional[Callable[[Any, int], dict[str, Any]]] = None,
                 args_class: type[TrainingArguments] = TrainingArguments, args_extra: Optional[dict[str, Any]] = None,
                 validate_at_start: bool = False, memory_terms: Optional[dict[str, Any]] = None,
                 **trainer_kwargs: Any) -> dict[str, Any]:
    """Train, resuming from the last checkpoint in ``out_dir`` if there is one, and save the result.

    ``examples``: token ids (``input_ids`` …) for the lab's trainers, or what a TRL trainer tokenises
    itself (``prompt``/``completion`` messages) with ``collator`` None. ``validate(model, step)``: what
    to measure after each epoch (else the letter metrics on ``val_records``, when there are any), and
    with ``validate_at_start`` before the first step too (not when resuming). ``memory_terms``: the
    trainer's own terms of the ``memory`` event's estimate (:func:`memory_estimate`).
    Returns where the trained weights are (``model`` and ``adapter``, as ``load_model`` takes them)
    and the per-epoch validation history.
    """
    from datasets import Dataset

    if validate is None and val_records:
        validate = lambda m, step: validation_metrics(m, tokenizer, val_records, cfg.template,  # noqa: E731
                                                      cfg.bins, cfg.bin_edges)
    callback = LabCallback(events, stage, validate, should_stop, cfg.eval_steps, validate_at_start)
    point_trackers(out_dir)
    run_name = f"{out_dir.name} {stage}" if stage not in out_dir.name else out_dir.name
    args = training_arguments(cfg, out_dir, device, run_name, args_class, **(args_extra or {}))
    lora = cfg.method in ("lora", "qlora")
    checkpoints = out_dir / CHECKPOINTS_DIR
    weights, trainable = saved_sizes(model, lora)
    guard = CheckpointCallback(checkpoints, checkpoint_bytes(weights, trainable, cfg.save_optimizer),
                               checkpoint_bytes(weights, trainable, False) if cfg.save_optimizer else None)
    callbacks = [callback, guard]
    if cfg.snapshots:
        callbacks.append(SnapshotCallback(out_dir / SNAPSHOTS_DIR, tokenizer, lora, weights))
    trainer = trainer_cls(model=model, args=args, train_dataset=Dataset.from_list(examples), data_collator=collator,
                          callbacks=callbacks, **trainer_kwargs)
    callback.log = trainer.log
    tokenised = examples if examples and "input_ids" in examples[0] else trainer.train_dataset
    if len(tokenised) < len(examples):  # TRL drops an example whose prompt fills max_length: nothing left to learn
        dropped = f"{len(examples) - len(tokenised)} of the {len(examples)} training examples"
        if not len(tokenised):
            raise DataError(f"{dropped} were dropped: each prompt fills max_length ({cfg.max_length} tokens), leaving "
                            "no room for its response. Raise max_length, or give shorter prompts")
        events.emit("log", message=f"{stage}: {dropped} dropped: their prompt fills max_length ({cfg.max_length} "
                                   "tokens)")
    # DPO's collator cuts a pair's sequences to max_length (the other trainers drop or cut longer examples before)
    longest = min(max((_sequence_length(e) for e in tokenised), default=0), cfg.max_length)
    memory = memory_estimate(cfg, model, longest, args, device, **(memory_terms or {}))
    if memory is not None and fsdp_launched():
        events.emit(MEMORY_EVENT, **fsdp_memory_event(memory, local_model_shape(cfg.model), cfg, stage, longest))
    elif memory is not None:
        where = "per GPU" if device.type == "cuda" else "of RAM"
        events.emit(MEMORY_EVENT, peak=memory.peak, **{k.replace(" ", "_"): v for k, v in memory.parts().items()},
                    message=f"{stage}: about {size_text(memory.peak)} {where} at the peak, batches of {cfg.batch_size}"
                            f" × {longest} tokens (the longest example): {describe(memory)}")
    resume = last_checkpoint(checkpoints)
    if resume:
        step = TrainerState.load_from_json(str(resume / STATE_FILE)).global_step
        restored = ("weights, optimizer, scheduler and RNG state restored" if _has_optimizer(resume) else
                    "weights restored; a weights-only checkpoint (save_optimizer: false), so AdamW starts afresh "
                    "and the learning-rate schedule goes on from that step")
        events.emit("resumed", step=step, message=f"{stage}: resumed from step {step} ({resume.name}): {restored}")
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    except (torch.OutOfMemoryError, MemoryError) as e:  # the worker reports its first line: what to lower goes there
        said = str(e).splitlines()[0] if str(e) else type(e).__name__
        advice = out_of_memory_advice(cfg, args, device, longest, memory_terms or {})
        raise type(e)(f"{stage}: {said.rstrip('.')}. {advice}") from e
    events.emit(MEASURED_EVENT, **measured_peaks(device))  # beside the estimate's ``memory`` event
    if callback.stopping:
        raise Stopped(f"{stage} stopped at step {trainer.state.global_step}; checkpoint kept in {checkpoints}")
    target = out_dir / (ADAPTER_DIR if lora else MODEL_DIR)
    ensure_room(target, weights, "the trained weights")
    if fsdp_launched():  # each rank holds a shard: gathered, then written by rank 0
        save_consolidated(trainer.model, target, tokenizer, lora)
    elif distributed.is_main():  # every rank holds the same weights; one writes them
        model.save_pretrained(target)
        if not lora:
            tokenizer.save_pretrained(target)
    distributed.barrier()  # no rank reads the model before it is written
    saved = {"model": cfg.model, "adapter": str(target)} if lora else {"model": str(target), "adapter": None}
    return {**saved, "n_train": len(examples), "history": callback.history}


def finetune(cfg: TrainConfig, out_dir: Path, events: EventWriter, should_stop: Callable[[], bool] = lambda: False,
             stage: str = "train", records: Optional[Sequence[MCQRecord]] = None,
             val: Optional[Sequence[MCQRecord]] = None) -> dict[str, Any]:
    """Fine-tune on hard labels with ``cfg.objective``'s loss and save the result.

    ``records`` / ``val`` replace the configured splits (the CFT pipeline trains on a mix of
    datasets it has already carved).
    """
    model, tokenizer, device = prepare_model(cfg)
    if records is None:
        records = load_split_records(cfg, cfg.split, [], cfg.limit)
    if val is None:
        val = load_split_records(cfg, cfg.val_split, cfg.val_data_files, cfg.val_limit) if cfg.val_split else []
    examples = build_examples(records, cfg.template, tokenizer, cfg.completion_only, cfg.max_length)
    events.emit("log", message=f"{stage}: {len(examples)} examples, {len(val)} validation questions, "
                               f"{cfg.method}, objective {cfg.objective}")
    pad_id = tokenizer.pad_token_id
    if cfg.objective == "sft":
        return run_training(Trainer, cfg, out_dir, examples, model, tokenizer, device, events, stage, should_stop, val,
                            lambda batch: pad_batch(batch, pad_id))
    collate = lambda batch: pad_option_batch(batch, pad_id)  # noqa: E731
    if cfg.objective == "label_smoothing":
        return run_training(LabelSmoothingTrainer, cfg, out_dir, examples, model, tokenizer, device, events, stage,
                            should_stop, val, collate, epsilon=cfg.label_smoothing)
    kept = [records[e["record"]] for e in examples]
    estep = lambda m: letter_probs(m, tokenizer, kept, cfg.template)  # noqa: E731
    esteps: list[dict[str, Any]] = []

    def on_estep(**fields: Any) -> None:
        events.emit(f"{stage}_estep", **fields)
        esteps.append(fields)

    result = run_training(RCFTTrainer, cfg, out_dir, examples, model, tokenizer, device, events, stage, should_stop,
                          val, collate, ece_lambda=cfg.ece_lambda, n_bins=cfg.ece_bins, estep_steps=cfg.estep_steps,
                          lambda_scale=cfg.lambda_scale, bin_edges=cfg.bin_edges, estep=estep,
                          answers=[r.answer for r in kept], on_estep=on_estep)
    return {**result, "esteps": esteps}
