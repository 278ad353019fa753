"""Every tensor's name and shape from a model's config.json alone: plan before downloading 14 GB.

A folder with config.json but no safetensors (a hub model not yet fetched, whose config.json the lab
ships or the Hugging Face cache holds) has no headers to read sizes from. Transformers can still
build the model on PyTorch's meta device (``accelerate.init_empty_weights`` +
``AutoModelForCausalLM.from_config``): every parameter gets its name and shape, and no storage is
allocated or read, so a 13B model is built in seconds in a few hundred MB of host memory.

The web server never imports torch (:mod:`jobs.preflight` runs inside it), so the build runs in a
subprocess, ``python -m lab.models.meta DIR``, which prints JSON; :func:`meta_shapes` starts it with a
timeout and caches its answer under ``cache_dir()/shapes/<sha256 of config.json>.json``, so each
config is built once per machine. Parameters shared between modules (a tied output layer) are
listed once, as safetensors stores them. A config transformers cannot build (an unknown
``model_type``, remote code) answers None: its size is unknown, as before.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from lab.core.files import cache_dir, write_atomic

TIMEOUT_S = 120.0  # importing transformers and building a 13B model on the meta device takes ~10 s
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding lab/, for the subprocess's import path


def shapes_cache(config_bytes: bytes) -> Path:
    """Where the shapes of the model a config.json describes are kept, by the file's content."""
    return cache_dir() / "shapes" / f"{hashlib.sha256(config_bytes).hexdigest()}.json"


def _valid(answer: Any) -> bool:
    """A cached or printed answer is a mapping of tensor names to lists of non-negative counts."""
    tensors = answer.get("tensors") if isinstance(answer, dict) else None
    return isinstance(tensors, dict) and bool(tensors) and all(
        isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape) for shape in tensors.values())


def meta_build(model_dir: Path, timeout: float = TIMEOUT_S) -> Optional[dict[str, Any]]:
    """``{"tensors": {name: shape}, "no_split": [module class names]}`` of the model ``model_dir``'s
    config.json describes, built on the meta device in a subprocess (cached by the config's content);
    None when it cannot be built within ``timeout`` seconds."""
    config = Path(model_dir) / "config.json"
    try:
        raw = config.read_bytes()
    except OSError:
        return None
    cached = shapes_cache(raw)
    try:
        answer = json.loads(cached.read_text())
        if _valid(answer):
            return answer
    except (OSError, ValueError):
        pass
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([sys.executable, "-m", "lab.models.meta", str(Path(model_dir).resolve())],
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=PACKAGE_ROOT)
        answer = json.loads(done.stdout) if done.returncode == 0 else None
    except (subprocess.SubprocessError, OSError, ValueError):
        return None
    if not _valid(answer):
        return None
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cached, json.dumps(answer))
    return answer


def meta_shapes(model_dir: Path) -> Optional[dict[str, list[int]]]:
    """Every parameter's shape by name, from ``model_dir``'s config.json alone (:func:`meta_build`)."""
    answer = meta_build(model_dir)
    return answer["tensors"] if answer else None


def build(model_dir: Path) -> dict[str, Any]:
    """The subprocess's work: the model built on the meta device, its parameters' shapes (each shared
    one once, under the first name it has) and the decoder layer classes FSDP wraps as units."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False, local_files_only=True)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return {"tensors": {name: list(p.shape) for name, p in model.named_parameters()},
            "no_split": sorted(getattr(model, "_no_split_modules", None) or [])}


def main(argv: list[str]) -> int:
    """``python -m lab.models.meta DIR``: print :func:`build`'s JSON; exit 2 with the reason on stderr."""
    if len(argv) != 1:
        print("usage: python -m lab.models.meta MODEL_DIR", file=sys.stderr)
        return 2
    try:
        answer = build(Path(argv[0]))
    except Exception as e:  # a config transformers refuses: any exception of its, reported, never a traceback
        print(f"config.json: cannot be built: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
