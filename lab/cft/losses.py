"""RCFT's ECE regulariser and the option-level label-smoothing loss, on small tensors.

Everything works on the answer position only: ``option_logits`` (B, K) are the model's logits of
the option letters there, ``mask`` (B, K) marks real options (questions have 2–5), ``answer``
(B,) the correct option. Confidence is the softmax over the option letters (REFERENCE.md §3).

RCFT (``cft_rcft_restoring_calibration.txt`` §4 and A.4) minimises ``L_SFT + λ·L_ECE`` with an EM
view of ECE:

* E-step (:func:`bin_accuracy`): bin the training questions by the model's current max-confidence
  (M equal-width bins) and measure each bin's accuracy ``acc_m``. The trainer recomputes it every
  epoch, or every N steps.
* M-step (:func:`ece_regulariser`): pull each question's max-probability to its bin's accuracy
  and the other options to :func:`rank_preserving_targets` (squared error, summed over options).
"""
from __future__ import annotations

import math

import torch

LN3 = math.log(3.0)
EPS = 1e-6  # keeps γ finite when p₂ = 0 or acc = 1


def option_probs(option_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the real options of each row (padded options get probability 0)."""
    return torch.softmax(option_logits.float().masked_fill(~mask, float("-inf")), dim=-1)


def bin_accuracy(confidence: torch.Tensor, correct: torch.Tensor, n_bins: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """E-step: (accuracy, count) per equal-width confidence bin; an empty bin's accuracy is NaN.

    Bins are ``[0, 1/M), …, [(M-1)/M, 1]`` (the last closed), the same as :func:`lab.metrics.ece`.
    """
    index = bin_index(confidence, n_bins)
    counts = torch.bincount(index, minlength=n_bins).double()
    hits = torch.bincount(index, weights=correct.double(), minlength=n_bins)
    accuracy = torch.where(counts > 0, hits / counts.clamp(min=1), torch.full_like(counts, float("nan")))
    return accuracy, counts


def bin_index(confidence: torch.Tensor, n_bins: int) -> torch.Tensor:
    return (confidence.detach().double() * n_bins).long().clamp(0, n_bins - 1)


def rank_preserving_targets(probs: torch.Tensor, mask: torch.Tensor, accuracy: torch.Tensor) -> torch.Tensor:
    """The M-step's target distribution per row (A.4 of the paper, for any number of options).

    The top option's target is the bin accuracy ``acc``; every other option j gets
    ``t_j = a·tanh(γ p_j) + b`` with ``γ = ln 3 / (p₂ (1 − acc))`` (p₂: the second-largest
    probability) and ``b = 0``, ``a = (1 − acc) / Σ_j tanh(γ p_j)`` (the paper's simplified
    solution), so the non-top targets sum to ``1 − acc`` and keep their order (tanh is increasing
    and a > 0). If every non-top probability is 0 the remainder is shared equally.
    """
    probs = probs.detach().double()
    acc = accuracy.double().clamp(0.0, 1.0)
    top = probs.masked_fill(~mask, -1.0).argmax(dim=-1)
    others = mask.clone()
    others[torch.arange(len(top)), top] = False
    rest = probs.masked_fill(~others, 0.0)
    p2 = rest.max(dim=-1).values
    remainder = 1.0 - acc
    gamma = LN3 / (p2.clamp(min=EPS) * remainder.clamp(min=EPS))
    squashed = torch.tanh(gamma[:, None] * rest).masked_fill(~others, 0.0)
    total = squashed.sum(dim=-1, keepdim=True)
    n_others = others.sum(dim=-1, keepdim=True).clamp(min=1)
    shares = torch.where(total > 0, squashed / total.clamp(min=EPS * EPS), others.double() / n_others)
    targets = remainder[:, None] * shares
    targets[torch.arange(len(top)), top] = acc
    return targets.masked_fill(~mask, 0.0)


def ece_regulariser(probs: torch.Tensor, mask: torch.Tensor, accuracy_per_bin: torch.Tensor) -> torch.Tensor:
    """M-step loss: mean over rows of Σ_options (p − target)², targets from the E-step's bins.

    A row is binned by its current max-confidence. Rows falling in a bin that was empty at the
    E-step have no accuracy to move to and contribute 0.
    """
    n_bins = len(accuracy_per_bin)
    confidence = probs.masked_fill(~mask, 0.0).max(dim=-1).values
    acc = accuracy_per_bin.to(probs.device)[bin_index(confidence, n_bins)]
    known = ~torch.isnan(acc)
    if not known.any():
        return probs.sum() * 0.0
    targets = rank_preserving_targets(probs[known], mask[known], acc[known]).to(probs.dtype)
    squared = ((probs[known] - targets) ** 2).masked_fill(~mask[known], 0.0).sum(dim=-1)
    return squared.sum() / len(probs)


def smoothed_targets(answer: torch.Tensor, mask: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``(1 − ε)`` on the answer plus ``ε`` spread evenly over the question's options."""
    n_options = mask.sum(dim=-1, keepdim=True).double()
    targets = mask.double() * (epsilon / n_options)
    targets[torch.arange(len(answer)), answer] += 1.0 - epsilon
    return targets


def option_smoothing_loss(answer_logits: torch.Tensor, option_ids: torch.Tensor, mask: torch.Tensor,
                          answer: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Per-row cross-entropy of the full-vocabulary softmax against smoothed option targets.

    ``answer_logits`` (B, V) are the logits at the answer position. The smoothing mass goes to the
    other option *letters*, not the whole vocabulary (transformers' ``label_smoothing_factor``
    would spread it over 49k tokens the model should never say). ε = 0 is plain cross-entropy.
    """
    log_p = torch.log_softmax(answer_logits.float(), dim=-1)
    option_log_p = log_p.gather(1, option_ids.clamp(min=0))
    targets = smoothed_targets(answer, mask, epsilon).to(log_p.dtype)
    return -(targets * option_log_p.masked_fill(~mask, 0.0)).sum(dim=-1)
