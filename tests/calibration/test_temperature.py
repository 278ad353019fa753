"""Every temperature (lab.calibration.temperature): both scalings (the logit form on option rows and on a
teacher's top-k, FIRST's Eq. 4) and their softmax; a fit that really moves T; both widening searches
(the fit's and the temperature lab's, and FIRST's sweep of a teacher's temperature on synthetic
over-confident teachers); the artefact; evaluation rows."""
import json
import math

import numpy as np
import pytest
import torch

from lab.calibration import metrics
from lab.calibration.first_sweep import (PAPER_GRID, TEACHER_LOGIT_GRID, TEACHER_SWEEP_BOUNDS, TEACHER_WIDEN_FACTOR,
                                         TRANSFORMS, sweep_teacher_temperature, widen_point_by_point)
from lab.calibration.temperature import (FIT_BOUNDS, FIT_GRID, WIDEN_FACTOR, beyond_edges, fit_temperature, scale,
                                         softmax, temperature_logit, temperature_paper, widened_search)
from lab.calibration.temperature_files import load_temperature, save_temperature
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import apply_temperature
from tests.helpers import random_topk

pytestmark = pytest.mark.unit


def _synthetic(sharpness: float, n: int = 400, k: int = 4, seed: int = 0):
    """Questions whose true answer follows softmax(z); the model reports softmax(sharpness · z)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1.5, size=(n, k))
    true = torch.softmax(torch.tensor(z), -1).numpy()
    labels = np.array([rng.choice(k, p=p) for p in true])
    reported = torch.softmax(torch.tensor(sharpness * z), -1).numpy()
    return reported, labels


def _constant(p_top: float, n: int, n_correct: int):
    """n two-option rows all reporting (p_top, 1 − p_top), the first n_correct right. One confidence
    value means one bin, so ECE(T) = |σ(ln(p_top / (1 − p_top)) / T) − acc| and its optimum is by hand
    T* = ln(p_top / (1 − p_top)) / ln(acc / (1 − acc))."""
    probs = np.tile([p_top, 1 - p_top], (n, 1))
    labels = np.array([0] * n_correct + [1] * (n - n_correct))
    acc = n_correct / n
    return probs, labels, np.log(p_top / (1 - p_top)) / np.log(acc / (1 - acc))


GRID_STEP = FIT_GRID[1] / FIT_GRID[0]  # the ECE search's resolution: a found T is within this factor of T*


def _grid_nll(probs, labels, grid):
    return [metrics.nll(scale(probs, t), labels) for t in grid]


def test_scale_is_temperature_scaling_of_the_logits():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 0.1, 3.0]], dtype=torch.float64)
    probs = torch.softmax(logits, -1).numpy()
    for t in (0.5, 1.0, 2.7):
        np.testing.assert_allclose(scale(probs, t), torch.softmax(logits / t, -1).numpy(), atol=1e-12)
    padded = scale([[0.7, 0.3, 0.0]], 2.0, mask=[[True, True, False]])
    np.testing.assert_allclose(padded[0, :2], torch.softmax(torch.log(torch.tensor([0.7, 0.3])) / 2, 0).numpy(), atol=1e-7)
    assert padded[0, 2] == 0
    with pytest.raises(ValueError, match="positive temperature"):
        scale(probs, 0.0)


@pytest.mark.parametrize("sharpness, direction", [(3.0, "up"), (0.4, "down")])
def test_nll_fit_moves_t_to_the_grid_minimum(sharpness, direction):
    probs, labels = _synthetic(sharpness)
    fit = fit_temperature(probs, labels, objective="nll")
    assert (fit.temperature > 1.2) if direction == "up" else (fit.temperature < 0.8)
    grid = np.linspace(0.05, 6, 6000)
    best = grid[int(np.argmin(_grid_nll(probs, labels, grid)))]
    assert fit.temperature == pytest.approx(best, abs=2e-3)  # the search found the minimum a dense grid finds
    assert fit.nll_after < fit.nll_before
    assert fit.nll_before == pytest.approx(metrics.nll(probs, labels), rel=1e-9)
    assert fit.nll_after == pytest.approx(metrics.nll(scale(probs, fit.temperature), labels), rel=1e-9)


def test_a_fit_running_off_to_infinity_stops_at_the_bound_and_says_so():
    # Confident answers, right exactly as often at every rank: the confidence carries no signal,
    # so NLL keeps falling as T grows (uniform is the best one can say).
    probs = np.tile([0.7, 0.2, 0.07, 0.03], (40, 1))
    fit = fit_temperature(probs, np.arange(40) % 4)
    assert fit.at_bound and fit.temperature == 100.0 and fit.nll_after < fit.nll_before
    assert not fit_temperature(*_synthetic(3.0)).at_bound


def test_ece_fit_lowers_ece_and_reports_it():
    probs, labels = _synthetic(3.0)
    fit = fit_temperature(probs, labels, objective="ece")
    assert fit.temperature > 1 and fit.ece_after < fit.ece_before
    scaled = scale(probs, fit.temperature)
    conf, correct = scaled.max(1), scaled.argmax(1) == labels
    assert fit.ece_after == pytest.approx(metrics.ece(conf, correct))


def test_ece_fit_widens_past_the_grid_edge_to_an_optimum_near_30():
    probs, labels, best = _constant(0.99, 50, 27)  # acc 0.54: T* = ln 99 / ln(27/23) = 28.66, beyond FIT_GRID's 20
    assert best == pytest.approx(28.658, abs=1e-3)
    fit = fit_temperature(probs, labels, objective="ece")
    assert fit.widened and fit.searched == pytest.approx((0.05, 80.0)) and not fit.at_bound  # 20 · WIDEN_FACTOR 4
    assert fit.searched[1] == pytest.approx(FIT_GRID[-1] * WIDEN_FACTOR)
    assert best / GRID_STEP <= fit.temperature <= best * GRID_STEP
    at_edge = abs(1 / (1 + 99 ** (-1 / 20)) - 0.54)  # what the unwidened grid's best, T = 20, leaves: 1.7 points
    assert at_edge == pytest.approx(0.0172, abs=1e-4) and fit.ece_after < 0.001


def test_ece_fit_with_an_interior_optimum_searches_the_grid_alone():
    probs, labels, best = _constant(0.99, 50, 40)  # acc 0.8: T* = ln 99 / ln 4 = 3.31
    fit = fit_temperature(probs, labels, objective="ece")
    assert not fit.widened and fit.searched == (FIT_GRID[0], FIT_GRID[-1]) and not fit.at_bound
    eces = [abs(1 / (1 + 99 ** (-1 / t)) - 0.8) for t in FIT_GRID]
    assert fit.temperature == FIT_GRID[int(np.argmin(eces))] and best / GRID_STEP <= fit.temperature <= best * GRID_STEP


def test_ece_fit_widens_down_too_and_stops_at_the_bounds():
    probs, labels, best = _constant(0.55, 100, 99)  # acc 0.99: T* = ln(11/9) / ln 99 = 0.0437, below FIT_GRID's 0.05
    fit = fit_temperature(probs, labels, objective="ece")
    assert fit.widened and fit.searched[0] == pytest.approx(0.0125) and best / GRID_STEP <= fit.temperature <= best * GRID_STEP
    probs, labels, best = _constant(0.99, 100, 51)  # acc 0.51: T* = 115, beyond FIT_BOUNDS' 100
    fit = fit_temperature(probs, labels, objective="ece")
    assert best > 100 and fit.temperature == 100.0 == FIT_BOUNDS[1] and fit.at_bound and fit.searched[1] == 100.0


def test_beyond_edges_steps_out_at_the_grid_s_own_ratio_up_to_the_bounds():
    grid = [1.0, 2.0, 4.0]
    below, above = beyond_edges(grid, [2], (0.01, 100))
    assert below.size == 0 and above.tolist() == [8.0, 16.0]  # ratio 2, four times past the edge
    below, above = beyond_edges(grid, [0, 2], (0.4, 10))
    assert below.tolist() == pytest.approx([0.4, 0.5]) and above.tolist() == [8.0, 10.0]  # cut at the bounds
    assert [a.size for a in beyond_edges(grid, [1], (0.01, 100))] == [0, 0]  # an interior optimum
    assert [a.size for a in beyond_edges([0.01, 1.0], [0], (0.01, 100))] == [0, 0]  # the edge is the bound


def test_fit_bins_its_ece_with_the_edges_asked_for():
    # confidences 0.5 (right) and 0.45 (wrong). Right-closed: both in (0.4, 0.5]: |0.475 − 0.5| = 0.025.
    # Left-closed: [0.5, 0.6) holds 0.5 alone, [0.4, 0.5) 0.45: (|0.5 − 1| + |0.45 − 0|) / 2 = 0.475.
    probs = [[0.5, 0.5, 0.0], [0.45, 0.35, 0.2]]
    mask = [[True, True, False], [True, True, True]]
    for edges, ece in (("right", 0.025), ("left", 0.475)):
        fit = fit_temperature(probs, [0, 1], mask, objective="nll", bin_edges=edges)
        assert fit.bin_edges == edges and fit.ece_before == pytest.approx(ece)
    with pytest.raises(ValueError, match="edges"):
        fit_temperature(probs, [0, 1], mask, bin_edges="both")


def test_fit_refuses_bad_input():
    with pytest.raises(ValueError, match="objective"):
        fit_temperature([[0.5, 0.5]], [0], objective="brier")
    with pytest.raises(ValueError, match=r"\(n, K\)"):
        fit_temperature(np.zeros((0, 2)), [])


# ---------------------------------------------------------------- a teacher's top-k: both forms (FIRST §4.2)
P = [0.6, 0.2, 0.1, 0.05, 0.05]  # a top-5 holding all the mass
P_PART = [0.5, 0.2, 0.1, 0.05, 0.05]  # a top-5 holding 0.9 of it


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

def scaled_teacher(n: int, seed: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """A teacher over 5 tokens whose probabilities are softmax(scale · z) while answers are drawn
    from softmax(z): the logit form at T = scale recovers the truth exactly (its top-5 is the whole
    distribution), so the ECE-optimal T is ``scale`` up to sampling noise."""
    rng = np.random.default_rng(seed)
    z = -np.sort(-rng.normal(size=(n, 5)), axis=1)

    def softmax(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    drawn = (rng.random((n, 1)) > np.cumsum(softmax(z), axis=1)).sum(axis=1)
    return softmax(scale * z), np.minimum(drawn, 4)  # min: a cumsum of 1 - 1e-16 is not a 6th token

def test_temperature_paper_by_hand():
    e = [math.exp(x / 0.5) for x in P]
    assert temperature_paper(P, 0.5) == pytest.approx([x / sum(e) for x in e], abs=1e-12)
    e = [math.exp(x) for x in P]  # c = 1: close to uniform, top-1 only 1.82 / 5.84
    assert temperature_paper(P, 1.0)[0] == pytest.approx(math.exp(0.6) / sum(e), abs=1e-12)
    assert temperature_paper(P, 1.0)[0] < 0.32

def test_temperature_logit_by_hand():
    # T = 0.5 squares: [.36, .04, .01, .0025, .0025] / 0.415
    assert temperature_logit(P, 0.5) == pytest.approx(
        [0.36 / 0.415, 0.04 / 0.415, 0.01 / 0.415, 0.0025 / 0.415, 0.0025 / 0.415], abs=1e-12
    )
    roots = [math.sqrt(x) for x in P_PART]
    assert temperature_logit(P_PART, 2.0) == pytest.approx([r / sum(roots) for r in roots])


@pytest.mark.parametrize("form", ["paper", "logit"])
@pytest.mark.parametrize("value", [0.02, 0.1, 0.3, 1.0, 2.5, 50.0])
def test_temperature_forms_keep_the_order(form, value):
    q = TRANSFORMS[form](random_topk(300, 5, seed=2), value)
    assert np.all(np.diff(q, axis=1) <= 1e-15)

def test_logit_at_one_is_normalisation_and_keeps_zeros():
    p = random_topk(100, 5, seed=3)
    q = temperature_logit(p, 1.0)
    assert np.allclose(q, p / p.sum(axis=1, keepdims=True), atol=1e-14)
    assert np.all(q[p == 0] == 0)
    assert np.all(np.isfinite(temperature_logit(p, 1e-3)))  # log space: no 0/0 at small T

def test_paper_form_flattens_as_c_grows():
    p = random_topk(300, 5, seed=4)
    h = np.stack([entropy(temperature_paper(p, c)) for c in [0.05, 0.1, 0.3, 1.0, 3.0, 30.0]])
    assert np.all(np.diff(h, axis=0) > 0)  # strictly, row by row: p is never uniform here
    assert np.allclose(temperature_paper(p, 1e4), 0.2, atol=1e-4)
    assert temperature_paper(P, 1e-2)[0] == pytest.approx(1.0)  # sharpens towards one-hot

def test_the_two_logit_scalings_agree_but_on_a_zero():
    # scale (option rows) and temperature_logit (a top-k) are both softmax(log p / T): equal on positive
    # rows; scale floors a 0 at PROB_FLOOR, so it gets a little mass back, temperature_logit keeps it 0
    p = random_topk(200, 5, seed=6)
    positive = p[p.shape[0] // 4:]  # the first quarter holds zeros
    for t in (0.3, 1.0, 4.0):
        np.testing.assert_allclose(scale(positive, t), temperature_logit(positive, t), rtol=1e-12, atol=0)
    assert temperature_logit([0.9, 0.1, 0.0], 4.0)[2] == 0.0 < scale([[0.9, 0.1, 0.0]], 4.0)[0, 2]
    assert scale([[0.9, 0.1, 0.0]], 4.0, mask=[[True, True, False]])[0, 2] == 0.0  # a masked option is exactly 0


def test_the_one_softmax():
    z = np.array([[2.0, 0.5, -np.inf], [1000.0, 999.0, 998.0]])
    np.testing.assert_allclose(softmax(z), torch.softmax(torch.tensor(z), -1).numpy(), rtol=1e-12)
    assert softmax(z)[0, 2] == 0.0 and np.all(np.isfinite(softmax(z)))  # -inf → exactly 0, no overflow


# ---------------------------------------------------------------- the two widening searches, side by side
def _parabola(centre: float):
    """An objective of log T lowest at T = ``centre``, as both searches' callers score a value."""
    return lambda t: {"value": t, "temperature": t, "ece": (math.log(t) - math.log(centre)) ** 2}


