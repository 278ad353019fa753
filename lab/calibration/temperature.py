"""Every temperature: its two scalings, the softmax they share, their bounds and grids, the searches
that pick one (a fit and two widening grid searches), and the artefact a fitted one is saved as.

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
and :data:`TEACHER_SWEEP_BOUNDS` (:func:`sweep_teacher_temperature`).

**Searches.** :func:`fit_temperature` minimises validation NLL over ``log T`` with a bounded Brent
search (scipy's ``minimize_scalar(method="bounded")``: T stays positive and the step size is
scale-free) or picks the lowest-ECE temperature on a log grid, as the CFT paper searches T (its
Appendix: "searched on a validation set to directly minimize the ECE"). A grid whose lowest point
is its edge says only that the optimum lies further out, so a search goes on past that edge, in one
of two ways, side by side here:

- :func:`widened_search` (with :func:`beyond_edges`): past an edge holding the lowest value of any of
  several objectives, a run of points at the grid's own log step out to :data:`WIDEN_FACTOR` (4)
  times the edge, records kept ascending. The CFT fit's ECE objective and the temperature lab's sweep.
- :func:`widen_point_by_point`: one value at a time, the edge × (or ÷) :data:`TEACHER_WIDEN_FACTOR`
  (2), one objective, records kept in the order tried (ties go to the first tried), values rounded
  to :data:`DECIMALS`, a one-value grid widened above first. FIRST's sweep of the teacher's
  temperature (:func:`sweep_teacher_temperature`).

They differ in more than the factor (what a step adds, the records' order and so the tie-break, the
rounding, the one-value grid), so one function with the factor as a parameter would change the
teacher sweep's records and, on ties, its best value: both stay.

The CFT paper's released baseline never updates T (REFERENCE.md §3); ours is tested to move it. A
fitted temperature is a small JSON artefact (:func:`save_temperature`) that evaluation, the UI and
reports read back.

**A token run's temperature** (tasks clm and facts) rescales the whole vocabulary, which its rows do
not keep; they keep what it takes instead (:class:`TokenLogits`): the raw logits of the top tokens
and of the target, and ``log Z(T) = logsumexp(z / T)`` over the vocabulary at each T of
:data:`TOKEN_GRID`. The argmax, so correctness, is every temperature's; the confidence is
``exp(z_top / T − log Z(T))``, the target's probability ``exp(z_target / T − log Z(T))`` and the exact
Brier score's ``Σ_v p_v² = exp(log Z(T / 2) − 2 log Z(T))`` (:func:`token_sum_sq`). Between grid points
:func:`token_log_z` interpolates; outside the grid nothing is known and it refuses.

Option rows are ``(n, K)`` with a boolean ``mask`` of real options (questions may have 3–5
options); padded entries stay 0. A teacher's top-k is ``p`` (..., k), sorted descending (rank 0 =
top-1), holding part of the mass (FIRST reports > 95 % on average for k = 5); see
``shared/REFERENCE.md`` §2.3 and ``shared/seeds/first_paper.txt`` §4.2 and §5.5. numpy only at
import: the web server applies temperatures too.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

import numpy as np

from lab.calibration import metrics
from lab.calibration.checks import BinEdges, check_edges, check_positive, check_positive_rows, check_sorted, check_topk
from lab.core.files import write_atomic
from lab.core.layout import TEMPERATURE_FILE
from lab.core.limits import TEMPERATURE_RANGE
from lab.core import stored
from lab.core.reads import read_text, shown_here

Form = Literal["logit", "paper"]  # which scaling: softmax(log p / T), or FIRST's softmax(p / c)
FORMS: tuple[str, ...] = ("logit", "paper")
FitObjective = Literal["nll", "ece"]  # what a fitted or swept temperature minimises
OBJECTIVES: tuple[str, ...] = ("ece", "nll")
PROB_FLOOR = 1e-12  # log(0) guard of scale and the fit: an option with probability 0 gets a very low, finite score
NLL_EPS = 1e-12  # probability floor of the teacher sweep's NLL; an answer outside the top-k scores -log(1e-12)

# ---------------------------------------------------------------- bounds: how far each search may go
FIT_BOUNDS = (0.01, 100.0)  # fit_temperature: an optimum outside is clamped and flagged (at_bound)
# The temperature lab's sweep (lab.results.analysis.temperature_sweep): the logit form as far as a fit
# may go; the paper form starts at c = 0.01 (LAB_SWEEP_GRIDS), so it gets room below that too.
LAB_SWEEP_BOUNDS: dict[str, tuple[float, float]] = {"logit": FIT_BOUNDS, "paper": (1e-4, FIT_BOUNDS[1])}
TEACHER_SWEEP_BOUNDS = TEMPERATURE_RANGE  # sweep_teacher_temperature: its grid's values, and no widening past
BOUND_TOLERANCE = 1e-3  # an NLL optimum this close to a bound in log T (0.1 %) is reported as the bound

# ---------------------------------------------------------------- grids: where each search starts
FIT_GRID = np.exp(np.linspace(np.log(0.05), np.log(20.0), 401))  # fit_temperature's ECE objective
# The temperature lab's sweep: the logit temperature is 1 for "no change"; the paper form divides
# probabilities in [0, 1], so only c well below 1 restores contrast (temperature_paper).
LAB_SWEEP_GRIDS: dict[str, np.ndarray] = {
    "logit": np.geomspace(0.1, 10.0, 81),
    "paper": np.geomspace(0.01, 1.0, 81),
}
# A token run's log-partition is kept at these temperatures (lab.models.token_scoring.log_partition, which
# evaluates every one from a fixed number of passes over the logits, so the grid's size costs disk, not time):
# FIT_BOUNDS, so that a fit and the temperature lab's sweep (LAB_SWEEP_BOUNDS["logit"], widened from
# LAB_SWEEP_GRIDS["logit"]) never leave it, and 30 per decade, where the quintic spline between them
# (token_log_z) is within 2e-5 of the exact confidence everywhere: measured at every midpoint between grid
# points and 1,601 temperatures more, on 256 targets of the bundled model (7e-6), on random logits over
# 49,152 tokens (normal with sd 3: 4e-7; Student t, 3 degrees of freedom, scale 2: 1.6e-5), sd 0.3 over 600
# (7e-8), and up to 5,600 tokens at one gap from the top (4e-6); tests/test_token_temperature.py holds it
# to that on its own sets. A cubic spline gives 1.5e-4 at 30 per decade, a quintic one 3e-4 at 20 per decade.
TOKEN_GRID = np.geomspace(FIT_BOUNDS[0], FIT_BOUNDS[1], 121)
SPLINE_DEGREE = 5  # token_log_z's spline, in log T
TOKEN_GRID_SLACK = 1e-9  # a T this close (relatively) to a grid end counts as on it: float noise, not a T beyond
DECIMALS = 10  # the teacher sweep's values are rounded to this: 3 * 0.1 is 0.30000000000000004 in floats
PAPER_GRID = np.round(np.arange(0.1, 1.01, 0.1), DECIMALS)  # FIRST §5.5: 0.1 .. 1.0, step 0.1
# The logit form cools an over-confident teacher only with T > 1, which the paper's grid never
# reaches: 0.25 .. 8, four values per doubling (each ~19 % above the last).
TEACHER_LOGIT_GRID = np.round(0.25 * 2.0 ** (np.arange(21) / 4), DECIMALS)
TEACHER_GRIDS: dict[str, np.ndarray] = {"paper": PAPER_GRID, "logit": TEACHER_LOGIT_GRID}  # the teacher sweep's
# The teacher sweep's fine pass splits the gap from the best to each neighbour into FINE_STEPS equal steps: on
# the paper's grid (step 0.1) that is its step of 0.02 over the best ± 0.1; on the log grid, equal ratios.
FINE_STEPS = 5
FINE_SPACING: dict[str, str] = {"paper": "linear", "logit": "geometric"}

# ---------------------------------------------------------------- widening past an edge (module docstring)
WIDEN_FACTOR = 4.0  # widened_search: an optimum on an edge extends the grid this factor past it, again if need be
MAX_NEW_POINTS = 100  # ... in at most this many points each time
TEACHER_WIDEN_FACTOR = 2.0  # widen_point_by_point: an optimum on an edge tries the edge × 2 (or / 2) next


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


TRANSFORMS: dict[str, Callable[[Any, float], np.ndarray]] = {  # a teacher's top-k at a value of each form
    "paper": temperature_paper,
    "logit": temperature_logit,
}


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
    ascending in t. (The teacher sweep widens otherwise, :func:`widen_point_by_point`: see the module
    docstring.)"""
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
        temperature, at_bound = _nll_minimum(lambda t: _nll_at(logits, labels, t), FIT_BOUNDS, max_iter)
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


