"""What a model directory holds, read without torch: where a named model lives and its size.

The job system's pre-flight (in the web server, which never imports torch) and the inference
lane's memory budget both need a model's size before loading it. Parameters are counted from the
safetensors headers: exact, and no weight is read.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Optional

from lab.files import cache_dir

BUNDLED = "bundled"
BUNDLED_DIRNAME = "SmolLM2-135M-Instruct"
# A small random-weight model for the controlled task (lab.scratch), made on first use.
SCRATCH = "scratch"
SCRATCH_DIRNAME = "scratch-synthetic"
NAMED_MODELS = (BUNDLED, SCRATCH)  # the names a model field takes besides a folder or a hub id
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024**3


def size_text(n: float) -> str:
    """Bytes as GiB, or MiB below one GiB (a 135M model is half a GiB; a LoRA a few MiB)."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 1024**2:.1f} MiB"


def bundled_target() -> Path:
    """Where the bundled model's safetensors copy lives (made on its first load)."""
    return cache_dir() / "models" / BUNDLED_DIRNAME


def scratch_target() -> Path:
    """Where the ``scratch`` model lives (created on its first use)."""
    return cache_dir() / "models" / SCRATCH_DIRNAME


def local_model_dir(model: str) -> Optional[Path]:
    """The directory ``model`` names (``bundled``: its converted copy), or None: not (yet) on disk."""
    named = {BUNDLED: bundled_target, SCRATCH: scratch_target}
    path = named[model]() if model in named else Path(model).expanduser()
    return path if path.is_dir() else None


def count_parameters(model_dir: Path) -> Optional[int]:
    """Σ of tensor sizes in ``model_dir``'s safetensors files, or None when there are none."""
    total, found = 0, False
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))  # safetensors: u64 header length, then JSON
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for dim in info["shape"]:
                    n *= dim
                total += n
        found = True
    return total if found else None
