"""RCFT's ECE regulariser and the option-level label-smoothing loss, on small tensors.

Everything works on the answer position only: ``option_logits`` (B, K) are the model's logits of
the option letters there, ``mask`` (B, K) marks real options (questions have 2–5), ``answer``
(B,) the correct option. Confidence is the softmax over the option letters (REFERENCE.md §3).

RCFT (``cft_rcft_restoring_calibration.txt`` §5.2 and A.4) minimises ``L_SFT + λ·L_ECE`` with an
EM view of ECE:

* E-step (:func:`bin_accuracy`): bin the training questions by the model's current max-confidence
  (M equal-width bins, exactly :func:`lab.calibration.metrics.bin_indices`' bins) and measure each bin's
  accuracy ``acc_m``. The trainer recomputes it every epoch, or every N steps.
* M-step (:func:`ece_regulariser`): pull each question's max-probability to its bin's accuracy
  and the other options to :func:`rank_preserving_targets` (squared error, summed over options).

``lambda_scale`` says how λ weighs the two terms: ``"paper"`` is ``L_SFT + λ·L_ECE`` with L_ECE the
batch mean of the squared errors; ``"released"`` is the authors' code,
``(1 − λ)·L_SFT + λ·10⁻³·Σ_m Σ_{i ∈ batch ∩ B_m} ‖p_i − t_i‖² / N_m`` with N_m the E-step's count
of bin m over the whole training set (λ ≤ 1; λ = 1 is "ECE only").
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from lab.calibration import metrics
from lab.calibration.checks import BinEdges

LN3 = math.log(3.0)  # atanh(0.8): γ maps the second-largest option to tanh(ln 3 / (1 − acc)) ≥ 0.8
RELEASED_SCALE = 1e-3  # the released code's factor on its calibration loss


def option_probs(option_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the real options of each row (padded options get probability 0)."""
    return torch.softmax(option_logits.float().masked_fill(~mask, float("-inf")), dim=-1)


