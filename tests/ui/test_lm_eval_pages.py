"""lm-eval tasks on the pages (issue 40): the Launch form's task picker and the fields an lm-eval task decides,
and how Results, Life cycle and a job's page name an lm-eval run (task and shots) and show its figures. The
picker in Chromium is in tests/browser/test_launch_form.py."""
from __future__ import annotations

import re

import gradio as gr
import pytest

from lab.data import harness
from lab.data.templates import LM_EVAL, default_template
from lab.results import runs, series, tables
from tests.helpers import form_values, row, write_eval
from ui import forms
from ui.job_results import job_results
from ui.launch_page import FOLLOW_DATASET, change_dataset, change_task, fill_tasks

SHIPPED = ["bundled_arc_challenge", "bundled_arc_easy", "bundled_boolq", "bundled_mmlu", "bundled_openbookqa"]


@pytest.fixture
def no_index(monkeypatch):
    """A process whose lm-eval index has not been read into the picker yet."""
    monkeypatch.setattr(forms, "_INDEX", [])


def _values(kind: str = "evaluate", **given) -> list:
    """The form's widget values: the defaults, with ``given`` typed in."""
    return form_values(kind, **given)


def _followers(values: list) -> list:
    names = [f.name for f in forms.fields("evaluate")]
    return [values[names.index(n)] for n in FOLLOW_DATASET]


def _apply(values: list, dataset: str) -> list:
    """What the page does when ``dataset`` is picked: the dataset set, then its followers' updates."""
    names = [f.name for f in forms.fields("evaluate")]
    values = list(values)
    values[names.index("dataset")] = dataset
    for name, update in zip(FOLLOW_DATASET, change_dataset("evaluate", dataset, *_followers(values))):
        if isinstance(update, dict) and "value" in update:
            values[names.index(name)] = update["value"]
    return values


# ---------------------------------------------------------------- the picker
@pytest.mark.unit
def test_the_picker_offers_the_shipped_tasks_at_once_after_the_lab_datasets(no_index):
    choices = forms.dataset_choices("evaluate")
    lab = [c for c in choices if isinstance(c, str)]
    tasks = [c for c in choices if not isinstance(c, str)]
    assert choices[:len(lab)] == lab and "arc_easy" in lab  # the lab's datasets first, as before
    assert [value for _, value in tasks] == [harness.PREFIX + name for name in SHIPPED]
    assert all(label == f"{value} — {forms.SHIPPED_NOTE}" for label, value in tasks)
    assert forms.dataset_choices("evaluate", "clm") == ["synthetic", "text", "trex"]  # a token task takes none
    datasets, _ = change_task("evaluate", "mcq", "text", "test")
    assert datasets["choices"] == choices


@pytest.mark.unit
def test_opening_the_picker_adds_lm_evals_list_once_offline_first_labelled_by_what_it_needs(no_index, monkeypatch):
    listed = [("hellaswag", "hub"), ("my_local", "offline"), ("gsm8k", "generate_until"), ("mmlu", "group"),
              ("ai2_arc", "tag"), ("bundled_arc_easy", "offline")]
    calls = []
    monkeypatch.setattr(harness, "task_list", lambda include=None: calls.append(include) or listed)
    update, filled = fill_tasks("evaluate", "mcq", False)
    tasks = [c for c in update["choices"] if not isinstance(c, str)][len(SHIPPED):]
    assert filled is True and tasks == [
        ("lm-eval:my_local — offline", "lm-eval:my_local"),
        ("lm-eval:ai2_arc — tag: a set of tasks (needs the network unless they are offline)", "lm-eval:ai2_arc"),
        ("lm-eval:hellaswag — hub (needs the network)", "lm-eval:hellaswag"),
        ("lm-eval:mmlu — group (needs the network unless its tasks are offline)", "lm-eval:mmlu")]
    assert fill_tasks("evaluate", "mcq", True) == (gr.skip(), True)  # this page has it: not sent again
    assert fill_tasks("evaluate", "clm", False) == (gr.skip(), False)  # nothing of lm-eval's feeds clm
    assert fill_tasks("evaluate", "mcq", False)[1] and calls == [None]  # another page: the index read once
    datasets, _ = change_task("evaluate", "mcq", "arc_easy", "validation")  # the task's list keeps it
    assert ("lm-eval:hellaswag — hub (needs the network)", "lm-eval:hellaswag") in datasets["choices"]


