"""Argument and input checks of :mod:`lab.calibration.metrics`, in the torchmetrics order: every metric checks
its arguments (``n_bins``, ``strategy``, ``edges``, ``n_boot``), then its inputs, then computes (``summarize``
checks one evaluation's arrays once for all its metrics); and, last, the checks of a teacher's top-k that the
temperature forms and FIRST's transforms share.

Input checks return the inputs as the metrics compute on them (float64, probabilities clipped
into [0, 1], padding zeroed), so no metric converts twice. Errors follow torchmetrics' wording:
"Expected `x` to be …, but got …". Shapes are those of :mod:`lab.calibration.metrics`: ``probs`` and ``mask``
(n, K), ``labels``, ``conf`` and ``correct`` (n,).
"""
from __future__ import annotations

from typing import Any, Literal

import numpy as np

Strategy = Literal["width", "mass"]
STRATEGIES: tuple[str, ...] = ("width", "mass")
BinEdges = Literal["right", "left"]  # which end of an equal-width bin is closed; see lab.calibration.metrics.bin_indices
BIN_EDGES: tuple[str, ...] = ("right", "left")
PROB_TOL = 1e-6  # probabilities this far outside [0, 1] are float error and are clipped


# ---------------------------------------------------------------- argument checks
def check_n_bins(n_bins: int) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"Expected `n_bins` to be an integer larger than 0, but got {n_bins!r}.")


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"Expected `strategy` to be one of {STRATEGIES}, but got {strategy!r}.")


def check_edges(edges: str) -> None:
    if edges not in BIN_EDGES:
        raise ValueError(f"Expected `edges` to be one of {BIN_EDGES}, but got {edges!r}.")


def check_n_boot(n_boot: int, smallest: int) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < smallest:
        raise ValueError(
            f"Expected `n_boot` to be an integer of at least {smallest}, but got {n_boot!r}."
        )


# ------------------------------------------------------------------- input checks
def check_unit_interval(name: str, x: np.ndarray) -> np.ndarray:
    """Finite values in [0, 1] up to ``PROB_TOL``; returns them clipped into [0, 1]."""
    if not np.all(np.isfinite(x)):
        raise ValueError(f"Expected `{name}` to contain only finite values, but got NaN or inf.")
    if x.size and (x.min() < -PROB_TOL or x.max() > 1 + PROB_TOL):
        raise ValueError(
            f"Expected `{name}` to be probabilities in [0, 1], but got values from {x.min()} to "
            f"{x.max()}. Pass probabilities (e.g. a softmax), not logits or percentages."
        )
    return np.clip(x, 0.0, 1.0)


def check_conf(conf: Any) -> np.ndarray:
    """Returns ``conf`` (n,) float64 clipped to [0, 1]."""
    conf = np.asarray(conf, dtype=np.float64)
    if conf.ndim != 1 or conf.shape[0] < 1:
        raise ValueError(f"Expected `conf` to have shape (n,) with n >= 1, but got {conf.shape}.")
    return check_unit_interval("conf", conf)


def check_conf_correct(conf: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``conf`` (n,) float64 clipped to [0, 1] and ``correct`` (n,) float64 of 0/1."""
    conf, correct = check_conf(conf), np.asarray(correct)
    if correct.shape != conf.shape:
        raise ValueError(
            f"Expected `correct` to have the shape of `conf` {conf.shape}, but got {correct.shape}."
        )
    if correct.dtype.kind not in "biuf" or not np.all((correct == 0) | (correct == 1)):
        raise ValueError("Expected `correct` to hold booleans or 0/1 values, but got other values.")
    return conf, correct.astype(np.float64)


def check_probs(probs: Any, mask: Any | None) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``probs`` (n, K) float64 (padding zeroed, rest clipped) and ``mask`` (n, K) bool."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] < 1 or probs.shape[1] < 1:
        raise ValueError(
            f"Expected `probs` to have shape (n, K) with n, K >= 1, but got {probs.shape}."
        )
    mask = np.ones(probs.shape, dtype=bool) if mask is None else np.asarray(mask)
    if mask.shape != probs.shape or mask.dtype != bool:
        raise ValueError(
            f"Expected `mask` to be a bool array of shape {probs.shape}, "
            f"but got {mask.dtype} {mask.shape}."
        )
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise ValueError(
            f"Expected every question to have a present option, "
            f"but row {empty[0]} of `mask` is all False."
        )
    out = np.zeros_like(probs)
    out[mask] = check_unit_interval("probs", probs[mask])
    return out, mask


def check_labels(labels: Any, mask: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    n, k = mask.shape
    if labels.shape != (n,) or labels.dtype.kind not in "iu":
        raise ValueError(
            f"Expected `labels` to be integers of shape ({n},), "
            f"but got {labels.dtype} {labels.shape}."
        )
    bad = np.flatnonzero((labels < 0) | (labels >= k))
    if bad.size:
        raise ValueError(
            f"Expected `labels` in [0, {k - 1}], but got {labels[bad[0]]} at index {bad[0]}."
        )
    absent = np.flatnonzero(~mask[np.arange(n), labels])
    if absent.size:
        i = absent[0]
        raise ValueError(
            f"Expected `labels` to point at present options, "
            f"but option {labels[i]} of row {i} is masked out."
        )
    return labels.astype(np.int64)


# ------------------------------------------------------------ a teacher's top-k
# The inputs of the top-k transforms (lab.calibration.temperature's temperature_paper, temperature_logit and the
# teacher sweep; lab.calibration.teacher's label smoothing and direct normalisation): ``p`` (..., k), the
# teacher's top-k probabilities at one position, sorted descending; a row may hold less than all the mass.
TOPK_SUM_TOL = 1e-3  # a top-k may sum this far above 1 (probabilities stored in half precision)


def check_topk(p: Any, ndim: int | None = None) -> np.ndarray:
    """Returns ``p`` (..., k) as float64 clipped to [0, 1]; rows must sum to at most 1."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim < 1 or p.shape[-1] < 1 or (ndim is not None and p.ndim != ndim):
        want = "(..., k)" if ndim is None else "(n, k)"
        raise ValueError(f"Expected `p` to have shape {want} with k >= 1, but got {p.shape}.")
    p = check_unit_interval("p", p)
    total = p.sum(axis=-1)
    if total.size and total.max() > 1 + TOPK_SUM_TOL:
        raise ValueError(
            f"Expected each row of `p` to sum to at most 1 (a top-k holds part of the mass), "
            f"but a row sums to {total.max():.6g}."
        )
    return p


def check_positive_rows(p: np.ndarray) -> None:
    if p.size and p.sum(axis=-1).min() <= 0:
        raise ValueError("Expected every row of `p` to have a positive entry, but a row is all 0.")


def check_sorted(p: np.ndarray) -> None:
    if np.any(p[..., 1:] > p[..., :-1]):
        raise ValueError(
            "Expected each row of `p` to be sorted descending (rank 0 = top-1), but it is not. "
            "Sort the top-k by probability, e.g. -np.sort(-p, axis=-1)."
        )


def check_positive(name: str, x: Any) -> None:
    number = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
    if not (number and np.isfinite(x) and x > 0):
        raise ValueError(f"Expected `{name}` to be positive, but got {x!r}.")
