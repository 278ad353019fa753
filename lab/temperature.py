"""Temperature scaling of stored option probabilities: apply, fit, save and load.

Letter and cloze confidences are softmaxes over per-option scores, so ``log p`` are those scores
up to a per-question constant and ``softmax(log p / T)`` is exactly temperature scaling of the
logits: the fit and the UI's slider work from ``predictions.jsonl`` without the model.

:func:`fit_temperature` minimises validation NLL over ``log T`` with a bounded Brent search (so T stays positive
and the step size is scale-free) or picks the lowest-ECE temperature on a log grid, as the CFT paper
searches T (its Appendix: "searched on a validation set to directly minimize the ECE"). A grid
whose lowest point is its edge says only that the optimum lies further out, so the search goes on
past that edge (:func:`beyond_edges`) up to the hard bounds. The CFT paper's released baseline
never updates T (REFERENCE.md §3); ours is tested to move it. A fitted temperature is a small
JSON artefact (:func:`save_temperature`) that evaluation, the UI and reports read back.

Rows are ``(n, K)`` with a boolean ``mask`` of real options (questions may have 3–5 options);
padded entries stay 0. numpy only at import: the web server applies temperatures too.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

import numpy as np

from lab import metrics
from lab.files import write_atomic
from lab.layout import TEMPERATURE_FILE
from lab.limits import TEMPERATURE_RANGE
from lab.metric_checks import BinEdges
from lab.reads import read_text

FitObjective = Literal["nll", "ece"]  # what a fitted temperature minimises (here and in lab.first.recalibration)
PROB_FLOOR = 1e-12  # log(0) guard: an option with probability 0 gets a very low, finite score
T_MIN, T_MAX = 0.01, 100.0  # a fit outside is clamped and flagged: beyond, the rows are one-hot or uniform
GRID = np.exp(np.linspace(np.log(0.05), np.log(20.0), 401))  # the ECE objective's first candidates
WIDEN_FACTOR = 4.0  # an optimum on a grid's edge extends the grid this factor past that edge, and again if need be
MAX_NEW_POINTS = 100  # ... in at most this many points each time
BOUND_TOLERANCE = 1e-3  # an NLL optimum this close to a bound in log T (0.1 %) is reported as the bound


def _logits(probs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, np.log(np.clip(probs, PROB_FLOOR, None)), -np.inf)


def scale(probs: Any, temperature: float, mask: Any | None = None) -> np.ndarray:
    """``softmax(log p / T)`` per row over the masked options; T = 1 returns the rows renormalised."""
    probs = np.asarray(probs, dtype=np.float64)
    mask = np.ones(probs.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"Expected a positive temperature, but got {temperature!r}")
    z = _logits(probs, mask) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    e = np.where(mask, np.exp(z), 0.0)
    return e / e.sum(axis=-1, keepdims=True)


def _nll_at(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    z = logits / temperature
    z = z - z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    return float(np.mean(lse - z[np.arange(len(labels)), labels]))


@dataclass(frozen=True)
class TemperatureFit:
    """A fitted temperature and what it did on the data it was fitted on."""

    temperature: float
    objective: str
    n: int
    nll_before: float
    nll_after: float
    ece_before: float
    ece_after: float
    bins: int
    at_bound: bool = False  # the optimum is at or beyond T_MIN / T_MAX: e.g. a model no better than chance → T = ∞
    bin_edges: str = "right"  # which end of an ECE bin is closed (lab.metrics.bin_indices)
    searched: Optional[tuple[float, float]] = None  # the ECE objective's grid as searched, after any widening
    widened: bool = False  # the ECE optimum lay on the edge of GRID, so the search went past it


def beyond_edges(grid: Sequence[float], lowest: Sequence[int],
                 bounds: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Temperatures to try below and above a strictly ascending ``grid`` whose minima sit at ``lowest``.

    An optimum on an edge of the grid (index 0 or the last) is no optimum, only a sign that the
    curve still falls there: past that edge come :data:`WIDEN_FACTOR` times further out, at the
    grid's own log step there (so the search keeps its resolution; at most :data:`MAX_NEW_POINTS`
    points), ending on the bound when the factor would overshoot it. Nothing is added past an edge
    already at ``bounds``. Callers score the new points and ask again until both arrays are empty.
    """
    grid = np.asarray(grid, dtype=np.float64)
    lo, hi = bounds
    below = above = np.empty(0)
    if 0 in lowest and grid[0] > lo:
        below = _geometric(grid[0], 1 / _step(grid[:2]), max(lo, grid[0] / WIDEN_FACTOR))[::-1]
    if len(grid) - 1 in lowest and grid[-1] < hi:
        above = _geometric(grid[-1], _step(grid[-2:]), min(hi, grid[-1] * WIDEN_FACTOR))
    return below, above


def _step(pair: np.ndarray) -> float:
    """The grid's ratio between two neighbours (> 1), or a coarser one where the grid is finer."""
    ratio = pair[-1] / pair[0] if len(pair) == 2 else WIDEN_FACTOR
    return max(ratio, WIDEN_FACTOR ** (1 / MAX_NEW_POINTS))


def _geometric(start: float, ratio: float, end: float) -> np.ndarray:
    """``start · ratio^k`` for k = 1, 2, … strictly short of ``end``, then ``end`` itself."""
    count = int(np.ceil(np.log(end / start) / np.log(ratio) - 1e-9))
    return np.append(start * ratio ** np.arange(1, count), end)


