"""``TrainConfig``: one supervised fine-tuning run (the ``finetune`` job kind, and each model the
FIRST and CFT pipelines train). Defaults are the FIRST paper's recipe (REFERENCE.md §2.1): 3
epochs, lr 2e-5, AdamW β = (0.9, 0.999), ε = 1e-6, cosine schedule with 3 % warm-up.

``objective`` picks the trainer: ``sft`` (cross-entropy; with ``completion_only`` this is CFT),
``label_smoothing`` (smoothed targets over the option letters) or ``rcft`` (cross-entropy plus
``ece_lambda`` × the EM ECE regulariser, REFERENCE.md §3).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from lab.config import ConfigMixin, doc
from lab.data import DATASETS
from lab.templates import default_template, get_template

Method = Literal["full", "lora", "qlora"]
METHODS = ("full", "lora", "qlora")
Objective = Literal["sft", "label_smoothing", "rcft"]
OBJECTIVES = ("sft", "label_smoothing", "rcft")


@dataclass
class TrainConfig(ConfigMixin):
    model: str = field(default="bundled", metadata=doc("'bundled', a local directory or a hub id"))
    method: Method = field(default="full", metadata=doc("full-parameter, LoRA, or QLoRA (LoRA on 4-bit weights, CUDA)"))
    lora_r: int = field(default=16, metadata=doc("LoRA rank"))
    lora_alpha: int = field(default=32, metadata=doc("LoRA scaling numerator"))
    lora_dropout: float = field(default=0.05, metadata=doc("dropout on the LoRA path"))
    dataset: str = field(default="csqa", metadata=doc("registered dataset name"))
    data_files: list[str] = field(default_factory=list, metadata=doc("local files: PATH or SPLIT=PATH"))
    split: str = field(default="train", metadata=doc("training split, or SOURCE:PART"))
    limit: Optional[int] = field(default=None, metadata=doc("first N training examples"))
    val_split: Optional[str] = field(default="validation", metadata=doc("split for per-epoch ECE/accuracy (None: skip)"))
    val_data_files: list[str] = field(default_factory=list, metadata=doc("files for the validation split"))
    val_limit: Optional[int] = field(default=200, metadata=doc("validation questions per epoch"))
    template: Optional[str] = field(default=None, metadata=doc("letter template; default depends on dataset"))
    completion_only: bool = field(default=True, metadata=doc("loss on the answer only (else prompt + answer)"))
    max_length: int = field(default=512, metadata=doc("longer examples are dropped"))
    epochs: float = field(default=3, metadata=doc("passes over the training data"))
    learning_rate: float = field(default=2e-5, metadata=doc("peak learning rate"))
    batch_size: int = field(default=8, metadata=doc("examples per device per step"))
    grad_accum: int = field(default=1, metadata=doc("gradient accumulation steps"))
    warmup_ratio: float = field(default=0.03, metadata=doc("linear warm-up, fraction of all steps"))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW weight decay"))
    adam_beta1: float = field(default=0.9, metadata=doc("AdamW β1"))
    adam_beta2: float = field(default=0.999, metadata=doc("AdamW β2"))
    adam_epsilon: float = field(default=1e-6, metadata=doc("AdamW ε"))
    lr_scheduler: str = field(default="cosine", metadata=doc("transformers scheduler name"))
    seed: int = field(default=0, metadata=doc("seed for data order, LoRA init and split carving"))
    device: str = field(default="auto", metadata=doc("auto, cpu, cuda"))
    dtype: str = field(default="auto", metadata=doc("auto (bf16 on GPU, fp32 on CPU), float32, bfloat16"))
    bins: int = field(default=10, metadata=doc("ECE bins for validation"))
    eval_steps: Optional[int] = field(default=None, metadata=doc("also validate every N optimiser steps (None: per epoch only)"))
    objective: Objective = field(default="sft", metadata=doc("sft, label_smoothing (over the option letters) or rcft"))
    label_smoothing: float = field(default=0.1, metadata=doc("ε of label_smoothing: mass spread over the options"))
    ece_lambda: float = field(default=1.0, metadata=doc("rcft: weight λ of the ECE regulariser"))
    ece_bins: int = field(default=10, metadata=doc("rcft: confidence bins of the E-step"))
    estep_steps: Optional[int] = field(default=None, metadata=doc("rcft: redo the E-step every N steps (None: every epoch)"))

    def __post_init__(self) -> None:
        DATASETS.get(self.dataset)
        if self.method not in METHODS:
            raise ValueError(f"Expected `method` to be one of {METHODS}, but got {self.method!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"Expected `objective` to be one of {OBJECTIVES}, but got {self.objective!r}")
        for name in ("batch_size", "grad_accum", "max_length", "lora_r", "bins", "ece_bins"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Expected `{name}` to be an integer larger than 0, but got {getattr(self, name)!r}")
        for name in ("epochs", "learning_rate"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) <= 0:
                raise ValueError(f"Expected `{name}` to be a positive number, but got {getattr(self, name)!r}")
        for name in ("eval_steps", "estep_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"Expected `{name}` to be a positive integer or unset, but got {value!r}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"Expected `label_smoothing` in [0, 1), but got {self.label_smoothing}")
        if not isinstance(self.ece_lambda, (int, float)) or self.ece_lambda < 0:
            raise ValueError(f"Expected `ece_lambda` to be 0 or more, but got {self.ece_lambda!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"Expected `warmup_ratio` in [0, 1), but got {self.warmup_ratio}")
        if self.template is None:
            self.template = default_template(self.dataset, "letter")
        if get_template(self.template).kind != "letter":
            raise ValueError(f"Expected a letter template for training, but {self.template!r} is a cloze template")
