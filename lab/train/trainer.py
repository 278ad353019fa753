"""Supervised fine-tuning on transformers' ``Trainer``, with the lab's events and per-epoch calibration.

One trainer per objective, all driven by ``finetune``: the plain ``Trainer`` (cross-entropy:
fine-tuning, and CFT with completion-only labels), ``LabelSmoothingTrainer`` (smoothed targets over
the option letters), ``RCFTTrainer`` (cross-entropy + λ·ECE regulariser with its E-step) and
``DistillTrainer`` (FIRST: top-k KL to a teacher's stored distribution).

After every epoch (and every ``eval_steps`` steps if set) the model scores the validation
questions (letter scoring, no gradients) and an ``eval`` event carries their ECE and accuracy —
REFERENCE.md §4: ECE grows with fine-tuning epochs, and users should see it happen. A ``STOP``
request ends training after the current step, saving what it has.

The custom trainers return a per-micro-batch mean loss and say so (``loss_is_scaled_for_ga =
False``): transformers then divides it by the gradient-accumulation steps itself.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from lab.cft.losses import bin_accuracy, ece_regulariser, option_probs, option_smoothing_loss
from lab.data import load_records
from lab.data.record import MCQRecord
from lab.errors import Stopped
from lab.events import EventWriter
from lab.evaluate import compute_metrics
from lab.models import load_model, select_device
from lab.scoring import score_letter
from lab.templates import get_template
from lab.train.config import TrainConfig
from lab.train.data import IGNORE, build_examples, pad_batch, pad_option_batch

OPTION_KEYS = ("answer_pos", "option_ids", "option_mask", "answer")


def letter_probs(model, tokenizer, records: Sequence[MCQRecord], template: str) -> list:
    """Option probabilities of ``records`` under ``model`` in eval mode, restoring its mode after."""
    was_training = model.training
    model.eval()
    render = get_template(template).render
    scores = score_letter(model, tokenizer, [render(r, tokenizer) for r in records])
    model.train(was_training)
    return [s.probs for s in scores]


def validation_metrics(model, tokenizer, records: Sequence[MCQRecord], template: str, bins: int) -> dict[str, Any]:
    """Letter-scoring accuracy and calibration of ``model`` on ``records`` (no bootstrap: cheap)."""
    probs = letter_probs(model, tokenizer, records, template)
    rows = [{"probs": p, "answer": r.answer} for r, p in zip(records, probs)]
    m = compute_metrics(rows, bins, n_boot=0, seed=0)
    return {k: m[k] for k in ("n", "accuracy", "ece", "cw_ece", "nll", "brier", "trust")}


class LabCallback(TrainerCallback):
    """Training progress and per-epoch validation as events; stops at the user's request."""

    def __init__(self, events: EventWriter, stage: str, validate: Optional[Callable[[Any], dict]],
                 should_stop: Callable[[], bool], eval_steps: Optional[int] = None) -> None:
        self.events, self.stage, self.validate, self.should_stop = events, stage, validate, should_stop
        self.eval_steps = eval_steps
        self.history: list[dict[str, Any]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            parts = {k: float(v) for k, v in logs.items() if k.startswith("loss_")}  # a trainer's loss components
            self.events.emit(self.stage, step=state.global_step, total=state.max_steps, epoch=round(state.epoch or 0, 3),
                             loss=float(logs["loss"]), lr=float(logs.get("learning_rate", 0.0)), **parts)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.should_stop():
            control.should_training_stop = True
            control.should_save = True
        elif self.eval_steps and state.global_step % self.eval_steps == 0:
            self._validate(state, model)

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.should_stop() and not (self.eval_steps and state.global_step % self.eval_steps == 0):
            self._validate(state, model)

    def _validate(self, state, model) -> None:
        if self.validate is None:
            return
        record = {"epoch": round(state.epoch or 0, 3), "step": state.global_step, **self.validate(model)}
        self.history.append(record)
        self.events.emit(f"{self.stage}_eval", **record)


def training_arguments(cfg: TrainConfig, out_dir: Path, device: torch.device) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out_dir / "checkpoints"), num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        lr_scheduler_type=cfg.lr_scheduler, warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_epsilon=cfg.adam_epsilon,
        logging_steps=1, save_strategy="epoch", save_total_limit=1, report_to="none", seed=cfg.seed,
        use_cpu=device.type == "cpu", bf16=device.type == "cuda" and torch.cuda.is_bf16_supported(),
        remove_unused_columns=False, dataloader_num_workers=0, disable_tqdm=True,
    )