def test_widened_search_steps_out_at_the_grid_s_ratio_and_keeps_the_records_ascending():
    # optimum at T = 30 past the grid 1, 2, 4: runs of points at ratio 2 out to 4 × the edge
    # (8, 16), then again (32, 64), whereupon the lowest (32) is interior
    records = widened_search(_parabola(30.0), [1.0, 2.0, 4.0], ["ece"], bounds=(0.01, 100))
    assert [r["temperature"] for r in records] == [1, 2, 4, 8, 16, 32, 64]
    # two objectives hold the grid open on both sides at once; the bound cuts the last run
    both = lambda t: {"temperature": t, "a": (math.log(t) - math.log(0.3)) ** 2,  # noqa: E731
                      "b": (math.log(t) - math.log(90.0)) ** 2}
    records = widened_search(both, [1.0, 2.0, 4.0], ["a", "b"], bounds=(0.2, 100))
    assert [r["temperature"] for r in records] == pytest.approx([0.2, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 100])


def test_widen_point_by_point_tries_one_value_at_a_time_in_the_order_tried():
    # the same optimum at T = 30 from the same grid: 8, 16, 32 (×2 each), then 64 shows 32 is interior
    score = lambda value, stage: {**_parabola(30.0)(value), "stage": stage}  # noqa: E731
    records = [score(v, "coarse") for v in (1.0, 2.0, 4.0)]
    widened = widen_point_by_point(score, records, "ece")
    assert [r["value"] for r in records] == [1, 2, 4, 8, 16, 32, 64]
    assert widened == [{"side": "above", "from": 4.0, "to": 64.0}] and TEACHER_WIDEN_FACTOR == 2.0
    # a one-value grid: above first (appended after it), then below; the widened search takes both at once
    records = [score(1.0, "coarse")]
    widen_point_by_point(score, records, "ece")
    assert [r["value"] for r in records][:2] == [1.0, 2.0]
    assert [r["temperature"] for r in widened_search(_parabola(30.0), [1.0], ["ece"])][:3] == [0.25, 1.0, 4.0]
    # ties go to the first tried: on a flat objective the best stays 1.0, so one step below (0.5,
    # appended after the grid, not sorted in) makes it interior and the widening stops
    flat = [{"value": v, "ece": 0.5, "stage": "coarse"} for v in (1.0, 2.0)]
    widened = widen_point_by_point(lambda v, s: {"value": v, "ece": 0.5, "stage": s}, flat, "ece")
    assert widened == [{"side": "below", "from": 1.0, "to": 0.5}] and [r["value"] for r in flat] == [1.0, 2.0, 0.5]


