"""Before a job is queued or starts: are there the GPUs it asks for, and will its models fit?

:func:`check_gpu_request` refuses, at submit, more GPUs than this machine has: the scheduler
(:mod:`jobs.scheduler`) hands out ``jobs.launch.visible_gpus()`` and fails a job asking for more the
moment it looks at it, so a form saying "queued" would only be a failure postponed.

Will the model fit? A rough estimate, said before the wait, not after.

Parameters are counted from the safetensors headers (exact, and readable without torch or
loading any weights); memory per parameter depends on what the job does with them:

- inference: the weights, plus 20 % for activations and the KV cache;
- full fine-tuning with AdamW: weights + gradients (job dtype) + two fp32 moments (8 bytes), plus 20 %;
- LoRA: the frozen weights plus about 2 % trainable parameters with their own gradients and moments;
- QLoRA: the same on 4-bit weights (half a byte each).

Which models a job loads, and whether it trains them, comes from its kind's config declarations
(every ``model`` field; its ``trained_by`` field names the training method), so a FIRST job's
teacher and student and every model of a comparison are checked, and a new kind needs nothing here.
Activations of long sequences and large batches come on top; the warning says so.
"""
from __future__ import annotations

import subprocess
import sys
from typing import Any, Iterator, Mapping, Optional

from jobs.launch import visible_gpus
from lab import kinds
from lab.config import ConfigError, spec_of, walk
from lab.weights import BYTES, count_parameters, local_model_dir

HEADROOM = 1.2
LORA_TRAINABLE = 0.02
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


def estimate_bytes(n_params: int, dtype: str, method: str) -> float:
    width = BYTES[dtype]
    if method == "inference":
        per_param = width
    elif method == "full":
        per_param = 2 * width + 8
    elif method == "lora":
        per_param = width + LORA_TRAINABLE * (2 * width + 8)
    elif method == "qlora":
        per_param = 0.5 + LORA_TRAINABLE * (2 * width + 8)
    else:
        raise ValueError(f"Expected method 'inference', 'full', 'lora' or 'qlora', but got {method!r}")
    return n_params * per_param * HEADROOM


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
    for path, spec, holder, key, _ in walk(cls, config):
        if spec.role == "model" and isinstance(holder[key], str):
            yield path, holder[key], _setting(cls, config, spec.trained_by) if spec.trained_by else "inference"


def check(kind: str, config: dict[str, Any], gpus: tuple[int, ...], free: Optional[dict[int, float]] = None) -> list[str]:
    """Warnings for a job about to start on ``gpus``, one per model that will not fit (nothing to say
    for CPU jobs or unknown sizes). Data-parallel ranks each hold a full copy, so the smallest GPU
    is what must fit it; a pipeline loads its models one after another, so each must fit alone."""
    if not gpus:
        return []
    dtype = config.get("dtype", "auto")
    dtype = "bfloat16" if dtype == "auto" else dtype
    warnings = []
    for path, model, method in models(kind, config):
        model_dir = local_model_dir(model)
        n_params = count_parameters(model_dir) if model_dir else None
        if n_params is None:
            continue
        need = estimate_bytes(n_params, dtype, method)
        free = free_gpu_memory() if free is None else free
        have = min((free[g] for g in gpus if g in free), default=None)
        if have is not None and need > have:
            warnings.append(
                f"{path}: {model} ({n_params / 1e9:.2f} B parameters, {dtype}, {method}) needs about "
                f"{need / GIB:.1f} GiB per GPU before activations; GPU(s) {','.join(map(str, gpus))} have "
                f"{have / GIB:.1f} GiB free. Use LoRA, bf16, a smaller model, or free the GPU.")
    return warnings