def prepare_model(cfg: TrainConfig):
    """The model to train: fp32 weights (bf16 autocast on a GPU) for full training; a LoRA
    wrapper around frozen weights (bf16 on a GPU) for LoRA; around 4-bit NF4 weights for QLoRA."""
    device = select_device(cfg.device)
    dtype = "float32" if cfg.method == "full" or device.type == "cpu" else cfg.dtype
    loaded = load_model(cfg.model, device=cfg.device, dtype=dtype, quantize_4bit=cfg.method == "qlora")
    model = loaded.model
    if cfg.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if cfg.method == "qlora":
            model = prepare_model_for_kbit_training(model)
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    return model, loaded.tokenizer, device


def load_split_records(cfg: TrainConfig, split: str, files: list[str], limit: Optional[int]) -> list[MCQRecord]:
    return load_records(cfg.dataset, split, files or cfg.data_files or None, seed=cfg.seed, limit=limit).records


def run_training(trainer_cls: type[Trainer], cfg: TrainConfig, out_dir: Path, examples: list[dict], model, tokenizer,
                 device: torch.device, events: EventWriter, stage: str, should_stop: Callable[[], bool],
                 val_records: Sequence[MCQRecord], collator: Callable, **trainer_kwargs: Any) -> dict[str, Any]:
    """Train, resuming from the last checkpoint in ``out_dir`` if there is one, and save the result.

    Returns where the trained weights are (``model`` and ``adapter``, as ``load_model`` takes them)
    and the per-epoch validation history.
    """
    from datasets import Dataset

    validate = (lambda m: validation_metrics(m, tokenizer, val_records, cfg.template, cfg.bins)) if val_records else None
    callback = LabCallback(events, stage, validate, should_stop, cfg.eval_steps)
    trainer = trainer_cls(model=model, args=training_arguments(cfg, out_dir, device), train_dataset=Dataset.from_list(examples),
                          data_collator=collator, callbacks=[callback], **trainer_kwargs)
    checkpoints = out_dir / "checkpoints"
    resume = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    trainer.train(resume_from_checkpoint=resume)
    if should_stop():
        raise Stopped(f"{stage} stopped at step {trainer.state.global_step}; checkpoint kept in {checkpoints}")
    if cfg.method in ("lora", "qlora"):
        model.save_pretrained(out_dir / "adapter")
        saved = {"model": cfg.model, "adapter": str(out_dir / "adapter")}
    else:
        model.save_pretrained(out_dir / "model")
        tokenizer.save_pretrained(out_dir / "model")
        saved = {"model": str(out_dir / "model"), "adapter": None}
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
    return run_training(RCFTTrainer, cfg, out_dir, examples, model, tokenizer, device, events, stage, should_stop, val,
                        collate, ece_lambda=cfg.ece_lambda, n_bins=cfg.ece_bins, estep_steps=cfg.estep_steps,
                        estep=estep, answers=[r.answer for r in kept],
                        on_estep=lambda **fields: events.emit(f"{stage}_estep", **fields))


def _answer_logits(logits: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, V) logits at each row's answer position."""
    return logits[torch.arange(len(logits), device=logits.device), inputs["answer_pos"]]


class _PartsLogging:
    """Averages a trainer's loss components between two logging steps into ``loss_<name>`` keys."""

    def _record(self, **parts: torch.Tensor) -> None:
        sums = self.__dict__.setdefault("_parts", {})
        for name, value in parts.items():
            total, count = sums.get(name, (0.0, 0))
            sums[name] = (total + float(value.detach()), count + 1)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            logs = {**logs, **{f"loss_{k}": t / max(c, 1) for k, (t, c) in self.__dict__.pop("_parts", {}).items()}}
        super().log(logs, *args, **kwargs)