# ---------------------------------------------------------------- FIRST's sweep of a teacher's temperature (§5.5)
def test_sweep_beats_no_recalibration_on_overconfident_teacher():
    p, rank = overconfident(2000, seed=0)
    out = sweep_teacher_temperature(p, rank)
    conf = p[:, 0] / p.sum(axis=1)
    assert conf.mean() > np.mean(rank == 0) + 0.2  # the teacher really is over-confident
    assert out["identity_ece"] == pytest.approx(metrics.ece(conf, rank == 0))
    assert out["best_ece"] <= out["identity_ece"]  # acceptance criterion
    assert out["best_ece"] < 0.5 * out["identity_ece"]
    assert not out["on_edge"] and out["widened"] == [] and 0.1 < out["best"] < 1.0
    best = min(out["records"], key=lambda r: r["ece"])
    assert (best["value"], best["ece"]) == (out["best"], out["best_ece"])
    assert {r["accuracy"] for r in out["records"]} == {np.mean(rank == 0)}  # rank-preserving
    json.dumps(out)

def test_sweep_grids():
    # the paper form's default grid and fine pass are FIRST §5.5's when the optimum is interior
    p, rank = overconfident(500, seed=1)
    out = sweep_teacher_temperature(p, rank)
    coarse = [r["value"] for r in out["records"] if r["stage"] == "coarse"]
    fine = [r["value"] for r in out["records"] if r["stage"] == "fine"]
    assert coarse == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # no 0.30000000000000004
    assert [r["stage"] for r in out["records"]].count("widen") == 0
    centre = min((r for r in out["records"] if r["stage"] == "coarse"), key=lambda r: r["ece"])
    step = [round(centre["value"] + d, 10) for d in np.arange(-0.08, 0.081, 0.02)]
    assert fine == [v for v in step if v != centre["value"]]  # centred, step 0.02, no repeats
    assert np.mean(fine) == pytest.approx(centre["value"])

