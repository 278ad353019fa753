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
from typing import Literal, Optional

from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.layout import ADAPTER_DIR, CALIBRATION_DIR, CHECKPOINTS_DIR, MODEL_DIR
from lab.core.limits import MAX_ROWS
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import BUNDLED, EvalSection, ModelSection, RunSection
from lab.kinds.alignment.section import AlignmentSection

# A CPU runs DPO at about half SFT's pace (two sequences a pair, and the reference's forward too).
CPU_LIMIT = 64
# The TRL losses this kind offers (and tests/kinds/test_dpo.py checks against their formulas): the DPO
# paper's sigmoid, IPO (Azar et al.; TRL averages over the response's tokens) and SLiC's hinge.
LossType = Literal["sigmoid", "ipo", "hinge"]


@dataclass
class DpoConfig(ConfigMixin, AlignmentSection, RunSection, EvalSection, ModelSection):
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
    epochs: float = redeclare(AlignmentSection, "epochs", default=1)
    learning_rate: float = redeclare(AlignmentSection, "learning_rate", default=5e-6, help=(
        "peak learning rate (DPO's is lower than fine-tuning's: its margin has no target to stop at)"))
    batch_size: int = redeclare(AlignmentSection, "batch_size", help="pairs per step (each is two sequences)")
    on_bad_rows: Literal["skip", "error"] = field(default="skip", metadata=doc("skip or reject malformed pairs"))

    def __post_init__(self) -> None:
        self.check_section()


register(JobKind(
    "dpo", "preference alignment with TRL's DPOTrainer (full or LoRA), ECE per calibration task every epoch",
    DpoConfig, "lab.kinds.dpo.run:run_job",
    outputs=(f"{MODEL_DIR}/", f"{ADAPTER_DIR}/", f"{CHECKPOINTS_DIR}/", f"{CALIBRATION_DIR}/"),
    key_fields=("model", "method", "preferences", "limit", "beta", "loss_type", "epochs", "learning_rate",
                "calibration"),
    data_parallel=True,
))
