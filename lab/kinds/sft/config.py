"""The ``sft`` kind's description: :class:`SftConfig` and its registration (the run: :mod:`.run`).

Instruction tuning, the alignment stage that both calibration papers find breaks calibration
(the alignment-calibration paper §6: worse with homogeneous synthetic data and more epochs, less with
LoRA): TRL's ``SFTTrainer`` on instruction–response pairs (:mod:`lab.data.instructions`: Alpaca rows,
chat ``messages`` or ``prompt``/``completion``), rendered with the model's chat template, the loss on
the response only. It runs on the lab's training machinery — events, resume, trackers, pre-flight,
snapshots — and after every epoch (and every ``eval_steps``) it evaluates ``calibration``, a list of
evaluate configs, so its job page follows ECE and accuracy per task through training.

The optimiser and LoRA fields are the ``finetune`` kind's (:class:`~lab.training.config.TrainConfig`),
re-declared with their bounds; the FIRST paper's recipe is not the default here: the alignment paper's
Table 2 is (``examples/sft-paper.yaml``: LLaMA-2-7B on 4 GPUs; ``sft-paper-1gpu.yaml`` on one).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.layout import ADAPTER_DIR, CALIBRATION_DIR, CHECKPOINTS_DIR, MODEL_DIR
from lab.data import DATASETS, dataset_names
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import DataSection, EvalSection, ModelSection, RunSection
from lab.kinds.alignment.section import AlignmentSection

# A CPU trains the bundled model at about one example a second: the defaults train minutes, not hours.
CPU_LIMIT = 64


@dataclass
class SftConfig(ConfigMixin, AlignmentSection, RunSection, EvalSection, DataSection, ModelSection):
    model: str = redeclare(ModelSection, "model", trained_by="method")
    dataset: str = redeclare(DataSection, "dataset", default="alpaca", help=(
        "instruction data: alpaca (homogeneous, synthetic; CC BY-NC 4.0), dolly (diverse, human-written; CC BY-SA "
        "3.0) or instructions (your files: Alpaca rows, chat messages or prompt/completion)"))
    split: str = redeclare(DataSection, "split", default="train", help="training split, or SOURCE:PART")
    limit: Optional[int] = redeclare(DataSection, "limit", default=CPU_LIMIT, help=(
        f"first N training examples (default {CPU_LIMIT}: minutes on a CPU; None: all)"))
    on_bad_rows: Literal["skip", "error"] = field(default="skip", metadata=doc("skip or reject malformed rows"))

    def __post_init__(self) -> None:
        if "sft" not in DATASETS.get(self.dataset).tasks:
            raise ValueError(f"dataset: {self.dataset!r} holds no instruction-response pairs; use one of: "
                             f"{', '.join(dataset_names('sft'))}")
        self.check_section()


register(JobKind(
    "sft", "instruction tuning with TRL's SFTTrainer (full or LoRA), ECE per calibration task every epoch", SftConfig,
    "lab.kinds.sft.run:run_job", outputs=(f"{MODEL_DIR}/", f"{ADAPTER_DIR}/", f"{CHECKPOINTS_DIR}/",
                                          f"{CALIBRATION_DIR}/"),
    key_fields=("model", "method", "dataset", "data_files", "limit", "epochs", "learning_rate", "calibration"),
    data_parallel=True,
))
