"""The CFT-family trainers beside their losses (:mod:`lab.training.cft_losses`), driven by
:func:`lab.training.trainer.finetune` for ``objective: label_smoothing`` and ``objective: rcft``.

Plain CFT needs no trainer of its own: it is transformers' ``Trainer`` (cross-entropy) on
completion-only labels. Both trainers here read the option letters at the answer position from
the batch (``OPTION_KEYS``, made by :func:`lab.training.data.pad_option_batch`), log their loss
components as ``loss_<name>`` (and RCFT the share of rows whose M-step targets rank another option
first, as ``rank_violations``). Their per-token terms are means over every supervised token of
the global batch (:func:`lab.training.tokens.global_token_mean`), as one process computes them
whatever the ranks and accumulation steps; RCFT's regulariser is a mean over the micro-batch's
questions (``loss_is_scaled_for_ga = False``: transformers divides by the accumulation steps).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from transformers import Trainer, TrainerCallback

from lab.calibration import metrics
from lab.calibration.checks import BinEdges
from lab.training.cft_losses import (bin_accuracy, bin_index, ece_regulariser, option_smoothing_loss,
                                     rank_preserving_targets, rcft_loss)
from lab.training.config import LambdaScale
from lab.training.tokens import global_token_mean, supervised_positions

OPTION_KEYS = ("answer_pos", "option_ids", "option_mask", "answer")


def _answer_logits(logits: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, V) logits at each row's answer position."""
    return logits[torch.arange(len(logits), device=logits.device), inputs["answer_pos"]]


class _PartsLogging:
    """Averages a trainer's loss components (and other per-batch figures) between two logging
    steps, under the keys given, which :class:`lab.training.callbacks.LabCallback` passes on in its
    events."""

    def _record(self, **parts: torch.Tensor) -> None:
        sums = self.__dict__.setdefault("_parts", {})
        for name, value in parts.items():
            total, count = sums.get(name, (0.0, 0))
            sums[name] = (total + float(value.detach()), count + 1)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            logs = {**logs, **{k: t / max(c, 1) for k, (t, c) in self.__dict__.pop("_parts", {}).items()}}
        super().log(logs, *args, **kwargs)