@pytest.mark.unit
@pytest.mark.slow
def test_lm_evals_own_list_names_the_network_and_leaves_out_what_the_lab_cannot_score(no_index):
    choices = dict((value, label) for label, value in forms.lm_eval_index())
    assert choices["lm-eval:hellaswag"] == "lm-eval:hellaswag — hub (needs the network)"
    assert "lm-eval:gsm8k" not in choices  # generate_until: refused at submit, so not offered
    assert "lm-eval:prost" in choices and "hub" in choices["lm-eval:prost"]  # its data_files are hf:// URLs
    assert not set(choices) & {harness.PREFIX + name for name in SHIPPED}  # listed once, first


@pytest.mark.unit
def test_the_page_is_built_without_reading_lm_evals_index(tmp_path, no_index, monkeypatch):
    from ui.context import LabContext
    from ui.launch_page import build_launch

    monkeypatch.setattr(harness, "task_list", lambda include=None: pytest.fail("the page build read the index"))
    with gr.Blocks() as page:
        build_launch(LabContext(tmp_path / "runs"))
    picker = next(b for b in page.blocks.values() if getattr(b, "elem_id", None) == "evaluate-dataset")
    assert ["lm-eval:bundled_mmlu — offline, ships with the lab", "lm-eval:bundled_mmlu"] in \
        [list(c) for c in picker.choices]
    assert "lm-eval:<task>" in picker.info and picker.filterable and picker.allow_custom_value
    names = {getattr(b, "elem_id", None) for b in page.blocks.values()}
    assert {"evaluate-num_fewshot", "evaluate-lm_eval_include"} <= names


# ---------------------------------------------------------------- the fields a task decides
@pytest.mark.unit
def test_picking_an_lm_eval_task_after_letter_scoring_submits_without_a_refusal():
    values = _apply(_values(scoring="letter", template="mmlu_letter", num_fewshot="2"), "lm-eval:bundled_arc_easy")
    config = forms.config_from_values("evaluate", values)
    assert (config["dataset"], config["scoring"], config["template"], config["data_files"], config["num_fewshot"]) \
        == ("lm-eval:bundled_arc_easy", "cloze", LM_EVAL, [], 2)


@pytest.mark.unit
def test_going_back_to_a_lab_dataset_puts_its_template_and_sample_back():
    picked = _apply(_values(lm_eval_include="tasks"), "lm-eval:bundled_boolq")
    names = [f.name for f in forms.fields("evaluate")]
    assert (picked[names.index("template")], picked[names.index("data_files")]) == (LM_EVAL, "")
    back = _apply(picked, "arc_easy")
    assert [back[names.index(n)] for n in ("template", "data_files", "lm_eval_include")] == ["", "bundled", ""]
    assert forms.config_from_values("evaluate", back)["template"] == default_template("arc_easy", "cloze")


@pytest.mark.unit
def test_a_lab_dataset_changes_nothing_the_user_set():
    assert forms.dataset_fields("obqa", {"template": "mmlu_letter", "scoring": "letter", "data_files": "x.jsonl"}) == {}
    assert change_dataset("evaluate", "obqa", *_followers(_values(template="mmlu_letter"))) == \
        [gr.skip()] * len(FOLLOW_DATASET)
    kept = forms.dataset_fields("custom", {"template": LM_EVAL, "data_files": "/up/questions.jsonl"})
    assert kept == {"template": ""}  # an uploaded file stays


