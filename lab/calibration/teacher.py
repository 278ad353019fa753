"""FIRST's re-calibrations of a teacher's stored top-k probabilities that are not a temperature (§4.2).

Input everywhere: ``p`` (..., k) float, the teacher's top-k probabilities at one position, sorted
descending (rank 0 = top-1). A row need not sum to 1: the top-k holds only part of the mass
(FIRST reports > 95 % on average for k = 5). Both transforms return float64 rows of the same
shape: :func:`direct` rows that sum to 1 over the k entries, while :func:`label_smooth` (Eq. 3 as
printed) keeps each row's own mass, as the paper's ±δ does.

- :func:`label_smooth`: FIRST Eq. 3 on the raw top-k, generalised to any k (or renormalised first).
- :func:`direct`: the "direct distillation" normalisation, i.e. no re-calibration.

FIRST's temperature (Eq. 4, and the usual logit form) lives with every other temperature, in
:mod:`lab.calibration.temperature`, and its grid search on a validation split (§5.5) in
:mod:`lab.calibration.first_sweep`; the checks of a top-k in :mod:`lab.calibration.checks`. See ``shared/REFERENCE.md`` §2.3 and
``shared/seeds/first_paper.txt`` §4.2 and §5.5.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lab.calibration.checks import check_positive, check_positive_rows, check_sorted, check_topk


def _check_fraction(name: str, x: Any) -> None:
    number = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
    if not (number and 0 <= x < 1):
        raise ValueError(f"Expected `{name}` to be a number in [0, 1), but got {x!r}.")


def label_smooth(p: Any, delta: float = 0.1, renormalise: bool = False) -> np.ndarray:
    """FIRST Eq. 3, generalised to any k ≥ 2: move δ from the top-1 to the others in equal shares,

    ``P'(1) = P(1) − δ``;  ``P'(i) = P(i) + δ/(k−1)`` for ranks i = 2..k

    on the raw top-k as the paper prints it (its ranks 2..5 get δ/4, k = 5). ``p`` (..., k) sorted
    descending → (..., k). A row keeps its own mass ``Σ P``: a top-k holding 0.9 of the teacher's
    mass still holds 0.9, so the distillation loss sees the same tail it would without smoothing
    (:func:`lab.training.kd_losses.topk_kl_loss` takes such rows as they are; only its opt-in
    ``renormalise=True`` divides them by their mass, which equals smoothing the normalised row by
    ``δ / Σ P``).

    ``renormalise=True``: normalise over the k first (``q = p / Σ p``) and smooth ``q``, so the rows
    sum to 1 and δ is a share of the top-k's mass rather than of the whole vocabulary's.

    It can break the rank order: whenever ``P(1) − P(2) < δ·k/(k−1)`` the top-2 overtakes the
    top-1, which the paper names as a drawback. Eq. 3 cannot take more than the top-1 holds: a row
    whose top-1 is below δ (an uncertain position) gives all of it, ``δ_row = P(1)``, so that no
    probability turns negative.
    """
    _check_fraction("delta", delta)
    p = check_topk(p)
    k = p.shape[-1]
    if k < 2:
        raise ValueError(f"Expected `p` to hold k >= 2 entries for label smoothing, but got {k}.")
    check_sorted(p)
    if renormalise:
        check_positive_rows(p)
        p = p / p.sum(axis=-1, keepdims=True)  # (..., k)
    moved = np.minimum(delta, p[..., :1])  # (..., 1): δ, or all of a top-1 smaller than δ
    return np.concatenate([p[..., :1] - moved, p[..., 1:] + moved / (k - 1)], axis=-1)


def direct(p: Any, delta: float = 1e-6) -> np.ndarray:
    """FIRST's "direct distillation" normalisation (no re-calibration):
    ``P'(j) = (P(j) + δ) / Σ_i (P(i) + δ)``. ``p`` (..., k) → (..., k).

    δ keeps every entry positive, so the teacher's log-probabilities stay finite.
    """
    check_positive("delta", delta)
    shifted = check_topk(p) + delta
    return shifted / shifted.sum(axis=-1, keepdims=True)
