"""FIRST's sweep of a teacher's temperature (§4.2, §5.5): a coarse grid, widened point by point past an
edge holding the best, then a fine pass around it, on a validation split's top-k.

Its widening differs from the fit's (:func:`lab.calibration.temperature.widened_search`; that module's
docstring says how and why both stay). The sweep applies either form of
:mod:`lab.calibration.temperature` (:data:`TRANSFORMS`) to a teacher's top-k ``p`` (n, k), sorted
descending; see ``shared/REFERENCE.md`` §2.3 and ``shared/seeds/first_paper.txt`` §4.2 and §5.5.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np

from lab.calibration import metrics
from lab.calibration.checks import BinEdges, check_edges, check_sorted, check_topk
from lab.calibration.temperature import OBJECTIVES, FitObjective, Form, temperature_logit, temperature_paper
from lab.core.limits import TEMPERATURE_RANGE

NLL_EPS = 1e-12  # probability floor of the sweep's NLL; an answer outside the top-k scores -log(1e-12)
TEACHER_SWEEP_BOUNDS = TEMPERATURE_RANGE  # sweep_teacher_temperature: its grid's values, and no widening past
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
TEACHER_WIDEN_FACTOR = 2.0  # widen_point_by_point: an optimum on an edge tries the edge × 2 (or / 2) next

TRANSFORMS: dict[str, Callable[[Any, float], np.ndarray]] = {  # a teacher's top-k at a value of each form
    "paper": temperature_paper,
    "logit": temperature_logit,
}


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
    c = 1 is not the identity (see :func:`lab.calibration.temperature.temperature_paper`), so it is computed apart.
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
    otherwise, :func:`lab.calibration.temperature.widened_search`: see its module docstring.)"""
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
