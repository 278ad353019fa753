"""Stored evaluation results, read back for the browser lab: no model calls, no torch.

Every evaluation writes ``metrics.json`` and ``predictions.jsonl`` (see :mod:`lab.evaluate`), and
the latter holds every probability the metrics came from. So the UI recomputes what it shows
(temperatures, equal-mass bins, case studies, cross-run tables) from these files alone, with the
same numpy functions as the evaluation (:mod:`lab.metrics`, :func:`lab.temperature.scale`): the
web server needs numpy, pandas and plotly only.

Where the files are: a plain ``evaluate`` job is ``runs/<job>/`` itself; FIRST and CFT pipelines
nest theirs as ``runs/<job>/eval/<row>-<set>/``. :func:`find_evaluations` finds both.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, NamedTuple, Optional, Sequence

import numpy as np
import pandas as pd

from lab import metrics
from lab.temperature import scale

METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.jsonl"
MAX_DEPTH = 4  # runs/<job>/eval/<row>-<set> is depth 3; deeper folders (checkpoints) are not searched
Form = Literal["logit", "paper"]
FORMS: tuple[str, ...] = ("logit", "paper")
CaseKind = Literal["all", "overconfident_wrong", "correct", "wrong"]
CASE_KINDS: tuple[str, ...] = ("all", "overconfident_wrong", "correct", "wrong")
# Default sweep grids: the logit temperature is 1 for "no change"; the paper form divides
# probabilities in [0, 1], so only c well below 1 restores contrast (lab.first.recalibration.temperature_paper).
DEFAULT_TEMPERATURES: dict[str, np.ndarray] = {
    "logit": np.geomspace(0.1, 10.0, 81),
    "paper": np.geomspace(0.01, 1.0, 81),
}
TOPK_COLUMNS = ["rank", "mean_prob", "answer_in_topk"]
CASE_COLUMNS = ["id", "dataset", "question", "options", "answer", "prediction", "confidence", "correct",
                "overconfident_wrong"]
SAME_QUESTION_COLUMNS = ["run", "answer", "prediction", "confidence", "correct", "probs"]
RESULTS_COLUMNS = ["run", "model", "dataset", "domain", "n", "ECE", "accuracy", "Trust", "cw-ECE"]
DOMAIN = {True: "in", False: "out", None: ""}


# ---------------------------------------------------------------- finding evaluations
@dataclass(frozen=True)
class EvalRun:
    """One evaluation directory and the headline numbers of its ``metrics.json`` (None when absent)."""

    path: Path
    name: str  # path relative to the searched root, POSIX, e.g. "12/eval/cft-in_domain"
    model: Optional[str] = None
    dataset: Optional[str] = None
    split: Optional[str] = None
    n: Optional[int] = None
    accuracy: Optional[float] = None
    ece: Optional[float] = None
    cw_ece: Optional[float] = None
    nll: Optional[float] = None
    trust: Optional[float] = None
    temperature: Optional[float] = None
    scoring: Optional[str] = None
    in_domain: Optional[bool] = None  # set by the FIRST and CFT pipelines for their evaluations


def _read_metrics(path: Path) -> Optional[dict[str, Any]]:
    """``metrics.json`` as a dict, or None when it is missing, half-written or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError covers JSONDecodeError and UnicodeDecodeError
        return None
    return data if isinstance(data, dict) else None


