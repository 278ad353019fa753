"""The sections job configs are composed of, each field declared once (TRL's ``GKDConfig(SFTConfig)``).

A job config inherits the sections it needs and adds its own fields; a section's field that needs
another default in one config is re-declared with :func:`lab.core.config.redeclare`, keeping its
bounds. The YAML stays flat (``dataset:``, ``bins:`` …), so a section is a vocabulary shared by
every kind rather than a level of nesting.

    ModelSection    model                       the model a job loads
    AdaptedModel    + adapter                   ... with a LoRA adapter on top
    Dataset         dataset, data_files, subject which questions
    DataSection     + split, limit              ... and which part of them
    PromptSection   template                    how a question becomes a prompt
    HarnessSection  num_fewshot, fewshot_split, lm_eval_include ... few-shot examples; a folder of lm-eval task YAMLs
    EvalSection     bins, bin_edges, bootstrap  how calibration is measured
    PipelineEvalSection + eval_batch_size       ... of every model a pipeline (FIRST, CFT) makes
    DeviceSection   device, dtype               where a model runs
    PlacementSection device_map, max_memory, offload_folder  ... or its layers, when it is larger than a GPU
    RunSection      + seed                      ... reproducibly

Dataclass fields are collected from the last base to the first, so a config lists its sections
last-first to show them in reading order (model, data, prompt, evaluation, device).

The defaults every kind starts from are the block below: the bundled model on the bundled
OpenBookQA sample (an evaluation's own default is ARC-Easy, :mod:`lab.kinds.evaluate.config`), so that each kind's defaults run on a fresh machine with no network and no
dataset files (``lab.data.samples``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from lab.calibration.checks import BinEdges
from lab.core.config import doc, redeclare
from lab.core.limits import DEVICE, MAX_BATCH, MAX_BINS, MAX_BOOTSTRAP, MAX_ROWS, SEED, SPLIT, SUBJECT, Dtype
from lab.core.errors import DataError
from lab.data import DATASETS, harness, with_sample
from lab.data.split import canonical_split, parse_split
from lab.data.templates import TEMPLATES
from lab.models import placement

BUNDLED = "bundled"  # the model (lab.models.loading) and the dataset samples (lab.data.samples) that ship with the lab

# ---------------------------------------------------------------- defaults
DEFAULT_MODEL = BUNDLED  # SmolLM2-135M-Instruct, shipped with the lab
DEFAULT_DATASET = "obqa"  # OpenBookQA: its bundled sample has train, validation and test splits
DEFAULT_DATA_FILES = (BUNDLED,)  # the dataset's bundled sample (lab/data/bundled/)
DEFAULT_SPLIT = "test"
DATA_FILES_HELP = ("local files, folders or globs: PATH or SPLIT=PATH; 'bundled': the sample that ships with the "
                   f"lab, every split of it ({', '.join(with_sample())}); none: the hub copy")


@dataclass
class ModelSection:
    model: str = field(default=DEFAULT_MODEL, metadata=doc(
        "'bundled', 'scratch' (a small random-weight model for the synthetic task), a local directory, a hub id, "
        "or run:<id>: the weights a finetune, sft or dpo job of this store left (the job waits for it)",
        role="model"))


@dataclass
class AdaptedModel(ModelSection):
    # A LoRA run named by run:<id> brings its adapter, which goes here.
    model: str = redeclare(ModelSection, "model", adapter_field="adapter")
    adapter: Optional[str] = field(default=None, metadata=doc("PEFT (LoRA) adapter directory", role="dir"))


@dataclass
class Dataset:
    dataset: str = field(default=DEFAULT_DATASET, metadata=doc("registered dataset name", role="name",
                                                               registry=DATASETS))
    data_files: list[str] = field(default_factory=lambda: list(DEFAULT_DATA_FILES), metadata=doc(
        DATA_FILES_HELP, role="data_files"))
    subject: Optional[str] = field(default=None, metadata=doc("MMLU subject (None: all)", **SUBJECT))


@dataclass
class DataSection(Dataset):
    split: str = field(default=DEFAULT_SPLIT, metadata=doc("split name, or SOURCE:PART for a seeded carve", **SPLIT))
    limit: Optional[int] = field(default=None, metadata=doc(
        "first N questions only (a token task, clm / facts: N documents; None: all)", ge=1, le=MAX_ROWS))


@dataclass
class PromptSection:
    template: Optional[str] = field(default=None, metadata=doc("prompt template (None: the dataset's default)",
                                                               role="name", registry=TEMPLATES))


@dataclass
class HarnessSection:
    num_fewshot: Optional[int] = field(default=None, metadata=doc(
        "solved examples before each question. An lm-eval task (dataset lm-eval:<task>) draws them as lm_eval does "
        "(None: the task's own num_fewshot, as lm_eval without --num_fewshot); a lab dataset draws them from "
        "fewshot_split with the seed, the same ones before every question (None or 0: none)",
        ge=0, le=harness.MAX_FEWSHOT))
    fewshot_split: Optional[str] = field(default=None, metadata=doc(
        "a lab dataset's split the few-shot examples come from, never the scored one: a name, or SOURCE:PART, a "
        "part of the seeded carve the scored split is another part of (None: dev for MMLU, its 5 per subject; "
        "train for the others)", **SPLIT))
    lm_eval_include: Optional[str] = field(default=None, metadata=doc(
        "a folder of your own lm-eval task YAMLs, as lm_eval --include_path (relative data files are read from it). "
        "It is code: a !function runs Python from it, so a server reads it only from folders it trusts "
        "(app.py --trust-tasks DIR)", role="tasks"))


@dataclass
class EvalSection:
    bins: int = field(default=10, metadata=doc("equal-width bins for ECE", ge=1, le=MAX_BINS))
    bin_edges: BinEdges = field(default="right", metadata=doc(
        "which end of a bin is closed: right, Guo et al.'s (m-1)/M < c <= m/M as both papers; "
        "left, torchmetrics' [m/M, (m+1)/M)"))
    bootstrap: int = field(default=1000, metadata=doc("bootstrap replicates for the ECE interval (0: none)",
                                                      ge=0, le=MAX_BOOTSTRAP))


@dataclass
class PipelineEvalSection(EvalSection):
    eval_batch_size: int = field(default=16, metadata=doc("questions per forward pass when evaluating",
                                                          ge=1, le=MAX_BATCH))


@dataclass
class DeviceSection:
    device: str = field(default="auto", metadata=doc("auto, cpu, cuda, cuda:N", **DEVICE))
    dtype: Dtype = field(default="auto", metadata=doc("auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"))


@dataclass
class PlacementSection:
    """Where the layers of a model too large for one GPU go (accelerate's big-model inference); the kinds that
    score a model take it, those that train one refuse it (:data:`lab.core.config.TRAINING_INSTEAD`)."""

    device_map: placement.DeviceMap = field(default="none", metadata=doc(
        "none: the whole model on `device`; auto: its layers spread over the job's GPUs, then the CPU, then "
        "offload_folder, each run in turn on the first GPU (the CPU without one): a model larger than one GPU, scored "
        "exactly as if it fitted, more slowly. With auto, device stays auto (or cpu: the CPU and the folder only)"))
    max_memory: dict[str, str] = field(default_factory=dict, metadata=doc(
        "device_map auto: the most each device may hold, a GPU by its index as the job sees it ('0', '1' …) or "
        "'cpu', each a size such as 20GiB, 500MiB or 20GB; a device left out gets what it has free (empty: every "
        "one). The first GPU's (the CPU's without GPUs) must hold the model's largest layer",
        key_pattern=placement.KEY_PATTERN, max_items=placement.MAX_DEVICES, max_len=placement.MAX_SIZE_TEXT))
    offload_folder: str = field(default="offload", metadata=doc(
        "device_map auto: a folder inside the run directory (a relative name) for the layers that fit neither the "
        "GPUs nor the CPU. It holds a copy of those weights, so it is deleted when the run ends, done or failed",
        role="name", pattern=placement.FOLDER_PATTERN, max_len=placement.MAX_FOLDER))

    def check_placement(self, models: Iterable[str]) -> None:
        """What can be refused from the config alone, ``models`` those it loads (the job's GPU count is the
        store's to check: :func:`lab.models.placement.check_job_gpus`)."""
        placement.check(self.device_map, self.max_memory, self.offload_folder, getattr(self, "device", "auto"),
                        getattr(self, "dtype", "auto"), models)


@dataclass
class RunSection(DeviceSection):
    seed: int = field(default=0, metadata=doc(
        "seed of split carving, sampling, data order, initialisation and the bootstrap", **SEED))


def bundled_split_problem(dataset: str, split: str, data_files: list[str]) -> Optional[str]:
    """Why ``split`` cannot be read from ``dataset``'s bundled sample (``data_files: [bundled]``), or None: the
    sample holds the split (or the one a ``SOURCE:PART`` carves from), or the files are the user's own (their
    splits are known once read). Said at submit; the loader would say it only once the job started."""
    if data_files != [BUNDLED] or dataset not in DATASETS or not DATASETS.get(dataset).bundled:
        return None  # a dataset without a sample: the path checks refuse 'bundled' for it
    spec = DATASETS.get(dataset)
    try:
        source = parse_split(split, spec.own_splits).source
    except DataError as e:
        return f"split: {e}"
    has = [canonical_split(name, spec.own_splits) for name, _ in spec.bundled]
    if source in has:
        return None
    carve_from = "validation" if "validation" in has else has[0]
    return (f"split: the bundled sample of {dataset} has no {source!r} split; it has {', '.join(has)}. Ask for one "
            f"of those, or carve one from it, e.g. '{carve_from}:{source}'")
