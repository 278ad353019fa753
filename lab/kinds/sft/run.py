"""Run an ``sft`` job: TRL's ``SFTTrainer`` in the lab's training loop (:func:`lab.training.trainer.run_training`).

    checkpoints/, model/ or adapter/, snapshots/    as a finetune run leaves them
    calibration/step-<n>/t<j>-<task>/               each calibration task evaluated at that step

The examples are TRL's conversational prompt–completion form (the prompt's messages, the response
as the assistant's turn): ``SFTTrainer`` renders them with the model's chat template and, with
``completion_only_loss``, puts the loss on the response's tokens only. A model without a chat template
(a base model, as the alignment-calibration paper tunes) gets Stanford Alpaca's prompt as plain text
instead (:meth:`lab.data.instructions.InstructionRecord.plain_example`). Before training, after every
epoch and every ``eval_steps``, each calibration task is evaluated on the model in training
(:mod:`lab.kinds.alignment.calibration`).
"""
from __future__ import annotations

from typing import Any

from lab.data import load
from lab.data.instructions import SFT_TASK
from lab.data.loading import log_skipped
from lab.data.chat_templates import has_chat_template
from lab.jobkit.worker import JobContext
from lab.kinds.alignment.calibration import calibration_check
from lab.kinds.sft.config import SftConfig

STAGE = "train"


def run_job(cfg: SftConfig, ctx: JobContext) -> dict[str, Any]:
    from trl import SFTConfig, SFTTrainer  # in the worker only: TRL imports transformers' Trainer

    from lab.training.trainer import prepare_model, run_training

    ctx.announce(f"loading data {cfg.dataset}")
    data = load(cfg.dataset, cfg.split, cfg.data_files or None, task=SFT_TASK, on_bad_rows=cfg.on_bad_rows,
                seed=cfg.seed, limit=cfg.limit)
    log_skipped(data.problems, ctx.log)
    ctx.announce(f"loading model {cfg.model}")
    model, tokenizer, device = prepare_model(cfg)
    chat = has_chat_template(tokenizer)  # a base model has none: Alpaca's prompt instead
    examples = [record.example() if chat else record.plain_example() for record in data.records]
    rendered = "in the model's chat template" if chat else "as Stanford Alpaca prompts (the model has no chat template)"
    ctx.events.emit("log", message=f"{STAGE}: {len(examples)} instruction–response pairs from {data.source}, "
                                   f"{rendered}, {cfg.method}, {len(cfg.calibration)} calibration tasks")
    ctx.announce(f"{STAGE}: preparing the trainer (tokenising {len(examples)} examples)")
    result = run_training(
        SFTTrainer, cfg, ctx.run_dir, examples, model, tokenizer, device, ctx.events, STAGE, ctx.should_stop, [], None,
        validate=calibration_check(cfg, tokenizer, ctx, device) if cfg.calibration else None,
        args_class=SFTConfig, args_extra={"completion_only_loss": True, "max_length": cfg.max_length, "packing": False,
                                            # TRL turns it on by default; the lab's memory estimate and the
                                            # finetune kind have it only for QLoRA (prepare_model)
                                            "gradient_checkpointing": cfg.method == "qlora"},
        validate_at_start=True, memory_terms={"trainer": "sft"}, processing_class=tokenizer)
    history = result["history"]
    last = history[-1] if history else {}
    return {"n_train": result["n_train"], "steps": last.get("step"),
            **{f"final_{key}_ece": task["ece"] for key, task in (last.get("tasks") or {}).items()}}
