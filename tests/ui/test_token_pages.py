"""Token-level runs (evaluate with task clm or facts) on the browser lab's pages, through their
handlers: Reliability and Selective prediction reproduce metrics.json, Case studies shows each
target in its context with the top tokens; the recalibration workbench and the temperature lab
take them (tests/calibration/test_token_temperature.py)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lab.jobkit.kinds import parse_config
from lab.kinds.evaluate.run import evaluate
from lab.results import analysis, predictions, runs, tables
from ui.cases_page import cases_view, same_question_view
from ui.context import LabContext
from ui.recalibration_page import fit_and_apply
from ui.reliability_page import NO_TOP_TOKENS, VIEWS, reliability_view, reported_summary
from ui.selective_page import selective_view
from ui.temperature_page import draw, save_chosen_temperature

pytestmark = pytest.mark.model

TEXT = ("The quick brown fox jumps over the lazy dog while the farmer watches from the gate.\n\n"
        "Rain fell on the hills all night, and by morning the river had risen over the old stone bridge.\n")
FACTS = [{"text": "Paris is the capital of France.", "entities": [[0, 5], [24, 30]]},
         {"text": "The Danube <flows> through Vienna and Budapest.", "entities": [[4, 10], [27, 33], [38, 46]]}]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("token-runs")
    texts, facts = root / "texts.txt", root / "facts.jsonl"
    texts.write_text(TEXT)
    facts.write_text("".join(json.dumps(f) + "\n" for f in FACTS))
    for name, values in {"clm": {"task": "clm", "data_files": [str(texts)], "positions": 12, "min_context": 2},
                         "facts": {"task": "facts", "data_files": [str(facts)]}}.items():
        _, cfg = parse_config({"kind": "evaluate", "model": str(tiny_model_dir), "bootstrap": 50, **values})
        evaluate(cfg, root / name, log=lambda m: None)
    return LabContext(root)


def _saved(lab, name):
    rows = [json.loads(line) for line in (lab.runs / name / "predictions.jsonl").read_text().splitlines()]
    return rows, json.loads((lab.runs / name / "metrics.json").read_text())


def test_a_token_run_loads_as_its_top_tokens_and_the_rest(lab):
    rows, saved = _saved(lab, "clm")
    pred = predictions.load_predictions(lab.runs / "clm")
    assert pred.task == "clm" and predictions.is_token_run(pred) and pred.probs.shape == (len(rows), 6)
    assert pred.mask.all() and np.allclose(pred.probs.sum(axis=1), 1.0)
    for row, slot in zip(rows, pred.labels):
        assert slot == (row["top_ids"].index(row["target_id"]) if row["target_id"] in row["top_ids"] else 5)
    assert np.array_equal(predictions.reported_confidence(pred), [r["confidence"] for r in rows])
    assert np.array_equal(predictions.reported_correct(pred), [r["correct"] for r in rows])
    summary = analysis.reported_summary(pred, saved["n_bins"])
    for key in ("ece", "accuracy", "nll", "brier", "trust"):
        assert summary[key] == pytest.approx(saved[key]), key
    assert summary["cw_ece"] is None and tables.positionwise_topk(pred).empty
    assert predictions.oracle_probs(pred) is None
    with pytest.raises(ValueError, match=r"token-level run.*temperature_summary"):
        analysis.recalibrate(pred, 2.0)  # option probabilities: a token run's come from its log-partition


@pytest.mark.parametrize("name", ["clm", "facts"])
def test_reliability_draws_a_token_run_as_metrics_json_says(lab, name):
    _, saved = _saved(lab, name)
    run = runs.evaluation(lab.runs, name)
    summary, _ = reported_summary(lab, run, saved["n_bins"], "width")
    assert summary["ece"] == pytest.approx(saved["ece"])
    assert json.loads(json.dumps(summary["reliability"])) == saved["reliability"]  # the Jobs page's figure
    figure, message = reliability_view(lab, [name], None, VIEWS[0])
    assert figure is not None and "lab-error" not in message
    figure, message = reliability_view(lab, [name], None, VIEWS[2])  # ECE against the number of bins
    assert figure is not None and "lab-error" not in message
    _, message = reliability_view(lab, [name], None, VIEWS[1])
    assert NO_TOP_TOKENS.split(" (")[0] in message


def test_selective_prediction_reads_a_token_run(lab):
    _, saved = _saved(lab, "clm")
    figure, table, dropped, heading, message = selective_view(lab, ["clm"], "max_prob", 0.5)
    assert figure is not None and message == "" and len(table) == 1
    assert table.loc[0, "AURC"] == pytest.approx(saved["aurc"], abs=1e-4)
    assert table.loc[0, "AUROC"] == pytest.approx(saved["auroc"], abs=1e-4)
    assert table.loc[0, "accuracy"] == pytest.approx(saved["accuracy"], abs=1e-4)
    assert (dropped["confidence"] < 0.5).all()
    _, table, _, _, message = selective_view(lab, ["clm"], "margin", 0.5)
    assert len(table) == 1 and message == ""
    figure, table, _, _, message = selective_view(lab, ["clm"], "certainty", 0.5)
    assert figure is None and "needs the options of a multiple-choice run" in message


def test_case_studies_show_a_target_in_its_context_with_the_top_tokens(lab):
    rows, _ = _saved(lab, "facts")
    table, _, note = cases_view(lab, "facts", "all", 0.0, 1.0, "")
    assert len(table) == len(rows) and note.startswith(f"**{len(rows)} of {len(rows)} targets.** Keeps every target. Shown: {len(rows)} of {len(rows)} (100%) targets")
    shown = table.set_index("id")
    for row in rows:
        case = shown.loc[row["id"]]
        assert case["question"].endswith(f"⟦{row['target']}⟧") and row["context"][-20:] in case["question"]
        assert case["options"].startswith(json.dumps(row["top_tokens"][0], ensure_ascii=False))
        assert "rest" in case["options"] and case["answer"] == json.dumps(row["target"], ensure_ascii=False)
        assert bool(case["correct"]) == row["correct"]
    assert any("<flows>" in q for q in table["question"])  # plain text in a plain-text table: shown as written
    wrong, _, _ = cases_view(lab, "facts", "wrong", 0.0, 1.0, "")
    assert len(wrong) == sum(not r["correct"] for r in rows)
    same = same_question_view(lab, rows[0]["id"], ["facts"])
    assert len(same) == 1 and "rest" in same.loc[0, "probabilities"]


def test_the_workbench_and_the_temperature_lab_take_a_token_run(lab):
    message = fit_and_apply(lab, "clm", "facts", "histogram", "max_prob", 10)[0]  # tests/calibration/test_token_temperature.py
    assert "lab-error" not in message and "; applied to " in message
    view = draw(lab, "clm", 1.5, "logit", None)
    assert view.message == "" and view.drawn["temperature"] == 1.5
    assert re.search(r"Only \d+ targets: below", view.text) and not re.search(r"Only \d+ questions", view.text)  # n counts targets
    assert "Saved T = 1.5" in save_chosen_temperature(lab, "clm", 1.5, "logit")