class LabelSmoothingTrainer(_PartsLogging, Trainer):
    """Cross-entropy on every supervised token, with smoothed targets over the option letters at
    the answer position (ε spread evenly over the question's options); ε = 0 is plain SFT."""

    loss_is_scaled_for_ga = False

    def __init__(self, *args, epsilon: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epsilon = epsilon

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        extra = {k: inputs.pop(k) for k in OPTION_KEYS}
        labels = inputs.pop("labels")
        keep = supervised_positions(labels)  # (B, T)
        # Logits only where there is a loss (DistillTrainer does the same): (N, V), not (B, T, V).
        outputs = model(**inputs, logits_to_keep=keep)
        logits = outputs.logits.reshape(-1, outputs.logits.shape[-1])
        token_loss = torch.nn.functional.cross_entropy(logits.float(), labels[:, 1:][keep[:, :-1]], reduction="none")
        rows = torch.arange(len(labels), device=labels.device)
        answer_row = keep.flatten().cumsum(0).reshape(keep.shape)[rows, extra["answer_pos"]] - 1  # its row in (N, V)
        smoothed = option_smoothing_loss(logits[answer_row], extra["option_ids"], extra["option_mask"], extra["answer"],
                                         self.epsilon)
        token_loss = token_loss.index_put((answer_row,), smoothed)
        self._record(loss_answer=smoothed.mean())
        loss = global_token_mean(self, token_loss.mean(), token_loss.numel(), num_items_in_batch)
        return (loss, outputs) if return_outputs else loss


class RCFTTrainer(_PartsLogging, Trainer):
    """``L = L_SFT + λ·L_ECE`` from one forward pass (REFERENCE.md §3), on the scale ``lambda_scale``
    names (:func:`lab.training.cft_losses.rcft_loss`).

    ``L_SFT`` is the model's mean cross-entropy over the supervised tokens (prompt + answer for
    RCFT); ``L_ECE`` is :func:`lab.training.cft_losses.ece_regulariser` on the option logits at the answer
    position. The E-step (``estep``: option probabilities of every training question under the
    current model) runs before the first step and then every epoch, or every ``estep_steps`` steps
    — the released code computes it once; the bins must follow the model as it trains. Each
    E-step also reports the share of training questions whose M-step targets would rank another
    option above the current top (A.4's condition on acc), and each logged step the batch's share.
    """

    loss_is_scaled_for_ga = False

    def __init__(self, *args, ece_lambda: float, n_bins: int, estep_steps: Optional[int],
                 estep: Callable[[Any], list], answers: Sequence[int], on_estep: Callable[..., None],
                 lambda_scale: LambdaScale = "paper", bin_edges: BinEdges = "right", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ece_lambda, self.n_bins, self.estep_steps = ece_lambda, n_bins, estep_steps
        self.lambda_scale, self.bin_edges = lambda_scale, bin_edges
        self._estep, self._answers, self._on_estep = estep, list(answers), on_estep
        self.bin_acc: Optional[torch.Tensor] = None
        self.bin_counts: Optional[torch.Tensor] = None
        self.add_callback(_EStep(self))

    def run_estep(self) -> None:
        probs = self._estep(self.model)
        padded, mask = metrics.padded([list(p) for p in probs])
        padded, mask = torch.from_numpy(padded), torch.from_numpy(mask)
        confidence = padded.max(dim=-1).values
        correct = padded.argmax(dim=-1) == torch.tensor(self._answers)
        self.bin_acc, self.bin_counts = bin_accuracy(confidence, correct, self.n_bins, self.bin_edges)
        acc = self.bin_acc[bin_index(confidence, self.n_bins, self.bin_edges)]
        known = ~torch.isnan(acc)
        _, keeps_top = rank_preserving_targets(torch.log(padded[known]), mask[known], acc[known])
        self._on_estep(step=self.state.global_step, epoch=round(self.state.epoch or 0, 3),
                       accuracy=[None if torch.isnan(a) else round(float(a), 4) for a in self.bin_acc],
                       counts=[int(c) for c in self.bin_counts], confidence=round(float(confidence.mean()), 4),
                       train_accuracy=round(float(correct.double().mean()), 4),
                       rank_violations=round(float((~keeps_top).double().mean()), 4) if len(keeps_top) else 0.0)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        extra = {k: inputs.pop(k) for k in OPTION_KEYS}
        outputs = model(**inputs)
        sft = global_token_mean(self, outputs.loss, supervised_positions(inputs["labels"]).sum(), num_items_in_batch)
        answer_logits = _answer_logits(outputs.logits, extra)
        option_logits = answer_logits.gather(1, extra["option_ids"].clamp(min=0))
        if self.bin_acc is None:
            regulariser, violations = option_logits.sum() * 0.0, torch.zeros(1, dtype=torch.bool)
        else:
            counts = self.bin_counts if self.lambda_scale == "released" else None
            regulariser, violations = ece_regulariser(option_logits, extra["option_mask"], self.bin_acc, counts,
                                                      self.bin_edges)
        loss = rcft_loss(sft, regulariser, self.ece_lambda, self.lambda_scale)
        self._record(loss_sft=outputs.loss, loss_ece=regulariser, rank_violations=violations.double().mean())
        return (loss, outputs) if return_outputs else loss


class _EStep(TrainerCallback):
    """Runs the RCFT trainer's E-step at the start of every epoch, or every ``estep_steps`` steps."""

    def __init__(self, trainer: RCFTTrainer) -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.trainer.estep_steps is None or self.trainer.bin_acc is None:
            self.trainer.run_estep()

    def on_step_begin(self, args, state, control, **kwargs):
        every = self.trainer.estep_steps
        if every and state.global_step > 0 and state.global_step % every == 0:
            self.trainer.run_estep()
