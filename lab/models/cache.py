"""Models kept loaded between requests within a memory budget: what makes a warm compare fast.

An interactive lane answers request after request with the same few models. Loading one costs
seconds and using a loaded one milliseconds, so the lane keeps what it loaded and, when a new model
would not fit in its budget, unloads the least recently used first.

An adapter (LoRA) is attached to its base model through PEFT's multi-adapter API and switched on
per request (``set_adapter``; ``disable_adapter`` for the bare base). A base model with three
adapters is therefore in memory once. Each adapter is an entry of its own: it can be evicted before
its base, and evicting a base evicts its adapters with it. Adapters are not merged, which costs a
little per forward pass and keeps the base reusable.
"""
from __future__ import annotations

import contextlib
import gc
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Optional

import psutil
import torch

from lab.core.errors import ModelLoadError
from lab.models.loading import LoadedModel, load_model, peft_quietly, select_device, select_dtype
from lab.models.weights import BYTES, count_parameters, local_model_dir, size_text

HEADROOM = 1.2  # what a forward pass needs beyond the weights, as in jobs.preflight
CPU_SHARE = 0.25  # default budget on the CPU: a quarter of the machine's RAM
GPU_SHARE = 0.5  # default budget on a GPU: half of it, the rest is the training jobs'


class DoesNotFit(ModelLoadError):
    """A model larger than the budget, or than the memory the device has free: the message says what to free."""


