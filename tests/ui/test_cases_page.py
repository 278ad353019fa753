"""Case studies (issue #15): the page's handlers called as the wiring calls them, on a runs folder
built by hand with the real writer; numbers worked out by hand below. lab.results.cases' own filtering is
also in tests/results/test_analysis.py."""
import re

import gradio as gr
import numpy as np
import pandas as pd
import pytest

from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import write_evaluation
from lab.results import cases, runs
from ui import cases_page
from ui.context import LabContext

pytestmark = pytest.mark.unit

# ten 4-option questions: confidence c on option A, the rest shared; answer A (right) or B (wrong)
CONF = [0.95, 0.9, 0.8, 0.7, 0.65, 0.6, 0.55, 0.51234, 0.4, 0.45]
RIGHT = [True, False, True, False, True, False, True, False, True, False]  # accuracy 0.5
# q0-q5 mmlu (accuracy 0.5, wrong: q1 .9, q3 .7, q5 .6), q6-q9 obqa (accuracy 0.5, wrong: q7 .512, q9 .45)


def _row(i, probs, answer, source):
    pred = int(np.argmax(probs))
    return {"id": f"q{i}", "source": source, "question": f"A long question number {i}? " * 20,
            "choices": ["alpha", "beta", "gamma", "delta"], "answer": answer, "probs": probs, "pred": pred,
            "confidence": max(probs), "correct": pred == answer}


@pytest.fixture
def ctx(tmp_path):
    rows = [_row(i, [c] + [(1 - c) / 3] * 3, 0 if right else 1, "mmlu" if i < 6 else "obqa")
            for i, (c, right) in enumerate(zip(CONF, RIGHT))]
    write_evaluation(tmp_path / "00001-evaluate", rows, EvalConfig(dataset="mmlu", bootstrap=0), {"model": "bundled"})
    other = [_row(3, [0.1234567, 0.654321, 0.111, 0.1112223], 1, "obqa")]
    write_evaluation(tmp_path / "00002-cft" / "eval" / "base-obqa", other,
                     EvalConfig(dataset="obqa", scoring="cloze", bootstrap=0), {"model": "bundled"})
    return LabContext(tmp_path)


def test_the_key_columns_come_first_and_confidences_have_three_digits(ctx):
    table, datasets, note = cases_page.cases_view(ctx, "00001-evaluate", "all", 0.0, 1.0, "")
    assert list(table.columns) == ["confidence", "prediction", "answer", "correct", "question", "options",
                                   "dataset", "id"]
    assert table["confidence"].tolist() == [0.9, 0.7, 0.6, 0.512, 0.45, 0.95, 0.8, 0.65, 0.55, 0.4]
    assert table["id"].tolist()[:5] == ["q1", "q3", "q5", "q7", "q9"]  # wrong answers first, surest first
    assert set(datasets["choices"]) == {"", "mmlu", "obqa"}
    assert note.startswith("**10 of 10 questions.**") and "10 of 10 (100%) questions" in note


def test_the_note_explains_the_filter_with_its_threshold_and_coverage(ctx):
    table, _, note = cases_page.cases_view(ctx, "00001-evaluate", "overconfident_wrong", 0.0, 1.0, "")
    assert table["id"].tolist() == ["q1", "q3", "q5", "q7"]  # q9 (0.45) is below the accuracy, 0.5
    assert "confidence above 0.5, the accuracy of these questions" in note
    assert "4 of 5 (80%) wrong answers at confidence 0.512–0.9" in note
    _, _, obqa = cases_page.cases_view(ctx, "00001-evaluate", "overconfident_wrong", 0.0, 1.0, "obqa")
    assert "1 of 2 (50%) wrong answers at confidence 0.512–0.512" in obqa and "(dataset obqa)" in obqa
    _, _, right = cases_page.cases_view(ctx, "00001-evaluate", "correct", 0.6, 1.0, "")
    assert "the right answers, confidence 0.6–1" in right and "3 of 5 (60%) right answers" in right
    empty, _, none = cases_page.cases_view(ctx, "00001-evaluate", "wrong", 0.96, 1.0, "")
    assert empty.empty and list(empty.columns) == cases_page.COLUMNS and "0 of 5 (0%) wrong answers." in none


