"""Stored evaluations analysed again: predictions as arrays, re-calibration, summaries, tables.

Every evaluation writes ``metrics.json`` and ``predictions.jsonl`` (see :mod:`lab.kinds.evaluate.run`), and
the latter holds every probability the metrics came from. So the browser lab recomputes what it
shows (temperatures, equal-mass bins, cross-run tables) from these files alone, with the same
numpy functions as the evaluation (:mod:`lab.calibration.metrics`, :func:`lab.calibration.temperature.scale`,
:func:`lab.calibration.temperature.temperature_paper`): the web server needs numpy and pandas only.
Which evaluations there are is :mod:`lab.results.runs`'s business; case studies are :mod:`lab.results.cases`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import pandas as pd

from lab.calibration import metrics
from lab.calibration.checks import BinEdges, check_edges
from lab.calibration.metrics import finite_or_none
from lab.calibration.summary import row_sum_sq, token_arrays, token_scores
from lab.calibration.temperature import (FORMS, LAB_SWEEP_BOUNDS, LAB_SWEEP_GRIDS, Form, scale, temperature_paper,
                                         widened_search)
from lab.calibration.token_temperature import TokenLogits, scaled_token_probs, token_sum_sq
from lab.core import stored
from lab.core.layout import PREDICTIONS_FILE
from lab.data.synthetic import true_distributions
from lab.data.templates import option_letter
from lab.results.reports import csv_text
from lab.results.runs import find_evaluations, read_metrics

LEGACY_BIN_EDGES = "left"  # what a metrics.json without "bin_edges" was binned with (before the choice existed)
TOPK_COLUMNS = ["rank", "mean_prob", "answer_in_topk"]
# The run, the numbers a reader came for, then how it was made: at 1440 px the numbers were behind a scroll.
RESULTS_COLUMNS = ["run", "ECE", "ECE low", "ECE high", "accuracy", "Trust", "AURC", "AUROC", "n", "cw-ECE",
                   "oracle accuracy", "oracle ECE", "model", "dataset", "split", "scoring", "domain", "folder"]
ROUNDED = {column: 4 for column in ("ECE", "ECE low", "ECE high", "accuracy", "Trust", "AURC", "AUROC", "cw-ECE",
                                    "oracle accuracy", "oracle ECE")}
DOMAIN = {True: "in", False: "out", None: ""}
ROBUSTNESS_BINS = tuple(range(5, 31))  # the bin counts the ECE-robustness plot tries
SMALL_N = 300  # below this many questions an ECE is flagged (HELM's floor for reporting calibration)
MCQ = "mcq"  # Predictions.task of a multiple-choice run; a token-level run's is its task, clm or facts
TOKEN_TASKS = ("clm", "facts")
TEMPERATURE_INSTEAD = ("Its figures at another temperature come from the log-partition each target kept "
                       "(temperature_summary, the Temperature lab).")
EVALUATE_AGAIN = ("was evaluated before the lab kept what a temperature needs (each target's log-partition over "
                  "the vocabulary); evaluate it again")
PAPER_ON_TOKENS = ("FIRST's softmax(p / c) divides every option's probability, and a token run keeps only its top "
                   "tokens' and the target's: use the logit form, softmax(z / T) over the whole vocabulary")


# ---------------------------------------------------------------- loading predictions
@dataclass
class Predictions:
    """One evaluation's questions as arrays.

    ``probs`` (n, K) float64 zero-padded: the *unscaled* option probabilities (``raw_probs`` where
    the run applied a temperature), so that any temperature is applied to the model's own output
    and not on top of another one. ``mask`` (n, K) bool marks real options, ``labels`` (n,) the
    correct option, ``rows`` the file's objects. ``dataset`` is the run's, from ``metrics.json``, and
    so is ``bin_edges``, the convention its ECE was computed with, so that a page redraws it as reported.

    ``task``: :data:`MCQ`, or for a token-level run (:mod:`lab.kinds.evaluate.tokens`) its task, clm or
    facts. There a row is one target token: ``probs`` (n, k + 1) holds its top-k probabilities over the
    whole vocabulary and, last, the ``rest`` mass outside them; ``labels`` the target's slot among
    them (k: outside the top k); ``mask`` is all True. The rest column can exceed the top token's
    probability, so the argmax of ``probs`` is not the prediction: read the confidence and correctness
    with :func:`reported_confidence` and :func:`reported_correct`, which hold for both kinds.
    ``logits``: what rescales a token run to any temperature of its grid (the raw logits and each
    target's log-partition, :class:`lab.calibration.token_temperature.TokenLogits`); None for a
    multiple-choice run, and for a token run evaluated before the lab kept them.
    """

    probs: np.ndarray
    mask: np.ndarray
    labels: np.ndarray
    rows: list[dict[str, Any]]
    path: Optional[Path] = None
    dataset: Optional[str] = None
    bin_edges: BinEdges = "right"
    task: str = MCQ
    logits: Optional[TokenLogits] = None
    name: str = "this run"  # what messages call the run (its name under the runs folder), never its absolute path


def _vector(row: dict[str, Any], key: str, where: str) -> list[float]:
    """``row[key]`` as floats, or a ValueError saying where: a bad row is named, not skipped."""
    values = row.get(key)
    if not isinstance(values, list) or not values or any(finite_or_none(v) is None for v in values):
        raise ValueError(f"{where}: expected '{key}' to be a non-empty list of finite numbers, but got {values!r}")
    return [float(v) for v in values]


def _row_probs(row: Any, where: str) -> list[float]:
    """The probabilities a row contributes (``raw_probs`` first), checked; ``where`` is ``file:line``."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object per line, but got {type(row).__name__}")
    probs = _vector(row, "probs", where)
    if "raw_probs" in row:
        raw = _vector(row, "raw_probs", where)
        if len(raw) != len(probs):
            raise ValueError(f"{where}: 'raw_probs' has {len(raw)} options but 'probs' has {len(probs)}")
        probs = raw
    answer = row.get("answer")
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(probs):
        raise ValueError(f"{where}: expected 'answer' to be an option index in 0..{len(probs) - 1}, "
                         f"but got {answer!r}")
    return probs


