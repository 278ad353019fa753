"""A stored evaluation analysed again: its summaries, as reported or at any temperature, and sweeps.

The browser lab recomputes what it shows (temperatures, equal-mass bins, ECE against the bin count)
from a run's :class:`lab.results.predictions.Predictions` alone, with the same numpy functions as the
evaluation (:mod:`lab.calibration.metrics`, :func:`lab.calibration.temperature.scale`,
:func:`lab.calibration.temperature.temperature_paper`): the web server needs numpy and pandas only.
Which evaluations there are is :mod:`lab.results.runs`'s business; tables across runs are
:mod:`lab.results.tables`', case studies :mod:`lab.results.cases`'.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import pandas as pd

from lab.calibration import metrics
from lab.calibration.checks import BinEdges, check_edges
from lab.calibration.metrics import finite_or_none
from lab.calibration.summary import row_sum_sq, token_scores
from lab.calibration.temperature import (FORMS, LAB_SWEEP_BOUNDS, LAB_SWEEP_GRIDS, Form, scale, temperature_paper,
                                         widened_search)
from lab.calibration.token_temperature import scaled_token_probs, token_sum_sq
from lab.results.predictions import (Predictions, is_token_run, reported_confidence, reported_correct, reported_probs,
                                     require_options, token_logits)

ROBUSTNESS_BINS = tuple(range(5, 31))  # the bin counts the ECE-robustness plot tries
SMALL_N = 300  # below this many questions an ECE is flagged (HELM's floor for reporting calibration)
TEMPERATURE_INSTEAD = ("Its figures at another temperature come from the log-partition each target kept "
                       "(temperature_summary, the Temperature lab).")
PAPER_ON_TOKENS = ("FIRST's softmax(p / c) divides every option's probability, and a token run keeps only its top "
                   "tokens' and the target's: use the logit form, softmax(z / T) over the whole vocabulary")


def reported_summary(pred: Predictions, n_bins: int = 10, strategy: metrics.Strategy = "width",
                     edges: Optional[BinEdges] = None, n_boot: int = 0) -> dict[str, Any]:
    """:func:`calibration_summary` of the run as it reported it (``edges`` default: the run's own).
    A token-level run gets the same keys as its ``metrics.json``: the binned figures from each
    target's confidence and correctness, NLL and Brier over the whole vocabulary (exact; Brier None for a
    run that did not keep each target's Σ p²), and no class-wise ECE (None)."""
    edges = pred.bin_edges if edges is None else edges
    if not is_token_run(pred):
        return calibration_summary(reported_probs(pred), pred.mask, pred.labels, n_bins, strategy, edges, n_boot)
    return _token_summary(pred, reported_confidence(pred), [float(row["target_prob"]) for row in pred.rows],
                          row_sum_sq(pred.rows), n_bins, strategy, edges, n_boot)


def _token_summary(pred: Predictions, conf: np.ndarray, target_probs: Any, sum_sq: Optional[np.ndarray], n_bins: int,
                   strategy: metrics.Strategy, edges: BinEdges, n_boot: int, seed: int = 0) -> dict[str, Any]:
    """A token run's summary from each target's confidence, probability and Σ p² over the vocabulary
    (None: Brier unknown): the keys of :func:`calibration_summary`, cw-ECE None."""
    summary = confidence_summary(conf, reported_correct(pred), n_bins, strategy, edges, n_boot, seed)
    return {**summary, **token_scores(target_probs, sum_sq), "cw_ece": None,
            "trust": metrics.trust(summary["accuracy"], summary["ece"])}


# ---------------------------------------------------------------- recalibration and summaries


def _check_temperature(temperature: Any) -> float:
    value = finite_or_none(temperature)
    if value is None or value <= 0:
        raise ValueError(f"Expected a positive temperature, but got {temperature!r}")
    return value


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"Expected `form` to be one of {FORMS}, but got {form!r}")


