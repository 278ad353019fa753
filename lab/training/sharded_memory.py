"""What each of N GPUs holds when a model is split across them, and what goes to host memory or disk.

:func:`lab.training.estimates.training_memory` counts one data-parallel (DDP) rank: a whole copy of the
weights, gradients and AdamW state on every GPU, 16 bytes a parameter for a full fine-tune: LLaMA-2-7B's
100 GiB fit no GPU. Two ways past that, each counted here from the same terms:

- **training with ``sharding: fsdp``** (accelerate's FSDP2, FULL_SHARD, one unit per decoder layer, bf16
  mixed precision on a GPU): every rank keeps 1/N of the fp32 weights, of their gradients and of AdamW's
  moments (DPO's frozen reference is sharded too). To compute, a unit's parameters are all-gathered in
  bf16 and freed after use; FSDP2 prefetches the next unit, so about :data:`PREFETCH` decoder layers'
  bf16 parameters are whole at once, and in backward also their bf16 gradients until they are
  reduce-scattered. The root unit (embeddings, final norm, output layer) stays gathered from forward
  through backward, with its gradient. The compute copies are FSDP's, so autocast keeps no bf16 copy of
  the weights (the DDP estimate's ``weight copies``). Activations and logits are the rank's own batch:
  unchanged. With ``fsdp_offload`` the sharded weights, gradients and optimizer state live in host
  memory (``cpu``, counted for every rank of the node: the whole 16 B/param) and the GPU holds only the
  gathered units, activations and logits. Host memory is also the larger of that and what loading takes:
  every rank of a node reads the whole model into it before ``fully_shard`` moves its shard to the GPU.
- **inference with ``device_map: auto``**: the weights spread over the job's GPUs (1/N each, within
  ``max_memory``'s per-GPU budget), the rest to host memory up to its ``cpu`` budget, the rest to the
  ``offload_folder`` on disk; each GPU adds the forward pass's headroom to its share.

Plain functions of a :class:`lab.models.weights.ModelShape` and a :class:`TrainingMemory`, no torch: the
web server's pre-flight and ``python -m jobs submit --dry-run`` count with them. tests/jobs/test_dry_run.py
checks the states against torch's own ``fully_shard`` over gloo (each rank's local shards after an AdamW
step).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from lab.core.config import ConfigError
from lab.models.placement import size_bytes
from lab.models.weights import ModelShape
from lab.training.estimates import FP32, Method, TrainingMemory

PREFETCH = 2  # decoder-layer units whole at once: the one computing and the one FSDP2 prefetches
BF16 = 2  # FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16): gathered parameters and unsharded gradients


@dataclass(frozen=True)
class Placement:
    """Bytes one job holds: per GPU at its peak (the CUDA context not included), in host memory (every
    rank of the node together) and on disk (an offload folder), with the per-GPU terms at the peak."""

    per_gpu: float
    cpu: float = 0.0
    disk: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)


def unit_params(shape: ModelShape) -> tuple[float, float]:
    """(parameters of one decoder layer: its linear weights and two norms, parameters outside the decoder
    layers: the root unit's embeddings, final norm and untied output layer)."""
    layer = shape.n_linear / shape.layers + 2 * shape.hidden
    return layer, max(shape.n_params - shape.layers * layer, 0.0)


def _weight_gradients_in_backward(memory: TrainingMemory, shape: ModelShape, method: Method) -> float:
    """The fp32 weight gradients :func:`training_memory`'s ``layer backward`` counts for the top layer and
    the output layer (full training): under FSDP they are the unsharded bf16 gradients of the units in
    flight, counted with them instead."""
    if method == "full":
        return FP32 * shape.n_linear / shape.layers + FP32 * shape.vocab * shape.hidden
    return memory.gradients / shape.layers


def sharded_training(memory: TrainingMemory, shape: ModelShape, method: Method, gpus: int,
                     offload: bool = False) -> Placement:
    """One rank of FSDP full sharding over ``gpus`` GPUs (the module docstring says what is counted), from
    the DDP estimate ``memory`` of the same run; ``offload``: ``fsdp_offload``."""
    n = max(gpus, 1)
    layer, root = unit_params(shape)
    in_flight = PREFETCH * layer + root
    gathered = (BF16 if method == "full" else min(BF16, memory.weights / shape.n_params)) * in_flight
    gathered_grads = BF16 * in_flight if method == "full" else memory.gradients * PREFETCH / shape.layers
    states = memory.weights + memory.gradients + memory.optimizer + memory.reference
    layer_work = max(memory.layer_backward - _weight_gradients_in_backward(memory, shape, method), 0.0)
    reference_pass = 0.0
    if memory.reference_forward:  # its autocast casts replaced by the reference's own gathered units
        casts = 2 * shape.n_linear if method == "full" else 0
        reference_pass = memory.reference_forward - casts + (gathered if memory.reference else 0)
    last = max([("logits", memory.logits), ("layer backward", layer_work), ("reference forward", reference_pass)],
               key=lambda part: part[1])
    held = {} if offload else {"sharded states": states / n}
    backward = {**held, "gathered units": gathered, "unsharded gradients": gathered_grads,
                "weight copies": 0.0 if method == "full" else memory.weight_copies,
                "activations": memory.activations, last[0]: last[1]}
    step = {**held, "gathered units": 0.0}
    parts = max(step, backward, key=lambda moment: sum(moment.values()))
    # Every rank loads the whole model into host memory before fully_shard takes its shard to the GPU (the lab
    # launches without cpu_ram_efficient_loading: jobs.launch.FSDP_OPTIONS), so a node briefly holds N copies.
    loading = n * (memory.weights + memory.reference)
    return Placement(sum(parts.values()), cpu=max(states if offload else 0.0, loading), parts=parts)


def parse_size(value: Any) -> Optional[float]:
    """Bytes of a ``max_memory`` budget as the config declares it (:func:`lab.models.placement.size_bytes`:
    "20GiB", "500MB"); None for anything else (a malformed value sets no budget here: submit refuses it)."""
    if not isinstance(value, str):
        return None
    try:
        return float(size_bytes("max_memory", value))
    except ConfigError:
        return None


def spread_inference(weight_bytes: float, gpus: int, max_memory: Optional[Mapping[Any, Any]] = None,
                     headroom: float = 1.2) -> Placement:
    """``device_map: auto`` over ``gpus`` GPUs: 1/N of the weights each, within ``max_memory``'s budget for
    that GPU (keys "0", "1" …), the rest to host memory within its "cpu" budget, the rest to disk; each
    GPU adds ``headroom`` for the forward pass to its share."""
    budgets = max_memory if isinstance(max_memory, Mapping) else {}
    limit = [parse_size(budgets.get(str(i), budgets.get(i))) for i in range(gpus)]
    share = weight_bytes / gpus if gpus else 0.0
    on_gpu = [share if b is None else min(share, b) for b in limit]
    rest = weight_bytes - sum(on_gpu)
    cpu_budget = parse_size(budgets.get("cpu"))
    cpu = rest if cpu_budget is None else min(rest, cpu_budget)
    top = max(on_gpu, default=0.0)
    return Placement(top * headroom, cpu=cpu, disk=rest - cpu, parts={"weights": top, "headroom": top * (headroom - 1)})
