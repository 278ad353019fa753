"""The ``series`` kind's description: :class:`SeriesConfig` and its registration (the run: :mod:`.run`).

A series evaluates a list of models on a list of tasks, as the alignment-calibration paper follows
ECE along a model's life: over parameter scale (its Figure 3, Pythia 70M → 12B), pre-training steps
(Figure 4) and alignment stages (Figure 5). Each model entry is a model to load, a finished
training run — ``finetune``, ``sft`` or ``dpo`` (its final weights, or on the ``step`` axis every
snapshot it kept, in step order after its base model) — or a ``finetune`` config the series trains itself, once per seed of
``seeds``. Each task is an ``evaluate`` config without its model. The x-axis is the parameter count
(read from the model), the training step, the ``stage`` label an entry gives, or the seed; points at
the same x that differ only in seed are reported as their mean with a 95 % interval over seeds,
beside each run's own bootstrap interval.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lab.core.config import ConfigMixin, doc
from lab.core.layout import CELLS_DIR, SERIES_CSV, SERIES_FILE
from lab.core.limits import SEED
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import EvalSection, PlacementSection, RunSection
from lab.kinds.evaluate.config import EvalConfig
from lab.training.config import TrainConfig

Axis = Literal["params", "step", "stage", "seed"]
MAX_MODELS, MAX_TASKS, MAX_SEEDS = 64, 16, 32
MAX_STAGE = 40  # characters of a stage label: it is a tick on an axis
# What the series decides for every model and task, not an entry: where each runs (its layers too), and how it
# is seeded.
SET_BY_SERIES = ("model", "adapter", "seed", "device", "dtype", "device_map", "max_memory", "offload_folder")
DEFAULT_MODELS = ({"model": "scratch"}, {"model": "bundled"})
DEFAULT_TASKS = ({"task": "clm", "data_files": ["bundled"], "limit": 100}, {"task": "facts", "data_files": ["bundled"]})


@dataclass(kw_only=True)
class SeriesModel:
    """One entry of ``models``: exactly one of ``model``, ``run`` or ``train``."""

    model: Optional[str] = field(default=None, metadata=doc(
        "a model to evaluate: 'bundled', 'scratch', a local directory, a hub id or run:<id> (a training job's "
        "final weights)", role="model", adapter_field="adapter"))
    adapter: Optional[str] = field(default=None, metadata=doc("a PEFT (LoRA) adapter on `model`", role="dir"))
    revision: Optional[str] = field(default=None, metadata=doc(
        "a hub model's branch or commit (Pythia's step1000 …: its pre-training checkpoints)", role="name",
        pattern=r"[A-Za-z0-9._-]{1,64}"))
    run: Optional[str] = field(default=None, metadata=doc(
        "a finished finetune, sft or dpo run's directory: its final weights; on the step axis its base model (step 0) "
        "and every snapshot it kept, in step order", role="dir"))
    train: Optional[dict[str, Any]] = field(default=None, metadata=doc(
        "a finetune config this job trains (once per seed of `seeds`), then read as `run` is", entries=TrainConfig,
        exclude=("seed", "device", "dtype"), exclude_reason="the series sets them (seeds, seed, device, dtype)"))
    stage: Optional[str] = field(default=None, metadata=doc(
        "the entry's label on the stage axis (base, SFT, DPO …) and in the tables", role="text", max_len=MAX_STAGE))
    step: Optional[int] = field(default=None, metadata=doc(
        "a model's training step on the step axis (a Pythia revision's step)", ge=0, le=10**12))


@dataclass
class SeriesConfig(ConfigMixin, PlacementSection, RunSection, EvalSection):
    """A list of models × a list of tasks, one evaluation per cell, resumable cell by cell."""

    axis: Axis = field(default="params", metadata=doc(
        "x-axis: params (parameter count, log scale), step (training step), stage (the entries' labels) or seed"))
    models: list[dict[str, Any]] = field(default_factory=lambda: [dict(m) for m in DEFAULT_MODELS], metadata=doc(
        "the models, in order: each {model, adapter} or {run} or {train}, with an optional stage and step",
        entries=SeriesModel, min_items=1, max_items=MAX_MODELS))
    tasks: list[dict[str, Any]] = field(default_factory=lambda: [dict(t) for t in DEFAULT_TASKS], metadata=doc(
        "the tasks, each an evaluate config without model, adapter, seed, device or dtype (task, dataset, "
        "data_files, split, limit, positions, scoring, template …)", entries=EvalConfig, exclude=SET_BY_SERIES,
        exclude_reason="the series sets them for every cell", min_items=1, max_items=MAX_TASKS))
    seeds: list[int] = field(default_factory=list, metadata=doc(
        "train each `train` entry once per seed (the seed axis; on the others, replicates averaged at each x); "
        "empty: once, with `seed`", max_items=MAX_SEEDS, **SEED))

    def __post_init__(self) -> None:
        self.check_placement([entry["model"] for entry in self.models if entry.get("model") is not None])
        for i, entry in enumerate(self.models):
            given = [key for key in ("model", "run", "train") if entry.get(key) is not None]
            if len(given) != 1:
                raise ValueError(f"models[{i}]: give exactly one of model, run or train "
                                 f"(got {', '.join(given) or 'none'})")
            for key in ("adapter", "revision"):
                if entry.get(key) is not None and entry.get("model") is None:
                    raise ValueError(f"models[{i}].{key}: goes with a model")
            if entry.get("train") is not None:
                TrainConfig.from_checked(entry["train"])  # its own cross-field checks, at submit time
            if self.axis == "stage" and not entry.get("stage"):
                raise ValueError(f"models[{i}].stage: every entry needs a stage label on the stage axis")
            if self.axis == "step" and entry.get("model") is not None and entry.get("step") is None:
                raise ValueError(f"models[{i}].step: a model on the step axis needs its step (or use run or train)")
        if self.axis == "seed" and not all(entry.get("train") is not None for entry in self.models):
            raise ValueError("models: on the seed axis every entry is a train entry, repeated over `seeds`")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: each seed once, got {self.seeds}")
        for j, task in enumerate(self.tasks):
            try:
                self.task_config(j, "bundled", None, self.seed)
            except ValueError as e:
                raise ValueError(f"tasks[{j}]: {e}") from None

    def task_config(self, index: int, model: str, adapter: Optional[str], seed: int) -> EvalConfig:
        """The evaluation of one cell: task ``index`` on ``model`` (+ ``adapter``), with the series'
        device, dtype and ECE settings unless the task sets its own bins."""
        values = {"bins": self.bins, "bin_edges": self.bin_edges, "bootstrap": self.bootstrap, **self.tasks[index]}
        return EvalConfig.from_checked({**values, "model": model, "adapter": adapter, "seed": seed,
                                        "device": self.device, "dtype": self.dtype})

    def run_seeds(self) -> list[int]:
        """The seeds each ``train`` entry is trained with."""
        return list(self.seeds) or [self.seed]


register(JobKind(
    "series", "evaluate a list of models (sizes, checkpoints, stages, seeds) on a list of tasks: ECE along the x-axis",
    SeriesConfig, "lab.kinds.series.run:run_job", outputs=(SERIES_FILE, SERIES_CSV, f"{CELLS_DIR}/"),
    key_fields=("axis", "models", "tasks", "seeds"),
))