def widened_search(evaluate: Callable[[float], dict[str, float]], grid: Sequence[float], keys: Sequence[str],
                   bounds: tuple[float, float] = (T_MIN, T_MAX)) -> list[dict[str, float]]:
    """``evaluate(t)`` for every t of ``grid``, ascending, widened (:func:`beyond_edges`) until the
    first lowest value of each of ``keys`` is off the grid's edges or on a bound."""
    temps = np.unique(np.asarray(grid, dtype=np.float64))
    records = [evaluate(float(t)) for t in temps]
    while True:
        below, above = beyond_edges(temps, [int(np.argmin([r[k] for r in records])) for k in keys], bounds)
        if not (below.size or above.size):
            return records
        temps = np.concatenate([below, temps, above])
        records = [evaluate(float(t)) for t in below] + records + [evaluate(float(t)) for t in above]


def fit_temperature(probs: Any, labels: Any, mask: Any | None = None, objective: FitObjective = "nll",
                    n_bins: int = 10, max_iter: int = 100, bin_edges: BinEdges = "right") -> TemperatureFit:
    """Fit one temperature on validation rows; returns it with NLL and ECE before and after.

    ``"ece"`` searches :data:`GRID`, widened past an edge that holds the lowest ECE (``widened``),
    up to [T_MIN, T_MAX]; ``at_bound`` says the optimum sits on a bound. ``bin_edges`` bins the ECE.
    """
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    mask = np.ones(probs.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if probs.ndim != 2 or len(probs) == 0 or labels.shape != (len(probs),):
        raise ValueError(f"Expected probs (n, K) with n > 0 and labels (n,), but got {probs.shape} and {labels.shape}")
    if objective not in ("nll", "ece"):
        raise ValueError(f"Expected objective 'nll' or 'ece', but got {objective!r}")
    logits = np.where(mask, np.log(np.clip(probs, PROB_FLOOR, None)), -1e30)
    if objective == "nll":
        from scipy.optimize import minimize_scalar  # lazy: scipy takes a second to import

        # NLL is convex in 1/T, hence unimodal in log T: a bounded Brent search finds its minimum.
        # A model whose confidence carries no signal is best "calibrated" flat, NLL falling all the
        # way to T = ∞: the search stops at T_MAX and says so rather than report T = 2e5.
        bounds = (np.log(T_MIN), np.log(T_MAX))
        found = minimize_scalar(lambda log_t: _nll_at(logits, labels, float(np.exp(log_t))), bounds=bounds,
                                method="bounded", options={"xatol": 1e-7, "maxiter": max_iter})
        log_t = float(found.x)
        at_bound = bool(min(abs(log_t - b) for b in bounds) < BOUND_TOLERANCE)
        temperature = float(np.exp(log_t))
        if at_bound:
            temperature = T_MIN if log_t < 0 else T_MAX
        searched, widened = None, False
    else:
        def ece_at(t: float) -> dict[str, float]:
            conf, correct = _conf_correct(scale(probs, t, mask), labels)
            return {"temperature": t, "ece": metrics.ece(conf, correct, n_bins=n_bins, edges=bin_edges)}

        records = widened_search(ece_at, GRID, ["ece"])
        temperature = records[int(np.argmin([r["ece"] for r in records]))]["temperature"]
        at_bound = temperature in (T_MIN, T_MAX)
        searched = (records[0]["temperature"], records[-1]["temperature"])
        widened = len(records) > len(GRID)
    before, after = scale(probs, 1.0, mask), scale(probs, temperature, mask)
    return TemperatureFit(
        temperature=temperature, objective=objective, n=len(labels), bins=n_bins, at_bound=at_bound,
        nll_before=_nll_at(logits, labels, 1.0), nll_after=_nll_at(logits, labels, temperature),
        ece_before=metrics.ece(*_conf_correct(before, labels), n_bins=n_bins, edges=bin_edges),
        ece_after=metrics.ece(*_conf_correct(after, labels), n_bins=n_bins, edges=bin_edges),
        bin_edges=bin_edges, searched=searched, widened=widened,
    )


def _conf_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred = probs.argmax(axis=1)
    return probs[np.arange(len(labels)), pred], pred == labels


def save_temperature(path: Path, fit: TemperatureFit, **provenance: Any) -> Path:
    """Write ``temperature.json`` (``path`` a directory or a file): the fit plus where it came from."""
    path = Path(path)
    target = path / TEMPERATURE_FILE if path.is_dir() or not path.suffix else path
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, json.dumps({**asdict(fit), "form": "logit", **provenance}, indent=2) + "\n")
    return target


def load_temperature(source: float | int | str | Path | None) -> Optional[float]:
    """A temperature from a number, a ``temperature.json`` or a run directory holding one."""
    if source is None:
        return None
    if isinstance(source, str):
        try:
            source = float(source)  # "1.5" from the command line
        except ValueError:
            pass
    if isinstance(source, (int, float)) and not isinstance(source, bool):
        value = float(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / TEMPERATURE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"No temperature file at {path}: fit one first (the CFT job's ts/ directory "
                                    "or the temperature lab's save button writes it)")
        text = read_text(path, encoding="utf-8")
        try:
            value = float(json.loads(text)["temperature"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a temperature file (expected JSON with a 'temperature' number): {e}") from None
    low, high = TEMPERATURE_RANGE
    if not (np.isfinite(value) and low <= value <= high):
        raise ValueError(f"Expected a temperature from {low:g} to {high:g}, but got {value!r}")
    return value
