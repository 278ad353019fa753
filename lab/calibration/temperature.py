"""The option temperature: its two scalings, the softmax they share, the fit's and the temperature
lab's bounds and grids, the fit, and the widening grid search the fit shares with the lab.

**Scalings.** Each returns float64 rows of the input's shape that sum to 1 over the entries present.

- :func:`scale`, the *logit* form on a run's option probabilities: ``softmax(log p / T)`` over the
  ``mask``-ed options. Letter and cloze confidences are softmaxes over per-option scores, so
  ``log p`` are those scores up to a per-question constant and this is exactly temperature scaling
  of the logits: the fit and the UI's slider work from ``predictions.jsonl`` without the model.
  A probability of 0 is floored at :data:`PROB_FLOOR` (a very low, finite score).
- :func:`temperature_logit`, the same logit form on a teacher's top-k (FIRST, ``P^(1/T)``
  renormalised over the k): the top-k is checked, and an entry with p = 0 stays exactly 0. That is
  where it and :func:`scale` differ, so both are kept.
- :func:`temperature_paper`, FIRST Eq. 4 as printed: ``softmax(p / c)``, the *probabilities* divided
  by c, on a top-k or (with a mask) on option rows. It is no logit temperature: c = 1 nearly flattens.

**Bounds**, each named for what it bounds (past any of them the rows are as good as one-hot or
uniform); the range a user may give, in a config or a ``temperature.json``, is
:data:`lab.core.limits.TEMPERATURE_RANGE`: :data:`FIT_BOUNDS` (:func:`fit_temperature`),
:data:`LAB_SWEEP_BOUNDS` (the temperature lab's sweep, :func:`lab.results.analysis.temperature_sweep`)
and :data:`lab.calibration.first_sweep.TEACHER_SWEEP_BOUNDS` (FIRST's sweep).

**Searches.** :func:`fit_temperature` minimises validation NLL over ``log T`` with a bounded Brent
search (scipy's ``minimize_scalar(method="bounded")``: T stays positive and the step size is
scale-free) or picks the lowest-ECE temperature on a log grid, as the CFT paper searches T (its
Appendix: "searched on a validation set to directly minimize the ECE"). A grid whose lowest point
is its edge says only that the optimum lies further out, so a search goes on past that edge, in one
of two ways:

- :func:`widened_search` (with :func:`beyond_edges`): past an edge holding the lowest value of any of
  several objectives, a run of points at the grid's own log step out to :data:`WIDEN_FACTOR` (4)
  times the edge, records kept ascending. The CFT fit's ECE objective and the temperature lab's sweep.
- :func:`lab.calibration.first_sweep.widen_point_by_point`: one value at a time, the edge × (or ÷) 2,
  one objective, records kept in the order tried (ties go to the first tried), values rounded.
  FIRST's sweep of the teacher's temperature.

They differ in more than the factor (what a step adds, the records' order and so the tie-break, the
rounding, the one-value grid), so one function with the factor as a parameter would change the
teacher sweep's records and, on ties, its best value: both stay.

The CFT paper's released baseline never updates T (REFERENCE.md §3); ours is tested to move it. A
fitted temperature is saved as a small JSON artefact (:mod:`lab.calibration.temperature_files`); a
token run's temperature is :mod:`lab.calibration.token_temperature`'s.

Option rows are ``(n, K)`` with a boolean ``mask`` of real options (questions may have 3–5
options); padded entries stay 0. A teacher's top-k is ``p`` (..., k), sorted descending (rank 0 =
top-1), holding part of the mass (FIRST reports > 95 % on average for k = 5); see
``shared/REFERENCE.md`` §2.3 and ``shared/seeds/first_paper.txt`` §4.2 and §5.5. numpy only at
import: the web server applies temperatures too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Sequence

import numpy as np

from lab.calibration import metrics
from lab.calibration.checks import BinEdges, check_positive, check_positive_rows, check_topk

Form = Literal["logit", "paper"]  # which scaling: softmax(log p / T), or FIRST's softmax(p / c)
FORMS: tuple[str, ...] = ("logit", "paper")
FitObjective = Literal["nll", "ece"]  # what a fitted or swept temperature minimises
OBJECTIVES: tuple[str, ...] = ("ece", "nll")
PROB_FLOOR = 1e-12  # log(0) guard of scale and the fit: an option with probability 0 gets a very low, finite score

# ---------------------------------------------------------------- bounds: how far each search may go
FIT_BOUNDS = (0.01, 100.0)  # fit_temperature: an optimum outside is clamped and flagged (at_bound)
# The temperature lab's sweep (lab.results.analysis.temperature_sweep): the logit form as far as a fit
# may go; the paper form starts at c = 0.01 (LAB_SWEEP_GRIDS), so it gets room below that too.
LAB_SWEEP_BOUNDS: dict[str, tuple[float, float]] = {"logit": FIT_BOUNDS, "paper": (1e-4, FIT_BOUNDS[1])}
BOUND_TOLERANCE = 1e-3  # an NLL optimum this close to a bound in log T (0.1 %) is reported as the bound

# ---------------------------------------------------------------- grids: where each search starts
FIT_GRID = np.exp(np.linspace(np.log(0.05), np.log(20.0), 401))  # fit_temperature's ECE objective
# The temperature lab's sweep: the logit temperature is 1 for "no change"; the paper form divides
# probabilities in [0, 1], so only c well below 1 restores contrast (temperature_paper).
LAB_SWEEP_GRIDS: dict[str, np.ndarray] = {
    "logit": np.geomspace(0.1, 10.0, 81),
    "paper": np.geomspace(0.01, 1.0, 81),
}

# ---------------------------------------------------------------- widening past an edge (module docstring)
WIDEN_FACTOR = 4.0  # widened_search: an optimum on an edge extends the grid this factor past it, again if need be
MAX_NEW_POINTS = 100  # ... in at most this many points each time


# ---------------------------------------------------------------- the scalings
def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; -inf entries become exactly 0. Some entry of each row must be finite."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))  # (..., k), largest entry exp(0) = 1
    return e / e.sum(axis=-1, keepdims=True)


def _logits(probs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, np.log(np.clip(probs, PROB_FLOOR, None)), -np.inf)


def scale(probs: Any, temperature: float, mask: Any | None = None) -> np.ndarray:
    """``softmax(log p / T)`` per row over the masked options; T = 1 returns the rows renormalised.
    A masked-out option is -inf before the softmax, so it gets exactly 0."""
    probs = np.asarray(probs, dtype=np.float64)
    mask = np.ones(probs.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"Expected a positive temperature, but got {temperature!r}")
    return softmax(_logits(probs, mask) / temperature)


def temperature_paper(p: Any, c: float, mask: Any | None = None) -> np.ndarray:
    """FIRST Eq. 4, literally on probabilities: ``P'(i) = exp(P(i)/c) / Σ_j exp(P(j)/c)``.

    ``p`` (..., k) → (..., k). This is *not* the usual logit temperature (see
    :func:`temperature_logit`): it treats probabilities in [0, 1] as logits, so at c = 1 no two
    entries differ by more than a factor e and rows are nearly uniform; only c ≪ 1 restores the
    teacher's contrast. c → 0 tends to one-hot on the top-1, c → ∞ to 1/k.
    c = 1 is therefore not "no re-calibration". Ranks are kept for every c > 0 (exp increases),
    and an entry with p = 0 still gets ``exp(0)/Σ > 0``. ``mask`` (..., k) bool, optional: the
    options present in a zero-padded row; the sum runs over those only and padding gets exactly 0.
    """
    check_positive("c", c)
    z = check_topk(p) / c  # (..., k)
    return softmax(z if mask is None else np.where(mask, z, -np.inf))


def temperature_logit(p: Any, T: float) -> np.ndarray:
    """The usual temperature applied to probabilities: ``P'(i) = P(i)^(1/T) / Σ_j P(j)^(1/T)``.

    ``p`` (..., k) → (..., k); equals ``softmax(logits / T)`` restricted to the top-k. Computed as
    a softmax of ``log P / T`` so that small T cannot underflow every entry; entries with p = 0
    stay 0 (:func:`scale` floors them instead). T = 1 is plain normalisation over the k (no
    re-calibration); T > 1 flattens and T < 1 sharpens. Ranks are kept for every T > 0.
    """
    check_positive("T", T)
    p = check_topk(p)
    check_positive_rows(p)
    with np.errstate(divide="ignore"):  # log 0 = -inf, which the softmax turns back into 0
        return softmax(np.log(p) / T)


# ---------------------------------------------------------------- the fit, and the search it shares with the lab
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
    at_bound: bool = False  # the optimum is at or beyond FIT_BOUNDS: e.g. a model no better than chance → T = ∞
    bin_edges: str = "right"  # which end of an ECE bin is closed (lab.calibration.metrics.bin_indices)
    searched: Optional[tuple[float, float]] = None  # the ECE objective's grid as searched, after any widening
    widened: bool = False  # the ECE optimum lay on the edge of FIT_GRID, so the search went past it


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
                   bounds: tuple[float, float] = FIT_BOUNDS) -> list[dict[str, float]]:
    """``evaluate(t)`` for every t of ``grid``, ascending, widened (:func:`beyond_edges`) until the
    first lowest value of each of ``keys`` is off the grid's edges or on a bound. The records stay
    ascending in t. (The teacher sweep widens otherwise,
    :func:`lab.calibration.first_sweep.widen_point_by_point`: see the module docstring.)"""
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

    ``"nll"``: a bounded Brent search over log T within :data:`FIT_BOUNDS`. ``"ece"`` searches
    :data:`FIT_GRID`, widened past an edge that holds the lowest ECE (``widened``, :func:`widened_search`),
    up to :data:`FIT_BOUNDS`; ``at_bound`` says the optimum sits on a bound. ``bin_edges`` bins the ECE.
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
        temperature, at_bound = nll_minimum(lambda t: _nll_at(logits, labels, t), FIT_BOUNDS, max_iter)
        searched, widened = None, False
    else:
        def ece_at(t: float) -> dict[str, float]:
            conf, correct = _conf_correct(scale(probs, t, mask), labels)
            return {"temperature": t, "ece": metrics.ece(conf, correct, n_bins=n_bins, edges=bin_edges)}

        records = widened_search(ece_at, FIT_GRID, ["ece"])
        temperature = records[int(np.argmin([r["ece"] for r in records]))]["temperature"]
        at_bound = temperature in FIT_BOUNDS
        searched = (records[0]["temperature"], records[-1]["temperature"])
        widened = len(records) > len(FIT_GRID)
    before, after = scale(probs, 1.0, mask), scale(probs, temperature, mask)
    return TemperatureFit(
        temperature=temperature, objective=objective, n=len(labels), bins=n_bins, at_bound=at_bound,
        nll_before=_nll_at(logits, labels, 1.0), nll_after=_nll_at(logits, labels, temperature),
        ece_before=metrics.ece(*_conf_correct(before, labels), n_bins=n_bins, edges=bin_edges),
        ece_after=metrics.ece(*_conf_correct(after, labels), n_bins=n_bins, edges=bin_edges),
        bin_edges=bin_edges, searched=searched, widened=widened,
    )


def nll_minimum(nll: Callable[[float], float], bounds: tuple[float, float], max_iter: int) -> tuple[float, bool]:
    """The temperature within ``bounds`` where ``nll(T)`` is lowest, and whether it sits on a bound."""
    from scipy.optimize import minimize_scalar  # lazy: scipy takes a second to import

    # NLL is convex in 1/T, hence unimodal in log T: a bounded Brent search finds its minimum.
    # A model whose confidence carries no signal is best "calibrated" flat, NLL falling all the
    # way to T = ∞: the search stops at the upper bound and says so rather than report T = 2e5.
    edges = (np.log(bounds[0]), np.log(bounds[1]))
    found = minimize_scalar(lambda log_t: nll(float(np.exp(log_t))), bounds=edges, method="bounded",
                            options={"xatol": 1e-7, "maxiter": max_iter})
    log_t = float(found.x)
    if min(abs(log_t - b) for b in edges) < BOUND_TOLERANCE:
        return (bounds[0] if abs(log_t - edges[0]) < abs(log_t - edges[1]) else bounds[1]), True
    return float(np.exp(log_t)), False


def _conf_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred = probs.argmax(axis=1)
    return probs[np.arange(len(labels)), pred], pred == labels