class LabelSmoothingTrainer(_PartsLogging, Trainer):
    """Cross-entropy on every supervised token, with smoothed targets over the option letters at
    the answer position (ε spread evenly over the question's options); ε = 0 is plain SFT."""

    loss_is_scaled_for_ga = False

    def __init__(self, *args, epsilon: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epsilon = epsilon

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        extra = {k: inputs.pop(k) for k in OPTION_KEYS}
        labels = inputs.pop("labels")
        keep = torch.zeros_like(labels, dtype=torch.bool)
        keep[:, :-1] = labels[:, 1:] != IGNORE  # position t predicts token t+1
        # Logits only where there is a loss (DistillTrainer does the same): (N, V), not (B, T, V).
        outputs = model(**inputs, logits_to_keep=keep)
        logits = outputs.logits.reshape(-1, outputs.logits.shape[-1])
        token_loss = torch.nn.functional.cross_entropy(logits.float(), labels[:, 1:][keep[:, :-1]], reduction="none")
        rows = torch.arange(len(labels), device=labels.device)
        answer_row = keep.flatten().cumsum(0).reshape(keep.shape)[rows, extra["answer_pos"]] - 1  # its row in (N, V)
        smoothed = option_smoothing_loss(logits[answer_row], extra["option_ids"], extra["option_mask"], extra["answer"],
                                         self.epsilon)
        token_loss = token_loss.index_put((answer_row,), smoothed)
        self._record(answer=smoothed.mean())
        loss = token_loss.mean()
        return (loss, outputs) if return_outputs else loss


class RCFTTrainer(_PartsLogging, Trainer):
    """``L = L_SFT + λ·L_ECE`` from one forward pass (REFERENCE.md §3).

    ``L_SFT`` is the model's mean cross-entropy over the supervised tokens (prompt + answer for
    RCFT); ``L_ECE`` is :func:`lab.cft.losses.ece_regulariser` on the option probabilities at the
    answer position. The E-step (``estep``: option probabilities of every training question under
    the current model) runs before the first step and then every epoch, or every ``estep_steps``
    steps — the released code computes it once; the bins must follow the model as it trains.
    """

    loss_is_scaled_for_ga = False

    def __init__(self, *args, ece_lambda: float, n_bins: int, estep_steps: Optional[int],
                 estep: Callable[[Any], list], answers: Sequence[int], on_estep: Callable[..., None], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ece_lambda, self.n_bins, self.estep_steps = ece_lambda, n_bins, estep_steps
        self._estep, self._answers, self._on_estep = estep, list(answers), on_estep
        self.bin_acc: Optional[torch.Tensor] = None
        self.add_callback(_EStep(self))

    def run_estep(self) -> None:
        probs = self._estep(self.model)
        confidence = torch.tensor([float(p.max()) for p in probs], dtype=torch.float64)
        correct = torch.tensor([int(p.argmax()) == a for p, a in zip(probs, self._answers)])
        self.bin_acc, counts = bin_accuracy(confidence, correct, self.n_bins)
        self._on_estep(step=self.state.global_step, epoch=round(self.state.epoch or 0, 3),
                          accuracy=[None if torch.isnan(a) else round(float(a), 4) for a in self.bin_acc],
                          counts=[int(c) for c in counts], confidence=round(float(confidence.mean()), 4),
                          train_accuracy=round(float(correct.double().mean()), 4))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        extra = {k: inputs.pop(k) for k in OPTION_KEYS}
        outputs = model(**inputs)
        answer_logits = _answer_logits(outputs.logits, extra)
        option_logits = answer_logits.gather(1, extra["option_ids"].clamp(min=0))
        probs = option_probs(option_logits, extra["option_mask"])
        regulariser = (ece_regulariser(probs, extra["option_mask"], self.bin_acc) if self.bin_acc is not None
                       else probs.sum() * 0.0)
        loss = outputs.loss + self.ece_lambda * regulariser
        self._record(sft=outputs.loss, ece=regulariser)
        return (loss, outputs) if return_outputs else loss


class _EStep(TrainerCallback):
    """Runs the RCFT trainer's E-step at the start of every epoch, or every ``estep_steps`` steps."""

    def __init__(self, trainer: RCFTTrainer) -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.trainer.estep_steps is None or self.trainer.bin_acc is None:
            self.trainer.run_estep()

    def on_step_begin(self, args, state, control, **kwargs):
        every = self.trainer.estep_steps
        if every and state.global_step > 0 and state.global_step % every == 0:
            self.trainer.run_estep()


class DistillTrainer(Trainer):
    """Knowledge matching: the loss is the top-k KL to the teacher at every supervised position.

    Logits are computed only at those positions (``logits_to_keep`` with a boolean mask): with
    completion-only data that is a few positions per sequence instead of all of them.
    """

    loss_is_scaled_for_ga = False

    def __init__(self, *args, kd_loss: Callable[..., torch.Tensor], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kd_loss = kd_loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"]  # (B, T)
        keep = torch.zeros_like(labels, dtype=torch.bool)
        keep[:, :-1] = labels[:, 1:] != IGNORE  # position t predicts token t+1
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], logits_to_keep=keep)
        logits = outputs.logits.reshape(1, -1, outputs.logits.shape[-1])  # (1, N, V), N = keep.sum()
        ids, logprobs = inputs["teacher_ids"][keep][None], inputs["teacher_logprobs"][keep][None]  # (1, N, k)
        mask = torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device)
        loss = self.kd_loss(logits, ids, logprobs, mask)
        return (loss, outputs) if return_outputs else loss
