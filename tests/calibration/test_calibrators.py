"""The recalibration workbench's science (lab.calibration.calibrators): each method against scikit-learn or a
hand computation, the stored artefact, and the refusal to score a calibrator on its own questions."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.optimize import minimize
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from lab.calibration import calibrators, confidence
from lab.calibration.temperature import fit_temperature, scale

pytestmark = pytest.mark.unit


def _run(seed: int, n: int = 300, start: int = 0):
    """An over-confident 4-option run: logits sharpened ×3 against the labels' real distribution."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 4))
    labels = np.array([rng.choice(4, p=np.exp(z) / np.exp(z).sum()) for z in logits])
    probs = np.exp(3 * logits) / np.exp(3 * logits).sum(axis=1, keepdims=True)
    rows = [{"question": f"question {start + i}", "choices": ["a", "b", "c", "d"]} for i in range(n)]
    return probs, np.ones(probs.shape, dtype=bool), labels, rows


VAL, TEST = _run(0), _run(1, start=10_000)


def _signal_and_right(run):
    probs, mask, labels, rows = run
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(float)


def test_isotonic_applies_as_sklearn_predicts():
    cal = calibrators.fit("isotonic", *VAL)
    s, right = _signal_and_right(VAL)
    reference = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(s, right)
    held_out, _ = _signal_and_right(TEST)
    pred, conf = calibrators.apply(cal, TEST[0], TEST[1], TEST[3])
    np.testing.assert_allclose(conf, reference.predict(held_out), atol=1e-12)
    assert (pred == TEST[0].argmax(axis=1)).all()  # the answer is never changed


def test_platt_applies_as_sklearn_predicts_and_minimises_the_log_loss():
    cal = calibrators.fit("platt", *VAL)
    s, right = _signal_and_right(VAL)
    x = calibrators._logit(s)[:, None]
    reference = LogisticRegression(C=calibrators.PLATT_C).fit(x, right)
    _, conf = calibrators.apply(cal, TEST[0], TEST[1], TEST[3])
    held_out = calibrators._logit(_signal_and_right(TEST)[0])[:, None]
    np.testing.assert_allclose(conf, reference.predict_proba(held_out)[:, 1], atol=1e-9)

    def log_loss(ab):  # the unregularised objective, minimised independently
        p = 1 / (1 + np.exp(-(ab[0] * x[:, 0] + ab[1])))
        return -np.mean(right * np.log(p) + (1 - right) * np.log(1 - p))

    a, b = minimize(log_loss, [1.0, 0.0], method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-12}).x
    assert (cal.params["a"], cal.params["b"]) == pytest.approx((a, b), abs=2e-3)


def test_histogram_binning_by_hand():
    probs = np.array([[p, 1 - p] for p in (0.55, 0.6, 0.7, 0.8, 0.9, 0.95)])
    labels = np.array([0, 1, 0, 0, 1, 0])  # right, wrong, right, right, wrong, right
    rows = [{"question": str(i)} for i in range(6)]
    cal = calibrators.fit("histogram", probs, np.ones_like(probs, dtype=bool), labels, rows, n_bins=2)
    # equal mass: {0.55, 0.6, 0.7} → 2/3 right, {0.8, 0.9, 0.95} → 2/3 right; the edge is the median
    assert cal.params["edges"] == pytest.approx([0.75]) and cal.params["values"] == pytest.approx([2 / 3, 2 / 3])
    cal = calibrators.fit("histogram", probs, np.ones_like(probs, dtype=bool), labels, rows, n_bins=3)
    assert cal.params["values"] == pytest.approx([0.5, 1.0, 0.5])
    _, conf = calibrators.apply(cal, np.array([[0.5, 0.5], [0.75, 0.25], [0.99, 0.01]]), np.ones((3, 2), bool),
                                [{}, {}, {}])
    assert conf.tolist() == pytest.approx([0.5, 1.0, 0.5])


def test_temperature_is_the_nll_fit_and_rescales_every_option():
    cal = calibrators.fit("temperature", *VAL)
    assert cal.params["temperature"] == pytest.approx(fit_temperature(VAL[0], VAL[2], VAL[1]).temperature)
    assert cal.params["temperature"] > 1.5  # the run was sharpened ×3
    _, conf = calibrators.apply(cal, TEST[0], TEST[1], TEST[3])
    np.testing.assert_allclose(conf, scale(TEST[0], cal.params["temperature"]).max(axis=1))
    with pytest.raises(ValueError, match="top probability"):
        calibrators.fit("temperature", *VAL, signal="margin")


