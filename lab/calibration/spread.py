"""How far a figure moves: across training seeds, and across resampled questions.

A training run's ECE on the controlled task moves more from one seed to the next than its bootstrap
interval over questions says (issue 34: the same seeds on another CPU moved LoRA's ECE from 3.9 to
10.3 %), so a series reports both: the mean over seeds with Student's t interval (few seeds, unknown
variance), beside each run's percentile bootstrap over its questions.
"""
from __future__ import annotations

import math
from typing import Any, Optional

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
