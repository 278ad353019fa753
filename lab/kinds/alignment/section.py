"""The config section the alignment kinds (sft, dpo) share: the calibration tasks measured through
training, and the ``finetune`` kind's optimiser, LoRA, checkpoint and tracker fields re-declared."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from lab.core.config import doc, redeclare
from lab.jobkit.sections import EvalSection
from lab.kinds.evaluate.config import EvalConfig
from lab.training.config import Scheduler, Sharding, Tracker, TrainConfig, Tuning, check_lora_targets, check_tracker

MAX_TASKS = 8
# Set for every calibration task by the job: the model in training, where it runs, and its seed.
SET_BY_JOB = ("model", "adapter", "seed", "device", "dtype")
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
