"""Load a causal language model (and its tokenizer) by hub id, local directory, ``bundled``
(:mod:`lab.models.bundled`) or ``scratch`` (:mod:`lab.models.scratch`): whole on one device, or, with
``device_map="auto"``, its layers spread over the GPUs, the CPU and a folder on disk (accelerate's big-model
inference; the fields' checks: :mod:`lab.models.placement`)."""
from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from lab.core.errors import ModelLoadError
from lab.core.hub import hub_reachable
from lab.core.reads import check_folder
from lab.models.bundled import bundled_converted, bundled_model_dir
from lab.models.scratch import default_model
from lab.models.tokenizers import load_tokenizer, offline_hint
from lab.models.weights import BUNDLED, SCRATCH_SIZES, ModelFolderError, check_model_folder

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@contextmanager
def peft_quietly() -> Iterator[None]:
    """Around peft's wrapping of a model (making or loading a LoRA adapter): peft reads
    transformers' ``is_gradient_checkpointing``, which transformers 5 renamed, and the
    FutureWarning it raises would fill every LoRA job's log with what only a peft release can
    fix. Only that warning, and only here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def resolve_model_path(name: str) -> str:
    """Map a user's model name to what ``from_pretrained`` takes: ``bundled``, ``scratch``, a local dir or a hub id."""
    if name == BUNDLED:
        return str(bundled_model_dir())
    if name in SCRATCH_SIZES:
        return str(default_model(name))
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
    device: torch.device  # where its inputs go: the embedding's device (a dispatched model's first GPU, or the CPU)
    dtype: torch.dtype