def _read_rows(file: Path, where: str) -> list[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line, read through :mod:`lab.core.stored` (size
    and depth bounded); ``where`` names the file. A bad line names itself: metrics computed without
    it would not be the run's, so the run is refused, not shown short of a question."""
    try:
        rows, problems = stored.read_lines(file, where, objects=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"No predictions in {where.rpartition('/')[0] or 'this run'}") from None
    if problems:
        raise ValueError(f"{stored.summary(problems)} (rerun the evaluation to rewrite its predictions)")
    if not rows:
        raise ValueError(f"{where} holds no predictions (the file is empty)")
    return rows


def load_predictions(path: Path, name: Optional[str] = None) -> Predictions:
    """``predictions.jsonl`` (the file or its directory) as :class:`Predictions`.

    Raises ValueError naming the file and line for an empty file or a malformed row, and naming
    the run for a ``bin_edges`` in its ``metrics.json`` that is no convention. ``name``: the run as
    messages call it (its name under the runs folder; default its folder's own name), never the
    absolute path, which a page would show.
    """
    path = Path(path)
    file = path / PREDICTIONS_FILE if path.is_dir() else path
    name = name or file.parent.name
    shown = Path(name) / file.name  # what messages name: the run, not where the server keeps it
    numbered = _read_rows(file, shown.as_posix())
    info = read_metrics(path if path.is_dir() else path.parent) or {}
    dataset, edges = info.get("dataset"), info.get("bin_edges", LEGACY_BIN_EDGES)
    try:
        check_edges(edges)
    except ValueError as e:
        raise ValueError(f"{name}: metrics.json: {e}") from None
    dataset = None if dataset is None else str(dataset)
    rows = [row for _, row in numbered]
    if isinstance(rows[0], dict) and "target_id" in rows[0]:
        probs, labels = _token_arrays(shown, numbered)
        task = info.get("task") if info.get("task") in TOKEN_TASKS else TOKEN_TASKS[0]
        return Predictions(probs, np.ones(probs.shape, dtype=bool), labels, rows, file, dataset, edges, str(task),
                           _token_logits(shown, numbered, info.get("temperature_grid")), name)
    vectors = [_row_probs(row, f"{shown}:{number}") for number, row in numbered]
    probs, mask = metrics.padded(vectors)
    labels = np.array([row["answer"] for row in rows], dtype=np.int64)
    return Predictions(probs, mask, labels, rows, file, dataset, edges, name=name)


def _token_arrays(file: Path, numbered: list[tuple[int, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """A token-level run's (probs, labels) as :class:`Predictions` holds them: each row's top-k
    probabilities and the rest mass, and the target's slot among them (k when outside the top k);
    a row lacking a field it needs names its file and line."""
    width = None  # the first row's number of top tokens: every row must have as many
    for number, row in numbered:
        where = f"{file}:{number}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object per line, but got {type(row).__name__}")
        top = _vector(row, "top_probs", where)
        rest, ids = finite_or_none(row.get("rest")), row.get("top_ids")
        if rest is None or not isinstance(ids, list) or len(ids) != len(top):
            raise ValueError(f"{where}: expected a finite 'rest' and one 'top_ids' entry per 'top_probs' entry")
        if finite_or_none(row.get("confidence")) is None or not isinstance(row.get("correct"), bool):
            raise ValueError(f"{where}: expected a finite 'confidence' and a true/false 'correct'")
        if width is not None and len(top) != width:
            raise ValueError(f"{where}: {len(top)} top tokens, but the first row has {width}")
        width = len(top)
    return token_arrays([row for _, row in numbered])


def _token_logits(file: Path, numbered: list[tuple[int, Any]], grid: Any) -> Optional[TokenLogits]:
    """A token run's :class:`TokenLogits` from its rows' ``top_logits``, ``target_logit`` and ``log_z``
    and its ``metrics.json``'s ``temperature_grid``; None when no row has them (a run evaluated before
    they were kept); a row lacking them, or holding them malformed, names its file and line."""
    kept = ["log_z" in row for _, row in numbered]
    if not any(kept):
        return None
    if not isinstance(grid, list) or len(grid) < 2 or any(finite_or_none(t) is None or t <= 0 for t in grid):
        raise ValueError(f"{file.parent}: metrics.json: expected 'temperature_grid', the positive temperatures the "
                         f"rows' log_z are at, but got {grid!r}")
    for (number, row), has in zip(numbered, kept):
        where = f"{file}:{number}"
        if not has:
            raise ValueError(f"{where}: no 'log_z', which the run's other rows have")
        top, log_z, target = (_vector(row, "top_logits", where), _vector(row, "log_z", where),
                              finite_or_none(row.get("target_logit")))
        if len(top) != len(row["top_probs"]) or len(log_z) != len(grid) or target is None:
            raise ValueError(f"{where}: expected a 'top_logits' entry per top token, a 'log_z' entry per temperature "
                             f"of the grid ({len(grid)}) and a finite 'target_logit'")
    return TokenLogits.from_rows([row for _, row in numbered], grid)


def is_token_run(pred: Predictions) -> bool:
    """Whether ``pred`` is a token-level run (task clm or facts), not a multiple-choice one."""
    return pred.task != MCQ


def require_options(pred: Predictions, what: str, instead: str = "") -> None:
    """ValueError when ``pred`` is a token-level run: ``what`` (e.g. "rescaling by a temperature")
    needs every option's probability, which a token run keeps only for its top tokens; ``instead``
    says what to do."""
    if is_token_run(pred):
        raise ValueError(f"{pred.name} is a token-level run (task {pred.task}): {what} needs the probability of every "
                         f"option, and the run keeps only the top tokens of the vocabulary and the rest mass."
                         + (f" {instead}" if instead else ""))


def reported_confidence(pred: Predictions) -> np.ndarray:
    """Each question's confidence as the run reported it: the top option probability (after any
    temperature it applied), or for a token-level run each target's ``confidence`` (the top
    probability over the whole vocabulary)."""
    if is_token_run(pred):
        return np.array([float(row["confidence"]) for row in pred.rows], dtype=np.float64)
    return metrics.predictions(reported_probs(pred), pred.mask)[1]


def reported_correct(pred: Predictions) -> np.ndarray:
    """Whether each reported answer is right: the top option of the probabilities as reported, or for
    a token-level run each target's ``correct`` (the top token is the text's)."""
    if is_token_run(pred):
        return np.array([bool(row["correct"]) for row in pred.rows])
    return metrics.predictions(reported_probs(pred), pred.mask)[0] == pred.labels


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


def oracle_probs(pred: Predictions) -> Optional[np.ndarray]:
    """The questions' true answer distributions (n, K) when every row carries one (``meta.true_probs``,
    the controlled task of :mod:`lab.data.synthetic`), else None (always for a token-level run,
    whose slots are tokens, not the colours the truths are over)."""
    if is_token_run(pred):
        return None
    truths = true_distributions(pred.rows)
    if truths is None or any(len(t) != int(m.sum()) for t, m in zip(truths, pred.mask)):
        return None
    return metrics.padded(truths)[0]


def reported_probs(pred: Predictions) -> np.ndarray:
    """The probabilities the run reported (its rows' ``probs``, after any temperature it applied); for
    a token-level run, :attr:`Predictions.probs` (top tokens and rest, as the run reported them)."""
    if is_token_run(pred):
        return pred.probs
    return metrics.padded([row["probs"] for row in pred.rows])[0]


# ---------------------------------------------------------------- recalibration and summaries
def _check_temperature(temperature: Any) -> float:
    value = finite_or_none(temperature)
    if value is None or value <= 0:
        raise ValueError(f"Expected a positive temperature, but got {temperature!r}")
    return value


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"Expected `form` to be one of {FORMS}, but got {form!r}")


def token_logits(pred: Predictions) -> TokenLogits:
    """A token run's :attr:`Predictions.logits`; a ValueError naming the run when it was evaluated
    before the lab kept them."""
    if pred.logits is None:
        raise ValueError(f"{pred.name} {EVALUATE_AGAIN}.")
    return pred.logits


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


# ---------------------------------------------------------------- across runs, and the top tokens
def results_table(root: Path) -> pd.DataFrame:
    """FIRST Table 1 across every evaluation under ``root``, newest first, numbers rounded to 4: each
    run by its label and folder, how it was scored, its ECE with the bootstrap interval
    (``ECE low``/``ECE high``; empty for a run evaluated without a bootstrap), and how well its top
    probability ranks right above wrong answers (AURC, lower is better; AUROC, higher is better;
    empty for a run evaluated before they were recorded); on data with known true distributions
    (the controlled task), the Bayes predictor's accuracy and ECE on the same questions."""
    records = [
        {"run": r.label, "folder": r.name, "model": r.model, "dataset": r.dataset_label, "split": r.split,
         "scoring": f"{r.scoring} ({r.template})" if r.scoring and r.template else r.scoring,
         "domain": DOMAIN[r.in_domain], "n": r.n, "ECE": r.ece, "ECE low": r.ece_ci[0] if r.ece_ci else None,
         "ECE high": r.ece_ci[1] if r.ece_ci else None, "accuracy": r.accuracy, "Trust": r.trust, "cw-ECE": r.cw_ece,
         "AURC": r.aurc, "AUROC": r.auroc, "oracle accuracy": r.oracle_accuracy, "oracle ECE": r.oracle_ece}
        for r in find_evaluations(root)
    ]
    return pd.DataFrame(records, columns=RESULTS_COLUMNS).round(ROUNDED)


def results_csv(df: pd.DataFrame) -> str:
    """The table as CSV text, for a download button; a run's name that a spreadsheet would run as a
    formula is written as text (:func:`lab.results.reports.csv_text`)."""
    return csv_text(df)


def _as_letter(token: Any) -> str:
    """A decoded token compared as a letter: it may carry a leading space, and some templates
    (``first_lower``) letter the options in lower case."""
    return str(token).strip().upper()


def _top_tokens(tokens: Any) -> bool:
    """Whether a row's ``top_tokens`` can be ranked: a non-empty list of ``{token, prob}`` with finite
    probabilities (a row without them, or with a damaged list, adds nothing to the table)."""
    return isinstance(tokens, list) and bool(tokens) and all(
        isinstance(t, dict) and "token" in t and finite_or_none(t.get("prob")) is not None for t in tokens)


def positionwise_topk(pred: Predictions) -> pd.DataFrame:
    """For rank k = 1..5 of the full-vocabulary top tokens at the answer position (letter scoring):
    ``mean_prob`` of the rank-k token, and ``answer_in_topk``, the fraction of questions whose
    answer letter is among the top k tokens. Empty when no row has ``top_tokens`` (cloze runs).
    """
    if is_token_run(pred):  # its top tokens are the vocabulary's at a target, not answer letters
        return pd.DataFrame(columns=TOPK_COLUMNS)
    tops = [(sorted(row["top_tokens"], key=lambda t: -t["prob"]), option_letter(row["answer"]))
            for row in pred.rows if _top_tokens(row.get("top_tokens"))]
    if not tops:
        return pd.DataFrame(columns=TOPK_COLUMNS)
    depth = max(len(tokens) for tokens, _ in tops)
    records = []
    for k in range(1, depth + 1):
        probs = [float(tokens[k - 1]["prob"]) for tokens, _ in tops if len(tokens) >= k]
        hits = [answer in {_as_letter(t["token"]) for t in tokens[:k]} for tokens, answer in tops]
        records.append({"rank": k, "mean_prob": float(np.mean(probs)), "answer_in_topk": float(np.mean(hits))})
    return pd.DataFrame(records, columns=TOPK_COLUMNS)