def bin_accuracy(confidence: torch.Tensor, correct: torch.Tensor, n_bins: int = 10,
                 edges: BinEdges = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """E-step: (accuracy, count) per equal-width confidence bin; an empty bin's accuracy is NaN.

    The bins are :func:`lab.calibration.metrics.bin_indices`' (``edges`` as there), so the E-step pulls each
    question towards the accuracy of the bin the reported ECE puts it in.
    """
    index = bin_index(confidence, n_bins, edges)
    counts = torch.bincount(index, minlength=n_bins).double()
    hits = torch.bincount(index, weights=correct.double(), minlength=n_bins)
    accuracy = torch.where(counts > 0, hits / counts.clamp(min=1), torch.full_like(counts, float("nan")))
    return accuracy, counts


def bin_index(confidence: torch.Tensor, n_bins: int, edges: BinEdges = "right") -> torch.Tensor:
    """The ECE's bin of each confidence, computed by :func:`lab.calibration.metrics.bin_indices` itself: a
    second formula (``floor(c·M)``) disagreed with it on edges such as 0.3 and 0.7."""
    index = metrics.bin_indices(confidence.detach().double().cpu().numpy(), n_bins, edges=edges)
    return torch.from_numpy(index).to(confidence.device)


def rank_preserving_targets(log_probs: torch.Tensor, mask: torch.Tensor,
                            accuracy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The M-step's target distribution per row (A.4 of the paper, any number of options), and
    whether it keeps the top option on top.

    The top option's target is the bin accuracy ``acc``; each of the K − 1 other options gets
    ``t_j = a·tanh(γ p_j) + b`` with ``γ = ln 3 / (p₂ (1 − acc))`` (p₂: the second-largest
    probability) and A.4's simplified solution ``a = b = (1 − acc) / (Σ_j tanh(γ p_j) + K − 1)``,
    as in the authors' code: the non-top targets sum to ``1 − acc`` and keep their order.

    ``γ p_j = ln 3 · (p_j / p₂) / (1 − acc)`` depends only on the ratios ``p_j / p₂``, taken here
    from log-probabilities (``log_probs`` (B, K), e.g. ``log_softmax`` of the option logits), so
    the targets are the same at any scale: a model sure to 1 − 1e-20 of its top option still gets
    the formula's targets, and they sum to 1. When every other option has probability 0 the
    ratios are 0 and the remainder is shared equally; when acc = 1 the others get 0.

    A.4 keeps the top on top only when ``acc ≥ max_j t_j``, i.e. ``acc ≥ (1 + τ₂)/(S + K + τ₂)``
    with ``τ₂ = tanh(γ p₂)`` and ``S = Σ_j tanh(γ p_j)`` (conservatively acc ≥ 2/(K + 2), 1/3 for
    four options). Below it the mapping still sums to 1 but ranks another option first; the
    returned ``keeps_top`` (B,) bool says, row by row, so the trainer can report the share.
    """
    log_probs = log_probs.detach().double().masked_fill(~mask, float("-inf"))
    acc = accuracy.double().clamp(0.0, 1.0)
    rows = torch.arange(len(log_probs), device=log_probs.device)
    top = log_probs.argmax(dim=-1)
    others = mask.clone()
    others[rows, top] = False
    rest = log_probs.masked_fill(~others, float("-inf"))
    log_p2 = rest.max(dim=-1, keepdim=True).values  # -inf when no other option has mass
    ratio = torch.where(others & torch.isfinite(log_p2), torch.exp(rest - log_p2), 0.0)
    remainder = 1.0 - acc
    # acc = 1 makes γ infinite, but then a = b = 0: any finite stand-in gives the same targets
    squashed = torch.tanh(LN3 * ratio / torch.where(remainder > 0, remainder, 1.0)[:, None])
    n_others = others.sum(dim=-1)
    a = remainder / (squashed.sum(dim=-1) + n_others).clamp(min=1)  # n_others ≥ 1 whenever a row has 2 options
    targets = torch.where(others, a[:, None] * (squashed + 1.0), 0.0)
    keeps_top = acc >= targets.max(dim=-1).values
    targets[rows, top] = acc
    return targets.masked_fill(~mask, 0.0), keeps_top


def ece_regulariser(option_logits: torch.Tensor, mask: torch.Tensor, accuracy_per_bin: torch.Tensor,
                    counts_per_bin: Optional[torch.Tensor] = None,
                    edges: BinEdges = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """M-step loss and the rows whose targets break the rank (``keeps_top`` false), per batch.

    A row is binned by its current max-confidence (``edges`` as the E-step's); rows falling in a
    bin that was empty at the E-step have no accuracy to move to and contribute 0. Without
    ``counts_per_bin`` the loss is the batch mean of ``Σ_options (p − t)²`` (the paper's MSE);
    with them (the released code's scale) each row's term is divided by its bin's E-step count
    N_m instead of the batch size. Returns ``(loss, violations)``, violations (B,) bool.
    """
    probs = option_probs(option_logits, mask)
    n_bins = len(accuracy_per_bin)
    confidence = probs.masked_fill(~mask, 0.0).max(dim=-1).values
    index = bin_index(confidence, n_bins, edges)
    acc = accuracy_per_bin.to(probs.device)[index]
    known = ~torch.isnan(acc)
    violations = torch.zeros(len(probs), dtype=torch.bool, device=probs.device)
    if not known.any():
        return probs.sum() * 0.0, violations
    log_probs = torch.log_softmax(option_logits.double().masked_fill(~mask, float("-inf")), dim=-1)
    targets, keeps_top = rank_preserving_targets(log_probs[known], mask[known], acc[known])
    violations[known] = ~keeps_top
    squared = ((probs[known] - targets.to(probs.dtype)) ** 2).masked_fill(~mask[known], 0.0).sum(dim=-1)
    if counts_per_bin is None:
        return squared.sum() / len(probs), violations
    weight = 1.0 / counts_per_bin.to(probs.device)[index[known]].clamp(min=1)
    return (squared * weight.to(squared.dtype)).sum(), violations


def rcft_loss(sft: torch.Tensor, regulariser: torch.Tensor, ece_lambda: float, scale: str) -> torch.Tensor:
    """``L_SFT + λ·L_ECE`` (``scale="paper"``) or ``(1 − λ)·L_SFT + λ·10⁻³·L_ECE`` (``"released"``,
    the authors' code, with ``regulariser`` normalised per bin: :func:`ece_regulariser`)."""
    if scale == "released":
        return (1.0 - ece_lambda) * sft + ece_lambda * RELEASED_SCALE * regulariser
    return sft + ece_lambda * regulariser


def smoothed_targets(answer: torch.Tensor, mask: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``1 − ε`` on the answer and ``ε`` shared evenly by the question's other options: the CFT
    paper's label smoothing (Müller et al. 2019), which gives the remaining classes the ε. (A
    question with one option keeps all its mass.)"""
    rows = torch.arange(len(answer), device=answer.device)
    others = mask.clone()
    others[rows, answer] = False
    n_others = others.sum(dim=-1, keepdim=True).double()
    targets = torch.where(others, epsilon / n_others.clamp(min=1), 0.0)
    targets[rows, answer] = torch.where(n_others[:, 0] > 0, 1.0 - epsilon, 1.0).double()
    return targets


def option_smoothing_loss(answer_logits: torch.Tensor, option_ids: torch.Tensor, mask: torch.Tensor,
                          answer: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Per-row cross-entropy of the full-vocabulary softmax against smoothed option targets.

    ``answer_logits`` (B, V) are the logits at the answer position. The smoothing mass goes to the
    other option *letters* (:func:`smoothed_targets`), not the whole vocabulary (transformers'
    ``label_smoothing_factor`` would spread it over 49k tokens the model should never say). ε = 0
    is plain cross-entropy.
    """
    log_p = torch.log_softmax(answer_logits.float(), dim=-1)
    option_log_p = log_p.gather(1, option_ids.clamp(min=0))
    targets = smoothed_targets(answer, mask, epsilon).to(log_p.dtype)
    return -(targets * option_log_p.masked_fill(~mask, 0.0)).sum(dim=-1)
