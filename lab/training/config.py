"""``TrainConfig``: one supervised fine-tuning run (the ``finetune`` job kind's config,
:mod:`lab.kinds.finetune`, and each model the FIRST and CFT pipelines train). Defaults are the FIRST paper's recipe (REFERENCE.md §2.1): 3
epochs, lr 2e-5, AdamW β = (0.9, 0.999), ε = 1e-6, cosine schedule with 3 % warm-up — on the first
64 training examples of the bundled OpenBookQA sample, so that the defaults finish in minutes on a
CPU (``limit: null`` trains on all; ``examples/finetune-paper.yaml`` is the paper's run).

``objective`` picks the trainer: ``sft`` (cross-entropy; with ``completion_only`` this is CFT),
``label_smoothing`` (smoothed targets over the option letters) or ``rcft`` (cross-entropy plus
``ece_lambda`` × the EM ECE regulariser, REFERENCE.md §3).

λ's scale (``lambda_scale``): ``paper`` is ``L_SFT + λ·L_ECE`` with L_ECE the batch mean of the
squared errors (the paper's equations); ``released`` is the authors' code, ``(1 − λ)·L_SFT +
λ·10⁻³·Σ_m (1/N_m) Σ_{i ∈ batch ∩ B_m} ‖p_i − t_i‖²``, for which λ ≤ 1 and λ = 1 is "ECE only".
The paper's Table 4 λ (0.4, 1, 1.8) go above 1, so they are not the released code's λ: the two
scales differ by the factor ``10⁻³·B/N_m`` and the (1 − λ) on the SFT term.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lab.calibration.checks import BinEdges
from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.limits import (MAX_BATCH, MAX_BINS, MAX_EPOCHS, MAX_LORA_RANK, MAX_LORA_TARGETS, MAX_ROWS, MAX_TOKENS,
                             MODULE_NAME, SPLIT)
from lab.data.templates import default_template, get_template
from lab.jobkit.sections import DataSection, EvalSection, ModelSection, PromptSection, RunSection
from lab.models.weights import ALL_LINEAR

Tuning = Literal["full", "lora", "qlora"]  # which weights train
Sharding = Literal["none", "fsdp"]  # each rank a whole copy (DDP), or the weights, gradients and AdamW state split
Loss = Literal["sft", "label_smoothing", "rcft"]  # what they train on: picks the trainer
Tracker = Literal["none", "tensorboard", "wandb", "mlflow", "trackio"]  # transformers' report_to names we offer
# The package each tracker needs; a tracker that is not installed is refused when the config is read.
TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",),
                    "trackio": ("trackio",)}
LambdaScale = Literal["paper", "released"]  # how RCFT's λ weighs its two terms (lab.training.cft_losses.rcft_loss)
CPU_TRAIN_LIMIT = 64  # the finetune default's training examples (the paper presets set their own)
CPU_VAL_LIMIT = 100  # ... and validation questions per epoch
# Checkpoints a run keeps (transformers' save_total_limit). One is enough to resume from: transformers
# deletes the older one only once the new one is whole (trainer_state.json written), so a kill
# mid-save still leaves it. Pre-flight counts the disk they take with this number.
KEPT_CHECKPOINTS = 1
# The transformers schedulers that need no extra arguments (``lr_scheduler_kwargs``).
Scheduler = Literal["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                    "inverse_sqrt"]


# Set to 1 by the operator (``app.py --trackers-online``, or in the environment of ``python -m jobs``) to let
# trackers send users' runs online (W&B's account, an MLflow server); unset, they write only into the run's folder
# (:func:`lab.training.trainer.tracker_env`). The workers inherit it from the scheduler.
TRACKERS_ONLINE_ENV = "CALIBRATION_LAB_TRACKERS_ONLINE"


def trackers_online() -> bool:
    """Whether the operator let trackers send users' runs online (:data:`TRACKERS_ONLINE_ENV` set to 1)."""
    return os.environ.get(TRACKERS_ONLINE_ENV, "").strip().lower() in ("1", "true", "yes")


def check_tracker(report_to: str) -> None:
    """A tracker that is not installed is refused when the config is read, not after the model loaded."""
    if report_to != "none" and not any(importlib.util.find_spec(p) for p in TRACKER_PACKAGES[report_to]):
        raise ValueError(f"report_to: {report_to} is not installed on this machine "
                         f"(pip install {TRACKER_PACKAGES[report_to][0]}), or pick none")


def check_lora_targets(targets: list[str]) -> None:
    """``all-linear`` means every layer: listed beside module names it would make one of them meaningless."""
    if ALL_LINEAR in targets and len(targets) > 1:
        raise ValueError(f"lora_targets: {ALL_LINEAR} already adapts every linear layer; list it alone, or "
                         f"list module names without it, got {targets}")


