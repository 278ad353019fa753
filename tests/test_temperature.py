"""Temperature scaling: the scaling itself, a fit that really moves T, the artefact, evaluation rows."""
import json

import numpy as np
import pytest
import torch

from lab import metrics
from lab.evaluate import EvalConfig, apply_temperature
from lab.temperature import fit_temperature, load_temperature, save_temperature, scale


def _synthetic(sharpness: float, n: int = 400, k: int = 4, seed: int = 0):
    """Questions whose true answer follows softmax(z); the model reports softmax(sharpness · z)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1.5, size=(n, k))
    true = torch.softmax(torch.tensor(z), -1).numpy()
    labels = np.array([rng.choice(k, p=p) for p in true])
    reported = torch.softmax(torch.tensor(sharpness * z), -1).numpy()
    return reported, labels


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
    assert fit.temperature == pytest.approx(best, abs=2e-3)  # L-BFGS found the minimum a dense grid finds
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
    with pytest.raises(ValueError, match="positive"):
        load_temperature(-1)
    with pytest.raises(ValueError, match="positive"):
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
