"""What a model directory holds, read without torch: where a named model lives and its size.

The job system's pre-flight (in the web server, which never imports torch) and the inference
lane's memory budget both need a model's size before loading it. Parameters are counted from the
safetensors headers: exact, and no weight is read. A training run's memory and checkpoint size
(:mod:`lab.training.estimates`) need its shape too: :func:`model_shape` adds the dimensions of
``config.json`` and the shape of every linear weight, so that a LoRA adapter's size is counted, not
guessed.

A model folder comes from a user, so what it says is checked before any of it is used
(:func:`check_model_folder`): a header that claims more bytes than its file holds, nests past
Python's recursion limit, or gives a shape that is not a list of counts, and a ``config.json`` whose
sizes are text or zero, are refused with the file's name (relative to the folder) and what is wrong,
at submit (:mod:`lab.jobkit.paths`) and again when the worker loads it (:mod:`lab.models.loading`).
The size readers (:func:`count_parameters`, :func:`model_shape`) answer None for such a folder.

A folder with config.json and no safetensors at all (a hub model planned before it is downloaded:
:func:`planning_dir` finds the Hugging Face cache's config.json, or the one the lab ships for the papers'
7-13B models under ``lab/models/configs/``) is sized by building it on the meta device in a subprocess
(:mod:`lab.models.meta`): no weight is loaded or allocated.
"""
from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from lab.core.errors import ModelLoadError
from lab.core.files import cache_dir
from lab.models.meta import meta_shapes

BUNDLED = "bundled"
BUNDLED_DIRNAME = "SmolLM2-135M-Instruct"
# A small random-weight model for the controlled task (lab.models.scratch), made on first use.
SCRATCH = "scratch"
SCRATCH_DIRNAME = "scratch-synthetic"
# ... and in other sizes, for a series over scale on a CPU (the alignment-calibration paper's Figure 3
# spans Pythia 70M → 12B): each name's (hidden width, layers, heads, MLP width), every one with the same
# 1,024-token vocabulary, from about 0.05 M to 3.7 M parameters.
SCRATCH_SIZES = {"scratch-xs": (32, 1, 2, 96), "scratch-s": (64, 2, 4, 192), SCRATCH: (128, 2, 4, 384),
                 "scratch-l": (256, 4, 4, 768)}
NAMED_MODELS = (BUNDLED, *SCRATCH_SIZES)  # the names a model field takes besides a folder or a hub id
ALL_LINEAR = "all-linear"  # peft's target_modules for every linear layer but the output one
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024**3
MAX_HEADER = 100_000_000  # safetensors' own limit on a header (MAX_HEADER_SIZE in its Rust loader)
MAX_CONFIG = 16 * 1024**2  # a config.json is a few KiB; one with a large label map, far less than this
# safetensors' dtypes and their bytes an element: a header's data_offsets must span shape × this.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
# config.json's sizes (Llama-type names, and GPT-2's): a positive integer wherever one is given. The first five
# are the ones model_shape reads; the others may be null (transformers then derives them).
SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
OPTIONAL_SIZE_KEYS = ("num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_layer", "n_head",
                      "n_positions", "n_inner")
# config.json files of hub models the papers train (LLaMA-2 7B and 13B, the CFT paper's 7-8B families), shipped
# so that a job is planned before its weights are fetched; SOURCES.md beside them says where each came from.
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")  # owner/name, as the hub spells them


class ModelFolderError(ModelLoadError):
    """A model folder whose config.json or weights' headers cannot be what they claim; the message starts
    with the file's name relative to the folder (never the server's path to it)."""


def size_text(n: float) -> str:
    """Bytes as GiB, or MiB below one GiB (a 135M model is half a GiB; a LoRA a few MiB)."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 1024**2:.1f} MiB"


def bundled_target() -> Path:
    """Where the bundled model's safetensors copy lives (made on its first load)."""
    return cache_dir() / "models" / BUNDLED_DIRNAME


def scratch_target(name: str = SCRATCH) -> Path:
    """Where a scratch model (``scratch``, ``scratch-l`` …) lives (created on its first use)."""
    return cache_dir() / "models" / (SCRATCH_DIRNAME if name == SCRATCH else f"{name}-synthetic")


def local_model_dir(model: str) -> Optional[Path]:
    """The directory ``model`` names (``bundled``: its converted copy), or None: not (yet) on disk."""
    if model == BUNDLED:
        path = bundled_target()
    elif model in SCRATCH_SIZES:
        path = scratch_target() if model == SCRATCH else scratch_target(model)
    else:
        path = Path(model).expanduser()
    return path if path.is_dir() else None


