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

A token-level run (task clm or facts) is calibrated alike, one target token a question: its
"options" are the top tokens and the rest (:attr:`lab.results.predictions.Predictions.probs`), the
prediction is always the top token (slot 0), the signals are the top probability and the margin,
and temperature scaling rescales the whole vocabulary through the log-partition each target kept
(:func:`lab.calibration.token_temperature.fit_token_temperature`). A calibrator remembers which kind it was
fitted on (``tokens``) and is refused on the other: a temperature or a map of confidences learnt on
letters or options says nothing about next tokens, and the reverse.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from lab.calibration import confidence, metrics
from lab.calibration.checks import BinEdges, check_conf_correct, check_labels, check_n_bins, check_probs
from lab.calibration.metrics import finite_or_none
from lab.calibration.temperature import scale
from lab.calibration.token_temperature import TokenLogits, scaled_token_probs
from lab.core.files import write_atomic
from lab.core.layout import CALIBRATOR_FILE
from lab.core import stored
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
    was fitted (``fitted_on``: run name, label, dataset, split, n; ``questions``: their keys;
    ``tokens``: on a token-level run's targets rather than a multiple-choice run's questions)."""

    method: str
    signal: str
    params: dict[str, Any]
    fitted_on: dict[str, Any] = field(default_factory=dict)
    questions: list[str] = field(default_factory=list)
    tokens: bool = False

    def describe(self) -> str:
        """``isotonic of top probability, fitted on <label> (n = 500)``."""
        title = confidence.SIGNALS.get(self.signal).title
        where = self.fitted_on.get("label") or self.fitted_on.get("run") or "another run"
        return f"{METHODS.get(self.method).title} of {title}, fitted on {where} (n = {len(self.questions)})"


class Sample(NamedTuple):
    """One run's questions as a method reads them: ``probs`` (n, K) and ``mask``, the signal's values
    ``s`` (n,), whether each answer is right (``correct``, 0/1; fitting only) and, for a token run,
    what rescales its whole vocabulary (``logits``; temperature scaling only)."""

    probs: np.ndarray
    mask: np.ndarray
    s: np.ndarray
    correct: Optional[np.ndarray] = None
    labels: Optional[np.ndarray] = None
    logits: Optional[TokenLogits] = None


@dataclass(frozen=True)
class Method:
    title: str
    fit: Callable[[Sample, int], dict[str, Any]]  # (the fit run, bins) → params
    apply: Callable[[dict[str, Any], Sample], np.ndarray]  # (params, a run) → confidences (n,), or probs (n, K)
    multiclass: bool = False  # rescales the option probabilities (the signal is then their top one)


# ---------------------------------------------------------------- question identity
def question_key(row: dict[str, Any]) -> str:
    """A stable key for one question: a hash of its text and options (ids collide across datasets); for
    a token run's target, the ``key`` its row carries (its document's text hashed, and where in it the
    target starts: :mod:`lab.kinds.evaluate.tokens`)."""
    if confidence.token_rows([row]):
        if not isinstance(row.get("key"), str):
            raise ValueError("A token run's target needs its 'key', which runs evaluated before calibrators "
                             "applied to token runs lack: evaluate it again")
        return row["key"]
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


def _fit_temperature(data: Sample, n_bins: int) -> dict[str, Any]:
    from lab.calibration.temperature import fit_temperature
    from lab.calibration.token_temperature import fit_token_temperature

    if data.logits is not None:
        fit = fit_token_temperature(data.logits, data.correct.astype(bool), n_bins=n_bins)
    else:
        fit = fit_temperature(data.probs, data.labels, data.mask, objective="nll", n_bins=n_bins)
    return {"temperature": fit.temperature, "at_bound": fit.at_bound}


def _apply_temperature(params, data: Sample) -> np.ndarray:
    """The option probabilities at T, or a token run's top tokens' (whose first is the confidence)."""
    if data.logits is not None:
        top = data.logits
        return scaled_token_probs(top.top, top.target, top.log_z, top.grid, float(params["temperature"]))[0]
    return scale(data.probs, float(params["temperature"]), data.mask)


def _fit_platt(data: Sample, n_bins: int) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=PLATT_C).fit(_logit(data.s)[:, None], data.correct)
    return {"a": float(model.coef_[0, 0]), "b": float(model.intercept_[0])}


def _apply_platt(params, data: Sample) -> np.ndarray:
    z = float(params["a"]) * _logit(data.s) + float(params["b"])
    return 1.0 / (1.0 + np.exp(-z))


def _fit_isotonic(data: Sample, n_bins: int) -> dict[str, Any]:
    from sklearn.isotonic import IsotonicRegression

    model = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(data.s, data.correct)
    return {"x": [float(v) for v in model.X_thresholds_], "y": [float(v) for v in model.y_thresholds_]}


def _apply_isotonic(params, data: Sample) -> np.ndarray:
    # sklearn's predict interpolates linearly between the thresholds and clips outside: np.interp does both
    return np.interp(data.s, np.asarray(params["x"], dtype=np.float64), np.asarray(params["y"], dtype=np.float64))


def _fit_histogram(data: Sample, n_bins: int) -> dict[str, Any]:
    s, correct = data.s, data.correct
    inner = np.unique(np.quantile(s, np.linspace(0, 1, n_bins + 1)[1:-1]))  # equal-mass; tied edges merge
    bins = np.searchsorted(inner, s, side="right")
    count = np.bincount(bins, minlength=inner.size + 1)
    hits = np.bincount(bins, weights=correct, minlength=inner.size + 1)
    overall = float(correct.mean())
    values = np.where(count > 0, hits / np.maximum(count, 1), overall)  # a bin emptied by ties: the mean
    return {"edges": [float(e) for e in inner], "values": [float(v) for v in values]}


def _apply_histogram(params, data: Sample) -> np.ndarray:
    bins = np.searchsorted(np.asarray(params["edges"], dtype=np.float64), data.s, side="right")
    return np.asarray(params["values"], dtype=np.float64)[bins]


METHODS: Registry[Method] = Registry("calibration method")
METHODS.add("temperature", Method("temperature scaling", _fit_temperature, _apply_temperature, multiclass=True))
METHODS.add("platt", Method("Platt scaling", _fit_platt, _apply_platt))
METHODS.add("isotonic", Method("isotonic regression", _fit_isotonic, _apply_isotonic))
METHODS.add("histogram", Method("histogram binning", _fit_histogram, _apply_histogram))


def _predicted(probs: np.ndarray, mask: np.ndarray, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """Each question's predicted option: the top one, or for a token run's targets slot 0 (the top token,
    every temperature's; the rest column may be larger, and is no prediction)."""
    if confidence.token_rows(rows):
        return np.zeros(len(rows), dtype=np.int64)
    return metrics.predictions(probs, mask)[0]


def _token_logits(spec: Method, rows: Sequence[dict[str, Any]],
                  logits: Optional[TokenLogits]) -> Optional[TokenLogits]:
    """``logits`` for temperature scaling of a token run, which needs them; None otherwise."""
    if not (spec.multiclass and confidence.token_rows(rows)):
        return None
    if logits is None:
        raise ValueError(f"{spec.title} of a token run rescales its whole vocabulary: it needs the log-partition "
                         "each target kept (lab.results.predictions.Predictions.logits)")
    return logits


def _check_kind(cal: Calibrator, rows: Sequence[dict[str, Any]]) -> None:
    """A calibrator fitted on a multiple-choice run is refused on a token run's targets, and the reverse."""
    tokens = confidence.token_rows(rows)
    if rows and cal.tokens != tokens:
        kinds = {True: "a token-level run's targets (task clm or facts)", False: "a multiple-choice run's questions"}
        raise ValueError(f"This calibrator was fitted on {kinds[cal.tokens]}, and these are {kinds[tokens]}: fit one "
                         "on a run of the same kind.")


# ---------------------------------------------------------------- fit, apply, score
def fit(method: str, probs: Any, mask: Any, labels: Any, rows: Sequence[dict[str, Any]],
        signal: str = confidence.DEFAULT, n_bins: int = DEFAULT_BINS, logits: Optional[TokenLogits] = None,
        **fitted_on: Any) -> Calibrator:
    """Fit ``method`` on one run's probabilities (``rows`` its prediction rows, for the signal and
    the question keys; ``logits``, a token run's, for temperature scaling); ``fitted_on`` records
    where (run, label, dataset, split)."""
    spec = METHODS.get(method)
    if spec.multiclass and signal != confidence.DEFAULT:
        raise ValueError(f"{spec.title} rescales the option probabilities, so its confidence is the top "
                         f"probability; pick signal {confidence.DEFAULT!r} or another method for {signal!r}.")
    check_n_bins(n_bins)
    probs, mask, labels = _arrays(probs, mask, labels)
    s = confidence.values(signal, probs, mask, rows)
    correct = (_predicted(probs, mask, rows) == labels).astype(np.float64)
    params = spec.fit(Sample(probs, mask, s, correct, labels, _token_logits(spec, rows, logits)), n_bins)
    return Calibrator(method, signal, params, {**fitted_on, "n": int(labels.size)}, [question_key(r) for r in rows],
                      confidence.token_rows(rows))


def apply(cal: Calibrator, probs: Any, mask: Any, rows: Sequence[dict[str, Any]],
          logits: Optional[TokenLogits] = None) -> tuple[np.ndarray, np.ndarray]:
    """The predicted option (n,) and its calibrated confidence (n,) for another run's questions
    (``logits``: a token run's, for temperature scaling)."""
    spec = METHODS.get(cal.method)
    _check_kind(cal, rows)
    probs, mask = np.asarray(probs, dtype=np.float64), np.asarray(mask, dtype=bool)
    if spec.multiclass:
        scaled = spec.apply(cal.params, Sample(probs, mask, np.empty(0), logits=_token_logits(spec, rows, logits)))
        if confidence.token_rows(rows):
            return _predicted(probs, mask, rows), scaled[:, 0]
        return metrics.predictions(scaled, mask)
    s = confidence.values(cal.signal, probs, mask, rows)
    pred = _predicted(probs, mask, rows)
    return pred, np.clip(spec.apply(cal.params, Sample(probs, mask, s)), 0.0, 1.0)


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
                 n_bins: int = 10, edges: BinEdges = "right", n_boot: int = 1000,
                 logits: Optional[TokenLogits] = None) -> dict[str, Any]:
    """The calibrator applied to a held-out run: its confidence before (the calibrator's signal as
    the run gave it) and after, each a :func:`confidence_report`, and ``overlap``, the number of
    questions shared with the fit set. Raises :class:`SameQuestions` (see :func:`check_held_out`),
    and ValueError for a run of the other kind (:func:`apply`)."""
    _check_kind(cal, rows)
    shared = check_held_out(cal, rows)
    probs, mask, labels = _arrays(probs, mask, labels)
    pred = _predicted(probs, mask, rows)
    signal = confidence.DEFAULT if METHODS.get(cal.method).multiclass else cal.signal
    before = np.clip(confidence.values(signal, probs, mask, rows), 0.0, 1.0)
    after_pred, after = apply(cal, probs, mask, rows, logits)
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