def _nll_minimum(nll: Callable[[float], float], bounds: tuple[float, float], max_iter: int) -> tuple[float, bool]:
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


# ---------------------------------------------------------------- a token run's temperatures (module docstring)
@dataclass(frozen=True, eq=False)  # arrays: compared by identity, not element by element
class TokenLogits:
    """What a token run keeps per target to be rescaled later: ``top`` (n, k) the raw logits of its top
    tokens, largest first; ``target`` (n,) the target's raw logit; ``log_z`` (n, G) ``log Z(T)`` over
    the whole vocabulary at each temperature of ``grid`` (G,), ascending. Raw: the model's own, whatever
    temperature the run was evaluated at."""

    top: np.ndarray
    target: np.ndarray
    log_z: np.ndarray
    grid: np.ndarray

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], grid: Any) -> "TokenLogits":
        """From a token run's prediction rows, each with ``top_logits``, ``target_logit`` and ``log_z``
        (at ``grid``): what the scorer wrote, or a stored run's rows once checked."""
        return cls(np.array([r["top_logits"] for r in rows], dtype=np.float64),
                   np.array([r["target_logit"] for r in rows], dtype=np.float64),
                   np.array([r["log_z"] for r in rows], dtype=np.float64), np.asarray(grid, dtype=np.float64))