@pytest.mark.parametrize("order, ids", [
    ("most over-confident wrong first", ["q1", "q3", "q5", "q7", "q9", "q0", "q2", "q4", "q6", "q8"]),
    ("confidence, high to low", ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q9", "q8"]),
    ("confidence, low to high", ["q8", "q9", "q7", "q6", "q5", "q4", "q3", "q2", "q1", "q0"]),
    ("dataset, then confidence high to low", ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q9", "q8"]),
])
def test_sort_by(ctx, order, ids):
    assert order in cases_page.cases.SORT_ORDERS
    table, _, _ = cases_page.cases_view(ctx, "00001-evaluate", "all", 0.0, 1.0, "", order)
    assert table["id"].tolist() == ids


def test_an_unknown_order_or_run_says_so(ctx):
    table, _, note = cases_page.cases_view(ctx, "00001-evaluate", "all", 0.0, 1.0, "", "by colour")
    assert table.empty and "Expected `order` to be one of" in note
    assert cases_page.cases_view(ctx, "../../etc", "all", 0.0, 1.0, "")[2] == "Pick an evaluation run."


def test_same_question_shows_run_labels_and_rounded_probabilities(ctx):
    names = ["00001-evaluate", "00002-cft/eval/base-obqa", "/etc"]
    answers = cases_page.same_question_view(ctx, " q3 ", names)
    labels = [runs.evaluation(ctx.runs, n).label for n in names[:2]]
    assert answers["run"].tolist() == labels
    assert list(answers.columns) == ["run", "answer", "prediction", "confidence", "correct", "probabilities"]
    assert answers["confidence"].tolist() == [0.7, 0.654]
    assert answers["probabilities"].tolist() == ["A 0.7 · B 0.1 · C 0.1 · D 0.1", "A 0.123 · B 0.654 · C 0.111 · D 0.111"]
    assert answers["correct"].tolist() == [False, True]
    assert str(ctx.runs) not in answers.to_string()  # no path anywhere
    assert cases_page.same_question_view(ctx, "", names).empty


def test_describe_and_sort_cases_directly():
    df = pd.DataFrame({"dataset": ["x", "x", "y"], "confidence": [0.9, 0.3, 0.8], "correct": [False, True, False]})
    df["overconfident_wrong"] = np.where(df["correct"], 0.0, df["confidence"])
    assert cases.overconfidence_threshold(df) == pytest.approx(1 / 3)
    shown = cases.filter_cases(df, "overconfident_wrong")
    assert cases.describe_cases(df, shown, "overconfident_wrong", (0.0, 1.0)) == (
        "Keeps wrong answers given with a confidence above 0.333, the accuracy of these questions: the model "
        "claimed a hit rate it does not reach. Shown: 2 of 2 (100%) wrong answers at confidence 0.8–0.9.")
    assert cases.sort_cases(df, "confidence, low to high")["confidence"].tolist() == [0.3, 0.8, 0.9]
    with pytest.raises(ValueError, match="order"):
        cases.sort_cases(df, "nope")


def test_every_filter_is_explained_on_the_page():
    for label, _ in cases_page.KIND_CHOICES:
        assert f"**{label}**" in cases_page.KIND_HELP
    assert {value for _, value in cases_page.KIND_CHOICES} == set(cases.CASE_KINDS)


def test_headers_have_room_to_stay_on_one_line():
    """A header shares its cell with the column menu's button (≈ 30 px); letters ≈ 8 px at 14 px."""
    assert len(cases_page.COLUMN_WIDTHS) == len(cases_page.COLUMNS)
    for header, width in zip(cases_page.COLUMNS, cases_page.COLUMN_WIDTHS):
        assert int(re.fullmatch(r"(\d+)px", width)[1]) >= 8 * len(header) + 30, header
    key = sum(int(w[:-2]) for w in cases_page.COLUMN_WIDTHS[:4])
    assert key + int(cases_page.COLUMN_WIDTHS[4][:-2]) < 1440 - 100  # the key columns and the question fit


def test_the_page_builds_with_these_table_settings_and_hands_back_its_picker(ctx):
    with gr.Blocks():
        controls = cases_page.build_cases(ctx)
    picker = controls.picker  # a job's page and the selective page open runs here
    assert isinstance(picker, gr.Dropdown) and picker.label == "Evaluation run"
    assert controls.hi.maximum == 1 and controls.kind.value == cases_page.DEFAULT_KIND