def _token_probs(pred: Predictions, temperature: float, form: str = "logit") -> tuple[np.ndarray, np.ndarray]:
    """A token run at ``temperature`` over the whole vocabulary: its top tokens and the rest (n, k + 1),
    as :attr:`Predictions.probs` holds them, and each target's probability (n,)."""
    if form == "paper":
        raise ValueError(f"{pred.name} is a token-level run (task "
                         f"{pred.task}): {PAPER_ON_TOKENS}.")
    logits = token_logits(pred)
    top, target = scaled_token_probs(logits.top, logits.target, logits.log_z, logits.grid, temperature)
    return np.column_stack([top, np.maximum(0.0, 1.0 - top.sum(axis=1))]), target


def recalibrate(pred: Predictions, temperature: float, form: Form = "logit") -> np.ndarray:
    """Option probabilities (n, K) at ``temperature``; padded options stay 0.

    ``"logit"``: ``softmax(log p / T)`` (:func:`lab.calibration.temperature.scale`); T = 1 only renormalises.
    ``"paper"``: FIRST Eq. 4 as printed, ``softmax(p / c)`` over the present options
    (:func:`lab.calibration.temperature.temperature_paper` with the mask), which flattens rows at c = 1.
    """
    t = _check_temperature(temperature)
    _check_form(form)
    require_options(pred, "rescaling by a temperature", TEMPERATURE_INSTEAD)
    if form == "logit":
        return scale(pred.probs, t, pred.mask)
    return temperature_paper(pred.probs, t, pred.mask)


def temperature_summary(pred: Predictions, temperature: Optional[float], form: Form = "logit", n_bins: int = 10,
                        strategy: metrics.Strategy = "width", edges: BinEdges = "right",
                        n_boot: int = 0, seed: int = 0) -> dict[str, Any]:
    """:func:`calibration_summary` of the run at ``temperature`` (:func:`recalibrate`), or with None of
    the model unscaled (:attr:`Predictions.probs`). A token run gets :func:`reported_summary`'s keys at
    T over the whole vocabulary, from the log-partition each target kept (None: T = 1, whatever the
    run was evaluated at), its top token being every temperature's; the paper form, which needs
    every probability, is refused there, and so is a run evaluated before the log-partition was kept.
    The ECE's interval (``n_boot`` > 0) is the bootstrap of these probabilities, at ``temperature``:
    with the run's ``bootstrap`` and ``seed``, at T = 1 it is the interval the evaluation reported."""
    if not is_token_run(pred):
        probs = pred.probs if temperature is None else recalibrate(pred, temperature, form)
        return calibration_summary(probs, pred.mask, pred.labels, n_bins, strategy, edges, n_boot, seed)
    _check_form(form)
    t = 1.0 if temperature is None else _check_temperature(temperature)
    vectors, target = _token_probs(pred, t, form)
    summary = _token_summary(pred, vectors[:, 0], target, token_sum_sq(token_logits(pred), t), n_bins, strategy,
                             edges, n_boot, seed)
    if summary["brier"] is None:  # T / 2 below the grid the log-partition was kept at
        summary["brier_note"] = (f"Brier needs log Z at T / 2 = {t / 2:.3g}, below the temperatures this run kept "
                                 "its log-partition at")
    return summary


def calibration_summary(probs: Any, mask: Any, labels: Any, n_bins: int = 10,
                        strategy: metrics.Strategy = "width", edges: BinEdges = "right", n_boot: int = 0,
                        seed: int = 0) -> dict[str, Any]:
    """Headline metrics and the reliability table of one set of probabilities, JSON-ready.

    Keys: ``n, accuracy, ece, ece_ci_low, ece_ci_high, nll, brier, cw_ece, trust, n_bins, strategy,
    bin_edges, reliability`` (the interval with ``n_boot`` > 0 and equal-width bins, else None);
    the reliability bins have the shape of ``metrics.json``'s (``lo, hi, count, conf, acc, gap``;
    NaN → None), so a figure draws a stored summary and a recomputed one alike. ``strategy`` bins
    the ECE and the table (``"mass"``: equal-mass bins); cw-ECE always uses equal-width bins.
    ``edges`` closes each equal-width bin on the right (Guo et al.) or left (torchmetrics); pass a
    run's :attr:`Predictions.bin_edges` to reproduce the ECE it reported.
    """
    mask, labels = np.asarray(mask), np.asarray(labels)
    brier = metrics.brier(probs, labels, mask)  # checks probs, mask and labels before anything else
    probs = np.where(mask, np.asarray(probs, dtype=np.float64), 0.0)  # nll takes no mask: padding must be 0
    choice, conf = metrics.predictions(probs, mask)
    summary = confidence_summary(conf, choice == labels, n_bins, strategy, edges, n_boot, seed)
    return {
        **summary, "nll": metrics.nll(probs, labels), "brier": brier,
        "cw_ece": metrics.classwise_ece(probs, labels, n_bins, mask, edges),
        "trust": metrics.trust(summary["accuracy"], summary["ece"]),
    }


