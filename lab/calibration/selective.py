"""Selective prediction: how well a confidence tells right answers from wrong ones.

A model that may abstain answers only the questions it is most confident about. Sorting the n
questions by confidence (highest first) and answering the first k gives *coverage* k/n and
*selective risk* (error rate among the answered); the risk–coverage curve and its area (AURC,
Geifman et al. 2018) score the ranking, whatever the confidences' scale. E-AURC subtracts the area
an oracle would reach (every right answer ranked before every wrong one), so it isolates the
ranking from the accuracy. AUROC is the probability that a random right answer is more confident
than a random wrong one (ties count one half): confidence as a detector of wrong answers.

Tied confidences have no order, so every curve here is the *expectation over random orders of the
ties*: within a block of equal confidence, errors accrue at the block's own error rate. That makes
every number independent of the order the questions were stored in (a stable sort would not be:
with letter scoring and bf16 logits, ties are common).

Inputs everywhere: ``conf`` (n,) any real score, higher = more confident (a probability or not:
margin and entropy signals work too, see :mod:`lab.calibration.confidence`), ``correct`` (n,) bool or 0/1.
numpy only: the web server computes these from stored predictions, and every evaluation job at its end.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from lab.calibration.checks import check_n_boot

COVERAGES = (0.5, 0.8)  # the accuracy-at-coverage points every summary reports


def _check(conf: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    conf = np.asarray(conf, dtype=np.float64)
    correct = np.asarray(correct)
    if conf.ndim != 1 or conf.size == 0:
        raise ValueError(f"Expected `conf` to be a non-empty 1-D array, but got shape {conf.shape}")
    if correct.shape != conf.shape:
        raise ValueError(f"Expected `correct` of shape {conf.shape}, but got {correct.shape}")
    if not np.all(np.isfinite(conf)):
        raise ValueError("Expected `conf` to hold finite numbers only")
    if correct.dtype != bool and not np.all((correct == 0) | (correct == 1)):
        raise ValueError("Expected `correct` to be boolean or 0/1")
    return conf, correct.astype(np.float64)


def expected_errors(conf: Any, correct: Any) -> np.ndarray:
    """E[number of wrong answers among the k most confident], k = 1..n, ties in random order.

    The cumulative error count is exact at the end of each block of equal confidence and linear
    inside it (each position in a tied block is wrong with the block's error rate).
    """
    conf, correct = _check(conf, correct)
    order = np.argsort(-conf, kind="stable")
    sorted_conf, wrong = conf[order], 1.0 - correct[order]
    ends = np.flatnonzero(np.append(sorted_conf[1:] != sorted_conf[:-1], True)) + 1  # block ends (exclusive)
    cum = np.cumsum(wrong)[ends - 1]
    k = np.arange(1, conf.size + 1)
    return np.interp(k, np.concatenate([[0], ends]), np.concatenate([[0.0], cum]))


def risk_coverage(conf: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    """The risk–coverage curve: coverage k/n and expected selective risk at it, k = 1..n."""
    errors = expected_errors(conf, correct)
    k = np.arange(1, errors.size + 1)
    return k / errors.size, errors / k


def aurc(conf: Any, correct: Any) -> float:
    """Area under the risk–coverage curve: the mean selective risk over coverages k/n, k = 1..n.

    0 for a model that is always right; lower is better for a given accuracy.

    >>> round(aurc([0.9, 0.8, 0.7, 0.6, 0.5], [1, 0, 1, 1, 0]), 6)
    0.296667
    """
    return _area(expected_errors(conf, correct))


def _area(errors: np.ndarray) -> float:
    """AURC from :func:`expected_errors`' counts: the mean of errors_k / k."""
    return float(np.mean(errors / np.arange(1, errors.size + 1)))


def oracle_aurc(correct: Any) -> float:
    """The AURC of a perfect ranking (all right answers first), for these answers' accuracy.

    ``(1/n) Σ_k max(0, k − n_right)/k``: the exact finite-n form of Geifman et al.'s
    ``r + (1 − r) ln(1 − r)`` (r the error rate), to which it converges as n grows.
    """
    correct = np.asarray(correct, dtype=np.float64)
    n, right = correct.size, float(correct.sum())
    k = np.arange(1, n + 1)
    return float(np.mean(np.maximum(0.0, k - right) / k))


def e_aurc(conf: Any, correct: Any) -> float:
    """Excess AURC: :func:`aurc` minus :func:`oracle_aurc`, the part due to the ranking alone."""
    return aurc(conf, correct) - oracle_aurc(correct)


def auroc(conf: Any, correct: Any) -> Optional[float]:
    """P(conf of a random right answer > conf of a random wrong one) + ½ P(tie): the area under the
    ROC curve with right answers as positives, as the Mann–Whitney U statistic over average ranks
    (tied confidences share their mean rank, which counts each tied pair one half). None when all
    answers are right or all wrong: there is nothing to separate. Tested against scikit-learn's
    ``roc_auc_score``, which every evaluation job would otherwise import (a second, with pandas)."""
    conf, correct = _check(conf, correct)
    positives = correct.astype(bool)
    n_right = int(positives.sum())
    n_wrong = positives.size - n_right
    if n_right == 0 or n_wrong == 0:
        return None
    _, tied, counts = np.unique(conf, return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2  # 1-based ranks of each distinct confidence, averaged
    u = mean_rank[tied][positives].sum() - n_right * (n_right + 1) / 2
    return float(u / (n_right * n_wrong))


def _accuracy_at(errors: np.ndarray, coverage: float) -> float:
    """Expected accuracy on the ⌈coverage·n⌉ most confident questions (ties in random order), from
    :func:`expected_errors`' counts."""
    if not (isinstance(coverage, (int, float)) and 0 < coverage <= 1):
        raise ValueError(f"Expected `coverage` in (0, 1], but got {coverage!r}")
    k = max(1, math.ceil(round(coverage * errors.size, 9)))
    return float(1.0 - errors[k - 1] / k)


def select(conf: Any, correct: Any, threshold: float) -> dict[str, Any]:
    """Answer only where ``conf ≥ threshold``: the kept mask, coverage and selective accuracy (None
    when nothing is kept), and how many right and wrong answers the threshold drops."""
    conf, correct = _check(conf, correct)
    kept = conf >= threshold
    n_kept = int(kept.sum())
    return {
        "kept": kept, "coverage": n_kept / conf.size,
        "accuracy": float(correct[kept].mean()) if n_kept else None,
        "dropped_right": int(correct[~kept].sum()), "dropped_wrong": int((1 - correct[~kept]).sum()),
    }


def bootstrap(statistic: Callable[[np.ndarray, np.ndarray], Optional[float]], conf: Any, correct: Any,
              n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> Optional[tuple[float, float]]:
    """Percentile bootstrap interval of ``statistic(conf, correct)`` over resampled questions.

    Replicates where the statistic is undefined (None: e.g. AUROC of a resample with no wrong
    answer) are left out; None when fewer than half are defined.
    """
    check_n_boot(n_boot, 1)
    conf, correct = _check(conf, correct)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        idx = rng.integers(0, conf.size, conf.size)
        value = statistic(conf[idx], correct[idx])
        if value is not None:
            values.append(value)
    if len(values) < n_boot / 2:
        return None
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def summary(conf: Any, correct: Any, coverages: Sequence[float] = COVERAGES, n_boot: int = 0,
            seed: int = 0) -> dict[str, Any]:
    """AURC, E-AURC, AUROC and accuracy at each coverage (``acc_at_50`` …), JSON-ready; with
    ``n_boot`` > 0 also the bootstrap intervals ``aurc_ci`` and ``auroc_ci`` (``[low, high]``)."""
    errors = expected_errors(conf, correct)  # one sort serves the area and every coverage
    area = _area(errors)
    out: dict[str, Any] = {"aurc": area, "e_aurc": area - oracle_aurc(correct), "auroc": auroc(conf, correct)}
    for c in coverages:
        out[f"acc_at_{round(100 * c)}"] = _accuracy_at(errors, c)
    if n_boot > 0:
        for key, stat in (("aurc", aurc), ("auroc", auroc)):
            interval = bootstrap(stat, conf, correct, n_boot, seed=seed)
            out[f"{key}_ci"] = list(interval) if interval else None
    return out
