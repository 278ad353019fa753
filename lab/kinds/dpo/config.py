"""The ``dpo`` kind's description: :class:`DpoConfig` and its registration (the run: :mod:`.run`).

Preference alignment, the stage the CFT paper blames for miscalibration (its aligned models — Tulu-3,
OLMo 2, Mistral-7B — are DPO models): TRL's ``DPOTrainer`` on (prompt, chosen, rejected) pairs
(:mod:`lab.data.preferences`: UltraFeedback layouts, or ``bundled`` OpenBookQA pairs), rendered with the
model's chat template. TRL no longer ships PPO, and DPO optimises the same KL-regularised reward objective
in closed form (Rafailov et al., 2023), so it stands in for the papers' RLHF stage. Like ``sft`` it runs on
the lab's training machinery and evaluates ``calibration`` (evaluate configs) before training and after every
epoch, so a job page shows what alignment does to ECE.

The optimiser and LoRA fields are :class:`~lab.training.config.TrainConfig`'s, re-declared; the learning rate
defaults to 5e-6, not 2e-5: DPO's loss keeps pushing the chosen–rejected margin with no target to stop at,
so fine-tuning rates overshoot (Zephyr's full DPO used 5e-7, LoRA recipes 5e-6).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.layout import ADAPTER_DIR, CHECKPOINTS_DIR, MODEL_DIR
from lab.core.limits import MAX_ROWS
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import BUNDLED, EvalSection, ModelSection, RunSection
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.sft.config import CALIBRATION_DIR, DEFAULT_CALIBRATION, MAX_TASKS, SET_BY_JOB, SftConfig
from lab.training.config import Scheduler, Tracker, TrainConfig, Tuning, check_tracker

# A CPU runs DPO at about half SFT's pace (two sequences a pair, and the reference's forward too).
CPU_LIMIT = 64
# The TRL losses this kind offers (and tests/test_dpo.py checks against their formulas): the DPO
# paper's sigmoid, IPO (Azar et al.; TRL averages over the response's tokens) and SLiC's hinge.
LossType = Literal["sigmoid", "ipo", "hinge"]


def _train(name: str, **changes: Any) -> Any:
    return redeclare(TrainConfig, name, **changes)


@dataclass
class DpoConfig(ConfigMixin, RunSection, EvalSection, ModelSection):
    model: str = redeclare(ModelSection, "model", trained_by="method")
    preferences: list[str] = field(default_factory=lambda: [BUNDLED], metadata=doc(
        "preference pair files (prompt, chosen, rejected: UltraFeedback layouts); 'bundled': OpenBookQA dev "
        "questions, the right answer chosen over a wrong one (an offline stand-in); empty: the hub's "
        "argilla/ultrafeedback-binarized-preferences", role="files"))
    limit: Optional[int] = field(default=CPU_LIMIT, metadata=doc(
        f"first N pairs (default {CPU_LIMIT}: minutes on a CPU; None: all)", ge=1, le=MAX_ROWS))
    beta: float = field(default=0.1, metadata=doc(
        "β: how far the policy may move from the reference (small: far); the DPO paper's and Zephyr's 0.1",
        gt=0, le=10))
    loss_type: LossType = field(default="sigmoid", metadata=doc(
        "sigmoid (the DPO paper's), ipo (squared, length-averaged) or hinge (SLiC)"))
    precompute_ref_log_probs: bool = field(default=False, metadata=doc(
        "score every pair with the reference once before training: full training then holds no second copy"))
    calibration: list[dict[str, Any]] = field(default_factory=lambda: [dict(t) for t in DEFAULT_CALIBRATION],
                                              metadata=doc(
        "what to evaluate before training and after each epoch (and every eval_steps): evaluate configs without "
        "model, adapter, seed, device or dtype (task, dataset, data_files, split, limit …)", entries=EvalConfig,
        exclude=SET_BY_JOB, exclude_reason="the job sets them: the model in training", max_items=MAX_TASKS))
    method: Tuning = _train("method")
    lora_r: int = _train("lora_r")
    lora_alpha: int = _train("lora_alpha")
    lora_dropout: float = _train("lora_dropout")
    max_length: int = _train("max_length", default=1024, help="tokens of prompt + response; longer are cut")
    epochs: float = _train("epochs", default=1)
    learning_rate: float = _train("learning_rate", default=5e-6, help=(
        "peak learning rate (DPO's is lower than fine-tuning's: its margin has no target to stop at)"))
    batch_size: int = _train("batch_size", help="pairs per step (each is two sequences)")
    grad_accum: int = _train("grad_accum")
    warmup_ratio: float = _train("warmup_ratio")
    weight_decay: float = _train("weight_decay")
    adam_beta1: float = _train("adam_beta1")
    adam_beta2: float = _train("adam_beta2")
    adam_epsilon: float = _train("adam_epsilon")
    lr_scheduler: Scheduler = _train("lr_scheduler")
    eval_steps: Optional[int] = _train("eval_steps", help="also evaluate calibration every N optimiser steps "
                                                          "(None: per epoch only)")
    save_steps: Optional[int] = _train("save_steps")
    save_optimizer: bool = _train("save_optimizer")
    snapshots: bool = _train("snapshots")
    report_to: Tracker = _train("report_to")
    bootstrap: int = redeclare(EvalSection, "bootstrap", default=200, help=(
        "bootstrap replicates of each calibration evaluation's ECE interval (0: none)"))
    on_bad_rows: Literal["skip", "error"] = field(default="skip", metadata=doc("skip or reject malformed pairs"))

    # The sft kind's: a calibration task as an evaluation of the model in training.
    task_config = SftConfig.task_config

    def __post_init__(self) -> None:
        check_tracker(self.report_to)
        for j in range(len(self.calibration)):
            try:
                self.task_config(j, "bundled", None)
            except ValueError as e:
                raise ValueError(f"calibration[{j}]: {e}") from None


register(JobKind(
    "dpo", "preference alignment with TRL's DPOTrainer (full or LoRA), ECE per calibration task every epoch",
    DpoConfig, "lab.kinds.dpo.run:run_job",
    outputs=(f"{MODEL_DIR}/", f"{ADAPTER_DIR}/", f"{CHECKPOINTS_DIR}/", f"{CALIBRATION_DIR}/"),
    key_fields=("model", "method", "preferences", "limit", "beta", "loss_type", "epochs", "learning_rate",
                "calibration"),
    data_parallel=True,
))
