"""Recalibrators fitted on one run and applied to another: honest by construction.

A calibrator fitted on the questions it is then scored on flatters every method (isotonic
regression, with one step per question, can drive that ECE to 0). So a :class:`Calibrator` keeps
the keys of the questions it was fitted on (:func:`question_key`: the question and its options,
not an id that two datasets may share), and :func:`check_held_out` refuses to report it on a set
that is mostly the same questions and counts any overlap, for the pages to mark it.

Methods (:data:`METHODS`), each a fit and an apply over a run's option probabilities:

    temperature  softmax(log p / T), T fitted on NLL (:func:`lab.calibration.temperature.fit_temperature`):
                 one parameter, keeps the ranking; the confidence is the new top probability.
    platt        Platt scaling of a confidence signal: σ(a · logit(s) + b), fitted by scikit-learn's
                 LogisticRegression (almost unregularised, C = 1e4, so a separable set stays finite).
    isotonic     scikit-learn's IsotonicRegression of correctness on the signal (monotone, clipped
                 outside the fitted range): flexible, and the surest to overfit a small set.
    histogram    histogram binning (Zadrozny & Elkan 2001): equal-mass bins of the signal, each
                 mapped to the accuracy of its fit questions.

Platt, isotonic and histogram binning calibrate the *top-label* confidence (any registered
:mod:`lab.calibration.confidence` signal) and leave the predicted option as it is; so the Brier score and NLL
reported before and after are those of that confidence as a probability of being right (the
binary, top-label forms), the same for every method. A calibrator is stored as JSON: plain numbers,
no pickle, so a file from elsewhere can be read without running anything in it. numpy only at
import; scikit-learn and scipy are imported by the fits.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from lab.calibration import confidence, metrics
from lab.calibration.checks import BinEdges, check_conf_correct, check_labels, check_n_bins, check_probs
from lab.calibration.metrics import finite_or_none
from lab.calibration.temperature import scale
from lab.core.files import write_atomic
from lab.core.layout import CALIBRATOR_FILE
from lab.core.reads import PathNotAllowed, read_text
from lab.core.registry import Registry

EPS = 1e-6  # a confidence is clipped to [EPS, 1 − EPS] before a logit or a log
PLATT_C = 1e4  # LogisticRegression's inverse regularisation: effectively none, but finite on separable data
SAME_QUESTIONS_REFUSED = 0.5  # at least this fraction of the scored set among the fit questions: refused
DEFAULT_BINS = 10


class SameQuestions(ValueError):
    """A calibrator asked to be scored on the questions it was fitted on."""


@dataclass
class Calibrator:
    """A fitted recalibration: ``method`` and its ``params``, the ``signal`` it maps, and where it
    was fitted (``fitted_on``: run name, label, dataset, split, n; ``questions``: their keys)."""

    method: str
    signal: str
    params: dict[str, Any]
    fitted_on: dict[str, Any] = field(default_factory=dict)
    questions: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """``isotonic of top probability, fitted on <label> (n = 500)``."""
        title = confidence.SIGNALS.get(self.signal).title
        where = self.fitted_on.get("label") or self.fitted_on.get("run") or "another run"
        return f"{METHODS.get(self.method).title} of {title}, fitted on {where} (n = {len(self.questions)})"


@dataclass(frozen=True)
class Method:
    title: str
    fit: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int], dict[str, Any]]
    apply: Callable[[dict[str, Any], np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    multiclass: bool = False  # rescales the option probabilities (the signal is then their top one)


# ---------------------------------------------------------------- question identity
def question_key(row: dict[str, Any]) -> str:
    """A stable key for one question: a hash of its text and options (ids collide across datasets)."""
    text = " ".join(str(row.get("question", "")).split()) + "\x1f" + "\x1f".join(
        " ".join(str(c).split()) for c in row.get("choices") or [])
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def overlap(cal: Calibrator, rows: Sequence[dict[str, Any]]) -> int:
    """How many of ``rows``' questions the calibrator was fitted on."""
    fitted = set(cal.questions)
    return sum(question_key(row) in fitted for row in rows)


