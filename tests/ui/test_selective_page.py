"""The selective-prediction page, the recalibration workbench and the Reliability page's calibrator
and ECE-robustness view, through their handlers, on synthetic runs written as evaluations write them."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lab.calibration import calibrators, confidence, metrics, selective
from lab.results import analysis, runs
from tests.helpers import RUNS, write_runs
from ui.app import open_below_threshold
from ui.context import LabContext
from ui.recalibration_page import fit_and_apply, save_calibrator
from ui.reliability_page import VIEWS, reliability_view
from ui.selective_page import TABLE_COLUMNS, selective_view

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    write_runs(root)
    return LabContext(root)


def test_an_evaluation_stores_every_signal_and_the_selective_metrics(lab):
    metrics = json.loads((lab.runs / "test" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (lab.runs / "test" / "predictions.jsonl").read_text().splitlines()]
    assert set(rows[0]["signals"]) == {"max_prob", "margin", "certainty"}
    conf = np.array([r["confidence"] for r in rows])
    right = np.array([r["correct"] for r in rows])
    assert metrics["aurc"] == pytest.approx(selective.aurc(conf, right))
    assert metrics["auroc"] == pytest.approx(selective.auroc(conf, right))
    assert metrics["aurc_ci"][0] < metrics["aurc"] < metrics["aurc_ci"][1]
    assert set(metrics["signals"]) == {"max_prob", "margin", "certainty"}
    assert runs.evaluation(lab.runs, "test").aurc == pytest.approx(metrics["aurc"])


def test_selective_view_compares_runs_and_lists_what_the_threshold_drops(lab):
    figure, table, dropped, heading, message = selective_view(lab, ["test", "val"], "max_prob", 0.9)
    assert list(table.columns) == TABLE_COLUMNS and len(table) == 2 and message == ""
    rows = [json.loads(line) for line in (lab.runs / "test" / "predictions.jsonl").read_text().splitlines()]
    conf = np.array([r["confidence"] for r in rows])
    assert len(dropped) == int((conf < 0.9).sum()) > 0
    assert dropped["confidence"].is_monotonic_increasing and (dropped["confidence"] <= 0.9).all()  # shown to 3 digits
    assert table.loc[0, "coverage at threshold"] == pytest.approx((conf >= 0.9).mean(), abs=1e-4)
    assert f"{len(dropped)} questions" in heading
    assert len([t for t in figure.data if t.fill == "tozeroy"]) == 2  # one risk curve per run


def test_moving_the_threshold_does_not_redo_the_bootstrap(tmp_path, monkeypatch):
    """The summary (AURC, AUROC with their bootstrap intervals) does not depend on the threshold: computed
    once per run, signal and version of its predictions, not on every move of the slider."""
    write_runs(tmp_path, RUNS[:1])
    ctx, calls = LabContext(tmp_path), []
    real = selective.summary
    monkeypatch.setattr(selective, "summary", lambda *a, **k: calls.append(1) or real(*a, **k))
    tables = [selective_view(ctx, ["val"], confidence.DEFAULT, t)[1] for t in (0.3, 0.5, 0.7)]
    assert len(calls) == 1 and tables[0]["AUROC"].equals(tables[2]["AUROC"])
    assert tables[0]["coverage at threshold"][0] > tables[2]["coverage at threshold"][0]
    selective_view(ctx, ["val"], "margin", 0.5)
    assert len(calls) == 2  # another signal is another summary


def test_the_table_leads_with_the_numbers_a_reader_came_for():
    """At 1440 px the accuracy at 50 / 80 % coverage sat behind a horizontal scroll (issue 30)."""
    assert TABLE_COLUMNS[:7] == ["run", "AUROC", "AURC", "acc @ 50%", "acc @ 80%", "accuracy", "n"]


def test_a_label_with_markup_is_shown_as_text_in_the_heading(tmp_path):
    write_runs(tmp_path, RUNS[:1])
    runs.write_label(tmp_path / "val", '<a href="https://evil.example">Log in</a>')
    heading = selective_view(LabContext(tmp_path), ["val"], confidence.DEFAULT, 0.5)[3]
    assert "&lt;a href=" in heading and "<a " not in heading


def test_a_signal_a_run_cannot_give_is_said_not_drawn(lab):
    figure, table, _, _, message = selective_view(lab, ["test"], "full_vocab", 0.5)
    assert figure is None and table.empty and "letter scoring" in message


def test_margin_signal_ranks_too(lab):
    _, table, _, _, _ = selective_view(lab, ["test"], "margin", 0.2)
    assert table.loc[0, "signal"] == "margin" and 0.5 < table.loc[0, "AUROC"] <= 1


def test_workbench_fits_on_validation_applies_to_test_and_saves(lab):
    message, figure, table, cal = fit_and_apply(lab, "val", "test", "isotonic", "max_prob", 10)
    assert "lab-ok" in message and cal is not None and len(figure.data) > 0
    before, after = (float(table.loc[0, c].split()[0]) for c in ("before", "after"))
    assert after < before / 2  # the runs are over-confident alike: a held-out fit helps
    saved = save_calibrator(lab, cal)
    assert "Saved as calibrators/" in saved
    (label, name), = runs.calibrator_choices(lab.runs)
    assert "isotonic regression of top probability" in label
    loads = []
    with pytest.MonkeyPatch.context() as patch:  # a poll lists the saved calibrators without re-reading them
        patch.setattr(runs.calibrators, "load", lambda d: loads.append(d))
        assert runs.calibrator_choices(lab.runs) == [(label, name)] and not loads
    figure, note = reliability_view(lab, ["test"], None, VIEWS[0], None, name)
    assert figure is not None and "optimistic" not in note
    _, note = reliability_view(lab, ["val"], None, VIEWS[0], None, name)
    assert "400 of these 400 questions were used to fit" in note  # marked, on the page that shows it


def test_the_saved_note_appears_beside_the_save_button(lab):
    """It was added at the foot of the page, under the figures, out of view of the button (issue 30)."""
    import gradio as gr

    from ui.recalibration_page import build_recalibration

    with gr.Blocks() as demo:
        build_recalibration(lab)
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    assert by_id["recal-saved"].parent is by_id["recal-save"].parent


def test_workbench_says_when_the_signal_it_calibrates_is_no_probability(lab):
    assert "not a probability" in fit_and_apply(lab, "val", "test", "isotonic", "margin", 10)[0]
    assert "not a probability" not in fit_and_apply(lab, "val", "test", "isotonic", "max_prob", 10)[0]


def _report(ece: float, low: float, high: float) -> dict:
    return {"ece": ece, "ece_ci_low": low, "ece_ci_high": high, "smece": ece, "brier": 0.2, "nll": 0.6,
            "accuracy": 0.5, "n": 400}


def test_an_ece_outside_its_own_bootstrap_range_says_what_the_range_is():
    """Issue 30: Platt's "after" read "0.09 [0.1, 8.2]", the point outside its interval. The
    bracket is the middle 95 % of the ECEs of resampled questions, which binning biases upward
    more than the ECE itself: the table says so, and a note explains a point below its range."""
    from ui.recalibration_page import metrics_table, range_note

    report = {"before": _report(0.25, 0.21, 0.31), "after": _report(0.0009, 0.001, 0.082)}
    row = metrics_table(report).iloc[0]
    assert row["metric"] == "ECE % [95% range of resampled ECE]" and row["after"] == "0.09 [0.1, 8.2]"
    said = range_note(report)
    assert "after" in said and "before" not in said and "below" in said and "upward" in said
    assert range_note({"before": _report(0.25, 0.21, 0.31), "after": _report(0.05, 0.03, 0.08)}) == ""


def test_workbench_refuses_the_same_questions_in_red(lab):
    message, figure, table, cal = fit_and_apply(lab, "val", "val", "platt", "max_prob", 10)
    assert "Refused" in message and "lab-error" in message and figure is None and cal is None


def test_workbench_and_pages_refuse_names_outside_the_runs(lab):
    assert "Pick the run" in fit_and_apply(lab, "../../etc", "test", "platt", "max_prob", 10)[0]
    _, message = reliability_view(lab, ["test"], None, VIEWS[0], None, "../../etc")
    assert "No saved calibrator" in message


def test_robustness_view_draws_ece_against_bins_and_flags_small_runs(lab):
    figure, message = reliability_view(lab, ["test", "small"], None, VIEWS[2])
    names = {t.name for t in figure.data}
    assert {"equal-width bins", "equal-mass bins"} <= names
    assert message.count("lab-note") == 1 and "n=120" in message and "Only 120 questions" in message


def test_every_drawn_ece_has_its_interval(lab):
    figure, _ = reliability_view(lab, ["test"], None, VIEWS[0])
    stats = [a.text for a in figure.layout.annotations if a.text and a.text.startswith("ECE")]
    assert stats and "[" in stats[0]


def test_the_link_opens_case_studies_below_the_threshold(lab):
    tabs, picker, kind, lo, hi, signal, dataset, _, note = open_below_threshold(lab, [], [], ["test", "val"],
                                                                                "max_prob", 0.7, None)
    assert tabs.selected == "cases" and picker["value"] == "test" and kind["value"] == "all"
    assert (lo["value"], hi["value"], signal["value"], dataset["value"]) == (0, 0.7, "max_prob", "")
    assert re.match(r"\*\*\d+ of 400 questions\.\*\* Keeps every question, confidence 0–0\.7", note)
    assert calibrators.METHODS.in_order() == ["temperature", "platt", "isotonic", "histogram"]


@pytest.mark.parametrize("signal, threshold", [("max_prob", 0.6), ("margin", 0.2), ("certainty", 0.3)])
def test_case_studies_keep_exactly_the_questions_the_threshold_drops(lab, signal, threshold):
    """Issue 30: with the margin at 0.2 the page said 15 questions fall below, and Case studies
    showed all of them ("Keeps every question"): it ranged over the top probability only."""
    from ui.cases_page import cases_view

    _, _, dropped, heading, _ = selective_view(lab, ["test"], signal, threshold)
    below = int(re.match(r"\*\*(\d+) questions of", heading).group(1))
    assert 0 < below == len(dropped) < 400
    _, picker, kind, lo, hi, picked, _, drawn, note = open_below_threshold(lab, [], [], ["test"], signal, threshold,
                                                                           "confidence, low to high")
    table, _, said = cases_view(lab, picker["value"], kind["value"], lo["value"], hi["value"], "",
                                signal=picked["value"])
    assert sorted(table["id"]) == sorted(dropped["id"]) == sorted(drawn["value"]["id"])  # the reply draws the view
    assert note == said
    title = "confidence" if signal == confidence.DEFAULT else confidence.SIGNALS.get(signal).title
    assert said.startswith(f"**{below} of 400 questions.**") and f"{title} 0–{threshold:g}" in said


def test_the_temperature_lab_gives_the_interval_and_says_its_optima_flatter(lab):
    from ui.temperature_page import typed_temperature

    text = typed_temperature(lab, "test", 2.0, None, "logit", "").text  # 2.0 typed into the box
    shown = [float(x) for x in re.search(r"\[95% CI ([\d.]+)–([\d.]+)%\]", text).groups()]
    pred = lab.results.predictions(runs.evaluation(lab.runs, "test"))
    choice, conf = metrics.predictions(analysis.recalibrate(pred, 2.0), pred.mask)
    expected = metrics.ece_bootstrap(conf, choice == pred.labels, 10, 1000, 0.95, 0, pred.bin_edges)
    assert shown == pytest.approx([100 * e for e in expected], abs=0.051)  # to the one decimal shown
    assert "fitted on these same questions" in text


@pytest.mark.parametrize("order", [["confidence, low to high"], {"a": 1}, "sideways"])
def test_the_link_answers_a_hostile_order_with_a_message(lab, order):
    """A browser can send a list of valid choices where one is meant (gradio's dropdown lets it through)."""
    *_, table, note = open_below_threshold(lab, [], [], ["test"], "max_prob", 0.7, order)
    assert "Expected `order` to be one of" in note and table["value"].empty
