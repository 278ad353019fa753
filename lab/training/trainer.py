"""Supervised fine-tuning on transformers' ``Trainer``, with the lab's events and per-epoch calibration.

The shared training loop; each method's trainer lives beside its loss. ``finetune`` picks
one per ``cfg.objective``: the plain ``Trainer`` (``sft``: cross-entropy, i.e. fine-tuning, and CFT
with completion-only labels), :class:`lab.training.cft.LabelSmoothingTrainer` (``label_smoothing``:
smoothed targets over the option letters) or :class:`lab.training.cft.RCFTTrainer` (``rcft``:
cross-entropy + λ·ECE regulariser with its E-step). FIRST's
:class:`lab.training.distill.DistillTrainer` (top-k KL to a teacher's stored distribution) goes
through ``run_training`` from :mod:`lab.kinds.first.run`.

Around the loop, each in its own module: the validation after every epoch
(:mod:`lab.training.validation`), the callbacks that report it and guard the disk
(:mod:`lab.training.callbacks`), LoRA (:mod:`lab.training.lora`), the memory estimate and the advice
when memory runs out (:mod:`lab.training.run_memory`), the checkpoints (:mod:`lab.training.checkpoints`)
and the disk (:mod:`lab.training.disk`). A ``STOP`` request ends training after the current step,
saving what it has.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from transformers import Trainer, TrainerState, TrainingArguments

from lab.core.errors import DataError, Stopped
from lab.core.events import EventWriter
from lab.core.layout import ADAPTER_DIR, CHECKPOINTS_DIR, MODEL_DIR, SNAPSHOTS_DIR, TRACKER_DIR
from lab.data import load
from lab.data.record import MCQRecord
from lab.models import distributed
from lab.models.loading import load_model, select_device, select_dtype
from lab.training.callbacks import CheckpointCallback, LabCallback, SnapshotCallback
from lab.training.cft import LabelSmoothingTrainer, RCFTTrainer
from lab.training.checkpoints import STATE_FILE, has_optimizer, last_checkpoint
from lab.training.config import KEPT_CHECKPOINTS, TrainConfig, trackers_online
from lab.training.data import build_examples, pad_batch, pad_option_batch
from lab.training.disk import ensure_room
from lab.training.estimates import MEMORY_EVENT, checkpoint_bytes
from lab.training.lora import with_lora
from lab.training.run_memory import memory_event, out_of_memory_advice
from lab.training.sharding import MEASURED_EVENT, fsdp_launched, load_device, measured_peaks, save_consolidated
from lab.training.validation import letter_probs, validation_metrics


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
        model = with_lora(model, cfg)
    model.train()
    return model, loaded.tokenizer, device


def saved_sizes(model, lora: bool) -> tuple[int, int]:
    """(bytes of the weights a checkpoint writes, trainable parameters): the whole model as it is
    held (fp32 for full training), or LoRA's adapters alone."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    written = trainable if lora else list(model.parameters())
    return sum(p.numel() * p.element_size() for p in written), sum(p.numel() for p in trainable)


def load_split_records(cfg: TrainConfig, split: str, files: list[str], limit: Optional[int]) -> list[MCQRecord]:
    return load(cfg.dataset, split, files or cfg.data_files or None, seed=cfg.seed, limit=limit).records


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
    trainer's own terms of the ``memory`` event's estimate (:func:`lab.training.run_memory.memory_event`).
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
    memory = memory_event(cfg, model, longest, args, device, stage, **(memory_terms or {}))
    if memory is not None:
        events.emit(MEMORY_EVENT, **memory)
    resume = last_checkpoint(checkpoints)
    if resume:
        step = TrainerState.load_from_json(str(resume / STATE_FILE)).global_step
        restored = ("weights, optimizer, scheduler and RNG state restored" if has_optimizer(resume) else
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