def input_device(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s inputs go: its embedding's device; for a model whose embedding accelerate offloaded (its
    weight on the meta device), the device its hook runs it on; for a model FSDP offloaded to host memory
    (``fsdp_offload``), the GPU its layers are gathered on."""
    embedding = model.get_input_embeddings()
    if embedding.weight.device.type == "cpu" and torch.cuda.is_available() and _fully_sharded(model):
        return torch.device("cuda", torch.cuda.current_device())  # FSDP's offload: shards in host memory, compute here
    hook_device = getattr(getattr(embedding, "_hf_hook", None), "execution_device", None)
    if embedding.weight.device.type == "meta" and hook_device is not None:
        return torch.device("cuda", hook_device) if isinstance(hook_device, int) else torch.device(hook_device)
    return embedding.weight.device


def _fully_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded by FSDP2 (``fully_shard``, as ``sharding: fsdp`` trains it)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def dispatched(model: torch.nn.Module) -> bool:
    """Whether ``model``'s layers lie on more than one device (``device_map="auto"`` spread them): its outputs may
    then come back on another device than its inputs went to."""
    return len(set(map(str, (getattr(model, "hf_device_map", None) or {}).values()))) > 1


def load_model(
    name: str,
    adapter: Optional[str] = None,
    device: str = "auto",
    dtype: str = "auto",
    merge_adapter: bool = True,
    quantize_4bit: bool = False,
    announce: Optional[Callable[[str], None]] = None,
    revision: Optional[str] = None,
    device_map: str = "none",
    max_memory: Optional[dict[Any, int]] = None,
    offload_folder: Optional[Path] = None,
) -> LoadedModel:
    """Load ``name`` (``bundled``, a local directory or a hub id) for inference.

    ``adapter`` is a PEFT (LoRA) directory; for evaluation it is merged into the weights so the
    forward pass costs the same as the base model's. ``quantize_4bit`` loads NF4 weights through
    bitsandbytes (QLoRA training; CUDA only). ``announce(stage)`` is told of the one-off
    conversion of the bundled model, which makes its first load half a minute longer. ``revision``: a
    hub model's branch or commit (Pythia's ``step1000``: its checkpoints along pre-training).

    ``device_map="auto"`` spreads the layers over the GPUs, the CPU, then ``offload_folder`` (which the caller
    makes and deletes: :func:`lab.models.placement.offload_folder`), each device holding at most its
    ``max_memory`` (bytes by GPU index or ``"cpu"``; a device left out gets what it has free). An adapter is
    merged first, in host memory, as for a model on one device, so the weights and scores are the same.
    """
    from transformers import AutoModelForCausalLM

    if announce is not None and name == BUNDLED and not bundled_converted():
        announce("converting the bundled model (once; about 30 s)")
    path = resolve_model_path(name)
    if Path(path).is_dir():  # checked at submit too; the folder may have changed since (a run's, re-trained)
        try:
            check_model_folder(Path(path))
        except ModelFolderError as e:
            raise ModelFolderError(f"model {Path(name).name!r}: {e}") from None
    torch_device = select_device(device)
    budgets = _budgets(device, max_memory or {}) if device_map == "auto" else None
    if budgets is not None:  # the layers run on the first GPU named, or on the CPU when none is
        torch_device = torch.device("cuda" if any(k != "cpu" and v for k, v in budgets.items()) else "cpu")
    torch_dtype = select_dtype(dtype, torch_device)
    tokenizer = load_tokenizer(path, name)
    extra = {"quantization_config": _nf4_config(torch_device, torch_dtype)} if quantize_4bit else {}
    if revision is not None:
        extra["revision"] = revision
    if device_map == "auto" and adapter is None:
        extra.update(device_map="auto", max_memory=budgets, offload_folder=str(offload_folder))
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=not hub_reachable(), **extra)
    except (OSError, ValueError) as e:
        raise ModelLoadError(offline_hint(name) if path == name else f"Cannot load model {name!r}: {e}") from e
    except (TypeError, KeyError, AttributeError, ZeroDivisionError, IndexError, RecursionError) as e:
        # A hub model's config.json is first read here: values transformers cannot build a model of are the
        # model's fault, not the lab's (a local folder's were checked at submit, lab.models.weights)
        raise ModelLoadError(f"Cannot build model {Path(name).name!r} from its config.json and weights "
                             f"({type(e).__name__}: {str(e)[:200]}); mend its config.json or pick another model") from e
    if adapter is not None:
        model = _attach_adapter(model, adapter, merge_adapter or device_map == "auto")
    if device_map == "auto":
        if adapter is not None:  # merged on the CPU above, as without device_map: then its layers are placed
            model = _dispatch(model, budgets, offload_folder)
        torch_device = input_device(model)
    elif not quantize_4bit:  # a quantised model is placed on the GPU as it loads and refuses .to()
        model.to(torch_device)
    model.eval()
    return LoadedModel(model, tokenizer, name, path, adapter, torch_device, torch_dtype)


def _budgets(device: str, max_memory: dict[Any, int]) -> Optional[dict[Any, int]]:
    """accelerate's ``max_memory`` for a load: None (every device what it has free, accelerate's default) when the
    user named none; else theirs, and each device they left out at what it has free (the CPU at 90 %, the margin
    transformers keeps for itself). ``device: cpu``: the CPU alone. A GPU this job does not see is refused."""
    from accelerate.utils import get_max_memory

    if device != "cpu" and not max_memory:
        return None
    free = get_max_memory()
    free["cpu"] = int(free.get("cpu", 0) * 0.9)
    missing = sorted(k for k in max_memory if k != "cpu" and k not in free)
    if missing:
        seen = sum(1 for k in free if k != "cpu")
        raise ModelLoadError(f"max_memory.{missing[0]}: this job sees {seen} GPU(s) (0 to {seen - 1}); name only those")
    if device == "cpu":
        return {"cpu": max_memory.get("cpu", free["cpu"])}
    return {**free, **max_memory}


def _dispatch(model: torch.nn.Module, budgets: Optional[dict[Any, int]], folder: Optional[Path]) -> torch.nn.Module:
    """``model`` (whole, in host memory) spread as ``from_pretrained(device_map="auto")`` spreads one: balanced over
    the GPUs, never splitting a decoder layer, the rest on the CPU, then written into ``folder``."""
    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = list(model._no_split_modules or [])
    balanced = get_balanced_memory(model, max_memory=budgets, no_split_module_classes=no_split)
    device_map = infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split)
    if set(device_map.values()) == {"disk"}:
        raise ModelLoadError("max_memory: holds no part of the model; give the first GPU (or the CPU) room for at "
                             "least its largest layer")
    model = dispatch_model(model, device_map, offload_dir=str(folder))
    model.hf_device_map = dict(device_map)
    return model


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
