"""Re-calibrating a teacher's stored top-k probabilities before distillation (FIRST §4.2).

Input everywhere: ``p`` (..., k) float, the teacher's top-k probabilities at one position, sorted
descending (rank 0 = top-1). A row need not sum to 1: the top-k holds only part of the mass
(FIRST reports > 95 % on average for k = 5). Every transform returns float64 rows of the same
shape; the temperatures and :func:`direct` return rows that sum to 1 over the k entries, while
:func:`label_smooth` (Eq. 3 as printed) keeps each row's own mass, as the paper's ±δ does.

- :func:`temperature_paper`: FIRST Eq. 4 as printed, a softmax of the *probabilities* divided by c.
- :func:`temperature_logit`: the usual temperature, ``P^(1/T)`` renormalised.
- :func:`label_smooth`: FIRST Eq. 3 on the raw top-k, generalised to any k (or renormalised first).
- :func:`direct`: the "direct distillation" normalisation, i.e. no re-calibration.
- :func:`sweep_teacher_temperature`: FIRST's grid search of the temperature on a validation split
  (§5.5), with a grid of its own per form, widened past an edge that holds the optimum.

See ``shared/REFERENCE.md`` §2.3 and ``shared/seeds/first_paper.txt`` §4.2 and §5.5.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Literal

import numpy as np

from lab.limits import TEMPERATURE_RANGE
from lab.metric_checks import BinEdges, check_edges, check_unit_interval
from lab.metrics import ece, nll
from lab.temperature import FitObjective

Form = Literal["paper", "logit"]
OBJECTIVES: tuple[str, ...] = ("ece", "nll")
DECIMALS = 10  # grid values are rounded to this: 3 * 0.1 is 0.30000000000000004 in floats
PAPER_GRID = np.round(np.arange(0.1, 1.01, 0.1), DECIMALS)  # FIRST §5.5: 0.1 .. 1.0, step 0.1
# The logit form cools an over-confident teacher only with T > 1, which the paper's grid never
# reaches: 0.25 .. 8, four values per doubling (each ~19 % above the last).
LOGIT_GRID = np.round(0.25 * 2.0 ** (np.arange(21) / 4), DECIMALS)
DEFAULT_GRIDS: dict[str, np.ndarray] = {"paper": PAPER_GRID, "logit": LOGIT_GRID}
# The fine pass splits the gap from the best to each neighbour into FINE_STEPS equal steps: on the
# paper's grid (step 0.1) that is its step of 0.02 over the best ± 0.1; on the log grid, equal ratios.
FINE_STEPS = 5
FINE_SPACING: dict[str, str] = {"paper": "linear", "logit": "geometric"}
HARD_BOUNDS = TEMPERATURE_RANGE  # no widening past these: there the rows are as good as one-hot or uniform
WIDEN_FACTOR = 2.0  # an optimum on an edge tries the edge × 2 (or / 2) next, until it is interior
NLL_EPS = 1e-12  # probability floor of the NLL; an answer outside the top-k scores -log(1e-12)
SUM_TOL = 1e-3  # a top-k may sum this far above 1 (probabilities stored in half precision)


# ------------------------------------------------------------------------------ checks
def _check_p(p: Any, ndim: int | None = None) -> np.ndarray:
    """Returns ``p`` (..., k) as float64 clipped to [0, 1]; rows must sum to at most 1."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim < 1 or p.shape[-1] < 1 or (ndim is not None and p.ndim != ndim):
        want = "(..., k)" if ndim is None else "(n, k)"
        raise ValueError(f"Expected `p` to have shape {want} with k >= 1, but got {p.shape}.")
    p = check_unit_interval("p", p)
    total = p.sum(axis=-1)
    if total.size and total.max() > 1 + SUM_TOL:
        raise ValueError(
            f"Expected each row of `p` to sum to at most 1 (a top-k holds part of the mass), "
            f"but a row sums to {total.max():.6g}."
        )
    return p


def _check_positive_rows(p: np.ndarray) -> None:
    if p.size and p.sum(axis=-1).min() <= 0:
        raise ValueError("Expected every row of `p` to have a positive entry, but a row is all 0.")


def _check_sorted(p: np.ndarray) -> None:
    if np.any(p[..., 1:] > p[..., :-1]):
        raise ValueError(
            "Expected each row of `p` to be sorted descending (rank 0 = top-1), but it is not. "
            "Sort the top-k by probability, e.g. -np.sort(-p, axis=-1)."
        )


