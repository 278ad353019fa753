"""Temperature scaling: the scaling itself, a fit that really moves T, the artefact, evaluation rows."""
import json

import numpy as np
import pytest
import torch

from lab import metrics
from lab.evaluate import EvalConfig, apply_temperature
from lab.temperature import GRID, beyond_edges, fit_temperature, load_temperature, save_temperature, scale


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


GRID_STEP = GRID[1] / GRID[0]  # the ECE search's resolution: a found T is within this factor of T*


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
    probs, labels, best = _constant(0.99, 50, 27)  # acc 0.54: T* = ln 99 / ln(27/23) = 28.66, beyond GRID's 20
    assert best == pytest.approx(28.658, abs=1e-3)
    fit = fit_temperature(probs, labels, objective="ece")
    assert fit.widened and fit.searched == pytest.approx((0.05, 80.0)) and not fit.at_bound  # 20 · WIDEN_FACTOR 4
    assert best / GRID_STEP <= fit.temperature <= best * GRID_STEP
    at_edge = abs(1 / (1 + 99 ** (-1 / 20)) - 0.54)  # what the unwidened grid's best, T = 20, leaves: 1.7 points
    assert at_edge == pytest.approx(0.0172, abs=1e-4) and fit.ece_after < 0.001


def test_ece_fit_with_an_interior_optimum_searches_the_grid_alone():
    probs, labels, best = _constant(0.99, 50, 40)  # acc 0.8: T* = ln 99 / ln 4 = 3.31
    fit = fit_temperature(probs, labels, objective="ece")
    assert not fit.widened and fit.searched == (GRID[0], GRID[-1]) and not fit.at_bound
    eces = [abs(1 / (1 + 99 ** (-1 / t)) - 0.8) for t in GRID]
    assert fit.temperature == GRID[int(np.argmin(eces))] and best / GRID_STEP <= fit.temperature <= best * GRID_STEP


def test_ece_fit_widens_down_too_and_stops_at_the_bounds():
    probs, labels, best = _constant(0.55, 100, 99)  # acc 0.99: T* = ln(11/9) / ln 99 = 0.0437, below GRID's 0.05
    fit = fit_temperature(probs, labels, objective="ece")
    assert fit.widened and fit.searched[0] == pytest.approx(0.0125) and best / GRID_STEP <= fit.temperature <= best * GRID_STEP
    probs, labels, best = _constant(0.99, 100, 51)  # acc 0.51: T* = 115, beyond T_MAX
    fit = fit_temperature(probs, labels, objective="ece")
    assert best > 100 and fit.temperature == 100.0 and fit.at_bound and fit.searched[1] == 100.0


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
