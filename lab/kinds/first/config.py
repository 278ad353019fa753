"""``FirstConfig``: the whole FIRST pipeline as one job (REFERENCE.md §2).

Teacher fine-tune (or an existing teacher) → top-k extraction → temperature sweep on validation
questions → students (``finetune``, ``distill``, ``distill_ls``, ``first``) → evaluation of the
teacher and every student in-domain and on the out-of-domain datasets named in ``ood``.

``training`` holds the fine-tuning settings of the teacher and every student — any
:class:`~lab.training.config.TrainConfig` field the protocol does not set itself — so the YAML is a
``finetune`` job's vocabulary, as in the CFT protocol.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lab.calibration.first_sweep import TEACHER_SWEEP_BOUNDS
from lab.calibration.temperature import FitObjective
from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.layout import EVAL_DIR, REPORT_JSON, REPORT_MD, TOPK_DIR
from lab.core.limits import MAX_EPOCHS, MAX_ROWS, MAX_TOP_K, SPLIT
from lab.data import harness
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import (AdaptedModel, DataSection, Dataset, HarnessSection, ModelSection, PipelineEvalSection,
                                 PromptSection, RunSection)
from lab.kinds.evaluate.config import EvalConfig
from lab.training.config import TrainConfig, Tuning, training_section

Student = Literal["finetune", "distill", "distill_ls", "first", "oracle"]
# The default students; ``oracle`` (distilled from the true answer distribution, where the data carries
# one: the controlled task) is the upper bound a FIRST student can reach, asked for by name.
STUDENTS: tuple[str, ...] = ("finetune", "distill", "distill_ls", "first")
ORACLE = "oracle"
MAX_GRID = 100  # temperatures in ts_grid: the paper's has 10, the default log grid 21
# The defaults' sizes: five models trained on a CPU at well under one example a second, so every stage of
# the pipeline runs on the bundled OpenBookQA sample in about half an hour (examples/first-paper.yaml: all).
TRAIN_LIMIT, VAL_LIMIT, TEST_LIMIT = 32, 32, 100
TRAINING_KEYS = ("epochs", "learning_rate", "batch_size", "grad_accum", "warmup_ratio", "max_length", "lora_r",
                 "lora_alpha", "completion_only")  # top-level keys before `training:` existed


@dataclass(kw_only=True)
class OodEvaluation(HarnessSection, PromptSection, DataSection):
    """One out-of-domain evaluation of every trained model (an entry of ``FirstConfig.ood``): a lab dataset,
    scored by letter as the in-domain test is, or an lm-eval task (``lm-eval:<task>``, its ``num_fewshot`` and
    ``lm_eval_include``), scored as the evaluate kind scores one: cloze on lm-eval's own prompts."""

    dataset: str = redeclare(DataSection, "dataset", required=True, families=True)


