"""Run a ``dpo`` job: TRL's ``DPOTrainer`` in the lab's training loop (:func:`lab.training.trainer.run_training`).

    checkpoints/, model/ or adapter/, snapshots/    as a finetune run leaves them
    calibration/step-<n>/t<j>-<task>/               each calibration task evaluated at that step

Each pair becomes TRL's conversational preference form (the prompt as the user's turn, each response
as the assistant's) so that the chat template renders it as the model will be used. The reference is
the model as the job starts: with LoRA the adapter-disabled base (no second copy), with full training a
second copy TRL loads from the model's folder, or — ``precompute_ref_log_probs`` — none, each pair scored
once before the first step. Calibration is measured by :func:`lab.kinds.alignment.calibration.calibration_check`, before
training and after each epoch, into ``train_eval`` events; the reward figures TRL logs at each step
(``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``) go into
:data:`REWARDS_EVENT` events, which the job's page tabulates per epoch.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from lab.core.errors import DataError
from lab.core.events import EventWriter
from lab.data.loading import log_skipped
from lab.data import load, preferences
from lab.data.preferences import PreferencePair
from lab.data.chat_templates import alpaca_prompt, has_chat_template
from lab.jobkit.worker import JobContext
from lab.kinds.dpo.config import DpoConfig
from lab.kinds.alignment.calibration import calibration_check

STAGE = "train"
SHOWN = 5  # bad pairs named one by one in the log; the rest counted
# TRL's reward figures as logged (averaged over the steps since the last log): {"step", "epoch", "rewards/…"}.
# Not ``train_…``: the ETA takes those for pauses of the training stage (ui.progress.eta_seconds).
REWARDS_EVENT = "rewards"


def preference_examples(pairs: Sequence[PreferencePair]) -> tuple[list[dict[str, Any]], list[str]]:
    """Pairs → TRL's conversational preference rows, and the pairs refused, each ``id: reason``.

    :func:`lab.data.load` already refuses empty responses and identical ones; this adds what it lets
    through that teaches DPO nothing or trains on nothing: a blank prompt (a chat row whose user
    message is empty) and responses that differ only in surrounding whitespace, which the chat
    template's stripping renders as the same tokens (a zero margin, a constant loss).
    """
    examples: list[dict[str, Any]] = []
    refused: list[str] = []
    for pair in pairs:
        if not pair.prompt.strip():
            refused.append(f"{pair.id}: empty prompt")
        elif pair.chosen.strip() == pair.rejected.strip():
            refused.append(f"{pair.id}: 'chosen' and 'rejected' differ only in whitespace")
        else:
            examples.append({"prompt": [{"role": "user", "content": pair.prompt}],
                             "chosen": [{"role": "assistant", "content": pair.chosen}],
                             "rejected": [{"role": "assistant", "content": pair.rejected}]})
    return examples, refused


def plain_preference(example: dict[str, Any]) -> dict[str, str]:
    """A conversational preference row as TRL's plain one, for a model without a chat template: the
    prompt in Stanford Alpaca's form (:func:`lab.data.chat_templates.alpaca_prompt`, as the sft kind renders
    it for such a model), the responses as text (DPOTrainer appends the end-of-text token)."""
    return {"prompt": alpaca_prompt(example["prompt"]), "chosen": example["chosen"][0]["content"],
            "rejected": example["rejected"][0]["content"]}


def trainer_class(seen: dict[str, float], events: Optional[EventWriter] = None) -> type:
    """TRL's ``DPOTrainer``, keeping the latest reward figures TRL logs in ``seen`` for the job's summary
    and writing each log's as a :data:`REWARDS_EVENT` event to ``events`` (a job's; a trainer built
    outside a job has none), for the per-epoch table of the job's page."""
    from trl import DPOTrainer  # in the worker only: TRL imports transformers' Trainer

    class LabDPOTrainer(DPOTrainer):
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            super().log(logs, start_time)  # TRL adds its averaged metrics to logs
            rewards = {k: float(v) for k, v in logs.items() if k.startswith("rewards/") and math.isfinite(v)}
            seen.update(rewards)
            if rewards and events is not None:
                events.emit(REWARDS_EVENT, step=self.state.global_step, epoch=round(self.state.epoch or 0, 3),
                            **rewards)

    return LabDPOTrainer


def run_job(cfg: DpoConfig, ctx: JobContext) -> dict[str, Any]:
    from trl import DPOConfig

    from lab.training.trainer import prepare_model, run_training

    ctx.announce("loading preference pairs")
    data = load(preferences.DATASET, files=cfg.preferences or None, task=preferences.TASK, limit=cfg.limit)
    pairs, problems = data.records, data.problems
    examples, refused = preference_examples(pairs)
    where = ", ".join(cfg.preferences) if cfg.preferences else "the hub"
    if cfg.on_bad_rows == "error" and (problems or refused):
        first = str(problems[0]) if problems else refused[0]
        raise DataError(f"{len(problems) + len(refused)} bad preference pairs in {where} (on_bad_rows: error). "
                        f"First: {first}")
    log_skipped(problems, ctx.log, SHOWN)
    _log_refused(refused, ctx.log)
    if not examples:
        raise DataError(f"No usable preference pairs in {where}: all {len(pairs)} refused. First: {refused[0]}")
    ctx.announce(f"loading model {cfg.model}")
    model, tokenizer, device = prepare_model(cfg)
    if not has_chat_template(tokenizer):  # a base model: Stanford Alpaca's prompt, plain responses
        examples = [plain_preference(e) for e in examples]
    skipped = len(problems) + len(refused)
    reference = ("the adapter-disabled base" if cfg.method != "full" else
                 "scored once before training" if cfg.precompute_ref_log_probs else "a frozen copy of the model")
    ctx.events.emit("log", message=f"{STAGE}: {len(examples)} preference pairs from {where} ({skipped} skipped), "
                                   f"{cfg.method}, {cfg.loss_type} loss, β {cfg.beta}, reference: {reference}, "
                                   f"{len(cfg.calibration)} calibration tasks")
    seen: dict[str, float] = {}
    ctx.announce(f"{STAGE}: preparing the trainer (tokenising {len(examples)} pairs)")
    result = run_training(
        trainer_class(seen, ctx.events), cfg, ctx.run_dir, examples, model, tokenizer, device, ctx.events, STAGE,
        ctx.should_stop, [], None, validate=calibration_check(cfg, tokenizer, ctx, device) if cfg.calibration else None,
        args_class=DPOConfig, args_extra={
            "beta": cfg.beta, "loss_type": [cfg.loss_type], "max_length": cfg.max_length,
            "precompute_ref_log_probs": cfg.precompute_ref_log_probs,
            # TRL turns it on by default; the lab's memory estimate and the other kinds have it only for QLoRA
            "gradient_checkpointing": cfg.method == "qlora"},
        validate_at_start=True, processing_class=tokenizer,
        memory_terms={"trainer": "dpo", "precompute_ref": cfg.precompute_ref_log_probs})
    history = result["history"]
    last = history[-1] if history else {}
    return {"n_train": result["n_train"], "skipped": skipped, "steps": last.get("step"),
            **{f"final_{key}_ece": task["ece"] for key, task in (last.get("tasks") or {}).items()},
            **{f"final_{key.replace('/', '_')}": value for key, value in sorted(seen.items())}}


def _log_refused(refused: Sequence[str], log: Callable[[str], None]) -> None:
    for reason in refused[:SHOWN]:
        log(f"skipped pair {reason}")
    if len(refused) > SHOWN:
        log(f"... and {len(refused) - SHOWN} more skipped pairs")