def confidence_summary(conf: Any, correct: Any, n_bins: int = 10, strategy: metrics.Strategy = "width",
                       edges: BinEdges = "right", n_boot: int = 0, seed: int = 0) -> dict[str, Any]:
    """The reliability of one confidence vector (the top probability, or a calibrated one), JSON-ready:
    ``n, accuracy, ece, ece_ci_low, ece_ci_high, n_bins, strategy, bin_edges, reliability``. The
    bootstrap interval (``n_boot`` > 0 replicates drawn with ``seed``, equal-width bins only) is None otherwise."""
    conf, correct = np.asarray(conf, dtype=np.float64), np.asarray(correct)
    low = high = None
    if n_boot > 0 and strategy == "width":
        low, high = metrics.ece_bootstrap(conf, correct, n_bins, n_boot, metrics.CI_LEVEL, seed, edges)
    return {
        "n": int(conf.size), "accuracy": float(np.mean(correct)), "ece": metrics.ece(conf, correct, n_bins, strategy, edges),
        "ece_ci_low": low, "ece_ci_high": high, "n_bins": int(n_bins), "strategy": strategy, "bin_edges": edges,
        "reliability": metrics.reliability_rows(conf, correct, n_bins, strategy, edges),
    }


def ece_robustness(conf: Any, correct: Any, bin_counts: Sequence[int] = ROBUSTNESS_BINS, edges: BinEdges = "right",
                   n_boot: int = 200, seed: int = 0) -> tuple[pd.DataFrame, float]:
    """How much an ECE owes to its binning: for each number of bins, the equal-width ECE with its
    bootstrap interval (``width``, ``width_low``, ``width_high``) and the equal-mass ECE (``mass``);
    and the bin-free smooth ECE, one number for every row (returned beside the table)."""
    conf, correct = np.asarray(conf, dtype=np.float64), np.asarray(correct)
    records = []
    for m in bin_counts:
        low, high = metrics.ece_bootstrap(conf, correct, m, n_boot, metrics.CI_LEVEL, seed, edges)
        records.append({"bins": int(m), "width": metrics.ece(conf, correct, m, "width", edges),
                        "width_low": low, "width_high": high, "mass": metrics.ece(conf, correct, m, "mass")})
    return pd.DataFrame(records), metrics.smooth_ece(conf, correct)


def small_sample_warning(n: int, token: bool = False) -> str:
    """A sentence when ``n`` is below :data:`SMALL_N` (HELM's floor for reporting ECE), else "";
    ``token``: a token run (clm, facts), whose ``n`` counts target tokens, not questions."""
    if n >= SMALL_N:
        return ""
    counted = "targets" if token else "questions"
    return (f"Only {n} {counted}: below {SMALL_N}, binned ECE is dominated by sampling noise and its upward "
            "bias; read the interval, not the point.")


class Sweep(NamedTuple):
    """A temperature sweep: ``table`` (temperature, ece, nll, accuracy), ascending, and the best of each.

    ``widened``: empty when the grid asked for held both optima inside it; otherwise a sentence
    saying which optimum lay on which edge and how far the sweep went past it.
    """

    table: pd.DataFrame
    best_ece: float
    best_nll: float
    widened: str = ""