# ---------------------------------------------------------------- labels and tables
def _lm_eval_run(directory, shots=(5, 5), name="<b>bundled_mmlu</b>"):
    subtasks = {f"{name}_{i}": {"n": 2, "accuracy": 0.5, "ece": 0.25, "brier": 0.5, "nll": 0.7, "shots": s,
                                "accuracy_norm": 1.0} for i, s in enumerate(shots)}
    tasks = {task: {"shots": s, "split": "test", "n": 2, "metrics": ["acc", "acc_norm"]}
             for task, s in zip(subtasks, shots)}
    rows = [row(i, [0.7, 0.3], i % 2, task=list(subtasks)[i // 2], doc_id=i % 2) for i in range(4)]
    return write_eval(directory, rows, dataset=f"lm-eval:{name}", split="validation", scoring="cloze",
                      template=LM_EVAL, accuracy=0.5, ece=0.2, accuracy_norm=0.75, ece_norm=0.125, n=4,
                      lm_eval={"tasks": tasks, "groups": {name: list(tasks)}, "fewshot_seed": 1234,
                               "version": "0.4.13"}, subtasks=subtasks)


@pytest.mark.unit
def test_results_name_an_lm_eval_run_by_its_task_and_shots(tmp_path):
    _lm_eval_run(tmp_path / "00001-evaluate", name="bundled_mmlu")
    _lm_eval_run(tmp_path / "00002-evaluate", shots=(0, 5), name="bundled_mmlu")
    write_eval(tmp_path / "00003-evaluate", [row(0, [0.6, 0.4], 0)])
    found = {r.name: r for r in runs.scan(tmp_path).evaluations}
    five, mixed, lab = found["00001-evaluate"], found["00002-evaluate"], found["00003-evaluate"]
    assert (five.dataset_label, five.split) == ("lm-eval:bundled_mmlu (5-shot)", "test")  # the task's split
    assert " · lm-eval:bundled_mmlu (5-shot) · cloze (lm_eval) · n=4 · " in five.label
    assert mixed.dataset_label == "lm-eval:bundled_mmlu (0–5-shot)"
    assert (lab.dataset_label, lab.shots) == ("arc_challenge", None) and " · arc_challenge/test · " in lab.label
    table = tables.results_table(tmp_path).set_index("folder")
    assert table.loc["00001-evaluate", "dataset"] == "lm-eval:bundled_mmlu (5-shot)"
    assert table.loc["00003-evaluate", "dataset"] == "arc_challenge"


@pytest.mark.unit
def test_life_cycle_names_a_task_with_its_shots():
    assert series.task_label({"task": "mcq", "dataset": "lm-eval:bundled_mmlu", "split": "validation",
                              "num_fewshot": 5}) == "mcq · lm-eval:bundled_mmlu (5-shot)"
    assert series.task_label({"task": "mcq", "dataset": "lm-eval:bundled_boolq", "split": "validation",
                              "num_fewshot": None}) == "mcq · lm-eval:bundled_boolq (the task's own shots)"
    assert series.task_label({"task": "clm", "dataset": "text", "split": "test"}) == "clm · text/test"


@pytest.mark.unit
def test_a_group_runs_page_shows_both_accuracies_with_their_ece_and_each_task_below_the_group(tmp_path):
    run_dir = _lm_eval_run(tmp_path / "00001-evaluate", shots=(5, 0))
    text = job_results(tmp_path, "evaluate", str(run_dir)).text
    assert "**acc 50.0%** (ECE 20.0%) · **acc_norm 75.0%** (ECE 12.5%" in text and "lm-eval 0.4.13" in text
    lines = text.splitlines()
    head = lines.index("| task | n | shots | accuracy | accuracy_norm | ECE |")
    assert lines[head + 2] == "| **&lt;b&gt;bundled_mmlu&lt;/b&gt;** (group, all documents) | 4 | – | 50.0% | 75.0% | 20.0% |"
    assert lines[head + 3:head + 5] == ["| &lt;b&gt;bundled_mmlu&lt;/b&gt;_0 | 2 | 5 | 50.0% | 100.0% | 25.0% |",
                                        "| &lt;b&gt;bundled_mmlu&lt;/b&gt;_1 | 2 | 0 | 50.0% | 100.0% | 25.0% |"]
    assert "<b>" not in text and str(tmp_path) not in text


@pytest.mark.unit
def test_a_lab_datasets_page_has_no_lm_eval_lines(tmp_path):
    run_dir = write_eval(tmp_path / "00001-evaluate", [row(0, [0.6, 0.4], 0)])
    text = job_results(tmp_path, "evaluate", str(run_dir)).text
    assert "lm-eval" not in text and not re.search(r"\| task \|", text)


@pytest.mark.unit
def test_the_dataset_line_keeps_its_lm_eval_hint_after_a_refusal_is_cleared():
    """A refusal's mark is cleared by drawing each field's line again: the dataset's lost the lm-eval hint
    it was built with (seen on the form after Submit)."""
    from ui import launch_page

    names = [f.name for f in forms.fields("evaluate")]
    marks = launch_page.field_marks("evaluate", "")
    assert marks[names.index("dataset")]["info"].endswith(launch_page.LM_EVAL_INFO)