def _check_positive(name: str, x: Any) -> None:
    number = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
    if not (number and np.isfinite(x) and x > 0):
        raise ValueError(f"Expected `{name}` to be positive, but got {x!r}.")


def _check_fraction(name: str, x: Any) -> None:
    number = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
    if not (number and 0 <= x < 1):
        raise ValueError(f"Expected `{name}` to be a number in [0, 1), but got {x!r}.")


def _check_grid(grid: Any) -> np.ndarray:
    """The coarse grid sorted, rounded to ``DECIMALS`` and without repeats; values must lie within
    ``HARD_BOUNDS``, the range the widening is allowed to reach."""
    values = np.asarray(grid, dtype=np.float64)
    low, high = HARD_BOUNDS
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


# -------------------------------------------------------------------------- transforms
def _softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; -inf entries become exactly 0. Some entry must be finite."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))  # (..., k), largest entry exp(0) = 1
    return e / e.sum(axis=-1, keepdims=True)


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
    _check_positive("c", c)
    z = _check_p(p) / c  # (..., k)
    return _softmax(z if mask is None else np.where(mask, z, -np.inf))


def temperature_logit(p: Any, T: float) -> np.ndarray:
    """The usual temperature applied to probabilities: ``P'(i) = P(i)^(1/T) / Σ_j P(j)^(1/T)``.

    ``p`` (..., k) → (..., k); equals ``softmax(logits / T)`` restricted to the top-k. Computed as
    a softmax of ``log P / T`` so that small T cannot underflow every entry; entries with p = 0
    stay 0. T = 1 is plain normalisation over the k (no re-calibration); T > 1 flattens and T < 1
    sharpens. Ranks are kept for every T > 0.
    """
    _check_positive("T", T)
    p = _check_p(p)
    _check_positive_rows(p)
    with np.errstate(divide="ignore"):  # log 0 = -inf, which the softmax turns back into 0
        return _softmax(np.log(p) / T)


def label_smooth(p: Any, delta: float = 0.1, renormalise: bool = False) -> np.ndarray:
    """FIRST Eq. 3, generalised to any k ≥ 2: move δ from the top-1 to the others in equal shares,

    ``P'(1) = P(1) − δ``;  ``P'(i) = P(i) + δ/(k−1)`` for ranks i = 2..k

    on the raw top-k as the paper prints it (its ranks 2..5 get δ/4, k = 5). ``p`` (..., k) sorted
    descending → (..., k). A row keeps its own mass ``Σ P``: a top-k holding 0.9 of the teacher's
    mass still holds 0.9, so the distillation loss sees the same tail it would without smoothing
    (:func:`lab.distill.losses.topk_kl_loss` takes such rows as they are; only its opt-in
    ``renormalise=True`` divides them by their mass, which equals smoothing the normalised row by
    ``δ / Σ P``).

    ``renormalise=True``: normalise over the k first (``q = p / Σ p``) and smooth ``q``, so the rows
    sum to 1 and δ is a share of the top-k's mass rather than of the whole vocabulary's.

    It can break the rank order: whenever ``P(1) − P(2) < δ·k/(k−1)`` the top-2 overtakes the
    top-1, which the paper names as a drawback. Eq. 3 cannot take more than the top-1 holds: a row
    whose top-1 is below δ (an uncertain position) gives all of it, ``δ_row = P(1)``, so that no
    probability turns negative.
    """
    _check_fraction("delta", delta)
    p = _check_p(p)
    k = p.shape[-1]
    if k < 2:
        raise ValueError(f"Expected `p` to hold k >= 2 entries for label smoothing, but got {k}.")
    _check_sorted(p)
    if renormalise:
        _check_positive_rows(p)
        p = p / p.sum(axis=-1, keepdims=True)  # (..., k)
    moved = np.minimum(delta, p[..., :1])  # (..., 1): δ, or all of a top-1 smaller than δ
    return np.concatenate([p[..., :1] - moved, p[..., 1:] + moved / (k - 1)], axis=-1)


def direct(p: Any, delta: float = 1e-6) -> np.ndarray:
    """FIRST's "direct distillation" normalisation (no re-calibration):
    ``P'(j) = (P(j) + δ) / Σ_i (P(i) + δ)``. ``p`` (..., k) → (..., k).

    δ keeps every entry positive, so the teacher's log-probabilities stay finite.
    """
    _check_positive("delta", delta)
    shifted = _check_p(p) + delta
    return shifted / shifted.sum(axis=-1, keepdims=True)