@dataclass
class TrainConfig(ConfigMixin, RunSection, PromptSection, DataSection, ModelSection):
    model: str = redeclare(ModelSection, "model", trained_by="method")
    split: str = redeclare(DataSection, "split", default="train", help="training split, or SOURCE:PART")
    # A CPU trains the bundled model at well under one example a second: the defaults train minutes, not hours.
    limit: Optional[int] = redeclare(DataSection, "limit", default=CPU_TRAIN_LIMIT, help=(
        f"first N training examples (default {CPU_TRAIN_LIMIT}: minutes on a CPU; None: all)"))
    template: Optional[str] = redeclare(PromptSection, "template", help="letter template (None: the dataset's default)")
    method: Tuning = field(default="full", metadata=doc("full-parameter, LoRA, or QLoRA (LoRA on 4-bit weights, CUDA)"))
    lora_r: int = field(default=16, metadata=doc("LoRA rank", ge=1, le=MAX_LORA_RANK))
    lora_alpha: int = field(default=32, metadata=doc("LoRA scaling numerator", ge=1, le=16 * MAX_LORA_RANK))
    lora_dropout: float = field(default=0.05, metadata=doc("dropout on the LoRA path", ge=0, lt=1))
    lora_targets: list[str] = field(default_factory=lambda: [ALL_LINEAR], metadata=doc(
        f"the linear layers LoRA adapts: {ALL_LINEAR} (every one but the output layer), or module names, one a "
        "line on the form (q_proj and v_proj: the alignment-calibration paper's)", role="name", pattern=MODULE_NAME,
        min_items=1, max_items=MAX_LORA_TARGETS))
    val_split: Optional[str] = field(default="validation", metadata=doc(
        "split for per-epoch ECE/accuracy (None: skip)", **SPLIT))
    val_data_files: list[str] = field(default_factory=list, metadata=doc("files for the validation split",
                                                                         role="data_files"))
    val_limit: Optional[int] = field(default=CPU_VAL_LIMIT, metadata=doc("validation questions per epoch (None: all)",
                                                                         ge=1, le=MAX_ROWS))
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
    bins: int = field(default=10, metadata=doc("ECE bins for validation", ge=1, le=MAX_BINS))
    bin_edges: BinEdges = redeclare(EvalSection, "bin_edges")
    eval_steps: Optional[int] = field(default=None, metadata=doc(
        "also validate every N optimiser steps (None: per epoch only)", ge=1, le=MAX_ROWS))
    save_steps: Optional[int] = field(default=None, metadata=doc(
        "also checkpoint every N optimiser steps, for resuming a killed run mid-epoch (None: per epoch)",
        ge=1, le=MAX_ROWS))
    save_optimizer: bool = field(default=True, metadata=doc(
        "checkpoints keep AdamW's state (8 bytes a trained parameter: a full fine-tune's checkpoint is 12 "
        "bytes a parameter, not 4) so that a resumed run continues exactly; off: weights only, and a resumed "
        "run restarts the optimizer"))
    snapshots: bool = field(default=False, metadata=doc(
        "also keep the weights of every save (each epoch, or every save_steps) in snapshots/step-N/, weights "
        "only, for a series over training steps (a full model's snapshot is 4 bytes a parameter)"))
    report_to: Tracker = field(default="none", metadata=doc(
        "experiment tracker for loss and validation ECE / accuracy / NLL (installed ones: "
        "tensorboard writes into the stage's tensorboard/ folder)"))
    sharding: Sharding = field(default="none", metadata=doc(
        "none: each GPU holds the whole model, its gradients and AdamW's state (DDP); fsdp: they are split across "
        "the job's GPUs (accelerate's FSDP2, full shard, one unit per decoder layer), so a model too large for one "
        "GPU trains on several. Needs GPUs"))
    fsdp_offload: bool = field(default=False, metadata=doc(
        "fsdp: keep the parameters, gradients and AdamW's state in host memory, moving each layer to the GPU for "
        "its forward and backward (fits a larger model, steps slower)"))
    objective: Loss = field(default="sft", metadata=doc("sft, label_smoothing (over the option letters) or rcft"))
    label_smoothing: float = field(default=0.1, metadata=doc("ε of label_smoothing: mass spread over the options",
                                                             ge=0, lt=1))
    ece_lambda: float = field(default=1.0, metadata=doc("rcft: weight λ of the ECE regulariser", ge=0, le=1000))
    ece_bins: int = field(default=10, metadata=doc("rcft: confidence bins of the E-step", ge=1, le=MAX_BINS))
    lambda_scale: LambdaScale = field(default="paper", metadata=doc(
        "rcft: paper, L_SFT + λ·L_ECE (batch-mean MSE), SFT a mean over every prompt + answer token and L_ECE "
        "over questions at the answer, so λ weighs a question like λ × its token count of cross-entropy (45 tokens "
        "on the controlled task: as hard as SFT at λ ≈ 0.1); released, the authors' code: "
        "(1-λ)·L_SFT + λ·1e-3·L_ECE normalised per bin, λ <= 1 (1: ECE only)"))
    estep_steps: Optional[int] = field(default=None, metadata=doc(
        "rcft: redo the E-step every N steps (None: every epoch)", ge=1, le=MAX_ROWS))

    def __post_init__(self) -> None:
        check_tracker(self.report_to)
        check_lora_targets(self.lora_targets)
        if self.template is None:
            self.template = default_template(self.dataset, "letter")
        if self.lambda_scale == "released" and self.ece_lambda > 1:
            raise ValueError(f"ece_lambda: the released code's scale weighs L_SFT by (1 - λ), so λ must be at most 1 "
                             f"(1 is 'ECE only'), got {self.ece_lambda}; use lambda_scale: paper for larger λ")
        if get_template(self.template).kind != "letter":
            raise ValueError(f"template: training needs a letter template, but {self.template!r} is a cloze template")


# What a pipeline (FIRST, CFT) sets for each model it trains: which model, on which data, where.
# Its `training:` section takes every other field, in a finetune job's vocabulary.
SET_PER_ROW = ("model", "dataset", "data_files", "subject", "split", "limit", "val_split", "val_data_files",
               "val_limit", "template", "seed", "device", "dtype", "bins", "bin_edges")


def training_section(help: str, set_by_protocol: tuple[str, ...], reason: str) -> dict[str, Any]:
    """The declaration of a pipeline's ``training:`` mapping: TrainConfig's fields but those it sets."""
    return doc(help, entries=TrainConfig, exclude=SET_PER_ROW + set_by_protocol, exclude_reason=reason)