def _hub_cache_config(model: str) -> Optional[Path]:
    """The Hugging Face cache's config.json of hub id ``model``, when it holds one."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model, "config.json")
    except ValueError:  # an id huggingface_hub refuses to look up
        return None
    return Path(found) if isinstance(found, str) else None


def planning_dir(model: str) -> Optional[Path]:
    """A folder whose config.json (and safetensors, when there) give ``model``'s size before it is
    loaded: the model's own folder, else for a hub id the Hugging Face cache's snapshot holding its
    config.json, else the config.json the lab ships for it (:data:`SHIPPED_CONFIGS`); None: no way to
    tell. A name with ``..`` or any other path in it is no hub id and never reaches the shipped folder."""
    local = local_model_dir(model)
    if local or not HUB_ID.fullmatch(model) or ".." in model:
        return local
    cached = _hub_cache_config(model)
    if cached:
        return cached.parent
    shipped = SHIPPED_CONFIGS / model
    return shipped if (shipped / "config.json").is_file() else None


def _short(value: object) -> str:
    """A value from a user's file, cut to what a message can show."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_json(raw: bytes, where: str) -> object:
    """``raw`` parsed as JSON, or :class:`ModelFolderError` naming ``where`` (a file, a header)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ModelFolderError(f"{where} nests its JSON too deeply to read") from None
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        raise ModelFolderError(f"{where} is not JSON ({e})") from None


def _tensor_shape(info: object, where: str, data_bytes: int) -> list[int]:
    """One header entry's shape, checked against its dtype and data_offsets as safetensors' loader checks them."""
    shape = info.get("shape") if isinstance(info, dict) else None
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ModelFolderError(f"{where}: expected a shape that is a list of non-negative integers, got {_short(shape)}")
    offsets = info.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_bytes):
        raise ModelFolderError(f"{where}: expected data_offsets [begin, end] within the file's {data_bytes:,} bytes "
                               f"of data, got {_short(offsets)}")
    width = DTYPE_BYTES.get(info.get("dtype"))
    if width is not None and math.prod(shape) * width != offsets[1] - offsets[0]:
        raise ModelFolderError(f"{where}: shape {_short(shape)} in {info['dtype']} is {math.prod(shape) * width:,} "
                               f"bytes, but its data_offsets span {offsets[1] - offsets[0]:,}")
    return shape


def read_header(path: Path, name: str) -> dict[str, list[int]]:
    """The shape of every tensor of one safetensors file (``name``: as messages call it), from its header:
    a little-endian u64 length, then that many bytes of JSON. :class:`ModelFolderError` when the file cannot
    be what it claims; the header is read only once its length is known to fit the file."""
    size = path.stat().st_size
    if size < 8:
        raise ModelFolderError(f"{name}: {size} bytes, too short for a safetensors file (an 8-byte header length, "
                               "then the header)")
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > min(MAX_HEADER, size - 8):
            room = f"safetensors allows {MAX_HEADER:,}" if length > MAX_HEADER else f"the file holds {size - 8:,}"
            raise ModelFolderError(f"{name}: its header claims {length:,} bytes, but {room}; is the file whole?")
        header = parse_json(f.read(length), f"{name}: the header")
    if not isinstance(header, dict):
        raise ModelFolderError(f"{name}: the header is a JSON {type(header).__name__}, expected an object of tensors")
    return {tensor: _tensor_shape(info, f"{name}: tensor {_short(tensor)}", size - 8 - length)
            for tensor, info in header.items() if tensor != "__metadata__"}


def read_tensor_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Every tensor's shape in ``model_dir``'s safetensors files, by name (empty: none), each header checked
    (:func:`read_header`)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        shapes.update(read_header(path, path.name))
    return shapes


def read_config(model_dir: Path) -> dict[str, Any]:
    """``model_dir``'s config.json, its sizes checked (:data:`SIZE_KEYS`): transformers divides by them and
    builds layers of them, so text, zero or a fraction there fails inside it with no word of the file."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        hint = (": it is a LoRA adapter; name it as the adapter and its base model as the model"
                if (path.parent / "adapter_config.json").is_file() else "")
        raise ModelFolderError(f"config.json: missing; a model folder holds config.json beside its weights{hint}")
    if path.stat().st_size > MAX_CONFIG:
        raise ModelFolderError(f"config.json: {path.stat().st_size:,} bytes; a model's config.json is a few KiB")
    config = parse_json(path.read_bytes(), "config.json")
    if not isinstance(config, dict):
        raise ModelFolderError(f"config.json: a JSON {type(config).__name__}, expected an object of settings")
    for key in (*SIZE_KEYS, *OPTIONAL_SIZE_KEYS):
        value = config.get(key)
        if key not in config or (value is None and key in OPTIONAL_SIZE_KEYS):
            continue
        if type(value) is not int or value < 1:
            raise ModelFolderError(f"config.json: {key} must be a positive integer, got {_short(value)}")
    return config