@dataclass
class FirstConfig(ConfigMixin, RunSection, PipelineEvalSection, PromptSection, Dataset):
    MOVED: typing.ClassVar[dict[str, str]] = {key: f"training.{key}" for key in TRAINING_KEYS}

    teacher: str = redeclare(ModelSection, "model", help="teacher base model: 'bundled', a directory, a hub id or "
                             "run:<id>", trained_by="teacher_method")
    teacher_adapter: Optional[str] = redeclare(AdaptedModel, "adapter", help="an existing teacher LoRA adapter")
    finetune_teacher: bool = field(default=True, metadata=doc("fine-tune the teacher first (else use it as is)"))
    teacher_method: Tuning = field(default="full", metadata=doc("teacher fine-tuning: full, lora or qlora"))
    teacher_epochs: Optional[float] = field(default=None, metadata=doc(
        "epochs for the teacher (None: training.epochs)", gt=0, le=MAX_EPOCHS))
    student: str = redeclare(ModelSection, "model", help="student base model (same tokenizer as the teacher)",
                             trained_by="student_method")
    student_method: Tuning = field(default="full", metadata=doc("student training: full, lora or qlora"))
    students: list[Student] = field(default_factory=lambda: list(STUDENTS), metadata=doc(
        f"any of {typing.get_args(Student)}; oracle: direct distillation from the questions' true answer distribution "
        "(the synthetic dataset) in place of the teacher's, an upper bound"))
    train_split: str = field(default="train", metadata=doc("training split (or SOURCE:PART)", **SPLIT))
    val_split: str = field(default="validation", metadata=doc("split for the temperature sweep and per-epoch ECE",
                                                              **SPLIT))
    test_split: str = field(default="test", metadata=doc("in-domain evaluation split", **SPLIT))
    train_limit: Optional[int] = field(default=TRAIN_LIMIT, metadata=doc(
        "first N training examples (None: all)", ge=1, le=MAX_ROWS))
    val_limit: Optional[int] = field(default=VAL_LIMIT, metadata=doc(
        "first N validation questions (None: all)", ge=1, le=MAX_ROWS))
    test_limit: Optional[int] = field(default=TEST_LIMIT, metadata=doc("first N test questions (None: all)",
                                                                       ge=1, le=MAX_ROWS))
    ood: list[dict[str, Any]] = field(default_factory=list, metadata=doc(
        "out-of-domain evaluations: [{dataset, data_files, subject, split, limit, template}]; dataset "
        "lm-eval:<task> (with num_fewshot, lm_eval_include) is scored on the task's own prompts (cloze)",
        entries=OodEvaluation, max_items=32))
    k: int = field(default=5, metadata=doc("teacher tokens kept per position", ge=1, le=MAX_TOP_K))
    logprob_dtype: Literal["float16", "float32"] = field(default="float16", metadata=doc(
        "stored log-prob width: float16 or float32"))
    ts_form: Literal["paper", "logit"] = field(default="paper", metadata=doc("paper: softmax(P/c); logit: P^(1/T)"))
    ts_objective: FitObjective = field(default="ece", metadata=doc("what the sweep minimises"))
    ts_grid: Optional[list[float]] = field(default=None, metadata=doc(
        "temperatures the sweep tries first (None: the form's own, paper 0.1..1.0 step 0.1, logit 0.25..8 "
        "geometric); an optimum on an edge widens it, up to 0.001..1000", ge=TEACHER_SWEEP_BOUNDS[0],
        le=TEACHER_SWEEP_BOUNDS[1], min_items=1, max_items=MAX_GRID))
    ls_delta: float = field(default=0.1, metadata=doc("label smoothing δ for distill_ls", ge=0, lt=1))
    ls_renormalise: bool = field(default=False, metadata=doc(
        "distill_ls: normalise the top-k to sum 1 before Eq. 3 (default: Eq. 3 on the raw top-k, as the paper)"))
    direct_delta: float = field(default=1e-6, metadata=doc("δ of direct distillation's normalisation", gt=0, lt=1))
    kd_renormalise: bool = field(default=False, metadata=doc("renormalise the student over the teacher's top-k"))
    kd_tail: bool = field(default=False, metadata=doc("add a 'rest of the vocabulary' bucket to the KL"))
    training: dict[str, Any] = field(default_factory=dict, metadata=training_section(
        "fine-tuning settings of the teacher and every student (TrainConfig fields: epochs, learning_rate, "
        "batch_size, lora_r, max_length, completion_only, weight_decay, lr_scheduler, ...)",
        ("method", "objective", "label_smoothing", "ece_lambda", "ece_bins", "estep_steps"),
        "the protocol sets it (use the top-level fields teacher, student, teacher_method, student_method, "
        "dataset, data_files, the splits and limits, template, seed, device, dtype, bins, bin_edges)"))

    def __post_init__(self) -> None:
        if not self.students:
            raise ValueError(f"students: must name at least one of {typing.get_args(Student)}")
        if self.kd_renormalise and self.kd_tail:
            raise ValueError("`kd_renormalise` and `kd_tail` exclude each other: after renormalising over the "
                             "top-k there is no mass left for a tail bucket")
        self.template = self.train_config(self.teacher, self.teacher_method).template
        for i, entry in enumerate(self.ood):  # each set as the evaluation will read it, at submit time
            try:
                self.eval_config({"split": "test", **entry}, self.teacher, self.teacher_adapter)
            except ValueError as e:
                raise ValueError(f"ood[{i}].{e}") from None

    def eval_config(self, spec: dict[str, Any], model: str, adapter: Optional[str]) -> EvalConfig:
        """One model's evaluation on one set (the in-domain test or an ``ood`` entry). A lab dataset is scored
        by letter, with the entry's template or, on the training dataset, the training one; an lm-eval task by
        cloze on its own prompts (template ``lm_eval``), as the evaluate kind scores it."""
        lm_eval = harness.is_task(spec["dataset"])
        template = spec.get("template") or (self.template if spec["dataset"] == self.dataset else None)
        return EvalConfig.from_dict({
            **spec, "model": model, "adapter": adapter, "scoring": "cloze" if lm_eval else "letter",
            "template": template, "bins": self.bins, "bin_edges": self.bin_edges, "batch_size": self.eval_batch_size,
            "device": self.device, "dtype": self.dtype, "bootstrap": self.bootstrap, "seed": self.seed})

    def train_config(self, model: str, method: Tuning, epochs: Optional[float] = None) -> TrainConfig:
        """The fine-tuning settings of the teacher or a student: ``training`` plus what the protocol sets."""
        return TrainConfig.from_dict({
            **self.training, "model": model, "method": method, "dataset": self.dataset, "data_files": self.data_files,
            "subject": self.subject, "split": self.train_split, "limit": self.train_limit, "val_split": self.val_split,
            "val_limit": self.val_limit, "template": self.template, "seed": self.seed, "device": self.device,
            "dtype": self.dtype, "bins": self.bins, "bin_edges": self.bin_edges,
            **({"epochs": epochs} if epochs else {}),
        })


register(JobKind(
    "first", "FIRST: teacher, top-k extraction, temperature sweep, four students, report", FirstConfig, "lab.kinds.first.run:run_job",
    outputs=("teacher/", f"{TOPK_DIR}/", "sweep/", "students/<name>/", f"{EVAL_DIR}/<model>-<set>/", REPORT_JSON,
             REPORT_MD),
    key_fields=("teacher", "student", "teacher_method", "student_method", "dataset", "data_files", "train_limit",
                "test_limit", "training", "k"),
    data_parallel=True,
))