def test_sweep_logit_default_grid_and_its_fine_pass():
    p, rank = scaled_teacher(2000, seed=0, scale=3.0)
    out = sweep_teacher_temperature(p, rank, form="logit")
    coarse = [r["value"] for r in out["records"] if r["stage"] == "coarse"]
    assert coarse == list(TEACHER_LOGIT_GRID) and coarse[0] == 0.25 and coarse[-1] == 8.0
    assert coarse[8] == 1.0 and coarse[12] == 2.0  # four steps of 2^(1/4) per doubling
    centre = min((r for r in out["records"] if r["stage"] == "coarse"), key=lambda r: r["ece"])["value"]
    fine = [r["value"] for r in out["records"] if r["stage"] == "fine"]
    # 4 values between the coarse best and each neighbour (2^(1/4) away), in steps of 2^(1/20) ≈ 3.5 %
    expected = centre * 2.0 ** (np.array([-4, -3, -2, -1, 1, 2, 3, 4]) / 20)
    assert fine == pytest.approx(expected, rel=1e-9)

def test_sweep_logit_form_finds_the_true_temperature_of_an_overconfident_teacher():
    # probabilities softmax(3z) for answers drawn from softmax(z): the truth is T = 3. On the paper's
    # grid (the old default for both forms) the logit form stopped on its edge at T = 1.1.
    p, rank = scaled_teacher(20000, seed=0, scale=3.0)
    out = sweep_teacher_temperature(p, rank, form="logit")
    assert out["best"] == pytest.approx(3.0, rel=0.03)
    assert not out["on_edge"] and out["widened"] == []
    assert out["best_ece"] < 0.02 < 0.25 < out["identity_ece"]
    old = metrics.ece(temperature_logit(p, 1.1)[:, 0], rank == 0)  # where the paper's grid used to stop
    assert out["best_ece"] < 0.1 * old

