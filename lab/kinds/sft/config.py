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
from typing import Any, Literal, Optional

from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.layout import ADAPTER_DIR, CHECKPOINTS_DIR, MODEL_DIR
from lab.data import DATASETS
from lab.data.loaders import dataset_names
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import DataSection, EvalSection, ModelSection, RunSection
from lab.kinds.evaluate.config import EvalConfig
from lab.training.config import Scheduler, Sharding, Tracker, TrainConfig, Tuning, check_lora_targets, check_tracker

CALIBRATION_DIR = "calibration"  # calibration/step-<n>/<task>/: the evaluations made during training
MAX_TASKS = 8
# Set for every calibration task by the job: the model in training, where it runs, and its seed.
SET_BY_JOB = ("model", "adapter", "seed", "device", "dtype")
# A CPU trains the bundled model at about one example a second: the defaults train minutes, not hours.
CPU_LIMIT = 64
DEFAULT_CALIBRATION = ({"task": "mcq", "dataset": "arc_easy", "data_files": ["bundled"], "split": "validation",
                        "limit": 100}, {"task": "clm", "data_files": ["bundled"], "limit": 50})


def _train(name: str, **changes: Any) -> Any:
    return redeclare(TrainConfig, name, **changes)


@dataclass
class AlignmentSection:
    """What the alignment stages (sft, dpo) share: the calibration tasks measured through training, and
    the ``finetune`` kind's optimiser, LoRA, checkpoint and tracker fields re-declared with their bounds.
    A config lists it first of its sections, with :class:`EvalSection` (whose ``bootstrap`` this re-declares
    and whose bins ``task_config`` reads) and :class:`RunSection` after it, so that these fields come after
    the model, data, evaluation and device fields."""

    calibration: list[dict[str, Any]] = field(default_factory=lambda: [dict(t) for t in DEFAULT_CALIBRATION],
                                              metadata=doc(
        "what to evaluate before training and after each epoch (and every eval_steps): evaluate configs without "
        "model, adapter, seed, device or dtype (task, dataset, data_files, split, limit …)", entries=EvalConfig,
        exclude=SET_BY_JOB, exclude_reason="the job sets them: the model in training", max_items=MAX_TASKS))
    method: Tuning = _train("method")
    lora_r: int = _train("lora_r")
    lora_alpha: int = _train("lora_alpha")
    lora_dropout: float = _train("lora_dropout")
    lora_targets: list[str] = _train("lora_targets")
    max_length: int = _train("max_length", default=1024, help="tokens of prompt + response; longer are cut")
    epochs: float = _train("epochs")
    learning_rate: float = _train("learning_rate")
    batch_size: int = _train("batch_size")
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
    sharding: Sharding = _train("sharding")
    fsdp_offload: bool = _train("fsdp_offload")
    bootstrap: int = redeclare(EvalSection, "bootstrap", default=200, help=(
        "bootstrap replicates of each calibration evaluation's ECE interval (0: none)"))

    def check_section(self) -> None:
        """The tracker must be installed, the LoRA targets consistent, and each calibration task a valid
        evaluation (checked at submit, on the bundled model)."""
        check_tracker(self.report_to)
        check_lora_targets(self.lora_targets)
        for j in range(len(self.calibration)):
            try:
                self.task_config(j, "bundled", None)
            except ValueError as e:
                raise ValueError(f"calibration[{j}]: {e}") from None

    def task_config(self, index: int, model: str, adapter: Optional[str]) -> EvalConfig:
        """Calibration task ``index`` as an evaluation of ``model``, with this job's device, seed and ECE settings."""
        values = {"bins": self.bins, "bin_edges": self.bin_edges, "bootstrap": self.bootstrap,
                  **self.calibration[index]}
        return EvalConfig.from_checked({**values, "model": model, "adapter": adapter, "seed": self.seed,
                                        "device": self.device, "dtype": self.dtype})


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