def load(path: Path, name: Optional[str] = None) -> Calibrator:
    """A :class:`Calibrator` from ``calibrator.json`` or the folder holding it, every field checked
    (it may come from anywhere): ValueError naming the file and what is wrong. ``name``: what messages
    call the file (a page passes the run's name); by default its folder and its own name, never the
    absolute path, which a page or a job's error would show."""
    path = Path(path)
    file = path / CALIBRATOR_FILE if path.is_dir() else path
    where = name or f"{file.parent.name}/{file.name}"
    try:
        data = stored.parse(read_text(file, encoding="utf-8"), where)  # depth-bounded: any file may come
    except PathNotAllowed:
        raise
    except FileNotFoundError:
        raise FileNotFoundError(f"No calibrator at {where}: fit one in the Recalibration workbench") from None
    except OSError as e:  # its own text names the absolute path
        raise ValueError(f"{where}: not a calibrator file ({e.strerror or type(e).__name__})") from None
    except ValueError as e:
        raise ValueError(f"{where}: not a calibrator file ({e})") from None
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
        tokens = data.get("tokens", False)  # a file from before token runs were calibrated: a multiple-choice one
        if not isinstance(tokens, bool):
            raise ValueError("tokens must be true or false")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return Calibrator(method, signal, checked, fitted_on, questions, tokens)


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