def test_sweep_widens_past_the_edge_and_says_so():
    # the truth T = 12 lies past the logit grid's 8: 16 is better than 8, 32 worse, so the best is
    # interior between 8 and 32 and the fine pass finds it
    p, rank = scaled_teacher(20000, seed=0, scale=12.0)
    out = sweep_teacher_temperature(p, rank, form="logit")
    assert [r["value"] for r in out["records"] if r["stage"] == "widen"] == [16.0, 32.0]
    assert out["widened"] == [{"side": "above", "from": 8.0, "to": 32.0}]
    assert not out["on_edge"] and out["best"] == pytest.approx(12.0, rel=0.05)
    # the old failure, the logit form on the paper's grid, now widens instead of stopping at 1.1
    p, rank = scaled_teacher(20000, seed=0, scale=3.0)
    paper_grid = sweep_teacher_temperature(p, rank, form="logit", grid=PAPER_GRID)
    assert paper_grid["widened"] == [{"side": "above", "from": 1.0, "to": 8.0}]
    assert not paper_grid["on_edge"] and paper_grid["best"] == pytest.approx(3.0, rel=0.05)

def test_sweep_on_edge_only_at_the_hard_bound():
    # a teacher that is never right: the ECE is the mean confidence, lowest as T → ∞; the grid
    # doubles from 8 and ends on the bound 1000 (not 1024), where the optimum still sits
    p, _ = scaled_teacher(300, seed=5, scale=1.0)
    out = sweep_teacher_temperature(p, np.full(300, 3), form="logit")
    assert [r["value"] for r in out["records"] if r["stage"] == "widen"] == [16, 32, 64, 128, 256, 512, 1000]
    assert out["widened"] == [{"side": "above", "from": 8.0, "to": 1000.0}]
    assert out["on_edge"] and out["best"] == TEACHER_SWEEP_BOUNDS[1]

