"""``FirstConfig``: the whole FIRST pipeline as one job (REFERENCE.md §2).

Teacher fine-tune (or an existing teacher) → top-k extraction → temperature sweep on validation
questions → students (``finetune``, ``distill``, ``distill_ls``, ``first``) → evaluation of the
teacher and every student in-domain and on the out-of-domain datasets named in ``ood``.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lab.config import ConfigMixin, doc
from lab.data import DATASETS
from lab.limits import (DEVICE, MAX_BATCH, MAX_BINS, MAX_BOOTSTRAP, MAX_EPOCHS, MAX_LORA_RANK, MAX_ROWS, MAX_TOKENS,
                        MAX_TOP_K, SEED, SPLIT, Dtype)
from lab.templates import TEMPLATES
from lab.train.config import Method, TrainConfig

Student = Literal["finetune", "distill", "distill_ls", "first"]
STUDENTS: tuple[str, ...] = typing.get_args(Student)


@dataclass
class OodEvaluation:
    """One out-of-domain evaluation of every trained model (an entry of ``FirstConfig.ood``)."""

    dataset: str = field(metadata=doc("registered dataset name", role="name", registry=DATASETS))
    data_files: list[str] = field(default_factory=list, metadata=doc("its local files: PATH or SPLIT=PATH",
                                                                     role="data_files"))
    split: str = field(default="test", metadata=doc("split (or SOURCE:PART)", **SPLIT))
    limit: Optional[int] = field(default=None, metadata=doc("first N questions", ge=1, le=MAX_ROWS))
    template: Optional[str] = field(default=None, metadata=doc("letter template; default depends on dataset",
                                                               role="name", registry=TEMPLATES))


@dataclass
class FirstConfig(ConfigMixin):
    teacher: str = field(default="bundled", metadata=doc("teacher base model: 'bundled', a directory or a hub id",
                                                         role="model"))
    teacher_adapter: Optional[str] = field(default=None, metadata=doc("an existing teacher LoRA adapter", role="dir"))
    finetune_teacher: bool = field(default=True, metadata=doc("fine-tune the teacher first (else use it as is)"))
    teacher_method: Method = field(default="full", metadata=doc("teacher fine-tuning: full, lora or qlora"))
    student: str = field(default="bundled", metadata=doc("student base model (same tokenizer as the teacher)",
                                                         role="model"))
    student_method: Method = field(default="full", metadata=doc("student training: full, lora or qlora"))
    students: list[Student] = field(default_factory=lambda: list(STUDENTS), metadata=doc(f"any of {STUDENTS}"))
    dataset: str = field(default="csqa", metadata=doc("in-domain dataset", role="name", registry=DATASETS))
    data_files: list[str] = field(default_factory=list, metadata=doc("its local files: PATH or SPLIT=PATH",
                                                                     role="data_files"))
    train_split: str = field(default="train", metadata=doc("training split (or SOURCE:PART)", **SPLIT))
    val_split: str = field(default="validation", metadata=doc("split for the temperature sweep and per-epoch ECE",
                                                              **SPLIT))
    test_split: str = field(default="test", metadata=doc("in-domain evaluation split", **SPLIT))
    train_limit: Optional[int] = field(default=None, metadata=doc("first N training examples", ge=1, le=MAX_ROWS))
    val_limit: Optional[int] = field(default=None, metadata=doc("first N validation questions", ge=1, le=MAX_ROWS))
    test_limit: Optional[int] = field(default=None, metadata=doc("first N test questions", ge=1, le=MAX_ROWS))
    ood: list[dict[str, Any]] = field(default_factory=list, metadata=doc(
        "out-of-domain evaluations: [{dataset, data_files, split, limit, template}]", entries=OodEvaluation,
        max_items=32))
    template: Optional[str] = field(default=None, metadata=doc("letter template; default depends on dataset",
                                                               role="name", registry=TEMPLATES))
    k: int = field(default=5, metadata=doc("teacher tokens kept per position", ge=1, le=MAX_TOP_K))
    logprob_dtype: Literal["float16", "float32"] = field(default="float16", metadata=doc(
        "stored log-prob width: float16 or float32"))
    ts_form: Literal["paper", "logit"] = field(default="paper", metadata=doc("paper: softmax(P/c); logit: P^(1/T)"))
    ts_objective: Literal["ece", "nll"] = field(default="ece", metadata=doc("what the sweep minimises"))
    ls_delta: float = field(default=0.1, metadata=doc("label smoothing δ for distill_ls", ge=0, lt=1))
    direct_delta: float = field(default=1e-6, metadata=doc("δ of direct distillation's normalisation", gt=0, lt=1))
    kd_renormalise: bool = field(default=False, metadata=doc("renormalise the student over the teacher's top-k"))
    kd_tail: bool = field(default=False, metadata=doc("add a 'rest of the vocabulary' bucket to the KL"))
    completion_only: bool = field(default=True, metadata=doc("supervise the answer only"))
    epochs: float = field(default=3, metadata=doc("epochs for every student", gt=0, le=MAX_EPOCHS))
    teacher_epochs: Optional[float] = field(default=None, metadata=doc("epochs for the teacher (default: epochs)",
                                                                       gt=0, le=MAX_EPOCHS))
    learning_rate: float = field(default=2e-5, metadata=doc("peak learning rate", gt=0, le=10))
    batch_size: int = field(default=8, metadata=doc("examples per device per step", ge=1, le=MAX_BATCH))
    grad_accum: int = field(default=1, metadata=doc("gradient accumulation steps", ge=1, le=MAX_BATCH))
    warmup_ratio: float = field(default=0.03, metadata=doc("linear warm-up fraction", ge=0, lt=1))
    max_length: int = field(default=512, metadata=doc("longer examples are dropped", ge=1, le=MAX_TOKENS))
    lora_r: int = field(default=16, metadata=doc("LoRA rank", ge=1, le=MAX_LORA_RANK))
    lora_alpha: int = field(default=32, metadata=doc("LoRA scaling numerator", ge=1, le=16 * MAX_LORA_RANK))
    eval_batch_size: int = field(default=16, metadata=doc("questions per forward pass when evaluating",
                                                          ge=1, le=MAX_BATCH))
    bins: int = field(default=10, metadata=doc("ECE bins", ge=1, le=MAX_BINS))
    bootstrap: int = field(default=1000, metadata=doc("bootstrap replicates for ECE intervals", ge=0, le=MAX_BOOTSTRAP))
    seed: int = field(default=0, metadata=doc("seed for carving, data order and initialisation", **SEED))
    device: str = field(default="auto", metadata=doc("auto, cpu, cuda", **DEVICE))
    dtype: Dtype = field(default="auto", metadata=doc("auto (bf16 on GPU, fp32 on CPU)"))

    def __post_init__(self) -> None:
        if not self.students:
            raise ValueError(f"students: must name at least one of {STUDENTS}")
        if self.kd_renormalise and self.kd_tail:
            raise ValueError("`kd_renormalise` and `kd_tail` exclude each other: after renormalising over the "
                             "top-k there is no mass left for a tail bucket")
        self.template = self.train_config(self.teacher, self.teacher_method).template

    def train_config(self, model: str, method: Method, epochs: Optional[float] = None) -> TrainConfig:
        """The fine-tuning settings shared by the teacher and every student."""
        return TrainConfig(
            model=model, method=method, lora_r=self.lora_r, lora_alpha=self.lora_alpha, dataset=self.dataset,
            data_files=self.data_files, split=self.train_split, limit=self.train_limit, val_split=self.val_split,
            val_limit=self.val_limit, template=self.template, completion_only=self.completion_only,
            max_length=self.max_length, epochs=epochs or self.epochs, learning_rate=self.learning_rate,
            batch_size=self.batch_size, grad_accum=self.grad_accum, warmup_ratio=self.warmup_ratio,
            seed=self.seed, device=self.device, dtype=self.dtype, bins=self.bins,
        )