def _number(value: Any) -> Optional[float]:
    """A finite float, or None: a metrics file written by another version must not break the table."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    if not math.isfinite(value):
        return None
    return float(value)


def _text(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _evaluation_dirs(directory: Path, depth: int) -> Iterator[Path]:
    """Directories holding both result files, searched ``depth`` levels down; hidden ones skipped."""
    if (directory / METRICS_FILE).is_file() and (directory / PREDICTIONS_FILE).is_file():
        yield directory
    if depth == 0:
        return
    try:
        children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:  # removed or unreadable while we looked: a job may be cleaning up
        return
    for child in children:
        yield from _evaluation_dirs(child, depth - 1)


def _eval_run(root: Path, directory: Path) -> Optional[tuple[float, EvalRun]]:
    """The run and its metrics file's modification time, or None when the metrics are unreadable."""
    path = directory / METRICS_FILE
    data = _read_metrics(path)
    if data is None:
        return None
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    n = _number(data.get("n"))
    run = EvalRun(
        path=directory, name=directory.relative_to(root).as_posix(), model=_text(data.get("model")),
        dataset=_text(data.get("dataset")), split=_text(data.get("split")), n=None if n is None else int(n),
        accuracy=_number(data.get("accuracy")), ece=_number(data.get("ece")), cw_ece=_number(data.get("cw_ece")),
        nll=_number(data.get("nll")), trust=_number(data.get("trust")),
        temperature=_number(data.get("temperature")), scoring=_text(data.get("scoring")),
        in_domain=data["in_domain"] if isinstance(data.get("in_domain"), bool) else None,
    )
    return mtime, run


def evaluation(root: Path, name: str) -> Optional[EvalRun]:
    """The evaluation called ``name`` (a :attr:`EvalRun.name`) under ``root``, or None.

    What a browser sends is a name; it must resolve (through ``..`` and symlinks) to a directory
    inside ``root`` holding both files. One lookup instead of a scan of the whole tree.
    """
    if not name:
        return None
    base = Path(os.path.realpath(root))
    directory = Path(os.path.realpath(base / name))
    if directory != base and base not in directory.parents:
        return None
    if not (directory / PREDICTIONS_FILE).is_file():
        return None
    found = _eval_run(base, directory)
    return found[1] if found else None


def find_evaluations(root: Path, max_depth: int = MAX_DEPTH) -> list[EvalRun]:
    """Every evaluation under ``root`` (``root`` itself included), newest ``metrics.json`` first.

    A damaged or half-written ``metrics.json`` (a job still writing, or killed) is skipped: the
    list is polled by the UI and must never fail because of one run.
    """
    root = Path(root)
    found = [entry for d in _evaluation_dirs(root, max_depth) if (entry := _eval_run(root, d)) is not None]
    found.sort(key=lambda item: (-item[0], item[1].name))
    return [run for _, run in found]


# ---------------------------------------------------------------- loading predictions
@dataclass
class Predictions:
    """One evaluation's questions as arrays.

    ``probs`` (n, K) float64 zero-padded: the *unscaled* option probabilities (``raw_probs`` where
    the run applied a temperature), so that any temperature is applied to the model's own output
    and not on top of another one. ``mask`` (n, K) bool marks real options, ``labels`` (n,) the
    correct option, ``rows`` the file's objects. ``dataset`` is the run's, from ``metrics.json``.
    """

    probs: np.ndarray
    mask: np.ndarray
    labels: np.ndarray
    rows: list[dict[str, Any]]
    path: Optional[Path] = None
    dataset: Optional[str] = None


def _vector(row: dict[str, Any], key: str, where: str) -> list[float]:
    """``row[key]`` as floats, or a ValueError saying where: a bad row is named, not skipped."""
    values = row.get(key)
    if not isinstance(values, list) or not values or any(_number(v) is None for v in values):
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