@lru_cache(maxsize=4)
def _spline(grid: tuple[float, ...]) -> Any:
    """The interpolating spline of every unit vector over log ``grid``: its value at log T is the weights
    that interpolate any row of values there (a spline is linear in the values it passes through)."""
    from scipy.interpolate import make_interp_spline  # lazy: scipy takes a second to import

    return make_interp_spline(np.log(grid), np.eye(len(grid)), k=SPLINE_DEGREE)


def token_log_z(log_z: Any, grid: Any, t: float, top_logit: Any) -> np.ndarray:
    """``log Z(t)`` (n,) from its values ``log_z`` (n, G) at the temperatures ``grid`` (G,), given each
    row's top logit (n,); exact at a grid point. ValueError for a t outside the grid.

    What is interpolated is ``log Z(T) − z_top / T = −log(confidence at T)``, which lies in [0, log V]
    and varies smoothly in log T, rather than log Z itself, which runs up to z_top / 0.01: a quintic
    spline in log T (:data:`SPLINE_DEGREE`), within 2e-5 of the exact confidence between the points of
    :data:`TOKEN_GRID` (measured there).
    """
    grid = np.asarray(grid, dtype=np.float64)
    log_z, top = np.asarray(log_z, dtype=np.float64), np.asarray(top_logit, dtype=np.float64)
    if grid.ndim != 1 or grid.size <= SPLINE_DEGREE or np.any(np.diff(grid) <= 0) or grid[0] <= 0:
        raise ValueError(f"Expected an ascending grid of more than {SPLINE_DEGREE} positive temperatures, "
                         f"but got {grid!r}")
    if log_z.ndim != 2 or log_z.shape[1] != grid.size or top.shape != (len(log_z),):
        raise ValueError(f"Expected log_z (n, {grid.size}) and top_logit (n,), but got {log_z.shape} and {top.shape}")
    low, high = grid[0], grid[-1]
    if not (np.isfinite(t) and low * (1 - TOKEN_GRID_SLACK) <= t <= high * (1 + TOKEN_GRID_SLACK)):
        raise ValueError(f"T = {t!r} lies outside the temperatures this token run kept its log-partition at "
                         f"({low:g} to {high:g}): nothing is known of the vocabulary there")
    t = min(max(float(t), low), high)
    weights = _spline(tuple(grid.tolist()))(np.log(t))  # (G,)
    return (log_z - top[:, None] / grid) @ weights + top / t


