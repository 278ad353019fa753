"""Pages that are never stale and polls that cost nothing when nothing changed: the run pickers
follow the catalogue, the Jobs page opens on the running job and resends only what changed, a
job's own page shows what it produced, runs are named for what they are (and renameable), and
only the visible page's timers run."""
from __future__ import annotations

import json
import time
from pathlib import Path

import gradio as gr
import pytest

from lab import runs
from lab.compare import COMPARE_FILE
from lab.evaluate import EvalConfig, write_evaluation
from lab.events import EventWriter
from lab.layout import REPORT_MD
from ui import components, jobs_page
from ui.context import LabContext
from ui.job_results import job_results

SKIP = gr.skip()


def _rows(n: int = 20) -> list[dict]:
    """Two-option questions, the first half right at confidence 0.9, the rest wrong at 0.8."""
    rows = []
    for i in range(n):
        right = i < n // 2
        probs = [0.9, 0.1] if right else [0.8, 0.2]
        rows.append({"id": f"q{i}", "question": f"Question {i}?", "choices": ["yes", "no"], "answer": 0 if right else 1,
                     "probs": probs, "pred": 0, "confidence": probs[0], "correct": right, "source": "toy"})
    return rows


def _evaluation(directory: Path, **config) -> Path:
    cfg = EvalConfig(**{"dataset": "obqa", "scoring": "letter", "template": "first", "bootstrap": 50, **config})
    write_evaluation(directory, _rows(), cfg, {"model": "bundled"})
    return directory


# ---------------------------------------------------------------- names
def test_a_run_is_named_for_what_it_is_and_can_be_renamed(tmp_path):
    run = runs.evaluation(tmp_path, _evaluation(tmp_path / "00003-evaluate").name)
    assert run.label.startswith("00003 · bundled · obqa/test · letter (first) · n=20 · ")
    assert runs.evaluation_choices(tmp_path) == [(run.label, "00003-evaluate")]  # the browser sends back the folder
    assert runs.write_label(run.path, "  letter\nbaseline  ") == "letter baseline"  # one line, trimmed
    assert runs.evaluation(tmp_path, "00003-evaluate").label == "letter baseline"
    assert len(runs.write_label(run.path, "x" * 1000)) == runs.MAX_LABEL
    assert runs.write_label(run.path, "") is None and runs.evaluation(tmp_path, "00003-evaluate").label == run.label


def test_labels_name_adapters_and_pipeline_parts_without_whole_paths():
    label = runs.describe_run("bundled", "/home/u/runs/00005-cft/models/rcft/adapter", "mmlu", "test", "letter",
                              "cft_chat", 100, 0.0, "00005-cft/eval/rcft-in_domain")
    assert label == "00005 · eval/rcft-in_domain · bundled + models/rcft · mmlu/test · letter (cft_chat) · n=100"


def test_rename_from_the_job_page(tmp_path):
    ctx = LabContext(tmp_path)
    _evaluation(tmp_path / "00001-evaluate")
    assert "Renamed to: cloze run" in jobs_page.rename_run(ctx, "00001-evaluate", "cloze run")
    assert runs.evaluation_choices(tmp_path)[0][0] == "cloze run"
    assert "no evaluation" in jobs_page.rename_run(ctx, "../elsewhere", "x")


# ---------------------------------------------------------------- pickers follow the catalogue
def test_a_picker_fills_picks_the_newest_and_then_sends_only_changes(tmp_path):
    ctx = LabContext(tmp_path)
    follow = jobs_follow = components.follow_catalogue
    update, seen = follow(ctx, runs.evaluation_choices, False, True, None, None)
    assert update["choices"] == [] and "value" not in update  # nothing to pick yet
    assert follow(ctx, runs.evaluation_choices, False, True, None, seen) == (SKIP, seen)  # quiet: nothing sent
    _evaluation(tmp_path / "00001-evaluate")
    update, seen = follow(ctx, runs.evaluation_choices, False, True, None, seen)
    assert update["value"] == "00001-evaluate"  # picked, so the page draws it
    time.sleep(0.01)
    _evaluation(tmp_path / "00002-evaluate")
    update, seen = jobs_follow(ctx, runs.evaluation_choices, True, True, ["00001-evaluate"], seen)
    assert [name for _, name in update["choices"]] == ["00002-evaluate", "00001-evaluate"]
    assert "value" not in update  # a run the user picked stays picked
    assert follow(ctx, runs.evaluation_choices, True, True, ["00001-evaluate"], seen) == (SKIP, seen)
    update, _ = follow(ctx, runs.evaluation_choices, True, True, [], None)
    assert update["value"] == ["00002-evaluate"]  # a multi-picker opens on the newest run
    update, _ = follow(ctx, runs.evaluation_choices, False, False, None, None)
    assert "value" not in update  # pick_newest=False: listed, not picked


