"""A stored evaluation's predictions read back as arrays, and what the run reported of them.

Every evaluation writes ``metrics.json`` and ``predictions.jsonl`` (see :mod:`lab.kinds.evaluate.run`), and
the latter holds every probability the metrics came from. :func:`load_predictions` reads it, checking
every row (a bad row is named, not skipped), into :class:`Predictions`, which the analyses
(:mod:`lab.results.analysis`), the case studies (:mod:`lab.results.cases`) and the pages start from.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lab.calibration import metrics
from lab.calibration.checks import BinEdges, check_edges
from lab.calibration.metrics import finite_or_none
from lab.calibration.summary import token_arrays
from lab.calibration.token_temperature import TokenLogits
from lab.core import stored
from lab.core.layout import PREDICTIONS_FILE
from lab.data.synthetic import true_distributions
from lab.results.run_metrics import read_metrics

LEGACY_BIN_EDGES = "left"  # what a metrics.json without "bin_edges" was binned with (before the choice existed)
MCQ = "mcq"  # Predictions.task of a multiple-choice run; a token-level run's is its task, clm or facts
TOKEN_TASKS = ("clm", "facts")
EVALUATE_AGAIN = ("was evaluated before the lab kept what a temperature needs (each target's log-partition over "
                  "the vocabulary); evaluate it again")


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


def token_logits(pred: Predictions) -> TokenLogits:
    """A token run's :attr:`Predictions.logits`; a ValueError naming the run when it was evaluated
    before the lab kept them."""
    if pred.logits is None:
        raise ValueError(f"{pred.name} {EVALUATE_AGAIN}.")
    return pred.logits
