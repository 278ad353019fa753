"""Where a model too large for one GPU goes (``device_map: auto``): its fields checked at submit, without torch.

accelerate's big-model inference spreads a model's layers over the job's GPUs, then the CPU, then a
folder on disk, and runs each layer on the first GPU (the CPU without one) as its turn comes. What a
user may get wrong is refused here, naming the field, before the job waits in the queue: a
``max_memory`` key that is neither a GPU index nor ``cpu``, a size that is not one or is zero or
absurd, an ``offload_folder`` leading out of the run directory or onto a file the run writes, and a
budget on the device that runs the layers smaller than the model's largest decoder layer (read from
its safetensors headers, :func:`lab.models.weights.read_tensor_shapes`, in the job's dtype): accelerate
would still load such a model, every layer then streamed from disk into a device that cannot hold it.

Sizes are accelerate's forms (``20GiB``, ``500MiB``, ``20GB``), read by :func:`size_bytes` as
``accelerate.utils.convert_file_size_to_int`` reads them (a test holds the two to each other): the web
server checks configs and never imports torch, which accelerate's parser does.
"""
from __future__ import annotations

import math
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping, Optional

from lab.core import layout
from lab.core.config import ConfigError, model_fields
from lab.core.reads import inside
from lab.models.weights import BYTES, ModelFolderError, local_model_dir, read_tensor_shapes, size_text

DeviceMap = Literal["none", "auto"]
CPU = "cpu"
KEY_PATTERN = r"cpu|0|[1-9][0-9]?"  # a GPU index as the job sees it (CUDA_VISIBLE_DEVICES renumbers from 0), or cpu
MAX_DEVICES = 101  # keys of max_memory: GPU indices 0 … 99 and cpu
UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "GB": 10**9, "MB": 10**6, "KB": 10**3}
SIZE_PATTERN = r"(\d{1,9}(?:\.\d{1,9})?) ?(" + "|".join(UNITS) + ")"
MAX_SIZE_TEXT = 24
MAX_BUDGET = 64 * 2**40  # 64 TiB: more than any GPU or host holds; a larger figure is a typo
MAX_FOLDER = 200  # characters of offload_folder
# offload_folder as the field declares it: relative, names of letters, digits, '_', '-' and '.' not starting with a
# dot (so neither '..' nor a hidden folder), joined by '/'; check_offload_folder says what else is refused, and why.
FOLDER_PATTERN = r"[A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*"
MARKER = ".offload"  # written into an offload folder the loader made: only such a folder is ever deleted
# The names a run directory's own files and folders have (lab.core.layout): an offload folder there is
# deleted when the run ends, so it may not be one of them.
RUN_NAMES = frozenset(value for name, value in vars(layout).items() if isinstance(value, str)
                      and name.endswith(("_FILE", "_DIR", "_JSON", "_MD", "_CSV")))


def size_bytes(path: str, text: str) -> int:
    """``text`` (``20GiB``, ``500MiB``, ``1.5GB``) in bytes, refused naming ``path`` unless it is one of
    accelerate's forms and between 1 byte and :data:`MAX_BUDGET`."""
    found = re.fullmatch(SIZE_PATTERN, text.strip())
    if found is None:
        raise ConfigError(f"{path}: {text!r} is not a size; write a number and a unit, e.g. 20GiB, 500MiB or 20GB "
                          f"(units: {', '.join(UNITS)})")
    size = int(float(found.group(1)) * UNITS[found.group(2)])
    if size < 1:
        raise ConfigError(f"{path}: {text!r} is zero; leave the device out to give it what it has free")
    if size > MAX_BUDGET:
        raise ConfigError(f"{path}: {text!r} is more than 64 TiB, which no device holds")
    return size


def parse_max_memory(max_memory: Mapping[str, str]) -> dict[Any, int]:
    """``max_memory`` as accelerate takes it: a GPU's index as an int, ``cpu`` as is, each size in bytes."""
    out: dict[Any, int] = {}
    for key, text in max_memory.items():
        if not re.fullmatch(KEY_PATTERN, key):
            raise ConfigError(f"max_memory: {key!r} is neither a GPU index as the job sees it (0, 1, …) nor 'cpu'")
        out[CPU if key == CPU else int(key)] = size_bytes(f"max_memory.{key}", text)
    return out


def check_offload_folder(folder: str) -> str:
    """``folder``, a relative path inside the run directory that is none of the run's own files; else refused."""
    parts = folder.replace("\\", "/").split("/")
    if not folder.strip() or folder.startswith(("/", "~")) or re.match(r"[A-Za-z]:", folder):
        raise ConfigError(f"offload_folder: {folder!r} is not a folder inside the run directory; give a relative "
                          "name such as offload")
    if any(part in ("", ".", "..") for part in parts):
        raise ConfigError(f"offload_folder: {folder!r} must name a folder inside the run directory, without '.', "
                          "'..' or empty parts (e.g. offload)")
    if parts[0] in RUN_NAMES:
        raise ConfigError(f"offload_folder: {parts[0]!r} is where the run keeps its own {parts[0]}; it is deleted "
                          "when the run ends, so pick another name (e.g. offload)")
    return folder


def layer_bytes(model_dir: Path, width: int) -> Optional[int]:
    """Bytes of ``model_dir``'s largest decoder layer at ``width`` bytes an element, from its safetensors
    headers (``model.layers.7.…``, GPT-2's ``h.7.…``); None: no weights, or none grouped by layer."""
    layers: dict[str, int] = {}
    for name, shape in read_tensor_shapes(model_dir).items():
        found = re.match(r"(.*?\b(?:layers|h|blocks|layer)\.\d+)\.", name)
        if found:
            layers[found.group(1)] = layers.get(found.group(1), 0) + math.prod(shape)
    return max(layers.values()) * width if layers else None


