"""Before a job is queued or starts: are there the GPUs it asks for, and will its models fit?

:func:`check_gpu_request` refuses, at submit, more GPUs than this machine has: the scheduler
(:mod:`jobs.scheduler`) hands out ``jobs.launch.visible_gpus()`` and fails a job asking for more the
moment it looks at it, so a form saying "queued" would only be a failure postponed.

Will the model fit? Said before the wait, not after, per GPU (data-parallel ranks each hold a
full copy): parameters are counted from the safetensors headers (exact, and readable without torch
or loading any weights), and what a job holds per parameter depends on what it does with them:

- inference: the weights, plus 20 % for activations and the KV cache;
- training: :func:`lab.training.estimates.training_memory`, the trainer's own code path counted term by
  term — fp32 master weights, gradients and AdamW moments for a full fine-tune under bf16 autocast,
  the frozen base in bf16 or 4-bit plus the adapters (their exact size, from the weight shapes and
  ``lora_r``) for LoRA/QLoRA, activations and the fp32 logits for batches of ``batch_size`` ×
  ``max_length`` tokens (the longest a batch can be; the worker reports the estimate again at the
  longest example it really has) — plus :data:`CUDA_CONTEXT`. The kinds that train with TRL's
  trainers (:data:`TRL_TRAINERS`) are counted as those train: SFT's fused LM head, DPO's pairs (two
  sequences each) and reference model (:func:`memory_terms`).

Split across GPUs, per GPU: ``sharding: fsdp`` counts 1/N of the weights, gradients and AdamW state
per rank plus the bf16 units FSDP gathers in flight, and with ``fsdp_offload`` moves the states to host
memory; an inference model with ``device_map: auto`` spreads its weights over the GPUs, host memory and
an offload folder per ``max_memory`` (:mod:`lab.training.sharded_memory`). A model not yet downloaded
is sized from its config.json (:func:`lab.models.weights.planning_dir`: the Hugging Face cache's, or one
the lab ships), built on the meta device, so :func:`dry_run` plans a job before its weights are fetched.

Will its checkpoints fit? :func:`check_disk` refuses a training job at submit when the disk of the
runs folder has less free than its checkpoints need at once (:func:`lab.training.estimates.disk_peak`);
the worker checks again before each save. :func:`submit_notes` says both sizes when a job is queued.

Which models a job loads, and whether it trains them, comes from its kind's config declarations
(every ``model`` field; its ``trained_by`` field names the training method), so a FIRST job's
teacher and student and every model of a comparison are checked, and a new kind needs nothing here.
A pipeline that trains one model several times (FIRST's students, CFT's rows) is counted once per
model: its disk need is a lower bound, and the check before each save covers the rest.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from jobs.launch import visible_gpus
from lab.core.config import ConfigError, model_fields, spec_of, walk
from lab.jobkit import kinds
from lab.models.weights import (BYTES, ModelShape, count_parameters, local_model_shape, model_shape, planning_dir,
                                size_text, unknown_targets)
from lab.training.config import KEPT_CHECKPOINTS, TrainConfig
from lab.training.disk import free_bytes
from lab.training.estimates import (FP32, GPU, NF4_BYTES, TrainingMemory, checkpoint_bytes, describe, describe_parts,
                                    disk_peak, memory_advice, run_checkpoint_bytes, training_memory)
from lab.training.sharded_memory import Placement, sharded_training, spread_inference

# Kinds whose models train under TRL's SFTTrainer or DPOTrainer (lab.kinds.sft, lab.kinds.dpo), the trainer
# training_memory counts for them; every other kind trains with transformers' Trainer.
TRL_TRAINERS = {"sft": "sft", "dpo": "dpo"}
HEADROOM = 1.2  # inference: what a forward pass needs beyond the weights (activations, the KV cache)
LORA_TRAINABLE = 0.02  # a model without a Llama-type config.json: its adapters' share, roughly
# What a GPU holds before any tensor: the CUDA runtime, cuBLAS's workspace, the kernels (typically
# 0.3-0.6 GiB with PyTorch 2.x; the GPU bench measures it).
CUDA_CONTEXT = 0.5 * 1024**3
GIB = 1024**3


def check_gpu_request(gpus: int, available: Optional[int] = None) -> None:
    """Refuse ``gpus`` beyond the ``available`` GPUs (default: those this machine's scheduler hands out)."""
    if gpus == 0:
        return
    have = len(visible_gpus()) if available is None else available
    if have == 0:
        raise ConfigError("gpus: this machine has no GPU; set GPUs to 0")
    if gpus > have:
        raise ConfigError(f"gpus: asked for {gpus} GPUs, but this machine has {have}; set GPUs to {have} or fewer")


def check_devices(kind: str, values: Mapping[str, Any], gpus: int, here: bool) -> None:
    """Every ``device`` a config names is one the job will see. The scheduler shows a job only the
    GPUs it asked for, numbered from 0 (``CUDA_VISIBLE_DEVICES``), and a CPU job none, so
    ``cuda:3`` on a one-GPU job fails the moment it loads a model; say so at submit instead.
    ``here``: the job runs on this machine (a browser's), so Apple's ``mps`` can be checked too."""
    for path, _, holder, key, _ in walk(kinds.get(kind).config, values):
        device = holder[key]
        if key != "device" or not isinstance(device, str):
            continue
        if device.startswith("cuda"):
            index = int(device.partition(":")[2] or 0)
            if gpus == 0:
                raise ConfigError(f"{path}: {device} needs a GPU, but the job asks for none; ask for a GPU, or set "
                                  f"{path} to auto or cpu")
            if index >= gpus:
                raise ConfigError(f"{path}: the job sees only the {gpus} GPU(s) it asks for, as cuda:0 to "
                                  f"cuda:{gpus - 1}; got {device}")
        if device == "mps" and here and sys.platform != "darwin":
            raise ConfigError(f"{path}: mps is the GPU of Apple's machines; this one runs {sys.platform}: use auto or cpu")


def inference_bytes(n_params: int, dtype: str) -> float:
    """A model used for inference: its weights in ``dtype``, plus :data:`HEADROOM`."""
    return n_params * BYTES[dtype] * HEADROOM


def _is_training_run(kind: str) -> bool:
    """The kind trains one model, with settings that are its config's own fields: a ``TrainConfig`` (finetune),
    or sft and dpo, which re-declare them; not a pipeline (a ``training:`` section, a series' ``train`` entries)."""
    cls = kinds.get(kind).config
    return issubclass(cls, TrainConfig) or "save_optimizer" in cls.__dataclass_fields__


def _training_section(kind: str) -> Optional[str]:
    """The field holding a pipeline's training settings (``training``), or None: a training run's own fields."""
    return None if _is_training_run(kind) else next(
        (f.name for f in dataclasses.fields(kinds.get(kind).config) if spec_of(f).entries is TrainConfig), None)


def trains(kind: str) -> bool:
    """Whether ``kind`` trains a model: with its own training fields, or in a pipeline's training section."""
    return _is_training_run(kind) or _training_section(kind) is not None


def setting_path(kind: str, name: str) -> str:
    """Where a refusal of training setting ``name`` points: ``training.name`` in a pipeline, else ``name``."""
    section = _training_section(kind)
    return f"{section}.{name}" if section else name


def training_settings(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``TrainConfig`` values a kind trains its models with, defaults filled: a finetune job's own
    fields, a pipeline's ``training:`` section (the field declared with ``entries=TrainConfig``), or the
    fields a kind re-declares at its top (sft, dpo: ``batch_size``, ``max_length`` … with their own
    defaults); TrainConfig's defaults for any it does not declare."""
    cls = kinds.get(kind).config
    section = _training_section(kind)
    given: Mapping[str, Any] = (config.get(section) or {}) if section else config
    declaring = TrainConfig if section else cls
    return {f.name: given.get(f.name, _setting(declaring if f.name in declaring.__dataclass_fields__ else TrainConfig,
                                               {}, f.name))
            for f in dataclasses.fields(TrainConfig)}


def memory_terms(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`training_memory`'s terms of the trainer a kind trains with (:data:`TRL_TRAINERS`), and for
    DPO whether its reference is scored before training (``precompute_ref_log_probs``)."""
    trainer = TRL_TRAINERS.get(kind, "transformers")
    if trainer != "dpo":
        return {"trainer": trainer}
    return {"trainer": trainer, "precompute_ref": bool(_setting(kinds.get(kind).config, dict(config),
                                                                "precompute_ref_log_probs"))}


@dataclass(frozen=True)
class ModelPlan:
    """What one model of a job needs: GPU memory at the peak and, when trained, disk for checkpoints."""

    path: str  # the config field
    model: str
    method: str  # inference, full, lora or qlora
    n_params: int
    memory: float  # peak bytes per GPU, the CUDA context not included
    how: str  # what the memory figure counts, for the messages
    checkpoint: float = 0.0  # bytes of one checkpoint (0: not trained)
    final: float = 0.0  # bytes of the trained weights it leaves
    cpu: float = 0.0  # host memory, every rank of the node (fsdp_offload; device_map auto's CPU share)
    offload: float = 0.0  # bytes device_map auto puts in the offload folder
    replicated: float = 0.0  # bytes per GPU were each GPU to hold a whole copy (DDP), for comparison

    @property
    def weights_only(self) -> float:
        """A checkpoint's bytes with ``save_optimizer: false``."""
        return checkpoint_bytes(self.final, 0, save_optimizer=False)


def _rough(n_params: int, method: str, dtype: str) -> tuple[float, int]:
    """(bytes, trainable parameters) of a model without a Llama-type config.json: each parameter's
    weight, gradient and moments as :mod:`lab.training.estimates` counts them, no activations."""
    trainable = n_params if method == "full" else int(LORA_TRAINABLE * n_params)
    base = {"full": 0, "lora": BYTES[dtype], "qlora": NF4_BYTES}[method] * n_params
    return base + 16 * trainable, trainable


def _estimate(shape: ModelShape, method: str, dtype: str, settings: Mapping[str, Any], terms: Mapping[str, Any],
              **change: Any) -> TrainingMemory:
    """One DDP rank's :func:`training_memory` at the job's settings (``change``: batch, method …)."""
    at = {"batch": settings["batch_size"], "method": method, **change}
    return training_memory(shape, at["method"], at["batch"], settings["max_length"], GPU, BYTES[dtype],
                           settings["lora_r"], settings["lora_dropout"], lora_targets=settings["lora_targets"], **terms)


def _placed(estimate: TrainingMemory, shape: ModelShape, method: str, settings: Mapping[str, Any],
            gpus: int) -> Placement:
    """Per GPU as the job's ``sharding`` spreads it: the whole DDP peak, or FSDP's shard and units."""
    if settings["sharding"] != "fsdp":
        return Placement(estimate.peak)
    return sharded_training(estimate, shape, method, gpus, bool(settings["fsdp_offload"]))


def _training_plan(path: str, model: str, method: str, model_dir: Path, n_params: int, dtype: str,
                   settings: Mapping[str, Any], terms: Mapping[str, Any], gpus: int) -> ModelPlan:
    shape = model_shape(model_dir)
    batch, length, r = settings["batch_size"], settings["max_length"], settings["lora_r"]
    if shape is None:
        memory, trainable = _rough(n_params, method, dtype)
        return ModelPlan(path, model, method, n_params, memory,
                         f"{method}, activations not counted: no Llama-type config.json",
                         checkpoint_bytes(4 * trainable, trainable, settings["save_optimizer"]), 4 * trainable,
                         replicated=memory)
    estimate = _estimate(shape, method, dtype, settings, terms)
    placed = _placed(estimate, shape, method, settings, gpus)
    checkpoint, final = run_checkpoint_bytes(shape, method, r, settings["save_optimizer"], settings["lora_targets"])
    batches = f"{batch} pairs ({2 * batch} sequences)" if terms["trainer"] == "dpo" else f"{batch}"
    terms_text = describe_parts(placed.parts) if placed.parts else describe(estimate)
    sharded = (f"fsdp over {max(gpus, 1)} GPU(s){', offloaded to host memory' if settings['fsdp_offload'] else ''}, "
               if settings["sharding"] == "fsdp" else "")
    how = f"{method}, {sharded}batches of {batches} × {length} tokens (max_length): {terms_text}"
    return ModelPlan(path, model, method, n_params, placed.per_gpu, how, checkpoint, final, cpu=placed.cpu,
                     replicated=estimate.peak)


def _inference_plan(path: str, model: str, n_params: int, dtype: str, config: Mapping[str, Any],
                    gpus: int) -> ModelPlan:
    """An inference model: a whole copy per GPU, or with ``device_map: auto`` spread per ``max_memory``."""
    whole = inference_bytes(n_params, dtype)
    if config.get("device_map") != "auto":
        return ModelPlan(path, model, "inference", n_params, whole, dtype, replicated=whole)
    spread = spread_inference(n_params * BYTES[dtype], gpus, config.get("max_memory"), HEADROOM)
    return ModelPlan(path, model, "inference", n_params, spread.per_gpu,
                     f"{dtype}, device_map auto over {gpus} GPU(s)", cpu=spread.cpu, offload=spread.disk,
                     replicated=whole)


def _dtype(config: Mapping[str, Any]) -> str:
    """The dtype a GPU job loads its models in: the config's, bf16 for ``auto`` (or a value it does not name)."""
    dtype = config.get("dtype", "auto")
    return dtype if isinstance(dtype, str) and dtype in BYTES else "bfloat16"


def plan(kind: str, config: Mapping[str, Any], gpus: int = 1) -> list[ModelPlan]:
    """A :class:`ModelPlan` per model field whose size can be told (on this machine, in the Hugging Face
    cache, or shipped: :func:`planning_dir`), for a job on ``gpus`` GPUs in the config's ``dtype``."""
    dtype = _dtype(config)
    settings, terms = training_settings(kind, config), memory_terms(kind, config)
    plans = []
    for path, model, method in models(kind, dict(config)):
        model_dir = planning_dir(model) if isinstance(model, str) else None
        n_params = count_parameters(model_dir) if model_dir else None
        if n_params is None:
            continue
        if method == "inference":
            plans.append(_inference_plan(path, model, n_params, dtype, config, gpus))
        else:
            plans.append(_training_plan(path, model, method, model_dir, n_params, dtype, settings, terms, gpus))
    return plans


def free_gpu_memory() -> dict[int, float]:
    """Free bytes per GPU index, from nvidia-smi; empty without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return {}
    free = {}
    for line in out.strip().splitlines():
        index, mib = (x.strip() for x in line.split(","))
        free[int(index)] = float(mib) * 1024**2
    return free


def _setting(cls: type, values: dict[str, Any], dotted: str) -> Any:
    """The value of ``dotted`` (``teacher_method``, ``training.method``) in a config, or its default."""
    head, _, rest = dotted.partition(".")
    f = cls.__dataclass_fields__[head]
    default = f.default_factory() if callable(f.default_factory) else f.default
    value = values.get(head, default)
    return _setting(spec_of(f).entries, value or {}, rest) if rest else value


def models(kind: str, config: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(field path, model, what the job does with it: inference or a training method) per model field."""
    cls = kinds.get(kind).config
    for path, spec, holder, key, declaring in model_fields(cls, config):
        yield path, holder[key], _method(cls, config, declaring, holder, spec.trained_by)


def _method(cls: type, config: dict[str, Any], declaring: type, holder: dict[str, Any], trained_by: Optional[str]) -> str:
    """How a model field's model is used: a dotted ``trained_by`` (``training.method``) is read from the
    top of the config, a plain one from the entry holding the field (a series' ``train`` entry); none: inference."""
    if not trained_by:
        return "inference"
    if "." in trained_by:
        return _setting(cls, config, trained_by)
    return _setting(declaring, holder, trained_by)


def check(kind: str, config: dict[str, Any], gpus: tuple[int, ...], free: Optional[dict[int, float]] = None) -> list[str]:
    """Warnings for a job about to start on ``gpus``, one per model that will not fit (nothing to say
    for CPU jobs or unknown sizes). Data-parallel ranks each hold a full copy, so the smallest GPU
    is what must fit it; a pipeline loads its models one after another, so each must fit alone."""
    if not gpus:
        return []
    warnings = []
    for p in plan(kind, config, len(gpus)):
        need = p.memory + CUDA_CONTEXT
        free = free_gpu_memory() if free is None else free
        have = min((free[g] for g in gpus if g in free), default=None)
        if have is not None and need > have:
            warnings.append(
                f"{p.path}: {p.model} ({p.n_params / 1e9:.2f} B parameters, {p.how}) needs about {need / GIB:.1f} "
                f"GiB per GPU at its peak, with the CUDA context; GPU(s) {','.join(map(str, gpus))} have "
                f"{have / GIB:.1f} GiB free. Use LoRA or QLoRA, a smaller batch_size or max_length, a smaller "
                "model, or free the GPU.")
    return warnings


def check_lora_targets(kind: str, config: Mapping[str, Any]) -> None:
    """Refuse a LoRA target that a model this job trains lacks, when the model is on this machine: the
    worker would refuse it only after the job waited its turn in the queue and loaded the model."""
    targets = training_settings(kind, config)["lora_targets"]
    field = setting_path(kind, "lora_targets")
    for path, model, method in models(kind, dict(config)):
        shape = local_model_shape(model) if method in ("lora", "qlora") else None
        problem = shape and unknown_targets(shape.linear_names, targets)
        if problem:
            raise ConfigError(f"{field}: {path} ({model}) has {problem}")


def disk_need(plans: list[ModelPlan], weights_only: bool = False) -> float:
    """Disk the trained models' checkpoints and weights take at once (:func:`disk_peak`, each
    trained model counted once); ``weights_only``: were ``save_optimizer`` off."""
    return disk_peak([(p.weights_only if weights_only else p.checkpoint, p.final) for p in plans if p.checkpoint],
                     KEPT_CHECKPOINTS)


def check_disk(kind: str, config: Mapping[str, Any], root: Path) -> None:
    """Refuse a training job whose checkpoints will not fit on ``root``'s disk, naming both sizes."""
    plans = [p for p in plan(kind, config) if p.checkpoint]
    if not plans:
        return
    need, free = disk_need(plans), free_bytes(root)
    if need <= free:
        return
    field = setting_path(kind, "save_optimizer")
    smaller = (f"; save_optimizer: false (weights only) needs {size_text(disk_need(plans, weights_only=True))}"
               if training_settings(kind, config)["save_optimizer"] else "")
    raise ConfigError(f"{field}: the checkpoints need {size_text(need)} of disk at once ({KEPT_CHECKPOINTS} kept, "
                      f"a new one written beside it, and the trained weights), but the disk of "
                      f"{Path(os.path.abspath(root)).name}/ has {size_text(free)} free: free space{smaller}")


def submit_notes(kind: str, config: Mapping[str, Any], gpus: int) -> list[str]:
    """What a queued job will take, one line each: GPU memory per model (GPU jobs) and the disk its
    checkpoints need."""
    plans = plan(kind, config, gpus)
    notes = [f"{p.path}: about {size_text(p.memory + CUDA_CONTEXT)} of GPU memory at its peak, with the CUDA "
             f"context ({p.how})" + _off_gpu(p) for p in plans if gpus]
    trained = [p for p in plans if p.checkpoint]
    if trained:
        optimizer = training_settings(kind, config)["save_optimizer"]
        sizes = ", ".join(f"{p.path} {size_text(p.checkpoint)}" for p in trained)
        notes.append(f"checkpoints: {sizes} each ({'with' if optimizer else 'without'} the optimizer's state), "
                     f"{KEPT_CHECKPOINTS} kept; {size_text(disk_need(trained))} of disk at once with the trained "
                     "weights" + ("" if _is_training_run(kind) else " (at least: a pipeline trains a model more than once)"))
    return notes


def _off_gpu(p: ModelPlan) -> str:
    """What a plan puts beside the GPUs, for a note: host memory and the offload folder."""
    return "".join([f"; {size_text(p.cpu)} of host memory" if p.cpu else "",
                    f"; {size_text(p.offload)} in the offload folder on disk" if p.offload else ""])


def accelerate_anchor(n_params: int) -> dict[str, float]:
    """GiB ``accelerate estimate-memory`` reports for training with Adam (its peak, ``estimate_training_usage``),
    from the same parameter count: fp32 (weights, gradients, two moments: 16 B/param) and mixed precision
    (the largest of its terms: the moments, 8 B/param). No activations, no gathering: a floor, for comparison."""
    fp32 = FP32 * n_params
    return {"float32": round(4 * fp32 / GIB, 2), "mixed_precision": round(2 * fp32 / GIB, 2)}


def _advice(kind: str, config: Mapping[str, Any], p: ModelPlan, gpus: int) -> list[str]:
    """What would make ``p`` fit, each with its figure where the lab can count it."""
    if p.method == "inference":
        return ["device_map: auto, to spread the weights over the job's GPUs (and max_memory with a cpu budget "
                "and an offload_folder for what does not fit them)"] if config.get("device_map") != "auto" else [
                "more GPUs, or a cpu budget in max_memory and an offload_folder for the rest"]
    settings, terms = training_settings(kind, config), memory_terms(kind, config)
    folder = planning_dir(p.model)
    shape = model_shape(folder) if folder else None
    if shape is None:
        return [memory_advice(settings)]
    estimate = _estimate(shape, p.method, _dtype(config), settings, terms)
    n = gpus if gpus > 1 else 8
    items = []
    if settings["sharding"] != "fsdp":
        fsdp = sharded_training(estimate, shape, p.method, n)
        items.append(f"sharding: fsdp over {n} GPUs (--gpus {n}): {size_text(fsdp.per_gpu + CUDA_CONTEXT)} per GPU")
    if not settings["fsdp_offload"]:
        off = sharded_training(estimate, shape, p.method, n, offload=True)
        items.append(f"sharding: fsdp over {n} GPUs with fsdp_offload: true: {size_text(off.per_gpu + CUDA_CONTEXT)} "
                     f"per GPU, {size_text(off.cpu)} of host memory")
    items.append("each GPU's whole copy (no sharding): " + memory_advice(
        settings, shape, p=GPU, base_dtype_bytes=BYTES[_dtype(config)], trainer=terms["trainer"],
        precompute_ref=terms.get("precompute_ref", False)))
    return items


def dry_run(kind: str, config: Mapping[str, Any], gpus: int, gpu_memory: float) -> dict[str, Any]:
    """What a job would take, without queueing it (``python -m jobs submit --dry-run``): per model, its
    parameters, GPU memory per GPU at the peak with the CUDA context, host memory and disk (its
    checkpoints and any offload folder), whether it fits GPUs of ``gpu_memory`` bytes, what would make it
    fit, and ``accelerate estimate-memory``'s figures for the same count. Models whose size cannot be told
    (no config.json here, none shipped) are listed with it said."""
    plans = plan(kind, config, gpus)
    known = {p.path for p in plans}
    rows: list[dict[str, Any]] = []
    for p in plans:
        per_gpu = p.memory + CUDA_CONTEXT if gpus else 0.0
        fits = per_gpu <= gpu_memory
        disk = (disk_peak([(p.checkpoint, p.final)], KEPT_CHECKPOINTS) if p.checkpoint else 0.0) + p.offload
        rows.append({"field": p.path, "model": p.model, "method": p.method, "n_params": p.n_params,
                     "per_gpu_gib": round(per_gpu / GIB, 2), "cpu_gib": round(p.cpu / GIB, 2),
                     "disk_gib": round(disk / GIB, 2), "fits": fits,
                     "replicated_per_gpu_gib": round((p.replicated + CUDA_CONTEXT) / GIB, 2), "how": p.how,
                     "accelerate_estimate_memory_gib": accelerate_anchor(p.n_params),
                     **({} if fits else {"advice": _advice(kind, config, p, gpus)})})
    for path, model, method in models(kind, dict(config)):
        if path not in known:
            rows.append({"field": path, "model": model, "method": method, "n_params": None,
                         "unknown": "no config.json to size it from: not on this machine, in the Hugging Face "
                                    "cache, or shipped with the lab"})
    trained = [p for p in plans if p.checkpoint]
    return {"kind": kind, "gpus": gpus, "gpu_memory_gib": round(gpu_memory / GIB, 2), "queued": False,
            "models": rows, "disk_gib": round(disk_need(trained) / GIB, 2)}

