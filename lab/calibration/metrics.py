"""Calibration metrics for multiple-choice answers, as plain numpy functions.

Inputs, everywhere in this module:

- ``probs`` (n, K) float: option probabilities per question. Questions may have different numbers
  of options; absent options are padded and marked False in ``mask`` (n, K) bool (default: all
  present). Padded entries are ignored. Rows are *not* required to sum to 1, because the
  full-vocabulary probability of the answer tokens (the FIRST authors' evaluation) does not.
- ``labels`` (n,) int: index of the correct option, which must be present.
- ``conf`` (n,) float in [0, 1] and ``correct`` (n,) bool or 0/1: the confidence of the predicted
  option and whether it was right (see :func:`predictions`).

Every public function follows the torchmetrics order: argument checks, input checks (both in
:mod:`lab.calibration.checks`), compute. The compute is a private core (:func:`_ece`, :func:`_mce` …)
that takes inputs already checked, so :func:`summarize` checks one evaluation's arrays once and calls
the cores, rather than each metric checking the same arrays again. All binned metrics share one core,
:func:`_bin_sums`, so ECE, MCE, the reliability table, the bootstrap and cw-ECE cannot drift apart. References: Guo et al.
2017 (ECE), Kull et al. 2019 (cw-ECE), Brier 1950, Błasiok & Nakkiran 2023 (smECE); see
``shared/REFERENCE.md`` §1.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from types import ModuleType
from typing import Any, Sequence

import numpy as np

from lab.calibration.checks import (BinEdges, Strategy, check_conf, check_conf_correct, check_edges, check_labels,
                                    check_n_bins, check_n_boot, check_probs, check_strategy)

CI_LEVEL = 0.95  # level of the bootstrap interval reported by summarize
_BOOT_CHUNK = 2**22  # indices drawn per bootstrap chunk: bounds memory at ~100 MB for any n
NLL_EPS = 1e-12  # the floor of p_y in nll: one question with p_y = 0 adds −log(eps) ≈ 27.6 nats, not infinity


# ---------------------------------------------------------------------- the core
def _width_edges(n_bins: int) -> np.ndarray:
    """``m / M`` for m = 0..M, each the float nearest the fraction (``np.linspace`` would give
    0.30000000000000004 for 3/10, so a confidence of 0.3 would not sit on its edge)."""
    return np.arange(n_bins + 1) / n_bins


def _assign_bins(conf: np.ndarray, n_bins: int, strategy: str, edges: str = "right") -> np.ndarray:
    """Bin index (n,) of each confidence; see :func:`bin_indices`."""
    if strategy == "width":
        side = "left" if edges == "right" else "right"  # a value on an edge joins the bin it closes
        return np.clip(np.searchsorted(_width_edges(n_bins), conf, side=side) - 1, 0, n_bins - 1)
    return np.searchsorted(_mass_edges(conf, n_bins), conf, side="left")  # #{m : e_m < c}: ties stay together


def _mass_edges(conf: np.ndarray, n_bins: int) -> np.ndarray:
    """Inner edges (M−1,) of equal-mass bins over ``conf`` (n,), n ≥ 1: ``e_m`` is the largest
    confidence in group m of ``np.array_split`` over the sorted confidences (:func:`bin_indices`)."""
    ends = np.cumsum([len(part) for part in np.array_split(np.arange(conf.shape[0]), n_bins)])[:-1]  # (M−1,) ≥ 1
    return np.sort(conf)[ends - 1]


def _bin_sums(
    bins: np.ndarray, conf: np.ndarray, target: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin count, Σ conf and Σ target for every row of a batch of binnings.

    ``bins`` (..., n) int in [0, n_bins); ``conf`` and ``target`` broadcast to it. Returns three
    arrays (..., n_bins). Each row is offset by ``row * n_bins`` so one ``bincount`` serves all rows
    at once: bootstrap replicates and cw-ECE classes need no Python loop.
    """
    lead = bins.shape[:-1]
    rows = math.prod(lead)
    flat = (bins.reshape(rows, -1) + n_bins * np.arange(rows)[:, None]).ravel()

    def total(weights: np.ndarray | None) -> np.ndarray:
        w = None if weights is None else np.broadcast_to(weights, bins.shape).ravel()
        return np.bincount(flat, weights=w, minlength=rows * n_bins).reshape(*lead, n_bins)

    return total(None), total(conf), total(target)