def check_held_out(cal: Calibrator, rows: Sequence[dict[str, Any]]) -> int:
    """The number of shared questions; raises :class:`SameQuestions` when they are at least
    :data:`SAME_QUESTIONS_REFUSED` of ``rows``: the result would measure the fit, not the calibration."""
    shared = overlap(cal, rows)
    if rows and shared >= SAME_QUESTIONS_REFUSED * len(rows):
        raise SameQuestions(
            f"{shared} of these {len(rows)} questions are the ones the calibrator was fitted on "
            f"({cal.fitted_on.get('label') or cal.fitted_on.get('run')}): scoring it there measures the fit, not "
            "the calibration. Fit on a validation run and apply to a test run of the same model and task.")
    return shared


# ---------------------------------------------------------------- the methods
def _logit(s: np.ndarray) -> np.ndarray:
    s = np.clip(s, EPS, 1 - EPS)
    return np.log(s) - np.log1p(-s)


def _fit_temperature(probs, mask, labels, signal_values, n_bins) -> dict[str, Any]:
    from lab.calibration.temperature import fit_temperature

    fit = fit_temperature(probs, labels, mask, objective="nll", n_bins=n_bins)
    return {"temperature": fit.temperature, "at_bound": fit.at_bound}


def _apply_temperature(params, probs, mask, signal_values) -> np.ndarray:
    return scale(probs, float(params["temperature"]), mask)


def _fit_platt(probs, mask, labels, s, n_bins) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    correct = _correct(probs, mask, labels)
    model = LogisticRegression(C=PLATT_C).fit(_logit(s)[:, None], correct)
    return {"a": float(model.coef_[0, 0]), "b": float(model.intercept_[0])}


def _apply_platt(params, probs, mask, s) -> np.ndarray:
    z = float(params["a"]) * _logit(s) + float(params["b"])
    return 1.0 / (1.0 + np.exp(-z))


def _fit_isotonic(probs, mask, labels, s, n_bins) -> dict[str, Any]:
    from sklearn.isotonic import IsotonicRegression

    model = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(s, _correct(probs, mask, labels))
    return {"x": [float(v) for v in model.X_thresholds_], "y": [float(v) for v in model.y_thresholds_]}


def _apply_isotonic(params, probs, mask, s) -> np.ndarray:
    # sklearn's predict interpolates linearly between the thresholds and clips outside: np.interp does both
    return np.interp(s, np.asarray(params["x"], dtype=np.float64), np.asarray(params["y"], dtype=np.float64))


def _fit_histogram(probs, mask, labels, s, n_bins) -> dict[str, Any]:
    correct = _correct(probs, mask, labels)
    inner = np.unique(np.quantile(s, np.linspace(0, 1, n_bins + 1)[1:-1]))  # equal-mass; tied edges merge
    bins = np.searchsorted(inner, s, side="right")
    count = np.bincount(bins, minlength=inner.size + 1)
    hits = np.bincount(bins, weights=correct, minlength=inner.size + 1)
    overall = float(correct.mean())
    values = np.where(count > 0, hits / np.maximum(count, 1), overall)  # a bin emptied by ties: the mean
    return {"edges": [float(e) for e in inner], "values": [float(v) for v in values]}


def _apply_histogram(params, probs, mask, s) -> np.ndarray:
    bins = np.searchsorted(np.asarray(params["edges"], dtype=np.float64), s, side="right")
    return np.asarray(params["values"], dtype=np.float64)[bins]


METHODS: Registry[Method] = Registry("calibration method")
METHODS.add("temperature", Method("temperature scaling", _fit_temperature, _apply_temperature, multiclass=True))
METHODS.add("platt", Method("Platt scaling", _fit_platt, _apply_platt))
METHODS.add("isotonic", Method("isotonic regression", _fit_isotonic, _apply_isotonic))
METHODS.add("histogram", Method("histogram binning", _fit_histogram, _apply_histogram))