def test_sweep_one_value_grid_widens_both_ways():
    # from a single value 1.0 the paper form first tries 2 (worse), then 0.5, 0.25 ...
    p, rank = overconfident(1000, seed=2)
    out = sweep_teacher_temperature(p, rank, grid=[1.0])
    widen = [r["value"] for r in out["records"] if r["stage"] == "widen"]
    assert widen[:3] == [2.0, 0.5, 0.25]
    assert [w["side"] for w in out["widened"]] == ["above", "below"]
    assert out["widened"][0] == {"side": "above", "from": 1.0, "to": 2.0}
    assert not out["on_edge"]

def test_sweep_bin_edges_reach_every_ece():
    # at T = 1 (on the logit grid) the confidences are 0.5 and 0.45, the first right, the second
    # wrong. Right-closed bins put both in (0.4, 0.5]: |0.475 − 0.5| = 0.025. Left-closed bins
    # split them, [0.4, 0.5) and [0.5, 0.6): (|0.45 − 0| + |0.5 − 1|) / 2 = 0.475.
    p, rank = np.array([[0.5, 0.5, 0.0], [0.45, 0.35, 0.2]]), np.array([0, 1])
    for edges, expected in (("right", 0.025), ("left", 0.475)):
        out = sweep_teacher_temperature(p, rank, form="logit", bin_edges=edges)
        at_one = next(r for r in out["records"] if r["value"] == 1.0)
        assert out["identity_ece"] == pytest.approx(expected, abs=1e-12)
        assert at_one["ece"] == pytest.approx(expected, abs=1e-12)
        assert out["bin_edges"] == edges

def test_sweep_identity_off_grid():
    p, rank = overconfident(300, seed=2)
    out = sweep_teacher_temperature(p, rank, grid=[0.2, 0.4, 0.8])
    values = [r["value"] for r in out["records"]]
    assert 1.0 not in values and not out["on_edge"]
    assert out["identity_ece"] == pytest.approx(metrics.ece(p[:, 0] / p.sum(axis=1), rank == 0))

