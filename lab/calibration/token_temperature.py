"""A token run's temperature (tasks clm and facts): its rows rescaled to any temperature, and its fit.

A token run's temperature rescales the whole vocabulary, which its rows do not keep; they keep what it
takes instead (:class:`TokenLogits`): the raw logits of the top tokens and of the target, and
``log Z(T) = logsumexp(z / T)`` over the vocabulary at each T of :data:`TOKEN_GRID`. The argmax, so
correctness, is every temperature's; the confidence is ``exp(z_top / T − log Z(T))``, the target's
probability ``exp(z_target / T − log Z(T))`` and the exact Brier score's
``Σ_v p_v² = exp(log Z(T / 2) − 2 log Z(T))`` (:func:`token_sum_sq`). Between grid points
:func:`token_log_z` interpolates; outside the grid nothing is known and it refuses. numpy only at
import (scipy when first interpolating or fitting): the web server rescales token runs too.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from lab.calibration import metrics
from lab.calibration.checks import BinEdges
from lab.calibration.temperature import FIT_BOUNDS, TemperatureFit, nll_minimum

# A token run's log-partition is kept at these temperatures (lab.models.token_scoring.log_partition, which
# evaluates every one from a fixed number of passes over the logits, so the grid's size costs disk, not time):
# FIT_BOUNDS, so that a fit and the temperature lab's sweep (LAB_SWEEP_BOUNDS["logit"], widened from
# LAB_SWEEP_GRIDS["logit"]) never leave it, and 30 per decade, where the quintic spline between them
# (token_log_z) is within 2e-5 of the exact confidence everywhere: measured at every midpoint between grid
# points and 1,601 temperatures more, on 256 targets of the bundled model (7e-6), on random logits over
# 49,152 tokens (normal with sd 3: 4e-7; Student t, 3 degrees of freedom, scale 2: 1.6e-5), sd 0.3 over 600
# (7e-8), and up to 5,600 tokens at one gap from the top (4e-6); tests/calibration/test_token_temperature.py holds it
# to that on its own sets. A cubic spline gives 1.5e-4 at 30 per decade, a quintic one 3e-4 at 20 per decade.
TOKEN_GRID = np.geomspace(FIT_BOUNDS[0], FIT_BOUNDS[1], 121)
SPLINE_DEGREE = 5  # token_log_z's spline, in log T
TOKEN_GRID_SLACK = 1e-9  # a T this close (relatively) to a grid end counts as on it: float noise, not a T beyond


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
    """:func:`lab.calibration.temperature.fit_temperature`'s NLL fit for a token run: the same Brent search
    over log T, within :data:`FIT_BOUNDS` and the run's grid, of :func:`token_nll`. ``correct`` (n,): each
    target's top token is the text's (no temperature changes it), for the ECE before (T = 1, the model
    unscaled) and after."""
    correct = np.asarray(correct, dtype=bool)
    grid = np.asarray(logits.grid, dtype=np.float64)
    if correct.shape != (len(logits.top),) or not correct.size:
        raise ValueError(f"Expected one correctness per target ({len(logits.top)}, at least one), "
                         f"but got {correct.shape}")
    bounds = (max(FIT_BOUNDS[0], float(grid[0])), min(FIT_BOUNDS[1], float(grid[-1])))
    temperature, at_bound = nll_minimum(partial(token_nll, logits), bounds, max_iter)
    ece = {t: metrics.ece(scaled_token_probs(logits.top, logits.target, logits.log_z, grid, t)[0][:, 0], correct,
                          n_bins, edges=bin_edges) for t in (1.0, temperature)}
    return TemperatureFit(temperature=temperature, objective="nll", n=int(correct.size), bins=n_bins,
                          at_bound=at_bound, nll_before=token_nll(logits, 1.0),
                          nll_after=token_nll(logits, temperature),
                          ece_before=ece[1.0], ece_after=ece[temperature], bin_edges=bin_edges)
