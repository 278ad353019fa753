"""This run's memory: the estimate of its peak at its longest example, and what to lower when it ran out."""
from __future__ import annotations

from typing import Any, Optional

import torch
from transformers import TrainingArguments

from lab.models.weights import local_model_shape, size_text
from lab.training.config import TrainConfig
from lab.training.estimates import Precision, describe, memory_advice, training_memory
from lab.training.sharding import fsdp_launched, fsdp_memory_event


def memory_event(cfg: TrainConfig, model, longest: int, args: TrainingArguments, device: torch.device, stage: str,
                 **terms: Any) -> Optional[dict[str, Any]]:
    """The worker's ``memory`` event: :func:`lab.training.estimates.training_memory` of this run at its ``longest``
    example (a batch pads to its longest), split over the ranks when it runs under FSDP
    (:func:`lab.training.sharding.fsdp_memory_event`); None for a model without a local folder and Llama-type config.
    ``terms``: the trainer's own (TRL's: ``trainer``, ``precompute_ref``)."""
    shape = local_model_shape(cfg.model)
    if shape is None or not longest:
        return None
    frozen = [p.element_size() for p in model.parameters() if not p.requires_grad]
    memory = training_memory(shape, cfg.method, cfg.batch_size, longest, run_precision(args, device),
                             frozen[0] if frozen else 4, cfg.lora_r, cfg.lora_dropout, lora_targets=cfg.lora_targets,
                             **terms)
    if fsdp_launched():
        return fsdp_memory_event(memory, shape, cfg, stage, longest)
    where = "per GPU" if device.type == "cuda" else "of RAM"
    return {"peak": memory.peak, **{k.replace(" ", "_"): v for k, v in memory.parts().items()},
            "message": f"{stage}: about {size_text(memory.peak)} {where} at the peak, batches of {cfg.batch_size} × "
                       f"{longest} tokens (the longest example): {describe(memory)}"}


def run_precision(args: TrainingArguments, device: torch.device) -> Precision:
    """How this run computes, for the estimates: bf16 autocast or fp32, and a CUDA device's bool
    dropout masks and Triton-fused head (a CPU keeps masks in the input's dtype and folds in torch)."""
    cuda = device.type == "cuda"
    return Precision(compute=2 if args.bf16 else 4, mask=1 if cuda else 4, triton=cuda)


def out_of_memory_advice(cfg: TrainConfig, args: TrainingArguments, device: torch.device, longest: int,
                         terms: dict[str, Any]) -> str:
    """What to lower for a run that ran out of memory (:func:`lab.training.estimates.memory_advice`),
    with the estimated peak before and after each change when the model's shape can be read; the
    weights' dtype is the job's (bf16 under autocast on a GPU, fp32 on a CPU), as LoRA would load them."""
    return memory_advice(vars(cfg), local_model_shape(cfg.model), longest or None, run_precision(args, device),
                         2 if args.bf16 else 4, **terms)
