"""Supervised fine-tuning on transformers' ``Trainer``, with the lab's events and per-epoch calibration.

``finetune`` trains one model (full or LoRA) on hard labels and saves it; ``DistillTrainer`` (used
by the FIRST pipeline) swaps the loss for knowledge matching against a teacher's stored top-k.
After every epoch the model scores the validation questions (letter scoring, no gradients) and an
``eval`` event carries their ECE and accuracy — REFERENCE.md §4: ECE grows with fine-tuning
epochs, and users should see it happen. A ``STOP`` request ends training after the current step,
saving what it has.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from lab.data import load_records
from lab.data.record import MCQRecord
from lab.errors import Stopped
from lab.events import EventWriter
from lab.evaluate import compute_metrics
from lab.models import load_model, select_device
from lab.scoring import score_letter
from lab.templates import get_template
from lab.train.config import TrainConfig
from lab.train.data import IGNORE, build_examples, pad_batch


def validation_metrics(model, tokenizer, records: Sequence[MCQRecord], template: str, bins: int) -> dict[str, Any]:
    """Letter-scoring accuracy and calibration of ``model`` on ``records`` (no bootstrap: cheap)."""
    was_training = model.training
    model.eval()
    render = get_template(template).render
    scores = score_letter(model, tokenizer, [render(r, tokenizer) for r in records])
    model.train(was_training)
    rows = [{"probs": s.probs, "answer": r.answer} for r, s in zip(records, scores)]
    m = compute_metrics(rows, bins, n_boot=0, seed=0)
    return {k: m[k] for k in ("n", "accuracy", "ece", "cw_ece", "nll", "brier", "trust")}


class LabCallback(TrainerCallback):
    """Training progress and per-epoch validation as events; stops at the user's request."""

    def __init__(self, events: EventWriter, stage: str, validate: Optional[Callable[[Any], dict]],
                 should_stop: Callable[[], bool]) -> None:
        self.events, self.stage, self.validate, self.should_stop = events, stage, validate, should_stop
        self.history: list[dict[str, Any]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.events.emit(self.stage, step=state.global_step, total=state.max_steps, epoch=round(state.epoch or 0, 3),
                             loss=float(logs["loss"]), lr=float(logs.get("learning_rate", 0.0)))

    def on_step_end(self, args, state, control, **kwargs):
        if self.should_stop():
            control.should_training_stop = True
            control.should_save = True

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.validate is None or self.should_stop():
            return
        record = {"epoch": round(state.epoch or 0, 3), **self.validate(model)}
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
    wrapper around frozen weights (bf16 on a GPU) for LoRA."""
    device = select_device(cfg.device)
    dtype = "float32" if cfg.method == "full" or device.type == "cpu" else cfg.dtype
    loaded = load_model(cfg.model, device=cfg.device, dtype=dtype)
    model = loaded.model
    if cfg.method == "lora":
        from peft import LoraConfig, get_peft_model

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
    callback = LabCallback(events, stage, validate, should_stop)
    trainer = trainer_cls(model=model, args=training_arguments(cfg, out_dir, device), train_dataset=Dataset.from_list(examples),
                          data_collator=collator, callbacks=[callback], **trainer_kwargs)
    checkpoints = out_dir / "checkpoints"
    resume = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    trainer.train(resume_from_checkpoint=resume)
    if should_stop():
        raise Stopped(f"{stage} stopped at step {trainer.state.global_step}; checkpoint kept in {checkpoints}")
    if cfg.method == "lora":
        model.save_pretrained(out_dir / "adapter")
        saved = {"model": cfg.model, "adapter": str(out_dir / "adapter")}
    else:
        model.save_pretrained(out_dir / "model")
        tokenizer.save_pretrained(out_dir / "model")
        saved = {"model": str(out_dir / "model"), "adapter": None}
    return {**saved, "n_train": len(examples), "history": callback.history}


def finetune(cfg: TrainConfig, out_dir: Path, events: EventWriter, should_stop: Callable[[], bool] = lambda: False,
             stage: str = "train") -> dict[str, Any]:
    """Hard-label fine-tuning (cross-entropy on the supervised tokens)."""
    model, tokenizer, device = prepare_model(cfg)
    records = load_split_records(cfg, cfg.split, [], cfg.limit)
    examples = build_examples(records, cfg.template, tokenizer, cfg.completion_only, cfg.max_length)
    val = load_split_records(cfg, cfg.val_split, cfg.val_data_files, cfg.val_limit) if cfg.val_split else []
    events.emit("log", message=f"{stage}: {len(examples)} examples, {len(val)} validation questions, {cfg.method}")
    pad_id = tokenizer.pad_token_id
    return run_training(Trainer, cfg, out_dir, examples, model, tokenizer, device, events, stage, should_stop, val,
                        lambda batch: pad_batch(batch, pad_id))


class DistillTrainer(Trainer):
    """Knowledge matching: the loss is the top-k KL to the teacher at every supervised position.

    Logits are computed only at those positions (``logits_to_keep`` with a boolean mask): with
    completion-only data that is a few positions per sequence instead of all of them.
    """

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
