"""``FirstConfig``: the whole FIRST pipeline as one job (REFERENCE.md §2).

Teacher fine-tune (or an existing teacher) → top-k extraction → temperature sweep on validation
questions → students (``finetune``, ``distill``, ``distill_ls``, ``first``) → evaluation of the
teacher and every student in-domain and on the out-of-domain datasets named in ``ood``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lab.config import ConfigMixin, doc
from lab.data import DATASETS
from lab.train.config import Method, TrainConfig

STUDENTS = ("finetune", "distill", "distill_ls", "first")


@dataclass
class FirstConfig(ConfigMixin):
    teacher: str = field(default="bundled", metadata=doc("teacher base model: 'bundled', a directory or a hub id"))
    teacher_adapter: Optional[str] = field(default=None, metadata=doc("an existing teacher LoRA adapter"))
    finetune_teacher: bool = field(default=True, metadata=doc("fine-tune the teacher first (else use it as is)"))
    teacher_method: Method = field(default="full", metadata=doc("teacher fine-tuning: full, lora or qlora"))
    student: str = field(default="bundled", metadata=doc("student base model (same tokenizer as the teacher)"))
    student_method: Method = field(default="full", metadata=doc("student training: full, lora or qlora"))
    students: list[str] = field(default_factory=lambda: list(STUDENTS), metadata=doc(f"any of {STUDENTS}"))
    dataset: str = field(default="csqa", metadata=doc("in-domain dataset"))
    data_files: list[str] = field(default_factory=list, metadata=doc("its local files: PATH or SPLIT=PATH"))
    train_split: str = field(default="train", metadata=doc("training split (or SOURCE:PART)"))
    val_split: str = field(default="validation", metadata=doc("split for the temperature sweep and per-epoch ECE"))
    test_split: str = field(default="test", metadata=doc("in-domain evaluation split"))
    train_limit: Optional[int] = field(default=None, metadata=doc("first N training examples"))
    val_limit: Optional[int] = field(default=None, metadata=doc("first N validation questions"))
    test_limit: Optional[int] = field(default=None, metadata=doc("first N test questions"))
    ood: list[dict[str, Any]] = field(default_factory=list, metadata=doc(
        "out-of-domain evaluations: [{dataset, data_files, split, limit}]"))
    template: Optional[str] = field(default=None, metadata=doc("letter template; default depends on dataset"))
    k: int = field(default=5, metadata=doc("teacher tokens kept per position"))
    logprob_dtype: str = field(default="float16", metadata=doc("stored log-prob width: float16 or float32"))
    ts_form: Literal["paper", "logit"] = field(default="paper", metadata=doc("paper: softmax(P/c); logit: P^(1/T)"))
    ts_objective: Literal["ece", "nll"] = field(default="ece", metadata=doc("what the sweep minimises"))
    ls_delta: float = field(default=0.1, metadata=doc("label smoothing δ for distill_ls"))
    direct_delta: float = field(default=1e-6, metadata=doc("δ of direct distillation's normalisation"))
    kd_renormalise: bool = field(default=False, metadata=doc("renormalise the student over the teacher's top-k"))
    kd_tail: bool = field(default=False, metadata=doc("add a 'rest of the vocabulary' bucket to the KL"))
    completion_only: bool = field(default=True, metadata=doc("supervise the answer only"))
    epochs: float = field(default=3, metadata=doc("epochs for every student"))
    teacher_epochs: Optional[float] = field(default=None, metadata=doc("epochs for the teacher (default: epochs)"))
    learning_rate: float = field(default=2e-5, metadata=doc("peak learning rate"))
    batch_size: int = field(default=8, metadata=doc("examples per device per step"))
    grad_accum: int = field(default=1, metadata=doc("gradient accumulation steps"))
    warmup_ratio: float = field(default=0.03, metadata=doc("linear warm-up fraction"))
    max_length: int = field(default=512, metadata=doc("longer examples are dropped"))
    lora_r: int = field(default=16, metadata=doc("LoRA rank"))
    lora_alpha: int = field(default=32, metadata=doc("LoRA scaling numerator"))
    eval_batch_size: int = field(default=16, metadata=doc("questions per forward pass when evaluating"))
    bins: int = field(default=10, metadata=doc("ECE bins"))
    bootstrap: int = field(default=1000, metadata=doc("bootstrap replicates for ECE intervals"))
    seed: int = field(default=0, metadata=doc("seed for carving, data order and initialisation"))
    device: str = field(default="auto", metadata=doc("auto, cpu, cuda"))
    dtype: str = field(default="auto", metadata=doc("auto (bf16 on GPU, fp32 on CPU)"))

    def __post_init__(self) -> None:
        unknown = sorted(set(self.students) - set(STUDENTS))
        if unknown or not self.students:
            raise ValueError(f"Expected `students` to be a non-empty list of {STUDENTS}, but got {self.students}")
        if self.kd_renormalise and self.kd_tail:
            raise ValueError("`kd_renormalise` and `kd_tail` exclude each other: after renormalising over the "
                             "top-k there is no mass left for a tail bucket")
        if self.k < 1:
            raise ValueError(f"Expected `k` to be an integer larger than 0, but got {self.k}")
        for entry in self.ood:
            if not isinstance(entry, dict) or "dataset" not in entry:
                raise ValueError(f"Expected each `ood` entry to be a mapping with `dataset`, but got {entry!r}")
            DATASETS.get(entry["dataset"])
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
