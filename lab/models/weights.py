"""What a model directory holds, read without torch: where a named model lives and its size.

The job system's pre-flight (in the web server, which never imports torch) and the inference
lane's memory budget both need a model's size before loading it. Parameters are counted from the
safetensors headers: exact, and no weight is read. A training run's memory and checkpoint size
(:mod:`lab.training.estimates`) need its shape too: :func:`model_shape` adds the dimensions of
``config.json`` and the shape of every linear weight, so that a LoRA adapter's size is counted, not
guessed.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from lab.core.files import cache_dir

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


def _tensor_shapes(model_dir: Path) -> Optional[dict[str, list[int]]]:
    """The shape of every tensor in ``model_dir``'s safetensors files by name, from their headers; None
    when there are none, or one cannot be read (a damaged file has no size to tell: the load will say why)."""
    shapes = {}
    try:
        for path in sorted(Path(model_dir).glob("*.safetensors")):
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))  # safetensors: u64 header length, then JSON
                header = json.loads(f.read(size))
            shapes.update({name: list(info["shape"]) for name, info in header.items() if name != "__metadata__"})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return None
    return shapes or None


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
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        vocab, hidden, layers = config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]
        heads, intermediate = config["num_attention_heads"], config["intermediate_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
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