def scaled_token_probs(top_logits: Any, target_logits: Any, log_z: Any, grid: Any,
                       t: float) -> tuple[np.ndarray, np.ndarray]:
    """The top tokens' probabilities (n, k) and the target's (n,) at temperature ``t``, from the raw
    logits and ``log_z`` at ``grid`` (:class:`TokenLogits`); the confidence is column 0. Interpolation
    may put a probability a hair above 1 (−log of it a hair below 0): it is capped at 1."""
    top, target = np.asarray(top_logits, dtype=np.float64), np.asarray(target_logits, dtype=np.float64)
    if top.ndim != 2 or target.shape != (len(top),):
        raise ValueError(f"Expected top_logits (n, k) and target_logits (n,), but got {top.shape} and {target.shape}")
    lz = token_log_z(log_z, grid, t, top[:, 0])  # (n,)
    return np.exp(np.minimum(top / t - lz[:, None], 0.0)), np.exp(np.minimum(target / t - lz, 0.0))


def token_sum_sq(logits: TokenLogits, t: float) -> Optional[np.ndarray]:
    """Each target's ``Σ_v p_v²`` (n,) over the whole vocabulary at ``t``, the term the exact Brier score
    needs (:func:`lab.calibration.summary.token_scores`); None when ``t / 2`` lies below the grid.

    ``Σ_v p_v² = Σ_v exp(2 z_v / t) / Z(t)² = exp(log Z(t / 2) − 2 log Z(t))``: the log-partition the run
    kept, read at half the temperature (:func:`token_log_z`), with its interpolation error (twice that
    of ``log Z``, relative). Capped at 1, which float error may pass for a one-hot row."""
    grid = np.asarray(logits.grid, dtype=np.float64)
    if t / 2 < grid[0] * (1 - TOKEN_GRID_SLACK):
        return None
    top = logits.top[:, 0]
    log_sq = token_log_z(logits.log_z, grid, t / 2, top) - 2 * token_log_z(logits.log_z, grid, t, top)
    return np.exp(np.minimum(log_sq, 0.0))


def token_nll(logits: TokenLogits, t: float) -> float:
    """Mean ``−log P(target)`` at ``t``: ``log Z(t) − z_target / t``, taken in logs (no floor)."""
    return float(np.mean(token_log_z(logits.log_z, logits.grid, t, logits.top[:, 0]) - logits.target / t))


def fit_token_temperature(logits: TokenLogits, correct: Any, n_bins: int = 10, max_iter: int = 100,
                          bin_edges: BinEdges = "right") -> TemperatureFit:
    """:func:`fit_temperature`'s NLL fit for a token run: the same Brent search over log T, within
    :data:`FIT_BOUNDS` and the run's grid, of :func:`token_nll`. ``correct`` (n,): each target's top token
    is the text's (no temperature changes it), for the ECE before (T = 1, the model unscaled) and after."""
    correct = np.asarray(correct, dtype=bool)
    grid = np.asarray(logits.grid, dtype=np.float64)
    if correct.shape != (len(logits.top),) or not correct.size:
        raise ValueError(f"Expected one correctness per target ({len(logits.top)}, at least one), "
                         f"but got {correct.shape}")
    bounds = (max(FIT_BOUNDS[0], float(grid[0])), min(FIT_BOUNDS[1], float(grid[-1])))
    temperature, at_bound = _nll_minimum(partial(token_nll, logits), bounds, max_iter)
    ece = {t: metrics.ece(scaled_token_probs(logits.top, logits.target, logits.log_z, grid, t)[0][:, 0], correct,
                          n_bins, edges=bin_edges) for t in (1.0, temperature)}
    return TemperatureFit(temperature=temperature, objective="nll", n=int(correct.size), bins=n_bins,
                          at_bound=at_bound, nll_before=token_nll(logits, 1.0),
                          nll_after=token_nll(logits, temperature),
                          ece_before=ece[1.0], ece_after=ece[temperature], bin_edges=bin_edges)


