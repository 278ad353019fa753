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
from lab.limits import (DEVICE, MAX_BATCH, MAX_BINS, MAX_EPOCHS, MAX_LORA_RANK, MAX_ROWS, MAX_TOKENS, SEED, SPLIT,
                        Dtype)
from lab.templates import TEMPLATES, default_template, get_template

Method = Literal["full", "lora", "qlora"]
Objective = Literal["sft", "label_smoothing", "rcft"]
# The transformers schedulers that need no extra arguments (``lr_scheduler_kwargs``).
Scheduler = Literal["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                    "inverse_sqrt"]


@dataclass
class TrainConfig(ConfigMixin):
    model: str = field(default="bundled", metadata=doc("'bundled', a local directory or a hub id", role="model"))
    method: Method = field(default="full", metadata=doc("full-parameter, LoRA, or QLoRA (LoRA on 4-bit weights, CUDA)"))
    lora_r: int = field(default=16, metadata=doc("LoRA rank", ge=1, le=MAX_LORA_RANK))
    lora_alpha: int = field(default=32, metadata=doc("LoRA scaling numerator", ge=1, le=16 * MAX_LORA_RANK))
    lora_dropout: float = field(default=0.05, metadata=doc("dropout on the LoRA path", ge=0, lt=1))
    dataset: str = field(default="csqa", metadata=doc("registered dataset name", role="name", registry=DATASETS))
    data_files: list[str] = field(default_factory=list, metadata=doc("local files: PATH or SPLIT=PATH",
                                                                     role="data_files"))
    split: str = field(default="train", metadata=doc("training split, or SOURCE:PART", **SPLIT))
    limit: Optional[int] = field(default=None, metadata=doc("first N training examples", ge=1, le=MAX_ROWS))
    val_split: Optional[str] = field(default="validation", metadata=doc(
        "split for per-epoch ECE/accuracy (None: skip)", **SPLIT))
    val_data_files: list[str] = field(default_factory=list, metadata=doc("files for the validation split",
                                                                         role="data_files"))
    val_limit: Optional[int] = field(default=200, metadata=doc("validation questions per epoch", ge=1, le=MAX_ROWS))
    template: Optional[str] = field(default=None, metadata=doc("letter template; default depends on dataset",
                                                               role="name", registry=TEMPLATES))
    completion_only: bool = field(default=True, metadata=doc("loss on the answer only (else prompt + answer)"))
    max_length: int = field(default=512, metadata=doc("longer examples are dropped", ge=1, le=MAX_TOKENS))
    epochs: float = field(default=3, metadata=doc("passes over the training data", gt=0, le=MAX_EPOCHS))
    learning_rate: float = field(default=2e-5, metadata=doc("peak learning rate", gt=0, le=10))
    batch_size: int = field(default=8, metadata=doc("examples per device per step", ge=1, le=MAX_BATCH))
    grad_accum: int = field(default=1, metadata=doc("gradient accumulation steps", ge=1, le=MAX_BATCH))
    warmup_ratio: float = field(default=0.03, metadata=doc("linear warm-up, fraction of all steps", ge=0, lt=1))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW weight decay", ge=0, le=10))
    adam_beta1: float = field(default=0.9, metadata=doc("AdamW β1", ge=0, lt=1))
    adam_beta2: float = field(default=0.999, metadata=doc("AdamW β2", ge=0, lt=1))
    adam_epsilon: float = field(default=1e-6, metadata=doc("AdamW ε", gt=0, le=1))
    lr_scheduler: Scheduler = field(default="cosine", metadata=doc("transformers scheduler name"))
    seed: int = field(default=0, metadata=doc("seed for data order, LoRA init and split carving", **SEED))
    device: str = field(default="auto", metadata=doc("auto, cpu, cuda", **DEVICE))
    dtype: Dtype = field(default="auto", metadata=doc("auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"))
    bins: int = field(default=10, metadata=doc("ECE bins for validation", ge=1, le=MAX_BINS))
    eval_steps: Optional[int] = field(default=None, metadata=doc(
        "also validate every N optimiser steps (None: per epoch only)", ge=1, le=MAX_ROWS))
    objective: Objective = field(default="sft", metadata=doc("sft, label_smoothing (over the option letters) or rcft"))
    label_smoothing: float = field(default=0.1, metadata=doc("ε of label_smoothing: mass spread over the options",
                                                             ge=0, lt=1))
    ece_lambda: float = field(default=1.0, metadata=doc("rcft: weight λ of the ECE regulariser", ge=0, le=1000))
    ece_bins: int = field(default=10, metadata=doc("rcft: confidence bins of the E-step", ge=1, le=MAX_BINS))
    estep_steps: Optional[int] = field(default=None, metadata=doc(
        "rcft: redo the E-step every N steps (None: every epoch)", ge=1, le=MAX_ROWS))

    def __post_init__(self) -> None:
        if self.template is None:
            self.template = default_template(self.dataset, "letter")
        if get_template(self.template).kind != "letter":
            raise ValueError(f"template: training needs a letter template, but {self.template!r} is a cloze template")