# ---------------------------------------------------------------- the jobs page
def test_the_jobs_page_opens_on_the_running_job_not_the_first_queued(tmp_path):
    ctx = LabContext(tmp_path)
    first = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    running = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    ctx.store.update(running.id, status="running", started=time.time())
    _, picker, _, sent = jobs_page.refresh_all(ctx, None)
    assert picker["value"] == running.id and first.id != running.id
    table, picker, banner, sent = jobs_page.refresh_all(ctx, running.id, sent)
    assert (table, picker, banner) == (SKIP, SKIP, SKIP)  # nothing changed: nothing resent
    ctx.store.update(running.id, status="succeeded", finished=time.time())
    table, picker, _, _ = jobs_page.refresh_all(ctx, running.id, sent)
    assert table is not SKIP and picker is not SKIP  # a status changed: the table and the picker's labels


def test_a_poll_resends_only_what_changed(tmp_path):
    ctx = LabContext(tmp_path)
    job = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    ctx.store.update(job.id, status="running", started=time.time())
    events = EventWriter(Path(job.run_dir) / "events.jsonl")
    events.emit("stage", name="scoring")
    *_, sent = jobs_page.show(ctx, job.id, {})
    quiet = jobs_page.poll(ctx, job.id, sent)
    assert quiet[1:-1] == (SKIP,) * 9  # only the status line (its elapsed time) is sent
    events.emit("scoring", step=16, total=100)
    busy = jobs_page.poll(ctx, job.id, quiet[-1])
    assert "scoring 16/100" in busy[0] and busy[8] is not SKIP  # the activity grew
    assert jobs_page.poll(ctx, job.id + 1, busy[-1]) == (SKIP,) * 11  # not the job this panel shows


def test_a_finished_evaluation_shows_its_numbers_and_diagram_on_its_page(tmp_path):
    ctx = LabContext(tmp_path)
    job = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    _evaluation(Path(job.run_dir))
    ctx.store.update(job.id, status="succeeded", finished=time.time())
    found = job_results(ctx.runs, "evaluate", job.run_dir)
    assert "**Accuracy 50.0%**" in found.text and "**ECE" in found.text and "95% interval" in found.text
    assert "n = 20" in found.text and found.run == Path(job.run_dir).name and found.figure is not None
    out = jobs_page.show(ctx, job.id, {})
    assert out[2]["visible"] is True and out[5]["visible"] is True  # the diagram and the links row
    assert out[6]["visible"] is False and out[7]["visible"] is False  # no training or sweep: no empty frames


def test_pipelines_show_their_report_and_a_compare_its_answers(tmp_path):
    ctx = LabContext(tmp_path)
    first = tmp_path / "00001-first"
    first.mkdir()
    (first / REPORT_MD).write_text("| model | ECE |\n|---|---|\n| FIRST | 3.1 |\n")
    assert "| FIRST | 3.1 |" in job_results(ctx.runs, "first", str(first)).text
    compare = tmp_path / "00002-compare"
    compare.mkdir()
    result = {"question": "Capital of Norway?", "options": ["Oslo", "Bergen"], "results": [
        {"label": "bundled", "probs": [0.7, 0.3], "prediction": 0, "temperature": None,
         "generation": {"text": "Oslo", "sequence_prob": 0.5, "first_token_prob": 0.6}}]}
    (compare / COMPARE_FILE).write_text(json.dumps(result))
    shown = job_results(ctx.runs, "compare", str(compare))
    assert "Capital of Norway?" in shown.text and shown.table["answer"].tolist() == ["Oslo"]
    assert shown.figure is not None
    assert job_results(ctx.runs, "finetune", str(tmp_path / "00003-finetune")).figure is None


# ---------------------------------------------------------------- only the visible page polls
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from ui.app import build

    return build(LabContext(tmp_path_factory.mktemp("runs")))


def test_no_timer_runs_until_its_page_is_shown(demo):
    from ui.app import timer_states, timers_in

    every = timers_in(demo)
    assert len(every) >= 4 and not any(t.active for t in every)  # the Launch page, first shown, polls nothing
    states = timer_states(every[:1], every)
    assert [s.active for s in states] == [True] + [False] * (len(every) - 1)


def test_an_idle_queue_sleeps_between_events(demo):
    from ui.app import IDLE_WAKE_S

    assert demo._queue.sleep_when_free >= IDLE_WAKE_S and demo._queue.progress_update_sleep_when_free >= IDLE_WAKE_S


def test_the_results_table_follows_the_runs_folder(tmp_path):
    from ui.results_page import follow_results

    ctx = LabContext(tmp_path)
    table, seen = follow_results(ctx, None)
    assert table.empty and follow_results(ctx, seen) == (SKIP, seen)
    _evaluation(tmp_path / "00001-evaluate")
    table, seen = follow_results(ctx, seen)
    assert table["folder"].tolist() == ["00001-evaluate"] and follow_results(ctx, seen) == (SKIP, seen)