def default_budget(device: torch.device) -> int:
    """Bytes the lane may hold when the operator sets no budget."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * GPU_SHARE)
    return int(psutil.virtual_memory().total * CPU_SHARE)


def free_memory(device: torch.device) -> int:
    """Bytes the device has free now (RAM for the CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def footprint(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (a LoRA's included once attached)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _estimate(model: str, dtype: torch.dtype) -> Optional[int]:
    """Bytes ``model`` will take loaded in ``dtype``, from its safetensors headers; None when unknown
    (a hub id, a ``.bin`` checkpoint, or the bundled model before its first conversion)."""
    path = local_model_dir(model)
    n = count_parameters(path) if path else None
    width = BYTES.get(str(dtype).removeprefix("torch."), 4)
    return int(n * width * HEADROOM) if n else None


def _adapter_estimate(adapter: str) -> int:
    return sum(p.stat().st_size for p in Path(adapter).glob("adapter_model.*"))


@dataclass
class Entry:
    """One thing held: a base model (``adapter`` None) or an adapter attached to ``base``."""

    base: str
    adapter: Optional[str]
    size: int
    loaded: Optional[LoadedModel] = None  # a base's model; its adapters share it
    adapters: dict[str, str] = field(default_factory=dict)  # a base's attached adapters: path -> PEFT name
    last_used: float = field(default_factory=time.time)

    @property
    def label(self) -> str:
        return f"{self.base} + {Path(self.adapter).name}" if self.adapter else self.base


class ModelCache:
    """Loaded models and adapters, least recently used first, within ``budget`` bytes.

    :meth:`use` is the only way in: it loads what is missing (making room first) and yields the
    model with the right adapter switched on. What a request uses is pinned while it does.
    ``load`` is :func:`lab.models.loading.load_model` (a test may count its calls).
    """

    def __init__(self, device: str = "auto", dtype: str = "auto", budget: Optional[int] = None,
                 load: Callable[..., LoadedModel] = load_model) -> None:
        self.device = select_device(device)
        self.dtype = select_dtype(dtype, self.device)
        self.budget = default_budget(self.device) if budget is None else int(budget)
        self._load = load
        self._entries: OrderedDict[tuple[str, Optional[str]], Entry] = OrderedDict()  # LRU first
        self._pinned: set[tuple[str, Optional[str]]] = set()

    # ------------------------------------------------------------ what is held
    @property
    def used(self) -> int:
        return sum(e.size for e in self._entries.values())

    def held(self) -> list[Entry]:
        """What is loaded, least recently used first (the order of eviction)."""
        return list(self._entries.values())

    def describe(self) -> str:
        """What is loaded, with sizes: what a user may free."""
        if not self._entries:
            return "nothing is loaded"
        return ", ".join(f"{e.label} ({size_text(e.size)})" for e in reversed(self._entries.values()))

    # ------------------------------------------------------------ use
    @contextlib.contextmanager
    def use(self, model: str, adapter: Optional[str] = None,
            announce: Optional[Callable[[str], None]] = None) -> Iterator[LoadedModel]:
        """The model ``model`` with ``adapter`` (a PEFT directory) on, or with every adapter off."""
        adapter = str(Path(adapter).expanduser().resolve()) if adapter else None
        base = self._base(model, announce)
        keys = {(model, None)} | ({(model, adapter)} if adapter else set())
        self._pinned |= keys
        try:
            loaded = base.loaded
            if adapter:
                self._attach(base, adapter, announce)
                loaded.model.set_adapter(base.adapters[adapter])
                yield replace(loaded, adapter=adapter)
            elif base.adapters:
                with loaded.model.disable_adapter():
                    yield loaded
            else:
                yield loaded
        finally:
            self._pinned -= keys

    def _touch(self, key: tuple[str, Optional[str]]) -> Entry:
        entry = self._entries[key]
        entry.last_used = time.time()
        self._entries.move_to_end(key)
        return entry

    def _base(self, model: str, announce: Optional[Callable[[str], None]]) -> Entry:
        if (model, None) in self._entries:
            return self._touch((model, None))
        need = _estimate(model, self.dtype)
        self._make_room(model, need)
        if announce:
            announce(f"loading {model}")
        try:
            loaded = self._load(model, device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
                                announce=announce)
        except (MemoryError, torch.OutOfMemoryError) as e:
            raise DoesNotFit(self._no_room(model, need)) from e
        size = footprint(loaded.model)
        if size > self.budget:  # no estimate beforehand (a hub id, .bin weights): known only now
            del loaded
            gc.collect()
            raise DoesNotFit(self._no_room(model, size))
        entry = Entry(model, None, size, loaded)
        self._entries[(model, None)] = entry
        self._make_room(model, 0, keep=(model, None))  # the estimate may have been low, or absent
        return entry

    def _attach(self, base: Entry, adapter: str, announce: Optional[Callable[[str], None]]) -> None:
        from peft import PeftModel

        key = (base.base, adapter)
        if key in self._entries:
            self._touch(key)
            return
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise ModelLoadError(f"Adapter {adapter!r} is not a PEFT directory (no adapter_config.json found there).")
        self._make_room(f"{base.base} + {Path(adapter).name}", _adapter_estimate(adapter))
        if announce:
            announce(f"attaching {Path(adapter).name} to {base.base}")
        loaded, name = base.loaded, f"a{len(base.adapters)}_{abs(hash(adapter)) % 10**8}"
        before = footprint(loaded.model)
        try:
            if isinstance(loaded.model, PeftModel):
                loaded.model.load_adapter(adapter, adapter_name=name)
            else:
                with peft_quietly():
                    loaded.model = PeftModel.from_pretrained(loaded.model, adapter, adapter_name=name)
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            raise ModelLoadError(f"Adapter {adapter!r} does not fit {base.base}: {e}") from e
        loaded.model.to(self.device).eval()
        base.adapters[adapter] = name
        self._entries[key] = Entry(base.base, adapter, max(footprint(loaded.model) - before, 0))

    # ------------------------------------------------------------ eviction
    def _make_room(self, label: str, need: Optional[int], keep: Optional[tuple[str, Optional[str]]] = None) -> None:
        """Unload the least recently used (never what is pinned, nor ``keep``) until ``need`` more bytes
        fit the budget; refuse what is larger than the budget or than the device has free."""
        need = need or 0
        if need > self.budget:
            raise DoesNotFit(self._no_room(label, need))
        for key in list(self._entries):
            if self.used + need <= self.budget:
                break
            if key not in self._pinned and key != keep and key in self._entries:
                self.evict(*key)
        if need > free_memory(self.device):
            raise DoesNotFit(self._no_room(label, need))

    def evict(self, model: str, adapter: Optional[str] = None) -> None:
        """Unload an adapter (detached from its base) or a base model with all its adapters."""
        if adapter is None:
            base = self._entries.pop((model, None))
            for path in list(base.adapters):
                self._entries.pop((model, path), None)
            base.loaded = None
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return
        self._entries.pop((model, adapter))
        base = self._entries[(model, None)]
        peft_model = base.loaded.model
        name = base.adapters.pop(adapter)
        if base.adapters:
            peft_model.delete_adapter(name)
        else:  # the last one: back to the plain model, LoRA layers removed
            base.loaded.model = peft_model.unload()

    def _no_room(self, label: str, need: Optional[int]) -> str:
        size = f"about {size_text(need)}" if need else "more memory than is free"
        return (f"{label} needs {size}; the inference lane may hold {size_text(self.budget)} on "
                f"{self.device} and the device has {size_text(free_memory(self.device))} free. Loaded now: "
                f"{self.describe()}. Free memory by stopping a job that uses this device, compare fewer or "
                f"smaller models (or in bfloat16), or start the app with a larger --lane-memory.")