def _read_rows(file: Path) -> list[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line; a malformed line names itself."""
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"No predictions at {file}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{file}: not UTF-8 text ({e})") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}:{number}: not valid JSON ({e.msg}); is the file still being written?") from None
    if not rows:
        raise ValueError(f"{file} holds no predictions (the file is empty)")
    return rows


def load_predictions(path: Path) -> Predictions:
    """``predictions.jsonl`` (the file or its directory) as :class:`Predictions`.

    Raises ValueError naming the file and line for an empty file or a malformed row.
    """
    path = Path(path)
    file = path / PREDICTIONS_FILE if path.is_dir() else path
    numbered = _read_rows(file)
    vectors = [_row_probs(row, f"{file}:{number}") for number, row in numbered]
    probs, mask = metrics.padded(vectors)
    rows = [row for _, row in numbered]
    labels = np.array([row["answer"] for row in rows], dtype=np.int64)
    run_metrics = _read_metrics(file.parent / METRICS_FILE) or {}
    return Predictions(probs, mask, labels, rows, file, _text(run_metrics.get("dataset")))


def reported_probs(pred: Predictions) -> np.ndarray:
    """The probabilities the run reported (its rows' ``probs``, after any temperature it applied)."""
    return metrics.padded([row["probs"] for row in pred.rows])[0]


# ---------------------------------------------------------------- recalibration and summaries
def _check_temperature(temperature: Any) -> float:
    value = _number(temperature)
    if value is None or value <= 0:
        raise ValueError(f"Expected a positive temperature, but got {temperature!r}")
    return value


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"Expected `form` to be one of {FORMS}, but got {form!r}")


def recalibrate(pred: Predictions, temperature: float, form: Form = "logit") -> np.ndarray:
    """Option probabilities (n, K) at ``temperature``; padded options stay 0.

    ``"logit"``: ``softmax(log p / T)`` (:func:`lab.temperature.scale`); T = 1 only renormalises.
    ``"paper"``: FIRST Eq. 4 as printed, ``softmax(p / c)`` over the present options
    (:func:`lab.first.recalibration.temperature_paper` with a mask), which flattens rows at c = 1.
    """
    t = _check_temperature(temperature)
    _check_form(form)
    if form == "logit":
        return scale(pred.probs, t, pred.mask)
    z = np.where(pred.mask, pred.probs / t, -np.inf)
    e = np.exp(z - z.max(axis=1, keepdims=True))  # exp(-inf) = 0: padding gets no mass
    return e / e.sum(axis=1, keepdims=True)


def _finite_or_none(value: float) -> Optional[float]:
    return float(value) if np.isfinite(value) else None


def calibration_summary(probs: Any, mask: Any, labels: Any, n_bins: int = 10,
                        strategy: metrics.Strategy = "width") -> dict[str, Any]:
    """Headline metrics and the reliability table of one set of probabilities, JSON-ready.

    Keys: ``n, accuracy, ece, nll, brier, cw_ece, trust, n_bins, strategy, reliability``; the
    reliability bins have the shape of ``metrics.json``'s (``lo, hi, count, conf, acc, gap``; NaN
    → None), so a figure draws a stored summary and a recomputed one alike. ``strategy`` bins the
    ECE and the table (``"mass"``: equal-mass bins); cw-ECE always uses equal-width bins.
    """
    mask, labels = np.asarray(mask), np.asarray(labels)
    brier = metrics.brier(probs, labels, mask)  # checks probs, mask and labels before anything else
    probs = np.where(mask, np.asarray(probs, dtype=np.float64), 0.0)  # nll takes no mask: padding must be 0
    choice, conf = metrics.predictions(probs, mask)
    correct = choice == labels
    accuracy = float(np.mean(correct))
    ece = metrics.ece(conf, correct, n_bins, strategy)
    table = metrics.reliability_table(conf, correct, n_bins, strategy)
    reliability = [
        {key: int(column[m]) if key == "count" else _finite_or_none(column[m]) for key, column in table.items()}
        for m in range(n_bins)
    ]
    return {
        "n": int(len(labels)), "accuracy": accuracy, "ece": ece, "nll": metrics.nll(probs, labels),
        "brier": brier, "cw_ece": metrics.classwise_ece(probs, labels, n_bins, mask),
        "trust": metrics.trust(accuracy, ece), "n_bins": int(n_bins), "strategy": strategy,
        "reliability": reliability,
    }


class Sweep(NamedTuple):
    """A temperature sweep: ``table`` (temperature, ece, nll, accuracy) and the best of each."""

    table: pd.DataFrame
    best_ece: float
    best_nll: float


def temperature_sweep(pred: Predictions, temperatures: Optional[Sequence[float]] = None, form: Form = "logit",
                      n_bins: int = 10) -> Sweep:
    """ECE, NLL and accuracy at each temperature (default: ``DEFAULT_TEMPERATURES[form]``).

    The best values are the first lowest-ECE and lowest-NLL temperatures in the order given.
    Accuracy is constant up to ties, since both forms keep each row's order.
    """
    _check_form(form)
    grid = DEFAULT_TEMPERATURES[form] if temperatures is None else np.asarray(temperatures, dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"Expected a non-empty 1-D sequence of temperatures, but got {temperatures!r}")
    records = []
    for t in grid:
        probs = recalibrate(pred, float(t), form)
        choice, conf = metrics.predictions(probs, pred.mask)
        correct = choice == pred.labels
        records.append({"temperature": float(t), "ece": metrics.ece(conf, correct, n_bins),
                        "nll": metrics.nll(probs, pred.labels), "accuracy": float(np.mean(correct))})
    table = pd.DataFrame(records, columns=["temperature", "ece", "nll", "accuracy"])
    return Sweep(table, float(grid[int(np.argmin(table["ece"]))]), float(grid[int(np.argmin(table["nll"]))]))


# ---------------------------------------------------------------- case studies
def _letter(index: int) -> str:
    """Option letter by position: prompts always letter options A, B, C, ... (lab.data.record)."""
    return chr(ord("A") + index)


def _options_text(choices: Sequence[Any]) -> str:
    return " · ".join(f"{_letter(i)}. {choice}" for i, choice in enumerate(choices))


def _row_dataset(row: dict[str, Any], fallback: Optional[str]) -> str:
    """Each row names its dataset (``source``: a pooled CFT set mixes several); older rows fall back
    to ``meta`` and then to the run's dataset."""
    meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
    return str(row.get("source") or meta.get("dataset") or meta.get("source") or fallback or "")


def case_table(pred: Predictions, probs: Optional[np.ndarray] = None) -> pd.DataFrame:
    """One row per question, for browsing what the model answered and how sure it was.

    ``probs`` (n, K): the probabilities to show, e.g. :func:`recalibrate` at the slider's
    temperature; default the ones the run reported. ``overconfident_wrong`` is the confidence put
    on a wrong answer (0 for a right one): the sort key of :func:`filter_cases`.
    """
    probs = reported_probs(pred) if probs is None else np.asarray(probs, dtype=np.float64)
    if probs.shape != pred.mask.shape:
        raise ValueError(f"Expected `probs` of shape {pred.mask.shape}, but got {probs.shape}")
    choice, conf = metrics.predictions(probs, pred.mask)
    correct = choice == pred.labels
    table = pd.DataFrame({
        "id": [str(row.get("id", i)) for i, row in enumerate(pred.rows)],
        "dataset": [_row_dataset(row, pred.dataset) for row in pred.rows],
        "question": [str(row.get("question", "")) for row in pred.rows],
        "options": [_options_text(row.get("choices") or []) for row in pred.rows],
        "answer": [_letter(int(a)) for a in pred.labels],
        "prediction": [_letter(int(c)) for c in choice],
        "confidence": conf,
        "correct": correct,
        "overconfident_wrong": np.where(correct, 0.0, conf),
    })
    return table[CASE_COLUMNS]


def filter_cases(df: pd.DataFrame, kind: CaseKind = "all", conf_range: tuple[float, float] = (0.0, 1.0),
                 dataset: Optional[str] = None) -> pd.DataFrame:
    """The cases of one kind, confidence in ``conf_range`` (inclusive), most over-confident wrong first.

    ``"overconfident_wrong"``: wrong answers given with more confidence than the accuracy of the
    table (of ``dataset`` when given): the model claimed a hit rate it does not reach. Order: by
    ``overconfident_wrong`` then confidence, both descending, so wrong answers lead, surest first.
    """
    if kind not in CASE_KINDS:
        raise ValueError(f"Expected `kind` to be one of {CASE_KINDS}, but got {kind!r}")
    if dataset is not None:
        df = df[df["dataset"] == dataset]
    lo, hi = conf_range
    keep = df["confidence"].between(lo, hi)
    if kind == "correct":
        keep &= df["correct"]
    elif kind == "wrong":
        keep &= ~df["correct"]
    elif kind == "overconfident_wrong":
        keep &= ~df["correct"] & (df["confidence"] > df["correct"].mean())
    ordered = df[keep].sort_values(["overconfident_wrong", "confidence"], ascending=False, kind="mergesort")
    return ordered.reset_index(drop=True)


def same_question(runs: Sequence[Path], question_id: Any) -> pd.DataFrame:
    """One question across runs: what each answered, as reported (after its own temperature).

    Runs without the question are left out; the first row with the id counts. Ids are compared as
    text, since a custom dataset may store them as numbers.
    """
    wanted, records = str(question_id), []
    for run in runs:
        pred = load_predictions(Path(run))
        found = next((i for i, row in enumerate(pred.rows) if str(row.get("id")) == wanted), None)
        if found is None:
            continue
        row, probs = pred.rows[found], [float(p) for p in pred.rows[found]["probs"]]
        choice = int(np.argmax(probs))
        records.append({"run": Path(run).as_posix(), "answer": _letter(row["answer"]), "prediction": _letter(choice),
                        "confidence": probs[choice], "correct": choice == row["answer"], "probs": probs})
    return pd.DataFrame(records, columns=SAME_QUESTION_COLUMNS)


# ---------------------------------------------------------------- tables across runs
def results_table(root: Path) -> pd.DataFrame:
    """FIRST Table 1 across every evaluation under ``root``, newest first, numbers rounded to 4."""
    records = [
        {"run": r.name, "model": r.model, "dataset": r.dataset, "domain": DOMAIN[r.in_domain], "n": r.n,
         "ECE": r.ece, "accuracy": r.accuracy,
         "Trust": r.trust, "cw-ECE": r.cw_ece}
        for r in find_evaluations(root)
    ]
    return pd.DataFrame(records, columns=RESULTS_COLUMNS).round({"ECE": 4, "accuracy": 4, "Trust": 4, "cw-ECE": 4})


def results_csv(df: pd.DataFrame) -> str:
    """The table as CSV text, for a download button."""
    return df.to_csv(index=False)


def _as_letter(token: Any) -> str:
    """A decoded token compared as a letter: it may carry a leading space, and some templates
    (``first_lower``) letter the options in lower case."""
    return str(token).strip().upper()


def positionwise_topk(pred: Predictions) -> pd.DataFrame:
    """For rank k = 1..5 of the full-vocabulary top tokens at the answer position (letter scoring):
    ``mean_prob`` of the rank-k token, and ``answer_in_topk``, the fraction of questions whose
    answer letter is among the top k tokens. Empty when no row has ``top_tokens`` (cloze runs).
    """
    tops = [(sorted(row["top_tokens"], key=lambda t: -t["prob"]), _letter(row["answer"]))
            for row in pred.rows if row.get("top_tokens")]
    if not tops:
        return pd.DataFrame(columns=TOPK_COLUMNS)
    depth = max(len(tokens) for tokens, _ in tops)
    records = []
    for k in range(1, depth + 1):
        probs = [float(tokens[k - 1]["prob"]) for tokens, _ in tops if len(tokens) >= k]
        hits = [answer in {_as_letter(t["token"]) for t in tokens[:k]} for tokens, answer in tops]
        records.append({"rank": k, "mean_prob": float(np.mean(probs)), "answer_in_topk": float(np.mean(hits))})
    return pd.DataFrame(records, columns=TOPK_COLUMNS)
