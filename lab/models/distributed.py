"""The ranks of a multi-process launch as the lab's own code sees them; identities in one process.

Under ``accelerate launch --num_processes N`` every rank runs the same config. Inside a
``Trainer`` transformers and accelerate split the batches and average the gradients; the work
around it is ours: validation, RCFT's E-step and the teacher's extraction are split across ranks
here and put back together in order (every rank then holds the whole result, as one process would),
only rank 0 writes, and a stop request is agreed on so that no rank waits in a collective for one
that stopped. The process group is accelerate's (:class:`accelerate.PartialState`): NCCL on GPUs,
gloo on a CPU.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
WAIT_POLL_S = 0.5  # how often a rank waiting for rank 0's file looks for it


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def _state():
    """accelerate's process state, joining the process group on first use. Where no GPU is visible
    (a CPU job sees none, :func:`jobs.launch.job_env`) it must be told ``cpu``, or it would take the
    ranks for one process; then they join over gloo, as the Trainer's ``use_cpu`` does."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def barrier() -> None:
    if world_size() > 1:
        _state().wait_for_everyone()


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share: every ``world_size``-th item from its rank on (balanced within one item)."""
    return list(items[rank()::world_size()])


def gather(local: Sequence[R], n: int) -> list[R]:
    """The results of :func:`shard`'s shares from every rank, back in the original order of ``n`` items."""
    size = world_size()
    if size == 1:
        return list(local)
    import torch.distributed as dist

    _state()
    parts: list = [None] * size
    dist.all_gather_object(parts, list(local))
    whole: list = [None] * n
    for r, part in enumerate(parts):
        whole[r::size] = part
    return whole


def map_sharded(fn: Callable[[list[T]], Sequence[R]], items: Sequence[T], lockstep: bool = False) -> list[R]:
    """``fn(items)`` computed as ``fn`` of each rank's share, gathered in order on every rank; ``lockstep``
    (a model sharded with FSDP, :func:`in_lockstep`): every rank computes all of it, since each forward pass
    gathers the layers from every rank and a rank with a smaller share would leave the others waiting."""
    if lockstep:
        return list(fn(list(items)))
    return gather(fn(shard(items)), len(items))


def in_lockstep(model: object) -> bool:
    """Whether ``model`` is sharded across the ranks (FSDP2's ``fully_shard``): its forward passes are
    collectives, so every rank must run the same ones."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed support
        return False
    return isinstance(model, FSDPModule)


def agree(flag: bool) -> bool:
    """True on every rank if it is True on any: a stop seen by one rank stops them all at the same step."""
    if world_size() == 1:
        return flag
    import torch
    import torch.distributed as dist

    state = _state()
    value = torch.tensor([int(flag)], device=state.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def wait_for(path: Path) -> None:
    """Wait, without a collective (which would time out during a long evaluation), until rank 0 has
    written ``path``. If rank 0 fails instead, the launcher ends this rank with it."""
    while not Path(path).exists():
        time.sleep(WAIT_POLL_S)