def test_sweep_nll_objective():
    p, rank = overconfident(1000, seed=4)
    out = sweep_teacher_temperature(p, rank, objective="nll")
    assert out["objective"] == "nll"
    assert out["best_nll"] == min(r["nll"] for r in out["records"])
    # by hand at the best value: an answer outside the top-5 counts as -log(1e-12)
    q = temperature_paper(p, out["best"])
    p_y = np.where(rank >= 0, q[np.arange(len(rank)), np.maximum(rank, 0)], 1e-12)
    assert out["best_nll"] == pytest.approx(np.mean(-np.log(p_y)))

# ---------------------------------------------------------------- a top-k's and the sweep's errors
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: temperature_paper(P, 0), "Expected `c` to be positive, but got 0"),
        (lambda: temperature_logit(P, -1.0), "Expected `T` to be positive"),
        (lambda: temperature_logit([0.0, 0.0], 1.0), "positive entry"),
        (lambda: temperature_paper([0.9, 0.8], 1.0), "sum to at most 1"),
        (lambda: temperature_paper([1.5, -0.5], 1.0), r"probabilities in \[0, 1\]"),
        (lambda: sweep_teacher_temperature([P], [5]), r"`correct_rank` in \[-1, 4\]"),
        (lambda: sweep_teacher_temperature([P], [0.0]), "`correct_rank` to be integers"),
        (lambda: sweep_teacher_temperature(P, [0]), r"shape \(n, k\)"),
        (lambda: sweep_teacher_temperature([P], [0], form="kelvin"), "`form` to be one of"),
        (lambda: sweep_teacher_temperature([P], [0], objective="acc"), "`objective` to be one of"),
        (lambda: sweep_teacher_temperature([P], [0], grid=[]), "`grid` to be a non-empty"),
        (lambda: sweep_teacher_temperature([P], [0], grid=[0.5, 2000]), r"values in \[0.001, 1000\]"),
        (lambda: sweep_teacher_temperature([P], [0], fine_steps=0), "`fine_steps` to be an integer"),
        (lambda: sweep_teacher_temperature([P], [0], bin_edges="both"), "`edges` to be one of"),
        (lambda: sweep_teacher_temperature([P], [0], n_bins=0), "`n_bins` to be an integer"),
    ],
)
def test_teacher_forms_and_sweep_refuse_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- the artefact, and evaluation rows
def test_artefact_round_trip_and_errors(tmp_path):
    probs, labels = _synthetic(2.0, n=100)
    fit = fit_temperature(probs, labels)
    path = save_temperature(tmp_path / "ts", fit, model="bundled")
    assert path.name == "temperature.json" and json.loads(path.read_text())["model"] == "bundled"
    assert load_temperature(tmp_path / "ts") == pytest.approx(fit.temperature)
    assert load_temperature(str(path)) == pytest.approx(fit.temperature)
    assert load_temperature(1.5) == 1.5 and load_temperature("0.8") == 0.8 and load_temperature(None) is None
    with pytest.raises(FileNotFoundError, match="No temperature file"):
        load_temperature(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a temperature file"):
        load_temperature(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="from 0.001 to 1000"):
        load_temperature(-1)
    with pytest.raises(ValueError, match="from 0.001 to 1000"):
        EvalConfig(temperature=0)


def test_apply_temperature_rescales_rows_and_keeps_the_raw_probabilities():
    rows = [{"probs": [0.7, 0.2, 0.1], "answer": 1, "pred": 0, "confidence": 0.7, "correct": False},
            {"probs": [0.5, 0.5], "answer": 0, "pred": 0, "confidence": 0.5, "correct": True}]
    scaled = apply_temperature(rows, 2.0)
    np.testing.assert_allclose(scaled[0]["probs"], scale([[0.7, 0.2, 0.1]], 2.0)[0])
    assert scaled[0]["raw_probs"] == [0.7, 0.2, 0.1] and scaled[0]["confidence"] == pytest.approx(max(scaled[0]["probs"]))
    again = apply_temperature(scaled, 1.0)  # from the raw probabilities, not compounded
    np.testing.assert_allclose(again[0]["probs"], [0.7, 0.2, 0.1])
    assert rows[0]["probs"] == [0.7, 0.2, 0.1]  # the input rows are not modified