def check_model_folder(model_dir: Path) -> None:
    """Raise :class:`ModelFolderError` when ``model_dir``'s config.json or a safetensors header is malformed
    (what :func:`read_config` and :func:`read_header` check); nothing is loaded."""
    read_config(model_dir)
    read_tensor_shapes(model_dir)


def _tensor_shapes(model_dir: Path) -> Optional[dict[str, list[int]]]:
    """The shape of every tensor in ``model_dir``'s safetensors files by name, from their headers; None
    when one cannot be read (a damaged file has no size to tell: the load will say why). A folder without
    safetensors is sized from its config.json (checked first) on the meta device (:mod:`lab.models.meta`)."""
    try:
        shapes = read_tensor_shapes(model_dir)
        if shapes or any(Path(model_dir).glob("*.safetensors")):
            return shapes or None
        read_config(model_dir)
    except (OSError, ModelFolderError):
        return None
    return meta_shapes(model_dir)


def count_parameters(model_dir: Path) -> Optional[int]:
    """Σ of tensor sizes in ``model_dir``'s safetensors files, or None when there are none."""
    shapes = _tensor_shapes(model_dir)
    return sum(map(math.prod, shapes.values())) if shapes else None


@dataclass(frozen=True)
class ModelShape:
    """A decoder's sizes, as the memory and checkpoint estimates need them (Llama-type names).

    ``linears`` are the (out, in) shapes of the 2-D weights inside the decoder layers: the layers
    that LoRA's ``target_modules="all-linear"`` adapts and QLoRA stores in 4 bits (every linear
    layer but the output one). The embedding and output layer are told apart by their vocabulary
    dimension. ``linear_names`` are their module names (``q_proj`` …), what a narrower LoRA's
    ``target_modules`` lists."""

    n_params: int  # every stored tensor (a tied output layer is stored once)
    linears: tuple[tuple[int, int], ...]
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    linear_names: tuple[str, ...]

    @property
    def n_linear(self) -> int:
        """Parameters of the decoder layers' linear weights."""
        return sum(out * inp for out, inp in self.linears)

    def adapted(self, targets: Sequence[str] = (ALL_LINEAR,)) -> tuple[tuple[str, int, int], ...]:
        """(name, out, in) of every linear a LoRA on ``targets`` adapts: all of them for ``all-linear``,
        else those whose module name is listed (peft matches a module by the last part of its name)."""
        every = tuple((name, out, inp) for name, (out, inp) in zip(self.linear_names, self.linears))
        return every if list(targets) == [ALL_LINEAR] else tuple(t for t in every if t[0] in targets)

    def lora_params(self, r: int, targets: Sequence[str] = (ALL_LINEAR,)) -> int:
        """Trainable parameters of a rank-``r`` LoRA on ``targets``: A (r × in) and B (out × r) each."""
        return r * sum(out + inp for _, out, inp in self.adapted(targets))


def unknown_targets(linear_names: Iterable[str], targets: Sequence[str]) -> Optional[str]:
    """Why a LoRA on ``targets`` cannot adapt a model whose linear layers are ``linear_names`` (module
    names), or None: peft refuses a list only when no name matches, and trains fewer layers than asked
    without a word when one is misspelt."""
    names = sorted(set(linear_names))
    missing = [t for t in targets if t not in names and t != ALL_LINEAR]
    if not missing:
        return None
    return (f"no linear layer named {', '.join(missing)}; its linear layers are {', '.join(names)} "
            f"(or {ALL_LINEAR} for every one)")


def model_shape(model_dir: Path) -> Optional[ModelShape]:
    """``model_dir``'s shape from its config.json and safetensors headers, or None: no weights, or a
    config without a Llama-type decoder's sizes (hidden_size, num_hidden_layers, ...)."""
    try:
        config = read_config(model_dir)
    except (OSError, ModelFolderError):
        return None
    if any(not config.get(key) for key in SIZE_KEYS):
        return None
    vocab, hidden, layers = config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]
    heads, intermediate = config["num_attention_heads"], config["intermediate_size"]
    shapes = _tensor_shapes(model_dir)
    if not shapes:
        return None
    linears = {name: (shape[0], shape[1]) for name, shape in shapes.items() if len(shape) == 2 and vocab not in shape}
    return ModelShape(sum(map(math.prod, shapes.values())), tuple(linears.values()), vocab, hidden, layers, heads,
                      config.get("num_key_value_heads") or heads, config.get("head_dim") or hidden // heads,
                      intermediate, tuple(module_name(name) for name in linears))


def local_model_shape(model: str) -> Optional[ModelShape]:
    """The shape of ``model`` (a model field's value) when it is on this machine, else None."""
    folder = local_model_dir(model)
    return model_shape(folder) if folder else None


def module_name(tensor: str) -> str:
    """The module name a LoRA target lists for a stored weight: ``model.layers.0.self_attn.q_proj.weight``
    → ``q_proj``."""
    return tensor.removesuffix(".weight").rsplit(".", 1)[-1]