@pytest.mark.parametrize("method", calibrators.METHODS.in_order())
def test_every_method_lowers_held_out_ece_of_an_over_confident_run(method):
    report = calibrators.before_after(calibrators.fit(method, *VAL), *TEST, n_boot=100)
    assert report["overlap"] == 0
    assert report["after"]["ece"] < report["before"]["ece"] / 2
    assert report["after"]["ece_ci_low"] <= report["after"]["ece_ci_high"]
    assert report["after"]["accuracy"] == report["before"]["accuracy"]


@pytest.mark.parametrize("signal", ["margin", "certainty"])
def test_other_signals_can_be_calibrated(signal):
    cal = calibrators.fit("isotonic", *VAL, signal=signal)
    report = calibrators.before_after(cal, *TEST, n_boot=50)
    assert report["signal"] == signal and 0 <= report["after"]["ece"] < 0.1


def test_scoring_on_the_fit_questions_is_refused_and_a_partial_overlap_counted():
    cal = calibrators.fit("isotonic", *VAL, run="val")
    with pytest.raises(calibrators.SameQuestions, match="300 of these 300"):
        calibrators.before_after(cal, *VAL)
    mixed = [np.concatenate([a[:30], b[30:]]) for a, b in zip(VAL[:3], TEST[:3])] + [VAL[3][:30] + TEST[3][30:]]
    assert calibrators.before_after(cal, *mixed, n_boot=20)["overlap"] == 30
    assert "30 of these 300" in calibrators.fitted_on_same(cal, mixed[3])
    assert calibrators.fitted_on_same(cal, TEST[3]) is None


def test_question_key_ignores_ids_and_spacing_but_not_options():
    a = {"id": "1", "question": "What  is 2+2?", "choices": ["3", "4"]}
    assert calibrators.question_key(a) == calibrators.question_key({**a, "id": "x", "question": "What is 2+2? "})
    assert calibrators.question_key(a) != calibrators.question_key({**a, "choices": ["4", "3"]})


@pytest.mark.parametrize("method", calibrators.METHODS.in_order())
def test_the_artefact_round_trips(method, tmp_path):
    cal = calibrators.fit(method, *VAL, run="00001-evaluate", label="val run")
    back = calibrators.load(calibrators.save(cal, tmp_path / "c").parent)
    assert back == cal
    np.testing.assert_allclose(calibrators.apply(back, *TEST[:2], TEST[3])[1], calibrators.apply(cal, *TEST[:2], TEST[3])[1])
    assert "fitted on val run (n = 300)" in back.describe()


@pytest.mark.parametrize("content, problem", [
    ("[1, 2]", "JSON object"),
    ('{"method": "magic", "signal": "max_prob", "params": {}}', "unknown method"),
    ('{"method": "platt", "signal": "max_prob", "params": {"a": "1", "b": 0}}', "numbers a and b"),
    ('{"method": "isotonic", "signal": "max_prob", "params": {"x": [0.2, 0.1], "y": [0, 1]}}', "ascending"),
    ('{"method": "histogram", "signal": "max_prob", "params": {"edges": [0.5], "values": [NaN, 1]}}', "finite"),
    ('{"method": "temperature", "signal": "max_prob", "params": {"temperature": -1}}', "positive"),
    ('{"method": "platt", "signal": "max_prob", "params": {"a": 1, "b": 0}, "questions": {"x": 1}}', "list of keys"),
    ("not json", "not a calibrator file"),
])
def test_a_damaged_or_hostile_artefact_is_refused_with_the_file_named(content, problem, tmp_path):
    file = tmp_path / "calibrator.json"
    file.write_text(content)
    with pytest.raises(ValueError, match=problem) as caught:
        calibrators.load(tmp_path)
    assert f"{tmp_path.name}/calibrator.json" in str(caught.value) and str(tmp_path) not in str(caught.value)


def test_a_missing_artefact_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="Recalibration workbench"):
        calibrators.load(tmp_path)


def test_the_signal_registry_and_the_methods_agree_on_names():
    for method in calibrators.METHODS.in_order():
        json.dumps(calibrators.fit(method, *VAL).params)  # plain numbers only
    assert confidence.DEFAULT in confidence.SIGNALS
