"""A token run (clm, facts) at any temperature: the log-partition the scorer keeps at the grid against a
naive full-vocabulary logsumexp, the spline between grid points against the exact value, the
Temperature lab's handlers against the model re-run at that temperature, the Recalibration workbench
from one token run to another, and the runs it refuses (evaluated before, or of the other kind)."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from scipy.special import logsumexp

from lab.calibration import calibrators, metrics
from lab.calibration.temperature import fit_temperature
from lab.calibration.token_temperature import (TOKEN_GRID, TokenLogits, fit_token_temperature, scaled_token_probs,
                                               token_log_z)
from lab.data import load
from lab.jobkit.kinds import parse_config
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import evaluate, write_evaluation
from lab.models import token_scoring
from lab.models.token_scoring import log_partition, score_documents
from lab.models.token_targets import TokenDoc, clm_positions, encode
from lab.results import analysis, predictions, runs
from tests.helpers import table_model, two_option_rows
from ui import reliability_page
from ui import temperature_page as page
from ui.context import LabContext
from ui.recalibration_page import ECE_LABEL, fit_and_apply

CONFIDENCE_BOUND = 2e-5  # the spline's measured bound on the confidence (TOKEN_GRID's comment); the issue asks 1e-4
BINS = "10 equal-width bins"
SHARPEN = 3.0  # the bigram model's logits are its log-frequencies times this: over-confident


# ---------------------------------------------------------------- the log-partition at the grid
@pytest.mark.unit
def test_the_scorer_keeps_log_z_at_the_token_grid():
    assert np.array_equal(token_scoring.GRID, TOKEN_GRID)  # lab.models cannot import lab.calibration
    assert TOKEN_GRID[0] == 0.01 and TOKEN_GRID[-1] == 100.0 and np.isclose(TOKEN_GRID, 1.0).sum() == 1


def _exact_log_z(z: np.ndarray, temperatures: np.ndarray) -> np.ndarray:
    """log Σ exp(z / T) (n, len(temperatures)) in float64, the whole vocabulary at once."""
    return np.stack([logsumexp(z / t, axis=1) for t in temperatures], axis=1)


def _logit_sets() -> dict[str, np.ndarray]:
    """Float32 logits over a 49,152-token vocabulary, as a small LM's (the bundled one's top logits sit
    about 35 above the bottom, sd 3): normal, heavy-tailed, and thousands of tokens at one gap from the top
    (the binned expansion's worst case), with a -inf entry (a masked token) in one row."""
    rng = np.random.default_rng(0)
    v = 49_152
    cluster = np.full((6, v), -40.0)
    cluster[:, 0] = 0.0
    for i, (n, gap) in enumerate([(5, 0.05), (300, 0.3), (3000, 1.0), (20000, 0.2), (9765, 1.07), (200, 20.0)]):
        cluster[i, 1:1 + n] = -gap
    normal = rng.normal(0.0, 3.0, (6, v))
    normal[0, 7] = -np.inf
    return {"normal": normal.astype(np.float32), "student": (2.0 * rng.standard_t(3, (6, v))).astype(np.float32),
            "cluster": cluster.astype(np.float32)}


@pytest.mark.unit
@pytest.mark.parametrize("name", ["normal", "student", "cluster"])
def test_the_binned_log_partition_is_the_logsumexp_at_every_grid_temperature(name):
    z = _logit_sets()[name]
    exact = _exact_log_z(z.astype(np.float64), TOKEN_GRID)
    got = log_partition(torch.from_numpy(z), torch.from_numpy(z.max(axis=1)),
                        torch.tensor(1.0 / TOKEN_GRID, dtype=torch.float64)).numpy()
    assert np.abs(got - exact).max() < 1e-5  # log_partition's docstring: 2.3e-7 at most, 2e-6 on the clusters


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from lab.models.loading import load_model

    return load_model(str(tiny_model_dir), device="cpu")


@pytest.mark.model
def test_log_z_equals_a_naive_full_vocabulary_logsumexp_per_position(tiny):
    texts = ["The sky is blue because of Rayleigh scattering of sunlight.", "Paris is the capital of France.",
             "Water boils at one hundred degrees at sea level, and freezes at zero; " * 3]
    rng = np.random.default_rng(1)
    docs = [TokenDoc(ids, clm_positions(len(ids), 4, 2, rng)) for ids, _ in (encode(tiny.tokenizer, t) for t in texts)]
    for doc, rows in zip(docs, score_documents(tiny.model, docs, pad_id=0, batch_size=8, temperature=2.0)):
        for row in rows:
            with torch.no_grad():  # one unpadded forward over the tokens before the target
                z = tiny.model(torch.tensor([doc.ids[:row["position"]]])).logits[0, -1].double()
            naive = torch.stack([torch.logsumexp(z / t, dim=-1) for t in TOKEN_GRID.tolist()]).numpy()
            assert np.abs(np.array(row["log_z"]) - naive).max() < 1e-5  # raw: the run's T = 2 is not in it
            order = torch.argsort(z, descending=True)[:5]
            assert row["top_logits"] == pytest.approx(z[order].tolist(), abs=1e-5)
            assert row["target_logit"] == pytest.approx(float(z[doc.ids[row["position"]]]), abs=1e-5)


# ---------------------------------------------------------------- between the grid points
def _spline_error(z: np.ndarray) -> float:
    """The largest confidence error of the spline over the grid, at every midpoint between two grid
    points (in log T) and at 400 more temperatures spread over it, against the exact value."""
    z = z.astype(np.float64)
    between = np.sqrt(TOKEN_GRID[1:] * TOKEN_GRID[:-1])
    dense = np.unique(np.concatenate([between, np.geomspace(TOKEN_GRID[0], TOKEN_GRID[-1], 400)]))
    log_z, exact = _exact_log_z(z, TOKEN_GRID), _exact_log_z(z, dense)
    top = np.sort(z, axis=1)[:, ::-1][:, :5]
    worst = 0.0
    for t, truth in zip(dense, exact.T):
        conf = scaled_token_probs(top, top[:, 0], log_z, TOKEN_GRID, t)[0][:, 0]
        worst = max(worst, float(np.abs(conf - np.exp(top[:, 0] / t - truth)).max()))
    return worst


@pytest.mark.unit
@pytest.mark.parametrize("name", ["normal", "student", "cluster"])
def test_the_spline_between_grid_points_is_within_its_bound_on_random_logits(name):
    assert _spline_error(_logit_sets()[name][:4]) < CONFIDENCE_BOUND


@pytest.mark.model
def test_the_spline_is_within_its_bound_on_the_tiny_models_logits(tiny):
    ids, _ = encode(tiny.tokenizer, "Water boils at one hundred degrees at sea level, and freezes at zero. " * 4)
    with torch.no_grad():
        z = tiny.model(torch.tensor([ids])).logits[0, ::7].double().numpy()
    for scale in (1.0, 10.0):  # as it is (flat, random weights), and with a trained model's spread of logits
        assert _spline_error(z * scale) < CONFIDENCE_BOUND


@pytest.mark.unit
def test_the_spline_is_exact_at_the_grid_and_refuses_outside_it():
    rng = np.random.default_rng(3)
    log_z, top = rng.normal(5.0, 2.0, (4, TOKEN_GRID.size)), rng.normal(2.0, 1.0, 4)
    for g in (0, 1, 17, 60, 119, 120):
        assert token_log_z(log_z, TOKEN_GRID, TOKEN_GRID[g], top) == pytest.approx(log_z[:, g], rel=1e-12, abs=1e-12)
    assert token_log_z(log_z, TOKEN_GRID, 100 * (1 + 1e-12), top) == pytest.approx(log_z[:, -1])  # float noise
    for t in (0.0099, 100.5, 0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="outside the temperatures"):
            token_log_z(log_z, TOKEN_GRID, t, top)
    with pytest.raises(ValueError, match="ascending grid"):
        token_log_z(log_z[:, :3], TOKEN_GRID[:3][::-1], 0.5, top)


# ---------------------------------------------------------------- the runs the pages read
@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Disjoint halves of the bundled texts, one speech a line: ``fit.txt`` and ``apply.txt``."""
    root = tmp_path_factory.mktemp("texts")
    records = load("text", "test", ["bundled"], task="clm").records
    for name, part in (("fit", records[:50]), ("apply", records[50:100])):
        (root / f"{name}.txt").write_text("\n\n".join(" ".join(r.text.split()) for r in part) + "\n")
    return root


@pytest.fixture(scope="module")
def bigram(tmp_path_factory, tiny_model_dir, texts):
    """A model that predicts: the tiny model's tokenizer, and a one-layer Llama whose logits after token
    a are :data:`SHARPEN` times the log of the bigram a → b's frequency in both texts (smoothed), so it
    is right now and then and over-confident (a temperature above 1 fits it). The tiny model itself is
    random: flat, and never better than chance, so that its NLL falls all the way to T = 100.

    The Llama is :func:`tests.helpers.table_model` of that table."""
    from lab.models.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir), str(tiny_model_dir))
    v = len(tokenizer)
    counts = np.full((v, v), 0.1)
    for name in ("fit", "apply"):
        for line in (texts / f"{name}.txt").read_text().split("\n\n"):
            ids = tokenizer(line)["input_ids"]
            np.add.at(counts, (ids[:-1], ids[1:]), 1.0)
    table = SHARPEN * np.log(counts / counts.sum(axis=1, keepdims=True))
    model = table_model(table, max_positions=512, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    out = tmp_path_factory.mktemp("bigram") / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _evaluate(root, name, model, data, **values):
    _, cfg = parse_config({"kind": "evaluate", "model": str(model), "task": "clm", "data_files": [str(data)],
                           "positions": 6, "min_context": 2, "bootstrap": 0, **values})
    evaluate(cfg, root / name, log=lambda m: None)
    return json.loads((root / name / "metrics.json").read_text())


@pytest.fixture(scope="module")
def lab(tmp_path_factory, bigram, texts):
    """Two clm runs of the bigram model on disjoint halves of the bundled texts (``fit``, ``apply``), and
    one of the second half evaluated at T = 2 (``apply-t2``)."""
    root = tmp_path_factory.mktemp("token-temperature")
    for name in ("fit", "apply"):
        shutil.copy(texts / f"{name}.txt", root / f"{name}.txt")
        _evaluate(root, name, bigram, root / f"{name}.txt")
    _evaluate(root, "apply-t2", bigram, root / "apply.txt", temperature=2.0)
    return LabContext(root)


def _rows(lab, name):
    return [json.loads(line) for line in (lab.runs / name / "predictions.jsonl").read_text().splitlines()]


def _ece_shown(text):
    return float(text.split("id='ece-value'>")[1].split("%")[0]) / 100


@pytest.mark.model
def test_a_token_run_keeps_its_logits_and_grid(lab):
    rows, saved = _rows(lab, "apply"), json.loads((lab.runs / "apply" / "metrics.json").read_text())
    assert saved["temperature_grid"] == TOKEN_GRID.tolist()
    pred = predictions.load_predictions(lab.runs / "apply")
    assert pred.logits.log_z.shape == (len(rows), TOKEN_GRID.size) and pred.logits.top.shape == (len(rows), 5)
    assert len({row["key"] for row in rows}) == len(rows)  # one key per target
    conf, target = scaled_token_probs(pred.logits.top, pred.logits.target, pred.logits.log_z, TOKEN_GRID, 1.0)
    # Every bigram unseen in the texts has the same logit: hundreds of tokens at one gap, log_partition's
    # worst case, within 1e-5 of log Z.
    assert conf[:, 0] == pytest.approx([r["confidence"] for r in rows], abs=1e-5)
    assert target == pytest.approx([r["target_prob"] for r in rows], abs=1e-5)
    assert conf[:, 0].max() > 0.3 and saved["ece"] > 0.1  # the bigram model is over-confident


@pytest.mark.model
def test_the_temperature_lab_at_t_1_is_the_run_as_evaluated(lab):
    saved = json.loads((lab.runs / "apply" / "metrics.json").read_text())
    view = page.pick_run(lab, "apply", "logit", BINS)
    assert view.message == "" and view.drawn["temperature"] == 1.0
    assert _ece_shown(view.text) == pytest.approx(saved["ece"], abs=5e-5)  # shown to 2 decimals of a percent
    summary = analysis.temperature_summary(predictions.load_predictions(lab.runs / "apply"), 1.0, n_boot=0)
    for key in ("ece", "nll", "brier", "accuracy"):
        assert summary[key] == pytest.approx(saved[key], abs=1e-5), key
    assert "softmax(z / T) over the whole vocabulary" in view.text


@pytest.mark.model
def test_the_temperature_lab_at_t_2_is_the_model_re_run_at_t_2(lab):
    again = json.loads((lab.runs / "apply-t2" / "metrics.json").read_text())  # the whole vocabulary, exactly
    pred = predictions.load_predictions(lab.runs / "apply")
    summary = analysis.temperature_summary(pred, 2.0)
    assert summary["ece"] == pytest.approx(again["ece"], abs=CONFIDENCE_BOUND)
    assert summary["nll"] == pytest.approx(again["nll"], abs=CONFIDENCE_BOUND)
    assert summary["accuracy"] == again["accuracy"]
    view = page.draw(lab, "apply", 2.0, "logit", BINS)
    assert _ece_shown(view.text) == pytest.approx(again["ece"], abs=5e-5)
    # A run evaluated at T = 2 is rescaled from the unscaled model too: T = 1 there is the model unscaled.
    twice = analysis.temperature_summary(predictions.load_predictions(lab.runs / "apply-t2"), 2.0)
    assert twice["ece"] == pytest.approx(again["ece"], abs=CONFIDENCE_BOUND)
    view = page.draw(lab, "apply-t2", 1.0, "logit", BINS)
    assert "the run itself was evaluated at T = 2" in view.text


@pytest.mark.model
def test_the_sweep_finds_its_optima_inside_the_grid_and_the_slider_stays_in_it(lab):
    sweep = analysis.temperature_sweep(predictions.load_predictions(lab.runs / "apply"))
    grid = (TOKEN_GRID[0], TOKEN_GRID[-1])
    assert grid[0] <= sweep.best_ece <= grid[1] and grid[0] <= sweep.best_nll <= grid[1]
    assert sweep.best_nll > 1.5  # over-confident: cooled
    assert (sweep.table["accuracy"] == sweep.table["accuracy"].iloc[0]).all()
    view = page.go_to_optimum(lab, "apply", "logit", BINS, which="nll")
    assert view.drawn["temperature"] == sweep.best_nll
    low, high = 10 ** view.slider["minimum"], 10 ** view.slider["maximum"]
    assert grid[0] * 0.99 <= low and high <= grid[1] * 1.01
    view = page.draw(lab, "apply", 500.0, "logit", BINS)  # past the grid: drawn at its end, and said so
    assert view.drawn["temperature"] == 100.0 and "outside the temperatures" in view.message


@pytest.mark.model
def test_a_saved_temperature_reproduces_the_pages_ece_when_evaluated(lab, bigram):
    t = 2.5
    message = page.save_chosen_temperature(lab, "apply", t, "logit", BINS)
    assert "Saved T = 2.5" in message
    saved = json.loads((lab.runs / "apply" / "temperature.json").read_text())
    assert saved["temperature"] == t and saved["form"] == "logit"
    shown = analysis.temperature_summary(predictions.load_predictions(lab.runs / "apply"), t)
    assert saved["ece_after"] == pytest.approx(shown["ece"])
    again = _evaluate(lab.runs, "apply-saved", bigram, lab.runs / "apply.txt", temperature=str(lab.runs / "apply"))
    assert again["temperature"] == t
    assert again["ece"] == pytest.approx(shown["ece"], abs=CONFIDENCE_BOUND)
    assert again["nll"] == pytest.approx(shown["nll"], abs=CONFIDENCE_BOUND)
    (lab.runs / "apply" / "temperature.json").unlink()  # the other tests start the page at T = 1


@pytest.mark.model
def test_the_paper_form_is_refused_for_a_token_run(lab):
    view = page.pick_run(lab, "apply", "paper", BINS)
    assert "softmax(p / c)" in view.message and "logit form" in view.message
    assert "logit form" in page.save_chosen_temperature(lab, "apply", 0.5, "paper", BINS)


# ---------------------------------------------------------------- the recalibration workbench
def _ece_cell(table, column):
    return float(table.set_index("metric").loc[ECE_LABEL, column].split(" ")[0]) / 100


@pytest.mark.model
@pytest.mark.parametrize("method", ["temperature", "platt", "isotonic", "histogram"])
def test_each_method_fits_on_one_token_run_and_applies_to_another(lab, method):
    message, figure, table, cal = fit_and_apply(lab, "fit", "apply", method, "max_prob", 10)
    assert "lab-error" not in message and figure is not None and cal.tokens
    fit_rows, rows = _rows(lab, "fit"), _rows(lab, "apply")
    assert cal.questions == [r["key"] for r in fit_rows] and "test questions were" not in message  # no overlap
    conf, correct = np.array([r["confidence"] for r in rows]), np.array([r["correct"] for r in rows])
    fit_conf, fit_correct = np.array([r["confidence"] for r in fit_rows]), np.array([r["correct"] for r in fit_rows])
    if method == "temperature":  # the NLL fit over the whole vocabulary, then the apply run at that T
        t, fit_pred = cal.params["temperature"], predictions.load_predictions(lab.runs / "fit")
        nll = [analysis.temperature_summary(fit_pred, t * step)["nll"] for step in (0.95, 1.0, 1.05)]
        assert t > 1 and nll[1] < min(nll[0], nll[2])
        after = scaled_token_probs(*_logits(lab, "apply"), t)[0][:, 0]
    elif method == "platt":
        from sklearn.linear_model import LogisticRegression

        logit = lambda s: np.log(np.clip(s, 1e-6, 1 - 1e-6)) - np.log1p(-np.clip(s, 1e-6, 1 - 1e-6))  # noqa: E731
        model = LogisticRegression(C=calibrators.PLATT_C).fit(logit(fit_conf)[:, None], fit_correct)
        after = model.predict_proba(logit(conf)[:, None])[:, 1]
    elif method == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        after = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(fit_conf, fit_correct).predict(conf)
    else:  # histogram binning: equal-mass bins of the fit run's confidence, each its accuracy
        edges = np.quantile(fit_conf, np.linspace(0, 1, 11)[1:-1])
        bins_fit, bins = np.searchsorted(edges, fit_conf, "right"), np.searchsorted(edges, conf, "right")
        after = np.array([fit_correct[bins_fit == b].mean() for b in bins])
    assert _ece_cell(table, "before") == pytest.approx(metrics.ece(conf, correct, 10), abs=5e-5)
    assert _ece_cell(table, "after") == pytest.approx(metrics.ece(after, correct, 10), abs=5e-5)


def _logits(lab, name):
    logits = predictions.load_predictions(lab.runs / name).logits
    return logits.top, logits.target, logits.log_z, logits.grid


@pytest.mark.model
def test_the_token_temperature_fit_is_the_nll_minimum(lab):
    pred = predictions.load_predictions(lab.runs / "fit")
    fit = fit_token_temperature(pred.logits, predictions.reported_correct(pred))
    grid = np.geomspace(fit.temperature / 1.05, fit.temperature * 1.05, 11)
    nll = [analysis.temperature_summary(pred, t)["nll"] for t in grid]
    assert int(np.argmin(nll)) == 5 and fit.nll_after < fit.nll_before and not fit.at_bound


@pytest.fixture
def mcq(tmp_path):
    rng = np.random.default_rng(0)
    rows = two_option_rows([(float(p), 0 if rng.uniform() < p else 1) for p in rng.uniform(0.5, 1.0, 200)])
    write_evaluation(tmp_path / "mcq", rows, EvalConfig(dataset="mmlu", bootstrap=0), {"model": "toy"})
    return tmp_path / "mcq"


@pytest.mark.model
def test_a_calibrator_of_one_kind_is_refused_on_the_other(lab, mcq):
    shutil.copytree(mcq, lab.runs / "mcq", dirs_exist_ok=True)
    for fit_on, apply_to in (("mcq", "apply"), ("fit", "mcq")):
        message = fit_and_apply(lab, fit_on, apply_to, "platt", "max_prob", 10)[0]
        assert "lab-error" in message and "fit one on a run of the same kind" in message
    cal = calibrators.fit("temperature", *_mcq_arrays(mcq))
    assert not cal.tokens
    saved = calibrators.load(calibrators.save(cal, lab.runs / "cal-mcq"))
    assert not saved.tokens
    token = fit_and_apply(lab, "fit", "apply", "isotonic", "max_prob", 10)[3]
    assert calibrators.load(calibrators.save(token, lab.runs / "cal-token")).tokens


@pytest.mark.model
@pytest.mark.parametrize("method", ["temperature", "isotonic"])
def test_a_saved_token_calibrator_draws_in_reliability_and_reports_in_an_evaluation(lab, bigram, method):
    """The calibrator the workbench saves, applied where a user applies it: the Reliability page's drawn
    ECE and an evaluation's ``calibrated`` block equal the ECE of the workbench's own 'after' column."""
    cal = fit_and_apply(lab, "fit", "apply", method, "max_prob", 10)[3]
    saved = calibrators.save(cal, lab.runs / f"cal-{method}")
    pred = predictions.load_predictions(lab.runs / "apply")
    _, after = calibrators.apply(cal, pred.probs, pred.mask, pred.rows, logits=pred.logits)
    conf, correct = predictions.reported_confidence(pred), predictions.reported_correct(pred)
    assert np.abs(after - conf).max() > 0.01  # it recalibrates: the check below could tell the two apart
    drawn, _ = reliability_page.reported_summary(lab, runs.evaluation(lab.runs, "apply"), 10, "width",
                                                 calibrator=calibrators.load(saved))
    assert drawn["ece"] == pytest.approx(metrics.ece(after, correct, 10), abs=1e-12)
    reported = _evaluate(lab.runs, f"apply-{method}", bigram, lab.runs / "apply.txt", calibrator=str(saved))
    assert reported["ece"] == pytest.approx(metrics.ece(conf, correct, 10), abs=1e-9)
    assert reported["calibrated"]["ece"] == pytest.approx(metrics.ece(after, correct, 10), abs=1e-9)
    assert reported["calibrated"]["overlap"] == 0 and "error" not in reported["calibrated"]
    assert [r["calibrated_confidence"] for r in _rows(lab, f"apply-{method}")] == pytest.approx(after.tolist(), abs=1e-9)


@pytest.mark.model
def test_an_evaluation_refuses_a_calibrator_of_the_other_kind_at_submit(lab, mcq, bigram):
    mcq_cal = calibrators.save(calibrators.fit("platt", *_mcq_arrays(mcq)), lab.runs / "cal-mcq-submit")
    token_cal = calibrators.save(fit_and_apply(lab, "fit", "apply", "platt", "max_prob", 10)[3],
                                 lab.runs / "cal-token-submit")
    with pytest.raises(ValueError, match="fitted on a multiple-choice run, and this is a token-level run"):
        parse_config({"kind": "evaluate", "model": str(bigram), "task": "clm", "calibrator": str(mcq_cal)})
    with pytest.raises(ValueError, match="fitted on a token-level run .*, and this is a multiple-choice run"):
        parse_config({"kind": "evaluate", "model": str(bigram), "calibrator": str(token_cal)})


def _mcq_arrays(path):
    pred = predictions.load_predictions(path)
    return predictions.reported_probs(pred), pred.mask, pred.labels, pred.rows


# ---------------------------------------------------------------- runs evaluated before, and multiple choice
@pytest.mark.model
def test_a_token_run_evaluated_before_is_refused_saying_to_evaluate_it_again(lab):
    old = lab.runs / "old"
    shutil.copytree(lab.runs / "apply", old)
    kept = ("top_logits", "target_logit", "log_z", "key")
    rows = [{k: v for k, v in row.items() if k not in kept} for row in _rows(lab, "apply")]
    (old / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    info = json.loads((old / "metrics.json").read_text())
    del info["temperature_grid"]
    (old / "metrics.json").write_text(json.dumps(info))
    pred = predictions.load_predictions(old)
    assert pred.logits is None and analysis.reported_summary(pred)["ece"] == pytest.approx(info["ece"])
    said = "evaluated before the lab kept what a temperature needs"
    assert said in page.pick_run(lab, "old", "logit", BINS).message
    assert said in page.save_chosen_temperature(lab, "old", 1.5, "logit", BINS)
    for fit_on, apply_to in (("old", "apply"), ("fit", "old")):
        assert said in fit_and_apply(lab, fit_on, apply_to, "platt", "max_prob", 10)[0]
    with pytest.raises(ValueError, match="evaluate it again"):
        analysis.temperature_sweep(pred)


@pytest.mark.unit
def test_a_multiple_choice_run_is_drawn_as_before(mcq):
    pred = predictions.load_predictions(mcq)
    assert pred.logits is None and analysis.temperature_limits(pred) is None
    for t in (0.5, 1.0, 3.0):
        for form in ("logit", "paper"):
            assert analysis.temperature_summary(pred, t, form) == analysis.calibration_summary(
                analysis.recalibrate(pred, t, form), pred.mask, pred.labels)
    assert analysis.temperature_summary(pred, None) == analysis.calibration_summary(pred.probs, pred.mask, pred.labels)
    probs, mask, labels, rows = _mcq_arrays(mcq)
    assert calibrators.fit("temperature", probs, mask, labels, rows).params["temperature"] == fit_temperature(
        probs, labels, mask).temperature


@pytest.mark.unit
def test_token_logits_hold_what_the_fit_needs():
    rng = np.random.default_rng(5)
    z = rng.normal(0.0, 3.0, (200, 2000))
    p = np.exp(z / 2 - logsumexp(z / 2, axis=1, keepdims=True))  # the targets are drawn at T = 2
    target = z[np.arange(len(z)), [rng.choice(z.shape[1], p=row) for row in p]]
    top = np.sort(z, axis=1)[:, ::-1][:, :5]
    logits = TokenLogits(top, target, _exact_log_z(z, TOKEN_GRID), TOKEN_GRID)
    fit = fit_token_temperature(logits, target == top[:, 0])
    assert 1.5 < fit.temperature < 2.5
    nll = [float(np.mean(logsumexp(z / t, axis=1) - target / t)) for t in (fit.temperature * 0.97, fit.temperature,
                                                                           fit.temperature * 1.03)]
    assert nll[1] <= min(nll[0], nll[2]) + 1e-9 and fit.nll_after == pytest.approx(nll[1], abs=1e-5)