def _predict(probs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Argmax (n,) over the present options; the first index wins ties."""
    return np.where(mask, probs, -np.inf).argmax(axis=1)


def _l1_gap(sum_conf: np.ndarray, sum_target: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """``Σ_m |B_m|/n · |acc_m − conf_m|`` as ``Σ_m |Σ target − Σ conf| / n``: empty bins add 0."""
    return np.abs(sum_target - sum_conf).sum(axis=-1) / n


# ------------------------------------------------------- the cores, on checked inputs
# Each takes what lab.calibration.checks returns (float64 ``conf`` in [0, 1], float64 0/1 ``correct``,
# ``probs`` with padding zeroed, int64 ``labels``) and arguments already checked; its public function
# checks first, and summarize once for all of them.
def _reliability_table(conf: np.ndarray, correct: np.ndarray, n_bins: int, strategy: str,
                       edges: str) -> dict[str, np.ndarray]:
    bins = _assign_bins(conf, n_bins, strategy, edges)
    count, sum_conf, sum_acc = _bin_sums(bins, conf, correct, n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf, acc = sum_conf / count, sum_acc / count
    if strategy == "width":
        lo, hi = _width_edges(n_bins)[:-1], _width_edges(n_bins)[1:]
    else:
        lo, hi = np.full(n_bins, np.nan), np.full(n_bins, np.nan)
        np.fmin.at(lo, bins, conf)  # fmin/fmax ignore the NaN start value
        np.fmax.at(hi, bins, conf)
    gap = mean_conf - acc
    return {"lo": lo, "hi": hi, "count": count, "conf": mean_conf, "acc": acc, "gap": gap}


def _reliability_rows(conf: np.ndarray, correct: np.ndarray, n_bins: int, strategy: str,
                      edges: str) -> list[dict[str, Any]]:
    table = _reliability_table(conf, correct, n_bins, strategy, edges)
    return [{key: int(col[m]) if key == "count" else finite_or_none(col[m]) for key, col in table.items()}
            for m in range(n_bins)]


def _ece(conf: np.ndarray, correct: np.ndarray, n_bins: int, strategy: str, edges: str) -> float:
    _, sum_conf, sum_acc = _bin_sums(_assign_bins(conf, n_bins, strategy, edges), conf, correct, n_bins)
    return float(_l1_gap(sum_conf, sum_acc, conf.shape[0]))


def _mce(conf: np.ndarray, correct: np.ndarray, n_bins: int, edges: str) -> float:
    count, sum_conf, sum_acc = _bin_sums(_assign_bins(conf, n_bins, "width", edges), conf, correct, n_bins)
    full = count > 0
    return float(np.max(np.abs(sum_acc[full] - sum_conf[full]) / count[full]))


def _classwise_ece(probs: np.ndarray, labels: np.ndarray, n_bins: int, mask: np.ndarray, edges: str) -> float:
    k = probs.shape[1]
    p = probs.T  # (K, n)
    target = (np.arange(k)[:, None] == labels[None, :]).astype(np.float64)  # (K, n)
    # absent options go to an extra bin n_bins, dropped below: one vectorised pass for all classes
    bins = np.where(mask.T, _assign_bins(p.ravel(), n_bins, "width", edges).reshape(p.shape), n_bins)
    count, sum_p, sum_y = (a[:, :n_bins] for a in _bin_sums(bins, p, target, n_bins + 1))
    n_c = count.sum(axis=1)
    offered = n_c > 0
    return float(np.mean(_l1_gap(sum_p[offered], sum_y[offered], n_c[offered])))


def _brier(probs: np.ndarray, labels: np.ndarray) -> float:
    onehot = np.arange(probs.shape[1])[None, :] == labels[:, None]  # (n, K)
    # padding is zeroed by check_probs and never the label, so it adds nothing to the sum
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def _nll(probs: np.ndarray, labels: np.ndarray, eps: float) -> float:
    p_y = probs[np.arange(probs.shape[0]), labels]
    return float(np.mean(-np.log(np.maximum(p_y, eps))))


def _relplot_metrics() -> ModuleType:
    """relplot's ``metrics`` module without relplot's package ``__init__``, which imports its plotting
    (matplotlib, seaborn, scikit-learn, pandas: 2 to 3 s of start-up in every job that reports metrics)
    although smECE needs numpy and scipy alone. Loaded as a package of its own name, so that a later
    ``import relplot`` still gets the whole package; Python caches it, so it is loaded once a process."""
    name = "_relplot_metrics"
    if name not in sys.modules:
        package = ModuleType(name)
        package.__path__ = list(importlib.util.find_spec("relplot").submodule_search_locations)
        sys.modules[name] = package
    return importlib.import_module(f"{name}.metrics")


def _smooth_ece(conf: np.ndarray, correct: np.ndarray) -> float:
    return float(_relplot_metrics().smECE(conf, correct))


def _ece_bootstrap(conf: np.ndarray, correct: np.ndarray, n_bins: int, n_boot: int, level: float,
                   seed: int | None, edges: str) -> tuple[float, float]:
    n = conf.shape[0]
    bins = _assign_bins(conf, n_bins, "width", edges)
    rng = np.random.default_rng(seed)
    chunk = max(1, _BOOT_CHUNK // n)
    replicates = []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - start), n))  # (B, n)
        _, sum_conf, sum_acc = _bin_sums(bins[idx], conf[idx], correct[idx], n_bins)
        replicates.append(_l1_gap(sum_conf, sum_acc, n))  # (B,)
    low, high = np.quantile(np.concatenate(replicates), [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


# ----------------------------------------------------------------- public metrics
def padded(vectors: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-question option vectors of different lengths (3–5 options) as (n, K_max), zero-padded,
    plus the (n, K_max) mask of real options that every function here accepts."""
    width = max(len(v) for v in vectors)
    out = np.zeros((len(vectors), width))
    mask = np.zeros((len(vectors), width), dtype=bool)
    for i, v in enumerate(vectors):
        out[i, : len(v)] = v
        mask[i, : len(v)] = True
    return out, mask


def predictions(probs: Any, mask: Any | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Predicted option (n,) = argmax over present options (first on ties), and its probability."""
    probs, mask = check_probs(probs, mask)
    pred = _predict(probs, mask)
    return pred, probs[np.arange(probs.shape[0]), pred]


def bin_indices(conf: Any, n_bins: int = 10, strategy: Strategy = "width", edges: BinEdges = "right") -> np.ndarray:
    """Bin index in [0, n_bins) of each confidence (n,).

    ``"width"``: M equal-width bins with edges ``m/M``, each the float nearest the fraction, so a
    confidence equal to ``0.3`` sits on the edge 3/10.

    - ``edges="right"`` (default): Guo et al. 2017, which both papers cite: bin m (1-based) holds
      ``(m−1)/M < c ≤ m/M``; a confidence of exactly 0 joins the first bin.
    - ``edges="left"``: torchmetrics' and numpy.histogram's ``[m/M, (m+1)/M)``, the last bin closed
      so that 1.0 is in bin M−1 (torchmetrics opens an extra bin for it).

    Only confidences exactly on an edge differ, but then by a whole bin: they are common with two
    options (a tie is 0.5) and with bf16 logits.

    ``"mass"``: equal-mass (adaptive) bins: sort the confidences and ``np.array_split`` them into M
    groups of as-equal-as-possible size (the first ``n mod M`` one larger); each group's largest
    confidence is an edge ``e_m``, and bin m holds ``e_{m−1} < c ≤ e_m``. Without ties that is
    exactly the split. A tie group is never split: it goes wholly to the bin of its first
    (lowest-ranked) member, which then holds more than n/M and leaves the bins it would have reached
    empty (ten confidences of 0.6 in 5 bins: one bin of ten, four empty). So the ECE is a function
    of the (confidence, correct) pairs, not of their order: a split tie group would give its bins
    whichever of its answers the row order put there, and ties are common (0.5 on two options, bf16
    logits, the controlled task's Bayes confidences). With n < M the last bins are empty. ``edges`` does not
    apply: these bins are always closed on the right, which keeps a tie group with its first member.
    """
    check_n_bins(n_bins)
    check_strategy(strategy)
    check_edges(edges)
    return _assign_bins(check_conf(conf), n_bins, strategy, edges)


def reliability_table(
    conf: Any, correct: Any, n_bins: int = 10, strategy: Strategy = "width", edges: BinEdges = "right"
) -> dict[str, np.ndarray]:
    """Per-bin rows of a reliability diagram: ``lo, hi, count, conf, acc, gap`` (each (n_bins,)).

    ``gap = conf − acc``: positive means over-confident. Empty bins have count 0 and NaN for
    conf/acc/gap. For ``"width"`` lo/hi are the bin edges; for ``"mass"`` they are the smallest and
    largest confidence in the bin (NaN when empty), since those bins have no fixed edges.
    ``edges``: which end of a width bin is closed (:func:`bin_indices`).
    """
    check_n_bins(n_bins)
    check_strategy(strategy)
    check_edges(edges)
    conf, correct = check_conf_correct(conf, correct)
    return _reliability_table(conf, correct, n_bins, strategy, edges)


def ece(conf: Any, correct: Any, n_bins: int = 10, strategy: Strategy = "width", edges: BinEdges = "right") -> float:
    """Expected calibration error (Guo et al. 2017): ``Σ_m |B_m|/n · |acc(B_m) − conf(B_m)|``.

    ``strategy="mass"`` uses equal-mass bins (the adaptive ECE), which keeps the bins populated
    when confidences pile up near 1; a tie group is never split (:func:`bin_indices`). Binned ECE
    is biased upward at small n: report n beside it, or better :func:`ece_bootstrap`. ``edges``: which end of a width bin is closed
    (:func:`bin_indices`; Guo's ``(m−1)/M < c ≤ m/M`` by default).

    >>> ece([0.75, 0.75, 0.75, 0.75], [1, 1, 1, 0])
    0.0
    >>> ece([1.0, 1.0], [0, 0])
    1.0
    >>> round(ece([0.5, 0.45], [1, 0]), 6), round(ece([0.5, 0.45], [1, 0], edges="left"), 6)
    (0.025, 0.475)
    """
    check_n_bins(n_bins)
    check_strategy(strategy)
    check_edges(edges)
    conf, correct = check_conf_correct(conf, correct)
    return _ece(conf, correct, n_bins, strategy, edges)


def mce(conf: Any, correct: Any, n_bins: int = 10, edges: BinEdges = "right") -> float:
    """Maximum calibration error: ``max_m |acc(B_m) − conf(B_m)|`` over non-empty width bins.

    The worst bin, whatever its size: it matters where any error is costly, but is noisy at small n.
    """
    check_n_bins(n_bins)
    check_edges(edges)
    conf, correct = check_conf_correct(conf, correct)
    return _mce(conf, correct, n_bins, edges)


def classwise_ece(probs: Any, labels: Any, n_bins: int = 10, mask: Any | None = None,
                  edges: BinEdges = "right") -> float:
    """Class-wise ECE (Kull et al. 2019), with equal-width bins of each class probability p_c.

    ``cw-ECE = 1/|C| · Σ_c Σ_m |B_cm|/n_c · |freq(y = c in B_cm) − mean p_c in B_cm|``

    where ``n_c`` is the number of questions in which option c is present and ``C`` the classes
    present in at least one question. Normalising by ``n_c`` rather than n makes each class term a
    proper ECE of its own binary problem, so a rarely offered option (say E in a mix of 4- and
    5-option questions) is neither diluted nor ignored. With all K options always present,
    ``n_c = n`` and this is the textbook ``Σ_c Σ_m |B_cm|/n · (…) / K``. ``edges`` as in
    :func:`bin_indices`.
    """
    check_n_bins(n_bins)
    check_edges(edges)
    probs, mask = check_probs(probs, mask)
    labels = check_labels(labels, mask)
    return _classwise_ece(probs, labels, n_bins, mask, edges)


def brier(probs: Any, labels: Any, mask: Any | None = None) -> float:
    """Multi-class Brier score (Brier 1950): mean over questions of ``Σ_c (p_c − 1[c = y])²``.

    Summed over the present options, so it ranges from 0 (certain and right) to 2 (certain and
    wrong). This is the original definition; for K = 2 it is twice sklearn's binary
    ``brier_score_loss``, which scores only the positive class.
    """
    probs, mask = check_probs(probs, mask)
    return _brier(probs, check_labels(labels, mask))


def nll(probs: Any, labels: Any, eps: float = NLL_EPS) -> float:
    """Negative log-likelihood of the correct option: mean of ``−log(max(p_y, eps))``.

    The clip keeps one question with p_y = 0 (possible after quantisation, top-k truncation or
    underflow) from making the mean infinite; it then contributes ``−log(eps)`` ≈ 27.6 nats.
    """
    if not (isinstance(eps, (int, float)) and 0 < eps < 1):
        raise ValueError(f"Expected `eps` to be a float in (0, 1), but got {eps!r}.")
    probs, mask = check_probs(probs, None)
    return _nll(probs, check_labels(labels, mask), eps)


def accuracy(probs: Any, labels: Any, mask: Any | None = None) -> float:
    """Fraction of questions whose predicted option (see :func:`predictions`) is the correct one."""
    probs, mask = check_probs(probs, mask)
    labels = check_labels(labels, mask)
    return float(np.mean(_predict(probs, mask) == labels))


def trust(accuracy: float, ece: float) -> float:
    """FIRST's trust score ``Acc − ECE``: rewards being right and knowing how right.

    Pass both as fractions or both as percentages.
    """
    return float(accuracy) - float(ece)


def smooth_ece(conf: Any, correct: Any) -> float:
    """Smooth ECE (Błasiok & Nakkiran 2023) via ``relplot.smECE(f, y)``: a bin-free, consistent
    calibration error that kernel-smooths the residual ``conf − correct`` with a bandwidth chosen
    automatically (the fixed point σ = smECE_σ).
    """
    conf, correct = check_conf_correct(conf, correct)
    return _smooth_ece(conf, correct)


def ece_bootstrap(
    conf: Any,
    correct: Any,
    n_bins: int = 10,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int | None = 0,
    edges: BinEdges = "right",
) -> tuple[float, float]:
    """Percentile bootstrap interval ``(low, high)`` for the equal-width ECE.

    Resamples the n (conf, correct) pairs with replacement ``n_boot`` times and takes the
    ``(1 ∓ level)/2`` quantiles of the replicate ECEs. Each sample keeps its bin, so all
    replicates of a chunk are binned by one offset ``bincount``; chunks bound memory for large n.
    Deterministic for a given ``seed`` (``np.random.default_rng``). ECE is biased upward, and its
    replicates more so (they add resampling noise to sampling noise, and |·| turns noise into
    error), so for a well-calibrated model the interval can lie wholly above the point ECE: read
    it as the sampling noise of the estimate, not as an interval for the true calibration error.
    """
    check_n_bins(n_bins)
    check_edges(edges)
    check_n_boot(n_boot, 1)
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ValueError(f"Expected `level` to be a float in (0, 1), but got {level!r}.")
    conf, correct = check_conf_correct(conf, correct)
    return _ece_bootstrap(conf, correct, n_bins, n_boot, level, seed, edges)


def finite_or_none(x: Any) -> float | None:
    """``x`` as a plain float when it is a finite real number, else None (NaN, ±inf, text, bool,
    None): what a JSON file may hold, and what a table read from another version's file may show."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        return None
    try:
        value = float(x)
    except OverflowError:  # an integer past a float's range (10**400 in a stored file)
        return None
    return value if math.isfinite(value) else None


def reliability_rows(conf: Any, correct: Any, n_bins: int = 10, strategy: Strategy = "width",
                     edges: BinEdges = "right") -> list[dict[str, Any]]:
    """:func:`reliability_table` as JSON-ready rows, one dict per bin (NaN → None): the shape
    ``metrics.json`` stores and every reliability figure draws."""
    check_n_bins(n_bins)
    check_strategy(strategy)
    check_edges(edges)
    conf, correct = check_conf_correct(conf, correct)
    return _reliability_rows(conf, correct, n_bins, strategy, edges)


def summarize(probs: Any, labels: Any, n_bins: int = 10, mask: Any | None = None, n_boot: int = 1000, seed: int = 0,
              edges: BinEdges = "right") -> dict[str, Any]:
    """All metrics of one evaluation as a JSON-ready dict (plain floats, ints, lists; NaN → None).

    Keys: ``n, accuracy, ece, ece_equal_mass, mce, cw_ece, brier, nll, trust, smece, ece_ci_low,
    ece_ci_high, ece_ci_level, n_bins, bin_edges, reliability`` (one dict per equal-width bin). With
    ``n_boot=0`` the bootstrap is skipped and the three ``ece_ci_*`` values are None. ``edges``
    (:func:`bin_indices`) applies to every binned metric and is reported as ``bin_edges``. The arrays are
    checked here once; every metric is then its unchecked core.
    """
    check_n_bins(n_bins)
    check_edges(edges)
    check_n_boot(n_boot, 0)
    probs, mask = check_probs(probs, mask)
    labels = check_labels(labels, mask)
    pred = _predict(probs, mask)
    conf = probs[np.arange(probs.shape[0]), pred]  # in [0, 1]: check_probs clipped it
    hits = (pred == labels).astype(np.float64)  # as check_conf_correct hands ``correct`` to the metrics
    return _confidence_summary(conf, hits, n_bins, n_boot, seed, edges, {
        "cw_ece": _classwise_ece(probs, labels, n_bins, mask, edges),
        "brier": _brier(probs, labels),
        "nll": _nll(probs, labels, NLL_EPS),
    })


def summarize_confidence(conf: Any, correct: Any, n_bins: int = 10, n_boot: int = 1000, seed: int = 0,
                         edges: BinEdges = "right", scores: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metrics of :func:`summarize` that need only each prediction's confidence and correctness — all
    but cw-ECE, Brier and NLL — for scores without option vectors (a token task's vocabulary-wide top
    probability). Checked here once, as :func:`summarize` checks its arrays. ``scores``: the caller's own
    figures for the rest (a token task's Brier and NLL over the vocabulary), placed where :func:`summarize`
    places its own, so that both kinds of ``metrics.json`` read in one order."""
    check_n_bins(n_bins)
    check_edges(edges)
    check_n_boot(n_boot, 0)
    conf, hits = check_conf_correct(conf, correct)
    return _confidence_summary(conf, hits, n_bins, n_boot, seed, edges, dict(scores or {}))


def _confidence_summary(conf: np.ndarray, hits: np.ndarray, n_bins: int, n_boot: int, seed: int, edges: str,
                        scores: dict[str, Any]) -> dict[str, Any]:
    """The summary's dict from checked ``conf`` and 0/1 ``hits``; ``scores`` (the option-vector metrics)
    go after MCE, where :func:`summarize` has always put them."""
    acc, err = float(np.mean(hits)), _ece(conf, hits, n_bins, "width", edges)
    low, high, level = None, None, None
    if n_boot > 0:
        low, high = _ece_bootstrap(conf, hits, n_bins, n_boot, CI_LEVEL, seed, edges)
        level = CI_LEVEL
    return {"n": int(conf.shape[0]), "accuracy": acc, "ece": err, "ece_equal_mass": _ece(conf, hits, n_bins, "mass", "right"),
            "mce": _mce(conf, hits, n_bins, edges), **scores, "trust": trust(acc, err), "smece": _smooth_ece(conf, hits),
            "ece_ci_low": low, "ece_ci_high": high, "ece_ci_level": level, "n_bins": int(n_bins), "bin_edges": edges,
            "reliability": _reliability_rows(conf, hits, n_bins, "width", edges)}