def _dtype(dtype: str, gpu: bool) -> str:
    """The job's ``dtype`` on a GPU or the CPU (auto: bfloat16 on a GPU, float32 on the CPU, as
    :func:`lab.models.loading.select_dtype` picks)."""
    return ("bfloat16" if gpu else "float32") if dtype == "auto" else dtype


def _shown(n: int) -> str:
    return size_text(n) if n >= 2**20 else f"{n:,} bytes"


def _runs_layers(device: str, budgets: dict[Any, int], gpus: Optional[int]) -> Optional[tuple[str, Any]]:
    """(path, key) of the budget that holds the layer running now, when it is known: GPU 0's (the first of the
    job's GPUs runs them), or the CPU's when the job runs on it (``device: cpu``, or ``gpus`` 0)."""
    if device == CPU or gpus == 0:
        return ("max_memory.cpu", CPU) if CPU in budgets else None
    return ("max_memory.0", 0) if 0 in budgets else None


def layer_problem(models: Iterable[str], dtype: str, device: str, budgets: dict[Any, int],
                  gpus: Optional[int] = None) -> Optional[str]:
    """Why a model of ``models`` (those on this machine) cannot run under ``budgets``: its largest decoder layer
    is larger than the budget of the device that runs the layers; None when each fits or it is not known."""
    runs = _runs_layers(device, budgets, gpus)
    if runs is None:
        return None
    path, key = runs
    width = _dtype(dtype, key != CPU)
    for model in models:
        folder = local_model_dir(model)
        try:
            need = layer_bytes(folder, BYTES[width]) if folder else None
        except (OSError, ModelFolderError):
            continue  # the model check refuses such a folder, naming the file
        if need is not None and need > budgets[key]:
            return (f"{path}: {_shown(budgets[key])} cannot hold one decoder layer of {Path(model).name} "
                    f"({_shown(need)} in {width}), and each layer runs there in turn; give it more, or leave it out "
                    "to give it what it has free")
    return None


def check(device_map: str, max_memory: Mapping[str, str], offload_folder: str, device: str, dtype: str,
          models: Iterable[str], gpus: Optional[int] = None) -> None:
    """Every placement refusal that needs no more than the config (and ``gpus``, the job's GPU count, where known)."""
    if device_map == "none":
        if max_memory:
            raise ConfigError("max_memory: applies with device_map auto; set device_map: auto, or leave it empty")
        if offload_folder != "offload":
            raise ConfigError("offload_folder: applies with device_map auto; set device_map: auto, or leave it out")
        return
    if device not in ("auto", CPU):
        raise ConfigError(f"device: with device_map auto the layers go where max_memory says, over the job's GPUs "
                          f"first; leave device auto (or cpu: the CPU and the offload folder only), not {device!r}")
    budgets = parse_max_memory(max_memory)
    gpu_keys = sorted(k for k in budgets if k != CPU)
    if gpu_keys and (device == CPU or gpus == 0):
        raise ConfigError(f"max_memory.{gpu_keys[0]}: names a GPU, and the job runs on the CPU "
                          f"({'device: cpu' if device == CPU else 'it asks for no GPU'}); leave GPUs out")
    if gpus is not None and gpu_keys and gpu_keys[-1] >= gpus:
        raise ConfigError(f"max_memory.{gpu_keys[-1]}: the job sees only the {gpus} GPU(s) it asks for, as 0 to "
                          f"{gpus - 1}")
    check_offload_folder(offload_folder)
    problem = layer_problem(models, dtype, device, budgets, gpus)
    if problem:
        raise ConfigError(problem)


def check_job_gpus(cls: type, values: Mapping[str, Any], gpus: int) -> None:
    """The checks that need the job's GPU count: a GPU index it will not see, and, on a job without GPUs, the
    CPU's budget against each model's largest layer. For the job store, with a config's values (``to_dict``)."""
    if values.get("device_map", "none") == "none":
        return
    models = [holder[key] for _, _, holder, key, _ in model_fields(cls, values)]
    check(values["device_map"], values.get("max_memory") or {}, values.get("offload_folder", "offload"),
          values.get("device", "auto"), values.get("dtype", "auto"), models, gpus)


@contextmanager
def offload_folder(run_dir: Path, folder: str) -> Iterator[Path]:
    """The offload folder ``folder`` inside ``run_dir``, made for a load and deleted when the block ends
    however it ends: it holds a copy of weights, which would double a results folder. A folder there that
    the loader did not make (no :data:`MARKER`) is refused rather than deleted; one a killed run left is
    ours, and emptied first."""
    path = Path(run_dir) / check_offload_folder(folder)
    if not inside(path.resolve(), [Path(run_dir).resolve()]):
        raise ConfigError(f"offload_folder: {folder!r} leads out of the run directory (a link on the way)")
    if path.exists() and not (path / MARKER).is_file():
        raise ConfigError(f"offload_folder: {folder!r} already exists in the run directory and is not an offload "
                          "folder; pick another name")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / MARKER).write_text("weights offloaded while the run loads its model; deleted when it ends\n")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def placed(run_dir: Path, cfg: Any) -> Iterator[dict[str, Any]]:
    """:func:`lab.models.loading.load_model`'s placement arguments for a config with
    :class:`lab.jobkit.sections.PlacementSection`'s fields: none for ``device_map: none``; else its budgets and
    its offload folder in ``run_dir``, which lives as long as the block (:func:`offload_folder`)."""
    if cfg.device_map == "none":
        yield {}
        return
    with offload_folder(run_dir, cfg.offload_folder) as folder:
        yield {"device_map": cfg.device_map, "max_memory": parse_max_memory(cfg.max_memory), "offload_folder": folder}
