"""A saved calibrator put to use: an evaluation reports it beside its own numbers, the path policy
checks where it lies, the Compare page applies it to every model's answers, and the temperature lab
says its optima are fitted on the questions it shows. Hand-built rows, no model."""
import json

import numpy as np
import pytest

from lab.calibration import calibrators
from lab.core.config import ConfigError
from lab.core.layout import CALIBRATOR_FILE, CALIBRATORS_DIR, PREDICTIONS_FILE
from lab.jobkit.kinds import parse_config
from lab.jobkit.paths import PathNotAllowed, checked_config, path_problems
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import write_evaluation
from ui import compare_page, temperature_page
from ui.context import LabContext

pytestmark = pytest.mark.unit


def _rows(n, seed, prefix):
    """``n`` four-option evaluation rows, overconfident: right about 60 % of the time at ~0.9."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        top = rng.uniform(0.7, 0.99)
        probs = [top, *([(1 - top) / 3] * 3)]
        answer = 0 if rng.uniform() < 0.6 else int(rng.integers(1, 4))
        rows.append({"id": f"{prefix}{i}", "question": f"{prefix} question {i}?", "choices": ["a", "b", "c", "d"],
                     "answer": answer, "probs": probs, "pred": 0, "confidence": top, "correct": answer == 0})
    return rows


def _fit(rows, method="histogram"):
    probs = np.array([r["probs"] for r in rows])
    return calibrators.fit(method, probs, np.ones(probs.shape, bool), [r["answer"] for r in rows], rows,
                           n_bins=5, run="val-run", label="validation")


@pytest.fixture
def saved(tmp_path):
    """A histogram-binning calibrator fitted on validation rows, saved as the workbench saves it."""
    fit_rows = _rows(200, 0, "val")
    cal = _fit(fit_rows)
    return calibrators.save(cal, tmp_path / "runs" / CALIBRATORS_DIR / "hist"), cal, fit_rows


# ---------------------------------------------------------------- evaluate
def test_an_evaluation_reports_the_calibrated_confidence_beside_its_own(saved, tmp_path):
    path, cal, _ = saved
    rows = _rows(120, 1, "test")
    cfg = EvalConfig(model="bundled", calibrator=str(path), bootstrap=20)
    result = write_evaluation(tmp_path / "run", rows, cfg, info={})
    pred, conf = calibrators.apply(cal, np.array([r["probs"] for r in rows]), np.ones((120, 4), bool), rows)
    correct = pred == np.array([r["answer"] for r in rows])
    expected = calibrators.confidence_report(conf, correct, cfg.bins, cfg.bin_edges, cfg.bootstrap, cfg.seed)
    assert result["calibrated"] == {**expected, "calibrator": cal.describe(), "overlap": 0, "warning": None}
    assert result["ece"] != result["calibrated"]["ece"]  # the run's own numbers stay those of its probabilities
    stored = [json.loads(line) for line in (tmp_path / "run" / PREDICTIONS_FILE).read_text().splitlines()]
    assert [r["calibrated_confidence"] for r in stored] == pytest.approx(conf.tolist())
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["calibrated"] == result["calibrated"]


def test_questions_the_calibrator_was_fitted_on_are_recorded_not_refused(saved, tmp_path):
    path, _, fit_rows = saved
    rows = fit_rows[:30] + _rows(10, 2, "test")
    block = write_evaluation(tmp_path / "run", rows, EvalConfig(model="bundled", calibrator=str(path.parent),
                                                                bootstrap=0), info={})["calibrated"]
    assert block["overlap"] == 30 and "30 of these 40 questions were used to fit" in block["warning"]


def test_a_calibrator_on_a_signal_the_run_lacks_is_said_not_fatal(tmp_path):
    fit_rows = [{**r, "option_vocab_probs": [p * 0.8 for p in r["probs"]]} for r in _rows(100, 3, "val")]
    probs = np.array([r["probs"] for r in fit_rows])
    cal = calibrators.fit("platt", probs, np.ones(probs.shape, bool), [r["answer"] for r in fit_rows], fit_rows,
                          signal="full_vocab")
    path = calibrators.save(cal, tmp_path / "cal")
    result = write_evaluation(tmp_path / "run", _rows(20, 4, "test"), EvalConfig(model="bundled", calibrator=str(path),
                                                                                  bootstrap=0), info={})
    assert "full-vocabulary" in result["calibrated"]["error"] and "ece" not in result["calibrated"]


def test_a_damaged_calibrator_is_refused_at_submit(tmp_path):
    (tmp_path / CALIBRATOR_FILE).write_text('{"method": "isotonic", "signal": "max_prob", "params": {}}')
    with pytest.raises(ConfigError, match="calibrator.json"):
        parse_config({"kind": "evaluate", "calibrator": str(tmp_path)}, [tmp_path])


# ---------------------------------------------------------------- the path policy
def test_the_calibrator_field_is_checked_like_every_path(saved, tmp_path):
    path, _, _ = saved
    root, outside = tmp_path / "runs", tmp_path / "secret"
    calibrators.save(_fit(_rows(50, 5, "x")), outside)
    (root / "link").symlink_to(outside)
    for folder_or_file in (path, path.parent):
        resolved = checked_config(EvalConfig, {"calibrator": str(folder_or_file)}, [root])
        assert resolved["calibrator"] == str(path.resolve())  # always the file: what the job will read
    assert path_problems(EvalConfig, {"calibrator": str(path)}, [root]) == []
    for leading_out in (outside, outside / CALIBRATOR_FILE, root / "link", root / ".." / "secret"):
        with pytest.raises(PathNotAllowed, match="^calibrator: "):
            checked_config(EvalConfig, {"calibrator": str(leading_out)}, [root])
    (problem,) = path_problems(EvalConfig, {"calibrator": str(root / "nowhere")}, [root])
    assert problem.startswith("calibrator: ") and "there is none at" in problem
    with pytest.raises(ConfigError, match="there is none at"):
        checked_config(EvalConfig, {"calibrator": str(root / CALIBRATORS_DIR / "*")}, [root])  # no glob expanded
    for shape in ([str(path)], {str(path): 1}, 7):
        with pytest.raises(ConfigError, match="^calibrator: must be text"):
            checked_config(EvalConfig, {"calibrator": shape}, [root])


# ---------------------------------------------------------------- the Compare page
def _comparison():
    """A compare.json as lab.kinds.compare.run writes it: two questions with options and one free-text, two models."""
    questions = [{"question": "Capital of Norway?", "options": ["Oslo", "Helsinki", "Bergen"], "answer": 0},
                 {"question": "Say hello.", "options": []},
                 {"question": "val question 3?", "options": ["a", "b", "c", "d"]}]

    def answers(first, third):
        generation = {"text": "x", "tokens": 1, "sequence_prob": 0.5, "first_token_prob": 0.5}
        return [{"raw_probs": first, "probs": first, "prediction": int(np.argmax(first)), "confidence": max(first),
                 "option_mass": 0.9, "generation": generation},
                {"generation": generation},
                {"raw_probs": third, "probs": third, "prediction": int(np.argmax(third)), "confidence": max(third),
                 "option_mass": 0.9, "generation": generation}]

    results = [{"label": "m1", "model": "bundled", "adapter": None, "temperature": None,
                "answers": answers([0.9, 0.06, 0.04], [0.1, 0.7, 0.1, 0.1])},
               {"label": "m2", "model": "bundled", "adapter": None, "temperature": 2.0,
                "answers": answers([0.5, 0.3, 0.2], [0.25, 0.25, 0.4, 0.1])}]
    return {"questions": questions, "results": results, "template": "cft_chat", "created": 0.0, "seconds": 1.0}


def test_the_compare_page_adds_the_calibrated_confidence_without_asking_the_models(saved, tmp_path):
    path, cal, _ = saved
    ctx, result, name = LabContext(tmp_path / "runs"), _comparison(), "comparisons/one"
    plain, _, note = compare_page.calibrated_answers(ctx, result, "", name)
    assert compare_page.CALIBRATED not in plain["value"] and note == ""
    shown, csv, note = compare_page.calibrated_answers(ctx, result, f"{CALIBRATORS_DIR}/hist", name)
    table = shown["value"]
    # each column its width, the calibrated one too, so that no header breaks mid-word (issue 30)
    assert shown["column_widths"] == [compare_page.ANSWER_WIDTHS[c] for c in table.columns]
    column = list(table[compare_page.CALIBRATED])
    for row, (q, model) in zip([0, 1, 4, 5], [(0, 0), (0, 1), (2, 0), (2, 1)]):  # question by question, each model
        item, probs = result["questions"][q], result["results"][model]["answers"][q]["probs"]
        _, conf = calibrators.apply(cal, np.array([probs]), np.ones((1, len(probs)), bool),
                                    [{"question": item["question"], "choices": item["options"]}])
        assert column[row] == pytest.approx(conf[0], abs=1e-4)
    assert np.isnan(column[2]) and np.isnan(column[3])  # the free-text question has no confidence
    assert list(table.columns).index(compare_page.CALIBRATED) == list(table.columns).index("confidence") + 1
    assert compare_page.CALIBRATED in open(csv["value"]).readline()
    assert "1 of these 2 questions were used to fit" in note  # "val question 3?" is one of the fit questions
    assert "No saved calibrator" in compare_page.calibrated_answers(ctx, result, "../../etc", name)[2]


def test_the_compare_page_says_why_a_full_vocabulary_calibrator_cannot_apply(tmp_path):
    fit_rows = [{**r, "option_vocab_probs": r["probs"]} for r in _rows(60, 6, "val")]
    probs = np.array([r["probs"] for r in fit_rows])
    cal = calibrators.fit("histogram", probs, np.ones(probs.shape, bool), [r["answer"] for r in fit_rows], fit_rows,
                          signal="full_vocab", n_bins=3)
    calibrators.save(cal, tmp_path / CALIBRATORS_DIR / "vocab")
    table, _, note = compare_page.calibrated_answers(LabContext(tmp_path), _comparison(), f"{CALIBRATORS_DIR}/vocab",
                                                     "comparisons/one")
    assert compare_page.CALIBRATED not in table["value"] and "cannot be applied here" in note


# ---------------------------------------------------------------- the temperature lab
def test_the_temperature_optima_say_they_are_fitted_on_the_questions_shown(tmp_path):
    write_evaluation(tmp_path / "00001-evaluate", _rows(60, 7, "q"), EvalConfig(bootstrap=0), {"model": "toy"})
    text = temperature_page.pick_run(LabContext(tmp_path), "00001-evaluate", "logit", "10 equal-width bins").text
    optima = text.split("id='temperature-optima'>")[1]
    assert "fitted on these same questions — optimistic" in optima and "Recalibration workbench" in optima