# ---------------------------------------------------------------- FIRST's sweep of a teacher's temperature
def sweep_teacher_temperature(
    p: Any,
    correct_rank: Any,
    form: Form = "paper",
    objective: FitObjective = "ece",
    grid: Any | None = None,
    fine_steps: int = FINE_STEPS,
    n_bins: int = 10,
    bin_edges: BinEdges = "right",
) -> dict[str, Any]:
    """FIRST's grid search of the teacher's temperature on a validation split (§4.2, §5.5), as a
    JSON-ready dict. (Not :func:`lab.results.analysis.temperature_sweep`, which scales a model's option
    probabilities for the temperature lab.)

    ``p`` (n, k): the teacher's top-k probabilities, sorted descending, at the answer position of
    n validation questions. ``correct_rank`` (n,) int: rank (0..k−1) of the correct answer token
    in the top-k, or −1 when it is not among them. For each value v of the temperature
    (``TRANSFORMS[form]``): ``q = transform(p, v)``, confidence ``q[:, 0]``, correct ``rank == 0``,

    - ``ece``: :func:`lab.calibration.metrics.ece` with ``n_bins`` equal-width bins closed on ``bin_edges``;
    - ``nll``: mean of ``−log max(q[rank], 1e-12)``; an answer outside the top-k (rank −1) has no
      re-calibrated probability and counts as ``−log 1e-12`` ≈ 27.6 for every v, so it shifts the
      NLL but never the choice of v;
    - ``accuracy``: mean of ``rank == 0``. Both forms are monotone in p, so the predicted token is
      always the top-1 and accuracy is the same for every v (reported to show just that).

    Three passes, each record tagged with its ``stage``:

    1. ``"coarse"``: ``grid``, or with None the form's own (``TEACHER_GRIDS``): the paper's
       0.1..1.0 step 0.1 for ``paper``; 0.25..8 geometric for ``logit``, which needs T > 1 to cool
       an over-confident teacher and would sit on the paper grid's edge at 1.0.
    2. ``"widen"``: while the best is the smallest or largest value tried, an optimum may lie
       beyond, so the edge × ``TEACHER_WIDEN_FACTOR`` (or ÷) is tried next, up to
       ``TEACHER_SWEEP_BOUNDS`` (:func:`widen_point_by_point`).
    3. ``"fine"``: the gap from the best to each neighbour split into ``fine_steps`` equal steps
       (``FINE_SPACING[form]``: linear for ``paper``, which on the paper's grid gives exactly its
       step 0.02 over the best ± 0.1; equal ratios for ``logit``).

    ``objective`` (``"ece"``, as the paper, or ``"nll"``) picks the best; ties go to the first
    tried, so a flat objective stops the widening. Values already tried are not repeated; all are
    rounded to 10 decimals. Returns ``form, objective, n_bins, bin_edges, best, best_ece,
    best_nll, identity_ece, widened, on_edge, records``, each record ``{value, ece, nll, accuracy,
    stage}``. ``widened`` lists ``{"side", "from", "to"}`` per side the grid was widened past (the
    edge it started from and the farthest value tried); ``on_edge`` is True only when the best
    remains on an edge of the values tried, i.e. at a hard bound. ``identity_ece`` is the ECE with
    no re-calibration, the top-k normalised over k (the logit form at T = 1); for the paper form
    c = 1 is not the identity (see :func:`temperature_paper`), so it is computed apart.
    """
    p, rank, coarse = _check_sweep(p, correct_rank, form, objective, grid, fine_steps, bin_edges)
    score = partial(_grid_point, p, rank, TRANSFORMS[form], n_bins, bin_edges)
    records = [score(v, "coarse") for v in coarse]
    widened = widen_point_by_point(score, records, objective)
    values = [r["value"] for r in records]
    centre = _best(records, objective)["value"]
    records += [score(v, "fine") for v in _fine_grid(centre, values, fine_steps, FINE_SPACING[form])
                if v not in values]
    return _sweep_result(p, rank, form, objective, records, widened, n_bins, bin_edges)


