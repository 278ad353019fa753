"""Where a causal LM's loss is taken, and how a per-token loss is averaged over the tokens of a
global batch: shared by the method trainers (:mod:`lab.training.cft`, :mod:`lab.training.distill`),
which compute their logits only at the supervised positions."""
from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer

from lab.training.data import IGNORE


def supervised_positions(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True at position t when token t+1 has a label, since the logits at t predict
    token t+1 (the causal-LM shift); the method trainers compute logits only there."""
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE
    return keep


def global_token_mean(trainer: Trainer, rank_mean: torch.Tensor, rank_tokens: Any,
                      num_items_in_batch: Any) -> torch.Tensor:
    """A per-token loss averaged over this micro-batch's ``rank_tokens`` tokens, rescaled so that
    what transformers does next — DDP averages the ranks' gradients, the Trainer divides by the
    accumulation steps — yields the mean over every token of the global batch, as one process
    with that whole batch computes it (the plain Trainer's loss does the same through the model).
    ``num_items_in_batch`` is the Trainer's count of those tokens over ranks and accumulation
    steps; without it (a model that takes no loss kwargs) the micro-batch's mean is all there is."""
    if num_items_in_batch is None:
        return rank_mean
    scale = trainer.accelerator.num_processes * trainer.current_gradient_accumulation_steps
    return rank_mean * (rank_tokens * scale / num_items_in_batch)
