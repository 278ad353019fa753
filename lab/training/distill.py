"""FIRST's student trainer beside its loss (:func:`lab.training.kd_losses.topk_kl_loss`).

The batch carries the teacher's stored top-k (``teacher_ids``, ``teacher_logprobs`` (B, T, k),
aligned with the labels as :mod:`lab.training.kd_losses` describes) next to the usual causal-LM
inputs; :mod:`lab.kinds.first.run` runs it through :func:`lab.training.trainer.run_training`.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import Trainer

from lab.training.tokens import global_token_mean, supervised_positions


class DistillTrainer(Trainer):
    """Knowledge matching: the loss is the top-k KL to the teacher at every supervised position.

    Logits are computed only at those positions (``logits_to_keep`` with a boolean mask): with
    completion-only data that is a few positions per sequence instead of all of them. The loss is
    the mean over every supervised position of the global batch (:func:`global_token_mean`), as
    one process computes it, whatever the ranks and accumulation steps.
    """

    loss_is_scaled_for_ga = False

    def __init__(self, *args, kd_loss: Callable[..., torch.Tensor], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kd_loss = kd_loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        keep = supervised_positions(inputs["labels"])  # (B, T)
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], logits_to_keep=keep)
        logits = outputs.logits.reshape(1, -1, outputs.logits.shape[-1])  # (1, N, V), N = keep.sum()
        ids, logprobs = inputs["teacher_ids"][keep][None], inputs["teacher_logprobs"][keep][None]  # (1, N, k)
        mask = torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device)
        loss = global_token_mean(self, self.kd_loss(logits, ids, logprobs, mask), keep.sum(), num_items_in_batch)
        return (loss, outputs) if return_outputs else loss