TRANSFORMS: dict[str, Callable[[Any, float], np.ndarray]] = {
    "paper": temperature_paper,
    "logit": temperature_logit,
}


# ------------------------------------------------------------------------------- sweep
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
    JSON-ready dict. (Not :func:`lab.analysis.temperature_sweep`, which scales a model's option
    probabilities for the temperature lab.)

    ``p`` (n, k): the teacher's top-k probabilities, sorted descending, at the answer position of
    n validation questions. ``correct_rank`` (n,) int: rank (0..k−1) of the correct answer token
    in the top-k, or −1 when it is not among them. For each value v of the temperature
    (``TRANSFORMS[form]``): ``q = transform(p, v)``, confidence ``q[:, 0]``, correct ``rank == 0``,

    - ``ece``: :func:`lab.metrics.ece` with ``n_bins`` equal-width bins closed on ``bin_edges``;
    - ``nll``: mean of ``−log max(q[rank], 1e-12)``; an answer outside the top-k (rank −1) has no
      re-calibrated probability and counts as ``−log 1e-12`` ≈ 27.6 for every v, so it shifts the
      NLL but never the choice of v;
    - ``accuracy``: mean of ``rank == 0``. Both forms are monotone in p, so the predicted token is
      always the top-1 and accuracy is the same for every v (reported to show just that).

    Three passes, each record tagged with its ``stage``:

    1. ``"coarse"``: ``grid``, or with None the form's own (``DEFAULT_GRIDS``): the paper's
       0.1..1.0 step 0.1 for ``paper``; 0.25..8 geometric for ``logit``, which needs T > 1 to cool
       an over-confident teacher and would sit on the paper grid's edge at 1.0.
    2. ``"widen"``: while the best is the smallest or largest value tried, an optimum may lie
       beyond, so the edge × ``WIDEN_FACTOR`` (or ÷) is tried next, up to ``HARD_BOUNDS``.
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
    widened = _widen(score, records, objective)
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
    p = _check_p(p, ndim=2)
    n, k = p.shape
    if n < 1:
        raise ValueError("Expected `p` to hold at least one question, but got n = 0.")
    _check_sorted(p)
    rank = _check_rank(correct_rank, n, k)
    if form not in TRANSFORMS:
        raise ValueError(f"Expected `form` to be one of {sorted(TRANSFORMS)}, but got {form!r}.")
    if objective not in OBJECTIVES:
        raise ValueError(f"Expected `objective` to be one of {OBJECTIVES}, but got {objective!r}.")
    if isinstance(fine_steps, bool) or not isinstance(fine_steps, (int, np.integer)) or fine_steps < 1:
        raise ValueError(f"Expected `fine_steps` to be an integer larger than 0, but got {fine_steps!r}.")
    check_edges(bin_edges)
    return p, rank, DEFAULT_GRIDS[form] if grid is None else _check_grid(grid)


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
        "ece": ece(q[:, 0], correct, n_bins, edges=bin_edges),
        "nll": nll(q_ext, labels, NLL_EPS),
        "accuracy": float(np.mean(correct)),
        "stage": stage,
    }


def _best(records: list[dict[str, Any]], objective: str) -> dict[str, Any]:
    """The record with the lowest ``objective``; ties go to the first tried."""
    return min(records, key=lambda r: r[objective])


def _widen(score: Callable[[float, str], dict[str, Any]], records: list[dict[str, Any]],
           objective: str) -> list[dict[str, Any]]:
    """Extend ``records`` past an edge that holds the best, one value × (or ÷) ``WIDEN_FACTOR`` at a
    time, until the best is interior or sits on ``HARD_BOUNDS``: a lowest value on the edge says
    only that the objective still falls there. Returns ``{"side", "from", "to"}`` per side widened."""
    low, high = HARD_BOUNDS
    widened: dict[str, dict[str, Any]] = {}
    while True:
        best = _best(records, objective)["value"]
        values = [r["value"] for r in records]
        if best == max(values) and best < high:
            side, value = "above", min(round(best * WIDEN_FACTOR, DECIMALS), high)
        elif best == min(values) and best > low:
            side, value = "below", max(round(best / WIDEN_FACTOR, DECIMALS), low)
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
        "identity_ece": ece(identity, rank == 0, n_bins, edges=bin_edges),
        "widened": widened,
        "on_edge": bool(best["value"] in (min(values), max(values))),
        "records": records,
    }
