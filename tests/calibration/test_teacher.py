"""Tests for lab.calibration.teacher: FIRST's label smoothing and direct normalisation, hand-computed on
one top-5 row, and their properties over random rows. The temperatures of a top-k and FIRST's sweep
are tested with every other temperature, in tests/calibration/test_temperature.py."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from lab.calibration import teacher as C
from lab.calibration.temperature import temperature_logit, temperature_paper
from tests.helpers import random_topk

pytestmark = pytest.mark.unit

P = [0.6, 0.2, 0.1, 0.05, 0.05]  # a top-5 holding all the mass
P_PART = [0.5, 0.2, 0.1, 0.05, 0.05]  # a top-5 holding 0.9 of it


# ------------------------------------------------------------------ hand-computed values
def test_label_smooth_by_hand():
    # FIRST Eq. 3 on the raw top-5: top-1 − δ, ranks 2..5 + δ/4; the row keeps its mass 0.98
    got = C.label_smooth([0.6, 0.2, 0.1, 0.05, 0.03], 0.1)
    assert got == pytest.approx([0.5, 0.225, 0.125, 0.075, 0.055], abs=1e-12)
    assert got.sum() == pytest.approx(0.98, abs=1e-12)
    assert C.label_smooth(P, 0.1) == pytest.approx([0.5, 0.225, 0.125, 0.075, 0.075], abs=1e-12)
    assert C.label_smooth(P_PART, 0.1) == pytest.approx([0.4, 0.225, 0.125, 0.075, 0.075], abs=1e-12)


def test_label_smooth_renormalised_variant_by_hand():
    q = [x / 0.9 for x in P_PART]  # normalised first (0.5/0.9 = 0.5556, ...), then the paper's ±δ, δ/4
    got = C.label_smooth(P_PART, 0.1, renormalise=True)
    assert got == pytest.approx([q[0] - 0.1] + [x + 0.025 for x in q[1:]], abs=1e-12)
    assert got.sum() == pytest.approx(1.0, abs=1e-12)


def test_label_smooth_takes_at_most_the_top1():
    # top-1 0.08 < δ = 0.1: it gives all of its 0.08, 0.04 to each of the other two
    assert C.label_smooth([0.08, 0.05, 0.03], 0.1) == pytest.approx([0.0, 0.09, 0.07], abs=1e-12)
    # renormalised: q = (0.5, 0.3125, 0.1875) ≥ δ, so the usual ±0.1, ±0.05
    assert C.label_smooth([0.08, 0.05, 0.03], 0.1, renormalise=True) == pytest.approx(
        [0.4, 0.3625, 0.2375], abs=1e-12)


def test_direct_by_hand():
    d = 1e-6
    expected = [(x + d) / (0.9 + 5 * d) for x in P_PART]
    assert C.direct(P_PART) == pytest.approx(expected, abs=1e-15)
    assert C.direct([0.7, 0.3, 0.0]).min() > 0  # every log-prob finite


# ------------------------------------------------------------------------- properties
@pytest.mark.parametrize("fn, arg", [(C.direct, 1e-6), (partial(C.label_smooth, renormalise=True), 0.05),
                                     (temperature_paper, 0.3), (temperature_paper, 7.0), (temperature_logit, 0.2),
                                     (temperature_logit, 3.0)])
def test_rows_sum_to_one_and_shape_kept(fn, arg):
    p = random_topk(200, 5, seed=1).reshape(10, 20, 5)
    q = fn(p, arg)
    assert q.shape == p.shape and q.dtype == np.float64
    assert np.allclose(q.sum(axis=-1), 1.0, atol=1e-12)
    assert q.min() >= 0


def test_label_smooth_keeps_each_rows_mass():
    p = random_topk(200, 5, seed=1).reshape(10, 20, 5)  # rows hold 0.5 to 1 of the mass
    q = C.label_smooth(p, 0.05)
    assert q.shape == p.shape and q.min() >= 0
    assert np.allclose(q.sum(axis=-1), p.sum(axis=-1), atol=1e-12)  # no hidden renormalisation


def test_label_smooth_can_break_the_order():
    q = C.label_smooth([0.3, 0.28, 0.2, 0.12, 0.1], 0.1)
    assert q.sum() == pytest.approx(1.0)
    assert q[1] > q[0]  # 0.2 vs 0.305: the top-2 overtakes the top-1 (FIRST §4.2)


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: C.direct(P, 0.0), "Expected `delta` to be positive"),
        (lambda: C.label_smooth(P, 1.5), r"Expected `delta` to be a number in \[0, 1\)"),
        (lambda: C.label_smooth([0.0, 0.0], 0.1, renormalise=True), "positive entry"),
        (lambda: C.label_smooth([0.1, 0.6, 0.2], 0.1), "sorted descending"),
        (lambda: C.label_smooth([0.9], 0.1), "k >= 2"),
        (lambda: C.direct([0.9, 0.8], 1e-6), "sum to at most 1"),
        (lambda: C.direct([1.5, -0.5], 1e-6), r"probabilities in \[0, 1\]"),
    ],
)
def test_validation_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