def _check_sweep(p: Any, correct_rank: Any, form: str, objective: str, grid: Any, fine_steps: int,
                 bin_edges: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every check of the sweep's inputs and arguments, before the first transform runs, so a bad
    call fails with its own message instead of deep inside a grid point. Returns ``p`` (n, k)
    float64, ``rank`` (n,) int64 and the coarse grid (sorted, rounded, no repeats)."""
    p = check_topk(p, ndim=2)
    n, k = p.shape
    if n < 1:
        raise ValueError("Expected `p` to hold at least one question, but got n = 0.")
    check_sorted(p)
    rank = _check_rank(correct_rank, n, k)
    if form not in TRANSFORMS:
        raise ValueError(f"Expected `form` to be one of {sorted(TRANSFORMS)}, but got {form!r}.")
    if objective not in OBJECTIVES:
        raise ValueError(f"Expected `objective` to be one of {OBJECTIVES}, but got {objective!r}.")
    if isinstance(fine_steps, bool) or not isinstance(fine_steps, (int, np.integer)) or fine_steps < 1:
        raise ValueError(f"Expected `fine_steps` to be an integer larger than 0, but got {fine_steps!r}.")
    check_edges(bin_edges)
    return p, rank, TEACHER_GRIDS[form] if grid is None else _check_grid(grid)


def _check_grid(grid: Any) -> np.ndarray:
    """The coarse grid sorted, rounded to ``DECIMALS`` and without repeats; values must lie within
    ``TEACHER_SWEEP_BOUNDS``, the range the widening is allowed to reach."""
    values = np.asarray(grid, dtype=np.float64)
    low, high = TEACHER_SWEEP_BOUNDS
    if (values.ndim != 1 or values.size < 1 or not np.all(np.isfinite(values))
            or values.min() < low or values.max() > high):
        raise ValueError(
            f"Expected `grid` to be a non-empty 1-D sequence of values in [{low:g}, {high:g}], "
            f"but got {grid!r}."
        )
    return np.unique(np.round(values, DECIMALS))


def _check_rank(correct_rank: Any, n: int, k: int) -> np.ndarray:
    rank = np.asarray(correct_rank)
    if rank.shape != (n,) or rank.dtype.kind not in "iu":
        raise ValueError(
            f"Expected `correct_rank` to be integers of shape ({n},), "
            f"but got {rank.dtype} {rank.shape}."
        )
    bad = np.flatnonzero((rank < -1) | (rank >= k))
    if bad.size:
        raise ValueError(
            f"Expected `correct_rank` in [-1, {k - 1}] (-1: not in the top-k), "
            f"but got {rank[bad[0]]} at index {bad[0]}."
        )
    return rank.astype(np.int64)


def _grid_point(p: np.ndarray, rank: np.ndarray, transform: Callable[[Any, float], np.ndarray], n_bins: int,
                bin_edges: str, value: float, stage: str) -> dict[str, Any]:
    """One record of the sweep: ECE, NLL and accuracy of the teacher re-calibrated at ``value``.

    An answer outside the top-k (rank −1) points at an extra column of zeros, so its NLL term is
    ``−log NLL_EPS`` at every value: it shifts the NLL but never the choice of value.
    """
    n, k = p.shape
    correct = rank == 0  # (n,)
    labels = np.where(rank < 0, k, rank)  # (n,), rank -1 → column k
    q = transform(p, value)  # (n, k)
    q_ext = np.concatenate([q, np.zeros((n, 1))], axis=1)  # (n, k + 1)
    return {
        "value": float(value),
        "ece": metrics.ece(q[:, 0], correct, n_bins, edges=bin_edges),
        "nll": metrics.nll(q_ext, labels, NLL_EPS),
        "accuracy": float(np.mean(correct)),
        "stage": stage,
    }


def _best(records: list[dict[str, Any]], objective: str) -> dict[str, Any]:
    """The record with the lowest ``objective``; ties go to the first tried."""
    return min(records, key=lambda r: r[objective])


def widen_point_by_point(score: Callable[[float, str], dict[str, Any]], records: list[dict[str, Any]],
                         objective: str) -> list[dict[str, Any]]:
    """Extend ``records`` past an edge that holds the best, one value × (or ÷) ``TEACHER_WIDEN_FACTOR``
    at a time, until the best is interior or sits on ``TEACHER_SWEEP_BOUNDS``: a lowest value on the
    edge says only that the objective still falls there. New records (``score(value, "widen")``) are
    appended in the order tried, so ties go to the first tried; values are rounded to ``DECIMALS``.
    Returns ``{"side", "from", "to"}`` per side widened. (The fit and the temperature lab widen
    otherwise, :func:`widened_search`: see the module docstring.)"""
    low, high = TEACHER_SWEEP_BOUNDS
    widened: dict[str, dict[str, Any]] = {}
    while True:
        best = _best(records, objective)["value"]
        values = [r["value"] for r in records]
        if best == max(values) and best < high:
            side, value = "above", min(round(best * TEACHER_WIDEN_FACTOR, DECIMALS), high)
        elif best == min(values) and best > low:
            side, value = "below", max(round(best / TEACHER_WIDEN_FACTOR, DECIMALS), low)
        else:
            return list(widened.values())
        widened.setdefault(side, {"side": side, "from": best})["to"] = value
        records.append(score(value, "widen"))


def _fine_grid(centre: float, values: list[float], steps: int, spacing: str) -> np.ndarray:
    """FIRST §5.5's second pass, generalised: the gap from ``centre`` to its neighbour on each side
    among ``values`` in ``steps`` equal steps (``"linear"``) or equal ratios (``"geometric"``),
    ends excluded, ascending and rounded as the coarse grid so that a value met twice compares equal."""
    below = [v for v in values if v < centre]
    above = [v for v in values if v > centre]
    spaced = np.linspace if spacing == "linear" else np.geomspace
    inner = [spaced(a, b, steps + 1)[1:-1] for a, b in ((max(below, default=None), centre),
                                                         (centre, min(above, default=None))) if None not in (a, b)]
    return np.round(np.concatenate([np.empty(0), *inner]), DECIMALS)


def _sweep_result(p: np.ndarray, rank: np.ndarray, form: str, objective: str, records: list[dict[str, Any]],
                  widened: list[dict[str, Any]], n_bins: int, bin_edges: str) -> dict[str, Any]:
    """The sweep's answer: the best record by ``objective`` (ties to the first tried), what was
    widened, whether the best still sits on an edge of the values tried (only possible at a hard
    bound), and the ECE with no re-calibration, computed apart because the paper form at c = 1 is
    not the identity (the identity is the top-k normalised over k, the logit form at T = 1)."""
    best = _best(records, objective)
    values = [r["value"] for r in records]
    identity = temperature_logit(p, 1.0)[:, 0]
    return {
        "form": form,
        "objective": objective,
        "n_bins": n_bins,
        "bin_edges": bin_edges,
        "best": best["value"],
        "best_ece": best["ece"],
        "best_nll": best["nll"],
        "identity_ece": metrics.ece(identity, rank == 0, n_bins, edges=bin_edges),
        "widened": widened,
        "on_edge": bool(best["value"] in (min(values), max(values))),
        "records": records,
    }


# ---------------------------------------------------------------- the artefact
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
            raise FileNotFoundError(f"No temperature file at {shown_here(path)}: fit one first (the CFT job's ts/ "
                                    "directory or the temperature lab's save button writes it)")
        text = read_text(path, encoding="utf-8")
        try:
            value = float(stored.parse(text, TEMPERATURE_FILE)["temperature"])  # depth-bounded: any file may come
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{shown_here(path)} is not a temperature file (expected JSON with a 'temperature' "
                             f"number): {e}") from None
    low, high = TEMPERATURE_RANGE
    if not (np.isfinite(value) and low <= value <= high):
        raise ValueError(f"Expected a temperature from {low:g} to {high:g}, but got {value!r}")
    return value