def _correct(probs: np.ndarray, mask: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return (metrics.predictions(probs, mask)[0] == labels).astype(np.float64)


# ---------------------------------------------------------------- fit, apply, score
def fit(method: str, probs: Any, mask: Any, labels: Any, rows: Sequence[dict[str, Any]],
        signal: str = confidence.DEFAULT, n_bins: int = DEFAULT_BINS, **fitted_on: Any) -> Calibrator:
    """Fit ``method`` on one run's probabilities (``rows`` its prediction rows, for the signal and
    the question keys); ``fitted_on`` records where (run, label, dataset, split)."""
    spec = METHODS.get(method)
    if spec.multiclass and signal != confidence.DEFAULT:
        raise ValueError(f"{spec.title} rescales the option probabilities, so its confidence is the top "
                         f"probability; pick signal {confidence.DEFAULT!r} or another method for {signal!r}.")
    check_n_bins(n_bins)
    probs, mask, labels = _arrays(probs, mask, labels)
    s = confidence.values(signal, probs, mask, rows)
    params = spec.fit(probs, mask, labels, s, n_bins)
    return Calibrator(method, signal, params, {**fitted_on, "n": int(labels.size)}, [question_key(r) for r in rows])


def apply(cal: Calibrator, probs: Any, mask: Any, rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The predicted option (n,) and its calibrated confidence (n,) for another run's questions."""
    spec = METHODS.get(cal.method)
    probs, mask = np.asarray(probs, dtype=np.float64), np.asarray(mask, dtype=bool)
    if spec.multiclass:
        probs = spec.apply(cal.params, probs, mask, np.empty(0))
        return metrics.predictions(probs, mask)
    s = confidence.values(cal.signal, probs, mask, rows)
    pred = metrics.predictions(probs, mask)[0]
    return pred, np.clip(spec.apply(cal.params, probs, mask, s), 0.0, 1.0)


def _arrays(probs: Any, mask: Any, labels: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    probs, mask = check_probs(probs, mask)
    return probs, mask, check_labels(labels, mask)


def top_label_brier(conf: np.ndarray, correct: np.ndarray) -> float:
    """Mean ``(c − 1[right])²``: the Brier score of the confidence as a probability of being right."""
    return float(np.mean((conf - correct) ** 2))


def top_label_nll(conf: np.ndarray, correct: np.ndarray) -> float:
    """Mean binary log loss of the confidence as a probability of being right (clipped at :data:`EPS`)."""
    c = np.clip(conf, EPS, 1 - EPS)
    return float(-np.mean(correct * np.log(c) + (1 - correct) * np.log1p(-c)))


def confidence_report(conf: Any, correct: Any, n_bins: int = 10, edges: BinEdges = "right",
                      n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """ECE with its bootstrap interval, smECE, top-label Brier and NLL, accuracy and the
    reliability bins of one confidence vector, JSON-ready."""
    conf, correct = check_conf_correct(conf, correct)
    low, high = metrics.ece_bootstrap(conf, correct, n_bins, n_boot, metrics.CI_LEVEL, seed, edges)
    return {
        "n": int(conf.size), "accuracy": float(correct.mean()), "ece": metrics.ece(conf, correct, n_bins, edges=edges),
        "ece_ci_low": low, "ece_ci_high": high, "smece": metrics.smooth_ece(conf, correct),
        "brier": top_label_brier(conf, correct), "nll": top_label_nll(conf, correct), "n_bins": int(n_bins),
        "bin_edges": edges,
        "reliability": metrics.reliability_rows(conf, correct, n_bins, edges=edges),
    }


def before_after(cal: Calibrator, probs: Any, mask: Any, labels: Any, rows: Sequence[dict[str, Any]],
                 n_bins: int = 10, edges: BinEdges = "right", n_boot: int = 1000) -> dict[str, Any]:
    """The calibrator applied to a held-out run: its confidence before (the calibrator's signal as
    the run gave it) and after, each a :func:`confidence_report`, and ``overlap``, the number of
    questions shared with the fit set. Raises :class:`SameQuestions` (see :func:`check_held_out`)."""
    shared = check_held_out(cal, rows)
    probs, mask, labels = _arrays(probs, mask, labels)
    pred = metrics.predictions(probs, mask)[0]
    signal = confidence.DEFAULT if METHODS.get(cal.method).multiclass else cal.signal
    before = np.clip(confidence.values(signal, probs, mask, rows), 0.0, 1.0)
    after_pred, after = apply(cal, probs, mask, rows)
    return {
        "calibrator": cal.describe(), "signal": signal, "overlap": shared,
        "before": confidence_report(before, pred == labels, n_bins, edges, n_boot),
        "after": confidence_report(after, after_pred == labels, n_bins, edges, n_boot),
    }


# ---------------------------------------------------------------- the artefact
def save(cal: Calibrator, directory: Path) -> Path:
    """Write ``calibrator.json`` into ``directory`` (created)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / CALIBRATOR_FILE
    write_atomic(target, json.dumps(asdict(cal), indent=1) + "\n")
    return target


def _numbers(value: Any, what: str) -> list[float]:
    if not isinstance(value, list) or any(finite_or_none(v) is None for v in value):
        raise ValueError(f"{what} must be a list of finite numbers")
    return [float(v) for v in value]


def load(path: Path) -> Calibrator:
    """A :class:`Calibrator` from ``calibrator.json`` or the folder holding it, every field checked
    (it may come from anywhere): ValueError naming the file and what is wrong."""
    path = Path(path)
    file = path / CALIBRATOR_FILE if path.is_dir() else path
    try:
        data = json.loads(read_text(file, encoding="utf-8"))
    except PathNotAllowed:
        raise
    except FileNotFoundError:
        raise FileNotFoundError(f"No calibrator at {file}: fit one in the Recalibration workbench") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{file}: not a calibrator file ({e})") from None
    try:
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        method, signal = data.get("method"), data.get("signal")
        if method not in METHODS or signal not in confidence.SIGNALS:
            raise ValueError(f"unknown method {method!r} or signal {signal!r}")
        params = data.get("params")
        if not isinstance(params, dict):
            raise ValueError("params must be an object")
        checked = _checked_params(method, params)
        questions = data.get("questions", [])
        if not isinstance(questions, list) or not all(isinstance(q, str) for q in questions):
            raise ValueError("questions must be a list of keys")
        fitted_on = data.get("fitted_on", {})
        if not isinstance(fitted_on, dict):
            raise ValueError("fitted_on must be an object")
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None
    return Calibrator(method, signal, checked, fitted_on, questions)


def _checked_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "temperature":
        t = finite_or_none(params.get("temperature"))
        if t is None or t <= 0:
            raise ValueError("temperature must be a positive number")
        return {"temperature": t, "at_bound": bool(params.get("at_bound", False))}
    if method == "platt":
        a, b = finite_or_none(params.get("a")), finite_or_none(params.get("b"))
        if a is None or b is None:
            raise ValueError("Platt scaling needs numbers a and b")
        return {"a": a, "b": b}
    if method == "isotonic":
        x, y = _numbers(params.get("x"), "x"), _numbers(params.get("y"), "y")
        if not x or len(x) != len(y) or np.any(np.diff(x) < 0):
            raise ValueError("isotonic x and y must be equal-length lists with x ascending")
        return {"x": x, "y": y}
    edges, values = _numbers(params.get("edges"), "edges"), _numbers(params.get("values"), "values")
    if len(values) != len(edges) + 1 or np.any(np.diff(edges) <= 0):
        raise ValueError("histogram binning needs ascending edges and one value more than edges")
    return {"edges": edges, "values": values}


def fitted_on_same(cal: Optional[Calibrator], rows: Sequence[dict[str, Any]]) -> Optional[str]:
    """A red-flag sentence when ``cal`` was fitted on some of these questions, else None."""
    if cal is None:
        return None
    shared = overlap(cal, rows)
    if not shared:
        return None
    return (f"{shared} of these {len(rows)} questions were used to fit this calibrator: "
            "its numbers here are optimistic.")