def _sweep_point(pred: Predictions, t: float, form: Form, n_bins: int, edges: BinEdges) -> dict[str, float]:
    if is_token_run(pred):
        vectors, target = _token_probs(pred, t, form)
        correct = reported_correct(pred)
        return {"temperature": t, "ece": metrics.ece(vectors[:, 0], correct, n_bins, edges=edges),
                "nll": token_scores(target, None)["nll"], "accuracy": float(np.mean(correct))}
    probs = recalibrate(pred, t, form)
    choice, conf = metrics.predictions(probs, pred.mask)
    correct = choice == pred.labels
    return {"temperature": t, "ece": metrics.ece(conf, correct, n_bins, edges=edges),
            "nll": metrics.nll(probs, pred.labels), "accuracy": float(np.mean(correct))}


def _widened_note(asked: np.ndarray, table: pd.DataFrame, bounds: tuple[float, float]) -> str:
    """What the sweep did past the grid it was asked for (``asked``, ascending), in words; empty when
    it did nothing."""
    lo, hi = float(table["temperature"].iloc[0]), float(table["temperature"].iloc[-1])
    if (lo, hi) == (asked[0], asked[-1]):
        return ""
    best = {column: float(table["temperature"].iloc[int(np.argmin(table[column]))]) for column in ("ece", "nll")}
    moved = " and ".join(f"lowest {c.upper()}" for c, t in best.items() if not asked[0] <= t <= asked[-1])
    note = (f"The {moved or 'optimum'} lay on the edge of T = {asked[0]:.3g}…{asked[-1]:.3g}, "
            f"so the sweep went on to T = {lo:.3g}…{hi:.3g}")
    hit = [t for t in best.values() if t in bounds]
    return note + (f"; it stopped at the bound T = {hit[0]:.3g}: the optimum may lie further out." if hit else ".")


def temperature_sweep(pred: Predictions, temperatures: Optional[Sequence[float]] = None, form: Form = "logit",
                      n_bins: int = 10, edges: BinEdges = "right") -> Sweep:
    """ECE, NLL and accuracy at each temperature (default: ``LAB_SWEEP_GRIDS[form]`` of
    :mod:`lab.calibration.temperature`), ascending.

    The best values are the first lowest-ECE and lowest-NLL temperatures. An optimum on an edge of
    the grid is only a sign that the curve still falls there, so the sweep widens the grid past that
    edge (:func:`lab.calibration.temperature.widened_search`, up to ``LAB_SWEEP_BOUNDS[form]``) until both optima are
    inside it or on a bound, and says so in ``widened``. Accuracy is constant up to ties, since both
    forms keep each row's order. ``edges`` bins the ECE (a run's :attr:`Predictions.bin_edges`).
    A token run is swept over the whole vocabulary (:func:`temperature_summary`), within the
    temperatures it kept its log-partition at (:func:`temperature_limits`).
    """
    _check_form(form)
    check_edges(edges)
    bounds = temperature_limits(pred) or LAB_SWEEP_BOUNDS[form]
    asked = LAB_SWEEP_GRIDS[form] if temperatures is None else np.asarray(temperatures, dtype=np.float64)
    if asked.ndim != 1 or asked.size == 0:
        raise ValueError(f"Expected a non-empty 1-D sequence of temperatures, but got {temperatures!r}")
    records = widened_search(lambda t: _sweep_point(pred, t, form, n_bins, edges), asked, ("ece", "nll"), bounds)
    table = pd.DataFrame(records, columns=["temperature", "ece", "nll", "accuracy"])
    best_ece, best_nll = (float(table["temperature"].iloc[int(np.argmin(table[c]))]) for c in ("ece", "nll"))
    return Sweep(table, best_ece, best_nll, _widened_note(np.unique(asked), table, bounds))


def temperature_limits(pred: Predictions) -> Optional[tuple[float, float]]:
    """The temperatures a token run can be rescaled to, its log-partition's grid within the logit form's
    sweep bounds; None for a multiple-choice run (any positive T). ValueError for a token run evaluated
    before the log-partition was kept."""
    if not is_token_run(pred):
        return None
    grid, (low, high) = token_logits(pred).grid, LAB_SWEEP_BOUNDS["logit"]
    return max(low, float(grid[0])), min(high, float(grid[-1]))
