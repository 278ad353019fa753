"""Tests for lab.first.recalibration: hand-computed transforms on one top-5 row, properties over random
rows, and the temperature sweep on a synthetic over-confident teacher."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lab.first import recalibration as C
from lab.metrics import ece

P = [0.6, 0.2, 0.1, 0.05, 0.05]  # a top-5 holding all the mass
P_PART = [0.5, 0.2, 0.1, 0.05, 0.05]  # a top-5 holding 0.9 of it


def random_topk(n: int, k: int, seed: int) -> np.ndarray:
    """Sorted-descending top-k rows (n, k) holding 0.5 to 1 of the mass, some entries 0."""
    rng = np.random.default_rng(seed)
    p = -np.sort(-rng.dirichlet(np.full(k, 0.5), size=n), axis=1) * rng.uniform(0.5, 1, (n, 1))
    p[: n // 4, -1] = 0.0
    return p


def entropy(q: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(q > 0, q * np.log(q), 0.0), axis=-1)


def overconfident(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A teacher whose top-5 is softmax(2 z) while answers are drawn from softmax(z) over 20
    tokens: its top-1 probability (≈ 0.85) is well above its accuracy (≈ 0.55)."""
    rng = np.random.default_rng(seed)
    z = -np.sort(-rng.normal(size=(n, 20)), axis=1)
    z[:, 0] += 3 * rng.random(n)

    def softmax(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    truth = softmax(z)
    drawn = (rng.random((n, 1)) > np.cumsum(truth, axis=1)).sum(axis=1)
    return softmax(2 * z)[:, :5], np.where(drawn < 5, drawn, -1)


# ------------------------------------------------------------------ hand-computed values
def test_temperature_paper_by_hand():
    e = [math.exp(x / 0.5) for x in P]
    assert C.temperature_paper(P, 0.5) == pytest.approx([x / sum(e) for x in e], abs=1e-12)
    e = [math.exp(x) for x in P]  # c = 1: close to uniform, top-1 only 1.82 / 5.84
    assert C.temperature_paper(P, 1.0)[0] == pytest.approx(math.exp(0.6) / sum(e), abs=1e-12)
    assert C.temperature_paper(P, 1.0)[0] < 0.32


def test_temperature_logit_by_hand():
    # T = 0.5 squares: [.36, .04, .01, .0025, .0025] / 0.415
    assert C.temperature_logit(P, 0.5) == pytest.approx(
        [0.36 / 0.415, 0.04 / 0.415, 0.01 / 0.415, 0.0025 / 0.415, 0.0025 / 0.415], abs=1e-12
    )
    roots = [math.sqrt(x) for x in P_PART]
    assert C.temperature_logit(P_PART, 2.0) == pytest.approx([r / sum(roots) for r in roots])


def test_label_smooth_by_hand():
    assert C.label_smooth(P, 0.1) == pytest.approx([0.5, 0.225, 0.125, 0.075, 0.075], abs=1e-12)
    q = [x / 0.9 for x in P_PART]  # normalised first, then the paper's ±δ, δ/4
    assert C.label_smooth(P_PART, 0.1) == pytest.approx(
        [q[0] - 0.1] + [x + 0.025 for x in q[1:]], abs=1e-12
    )


def test_direct_by_hand():
    d = 1e-6
    expected = [(x + d) / (0.9 + 5 * d) for x in P_PART]
    assert C.direct(P_PART) == pytest.approx(expected, abs=1e-15)
    assert C.direct([0.7, 0.3, 0.0]).min() > 0  # every log-prob finite


# ------------------------------------------------------------------------- properties
@pytest.mark.parametrize(
    "fn, arg",
    [(C.temperature_paper, 0.3), (C.temperature_paper, 7.0), (C.temperature_logit, 0.2),
     (C.temperature_logit, 3.0), (C.direct, 1e-6), (C.label_smooth, 0.05)],
)
def test_rows_sum_to_one_and_shape_kept(fn, arg):
    p = random_topk(200, 5, seed=1).reshape(10, 20, 5)
    q = fn(p, arg)
    assert q.shape == p.shape and q.dtype == np.float64
    assert np.allclose(q.sum(axis=-1), 1.0, atol=1e-12)
    assert q.min() >= 0


@pytest.mark.parametrize("form", ["paper", "logit"])
@pytest.mark.parametrize("value", [0.02, 0.1, 0.3, 1.0, 2.5, 50.0])
def test_temperature_forms_keep_the_order(form, value):
    q = C.TRANSFORMS[form](random_topk(300, 5, seed=2), value)
    assert np.all(np.diff(q, axis=1) <= 1e-15)


def test_logit_at_one_is_normalisation_and_keeps_zeros():
    p = random_topk(100, 5, seed=3)
    q = C.temperature_logit(p, 1.0)
    assert np.allclose(q, p / p.sum(axis=1, keepdims=True), atol=1e-14)
    assert np.all(q[p == 0] == 0)
    assert np.all(np.isfinite(C.temperature_logit(p, 1e-3)))  # log space: no 0/0 at small T


def test_paper_form_flattens_as_c_grows():
    p = random_topk(300, 5, seed=4)
    h = np.stack([entropy(C.temperature_paper(p, c)) for c in [0.05, 0.1, 0.3, 1.0, 3.0, 30.0]])
    assert np.all(np.diff(h, axis=0) > 0)  # strictly, row by row: p is never uniform here
    assert np.allclose(C.temperature_paper(p, 1e4), 0.2, atol=1e-4)
    assert C.temperature_paper(P, 1e-2)[0] == pytest.approx(1.0)  # sharpens towards one-hot


def test_label_smooth_can_break_the_order():
    q = C.label_smooth([0.3, 0.28, 0.2, 0.12, 0.1], 0.1)
    assert q.sum() == pytest.approx(1.0)
    assert q[1] > q[0]  # 0.2 vs 0.305: the top-2 overtakes the top-1 (FIRST §4.2)


# ------------------------------------------------------------------------------- sweep
def test_sweep_beats_no_recalibration_on_overconfident_teacher():
    p, rank = overconfident(2000, seed=0)
    out = C.sweep_teacher_temperature(p, rank)
    conf = p[:, 0] / p.sum(axis=1)
    assert conf.mean() > np.mean(rank == 0) + 0.2  # the teacher really is over-confident
    assert out["identity_ece"] == pytest.approx(ece(conf, rank == 0))
    assert out["best_ece"] <= out["identity_ece"]  # acceptance criterion
    assert out["best_ece"] < 0.5 * out["identity_ece"]
    assert not out["on_edge"] and 0.1 < out["best"] < 1.0
    best = min(out["records"], key=lambda r: r["ece"])
    assert (best["value"], best["ece"]) == (out["best"], out["best_ece"])
    assert {r["accuracy"] for r in out["records"]} == {np.mean(rank == 0)}  # rank-preserving
    json.dumps(out)


def test_sweep_grids():
    p, rank = overconfident(500, seed=1)
    out = C.sweep_teacher_temperature(p, rank)
    coarse = [r["value"] for r in out["records"] if r["stage"] == "coarse"]
    fine = [r["value"] for r in out["records"] if r["stage"] == "fine"]
    assert coarse == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # no 0.30000000000000004
    centre = min((r for r in out["records"] if r["stage"] == "coarse"), key=lambda r: r["ece"])
    step = [round(centre["value"] + d, 10) for d in np.arange(-0.08, 0.081, 0.02)]
    assert fine == [v for v in step if v != centre["value"]]  # centred, step 0.02, no repeats
    assert np.mean(fine) == pytest.approx(centre["value"])


def test_sweep_fine_grid_clipped_and_identity_off_grid():
    p, rank = overconfident(300, seed=2)
    out = C.sweep_teacher_temperature(p, rank, coarse=[0.05, 0.5], fine_step=0.01)
    values = [r["value"] for r in out["records"]]
    assert min(values) > 0 and 1.0 not in values
    assert out["identity_ece"] == pytest.approx(ece(p[:, 0] / p.sum(axis=1), rank == 0))


def test_sweep_on_edge_when_optimum_beyond_grid():
    # the logit form cools only with T > 1, but the paper's grid stops at 1.0 (+ 0.1 fine)
    p, rank = overconfident(1000, seed=3)
    out = C.sweep_teacher_temperature(p, rank, form="logit")
    assert out["on_edge"] and out["best"] == pytest.approx(1.1)
    wide = C.sweep_teacher_temperature(p, rank, form="logit", coarse=np.arange(0.5, 4.01, 0.5))
    assert not wide["on_edge"] and wide["best"] > 1.1
    assert wide["best_ece"] < out["best_ece"] <= out["identity_ece"]


def test_sweep_nll_objective():
    p, rank = overconfident(1000, seed=4)
    out = C.sweep_teacher_temperature(p, rank, objective="nll")
    assert out["objective"] == "nll"
    assert out["best_nll"] == min(r["nll"] for r in out["records"])
    # by hand at the best value: an answer outside the top-5 counts as -log(1e-12)
    q = C.temperature_paper(p, out["best"])
    p_y = np.where(rank >= 0, q[np.arange(len(rank)), np.maximum(rank, 0)], 1e-12)
    assert out["best_nll"] == pytest.approx(np.mean(-np.log(p_y)))


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: C.temperature_paper(P, 0), "Expected `c` to be positive, but got 0"),
        (lambda: C.temperature_logit(P, -1.0), "Expected `T` to be positive"),
        (lambda: C.direct(P, 0.0), "Expected `delta` to be positive"),
        (lambda: C.label_smooth(P, 1.5), r"Expected `delta` to be a number in \[0, 1\)"),
        (lambda: C.label_smooth([0.15, 0.1, 0.05], 0.6), "at most the normalised top-1"),
        (lambda: C.label_smooth([0.1, 0.6, 0.2], 0.1), "sorted descending"),
        (lambda: C.label_smooth([0.9], 0.1), "k >= 2"),
        (lambda: C.temperature_logit([0.0, 0.0], 1.0), "positive entry"),
        (lambda: C.temperature_paper([0.9, 0.8], 1.0), "sum to at most 1"),
        (lambda: C.temperature_paper([1.5, -0.5], 1.0), r"probabilities in \[0, 1\]"),
        (lambda: C.sweep_teacher_temperature([P], [5]), r"`correct_rank` in \[-1, 4\]"),
        (lambda: C.sweep_teacher_temperature([P], [0.0]), "`correct_rank` to be integers"),
        (lambda: C.sweep_teacher_temperature(P, [0]), r"shape \(n, k\)"),
        (lambda: C.sweep_teacher_temperature([P], [0], form="kelvin"), "`form` to be one of"),
        (lambda: C.sweep_teacher_temperature([P], [0], objective="acc"), "`objective` to be one of"),
        (lambda: C.sweep_teacher_temperature([P], [0], coarse=[]), "`coarse` to be a non-empty"),
        (lambda: C.sweep_teacher_temperature([P], [0], fine_step=0), "`fine_step` to be positive"),
        (lambda: C.sweep_teacher_temperature([P], [0], n_bins=0), "`n_bins` to be an integer"),
    ],
)
def test_validation_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
