"""Training under FSDP (``sharding: fsdp``): what changes for the lab's trainer around transformers' own.

The job is launched with accelerate's FSDP2 options (:data:`jobs.launch.FSDP_OPTIONS`), which reach the
worker as ``ACCELERATE_USE_FSDP`` and ``FSDP_*`` variables; transformers' Trainer (and TRL's, which are
Trainers) builds accelerate's FSDP plugin from them and shards the model when it prepares it. Three
things are the lab's:

- **loading**: each rank loads the weights into host memory and the Trainer's ``fully_shard`` moves
  only its shard of each layer to its GPU (:func:`load_device`); loading onto the GPU first would need
  the whole model to fit one GPU, which is what sharding is for;
- **validation** runs every question on every rank (:func:`lab.models.distributed.in_lockstep`);
- **the trained weights** are consolidated into one safetensors folder at the end
  (:func:`save_consolidated`), so that ``run:<id>``, evaluate and compare read them as any other run's;
  the checkpoints while training stay sharded (each rank its part of the weights and of AdamW's state,
  through ``torch.distributed.checkpoint``), which is what resuming restores.
"""
from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

from lab.models import distributed
from lab.models.weights import ModelShape, size_text
from lab.training.estimates import TrainingMemory, describe_parts
from lab.training.sharded_memory import sharded_training

FSDP_ENV = "ACCELERATE_USE_FSDP"  # set by ``accelerate launch --use_fsdp`` for every rank
MEASURED_EVENT = "memory_used"  # what a training stage held at its peak, beside the estimate's ``memory`` event


def fsdp_launched() -> bool:
    """Whether this worker was launched with FSDP (``sharding: fsdp``)."""
    return os.environ.get(FSDP_ENV, "false").lower() == "true"


def load_device(device: str) -> str:
    """Where the model to train is loaded: the host under FSDP (the Trainer's ``fully_shard`` then moves each
    rank's shard to its GPU, or leaves it in host memory with ``fsdp_offload``), else ``device``."""
    return "cpu" if fsdp_launched() else device


def fsdp_memory_event(memory: TrainingMemory, shape: ModelShape, cfg: Any, stage: str, longest: int) -> dict[str, Any]:
    """The worker's ``memory`` event for a rank of this FSDP run: the unsharded estimate ``memory`` split over the
    launch's ranks (:func:`lab.training.sharded_memory.sharded_training`), with host memory where the run offloads."""
    offload = os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true"
    placed = sharded_training(memory, shape, cfg.method, distributed.world_size(), offload=offload)
    return {"peak": placed.per_gpu, "host": placed.cpu, **{k.replace(" ", "_"): v for k, v in placed.parts.items()},
            "message": f"{stage}: about {size_text(placed.per_gpu)} per GPU at the peak over "
                       f"{distributed.world_size()} FSDP rank(s){', states offloaded' if offload else ''} "
                       f"({size_text(placed.cpu)} of host memory), batches of {cfg.batch_size} × {longest} tokens "
                       f"(the longest example): {describe_parts(placed.parts)}"}


def save_consolidated(model: Any, target: Path, tokenizer: Any, lora: bool) -> None:
    """Write the trained weights of ``model`` (the Trainer's, sharded in place by FSDP2) into ``target`` as one
    folder: every rank takes part in gathering the full state dict (torch's ``get_model_state_dict``, each tensor
    gathered and moved to host memory, as accelerate's ``get_state_dict`` does for FSDP2), rank 0 writes it with
    ``save_pretrained``: the model's safetensors and config, or a LoRA run's adapter alone."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # Gathered one by one, a tied output layer comes back as a copy of the embedding, which save_pretrained would
    # store twice (it drops a tied key only when both share storage): keep the first name of each parameter.
    first: dict[int, str] = {}
    tied = {name for name, parameter in model.named_parameters(remove_duplicate=False)
            if first.setdefault(id(parameter), name) != name}
    state = {name: tensor for name, tensor in state.items() if name not in tied}
    if distributed.is_main():
        model.save_pretrained(target, state_dict=state)
        if not lora:
            tokenizer.save_pretrained(target)


def measured_peaks(device: Any) -> dict[str, float]:
    """What this rank held at its peak, in bytes: ``gpu``, torch's ``max_memory_allocated`` (what the estimates
    count: no CUDA context, no allocator reserve), on a GPU; ``host``, the process's peak resident memory (where
    ``fsdp_offload`` keeps the weights and AdamW's state). Read on every run, so a job page and the GPU bench
    compare the estimate with the run itself."""
    import torch

    peaks = {"host": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0}  # Linux reports KiB
    if getattr(device, "type", None) == "cuda":
        peaks["gpu"] = float(torch.cuda.max_memory_allocated(device))
    return peaks
