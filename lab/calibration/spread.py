"""How far a figure moves: across training seeds, and across resampled questions.

A training run's ECE on the controlled task moves more from one seed to the next than its bootstrap
interval over questions says (issue 34: the same seeds on another CPU moved LoRA's ECE from 3.9 to
10.3 %), so a series reports both: the mean over seeds with Student's t interval (few seeds, unknown
variance), beside each run's percentile bootstrap over its questions. Two rows fed by the same seeds
are compared by the paired difference (:func:`paired_difference`), and a table of such claims by
Holm's adjustment (:func:`holm_adjust`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
from scipy import stats

from lab.calibration.checks import check_n_boot


def mean_interval(values: Any, level: float = 0.95) -> tuple[float, Optional[float], Optional[float]]:
    """(mean, low, high): the ``level`` Student-t interval of the mean of independent runs; no
    interval (None, None) from fewer than two."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"Expected a non-empty 1-D array of finite values, got {x!r}.")
    mean = float(x.mean())
    if x.size < 2:
        return mean, None, None
    half = float(stats.t.ppf((1 + level) / 2, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def accuracy_bootstrap(correct: Any, n_boot: int = 1000, level: float = 0.95,
                       seed: Optional[int] = 0) -> tuple[float, float]:
    """Percentile bootstrap interval (low, high) of the accuracy of ``correct`` (0/1 per question),
    the same kind of interval as :func:`lab.calibration.metrics.ece_bootstrap`'s. The number right in
    a resample of n answers drawn with replacement is Binomial(n, accuracy): drawn as such, in O(n_boot)."""
    check_n_boot(n_boot, 1)
    hits = np.asarray(correct, dtype=np.float64)
    if hits.ndim != 1 or hits.size == 0:
        raise ValueError(f"Expected a non-empty 1-D array of 0/1, got shape {hits.shape}.")
    rng = np.random.default_rng(seed)
    means = rng.binomial(hits.size, hits.mean(), size=n_boot) / hits.size
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


@dataclass(frozen=True)
class Difference:
    """A mean difference over n runs with its Student-t interval and two-sided p (H0: the mean is 0)."""
    mean: float
    low: float
    high: float
    p: float


def t_difference(mean: float, sd: float, n: int, level: float = 0.95) -> Difference:
    """The one-sample t interval and two-sided p of differences with mean ``mean`` and standard
    deviation ``sd`` (ddof 1) over ``n`` ≥ 2 runs. An ``sd`` above the differences' own (a bound from
    the rows' spreads) widens the interval and raises p: still a valid interval and test, a weaker one."""
    if n < 2 or not (math.isfinite(mean) and math.isfinite(sd)) or sd < 0:
        raise ValueError(f"Expected a finite mean, a finite sd ≥ 0 and n ≥ 2, got mean={mean}, sd={sd}, n={n}.")
    se = sd / math.sqrt(n)
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * se
    if se == 0:  # every run differs by the same amount: no doubt left but whether it is 0
        return Difference(mean, mean, mean, 1.0 if mean == 0 else 0.0)
    p = 2 * float(stats.t.sf(abs(mean) / se, n - 1))
    return Difference(mean, mean - half, mean + half, p)


def paired_difference(a: Any, b: Any, level: float = 0.95) -> Difference:
    """The mean of the per-run differences a_i − b_i (run i of both rows: the same seed) with its
    ``level`` Student-t interval and the paired t-test's two-sided p (scipy's ``ttest_rel``). Pairing
    removes what a seed shares between the two rows (its base model, its data order): two rows whose
    own intervals overlap can still differ in every seed."""
    x, y = (np.asarray(v, dtype=np.float64) for v in (a, b))
    if x.ndim != 1 or x.shape != y.shape or x.size < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError(f"Expected two 1-D arrays of finite values, one per run and at least two runs each, got "
                         f"shapes {x.shape} and {y.shape}: {x!r}, {y!r}.")
    d = x - y
    return t_difference(float(d.mean()), float(d.std(ddof=1)), d.size, level)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the order given: sorted ascending, the i-th smallest
    (from 0) is multiplied by (m − i), made non-decreasing, capped at 1. Rejecting where the adjusted
    p < α keeps the chance of any false rejection among the m tests at most α, and rejects at least
    what Bonferroni (every p × m) rejects."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or ((p < 0) | (p > 1) | ~np.isfinite(p)).any():
        raise ValueError(f"Expected a 1-D list of p-values in [0, 1], got {p_values!r}.")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return [float(v) for v in adjusted]
