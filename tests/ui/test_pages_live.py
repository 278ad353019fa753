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

from lab.core.events import EventWriter
from lab.core.layout import REPORT_MD
from lab.kinds.compare.run import COMPARE_FILE
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import write_evaluation
from lab.results import runs
from ui import components, jobs_page
from ui.context import LabContext
from ui.job_results import job_results

pytestmark = pytest.mark.unit

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
    cfg = EvalConfig(**{"dataset": "obqa", "split": "test", "scoring": "letter", "template": "first", "bootstrap": 50,
                        **config})
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


def test_a_rename_redraws_the_job_page_at_once(tmp_path):
    """The `Run:` line and the diagram's title kept the old name until the page was reopened, and the
    confirmation showed at the top of the page, far from the Rename button (issue 30)."""
    ctx = LabContext(tmp_path)
    job = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    _evaluation(Path(job.run_dir))
    ctx.store.update(job.id, status="succeeded", finished=time.time())
    name = Path(job.run_dir).name
    said, text, figure, *_ = jobs_page.rename_and_redraw(ctx, job.id, name, "letter baseline")
    assert "Renamed to: letter baseline" in said
    assert "Run: **letter baseline**" in text and figure["value"].layout.title.text == "letter baseline"
    said, text, figure, *_ = jobs_page.rename_and_redraw(ctx, job.id, name, "")
    assert "named for what it is" in said and "Run: **00001 · bundled" in text
    _, text, *_ = jobs_page.rename_and_redraw(ctx, job.id, name, '<a href="https://evil.example">Log in</a>')
    assert "Run: **&lt;a href=" in text and "<a " not in text  # shown as typed, never a live link


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


def _listeners_setting(demo: gr.Blocks, component) -> list:
    return [fn for fn in demo.fns.values() if any(out is component for out in fn.outputs)]


def test_a_new_run_never_takes_away_the_runs_picked(tmp_path):
    """Issue 30: runs 00001 and 00002 picked, a third finishing left only the new one picked. The
    load listener ran again whenever the poll's State changed, and it re-picked the newest as if
    nothing were picked. Every listener that sets a picker must read what is picked, or run on
    the page's load only."""
    ctx = LabContext(tmp_path)
    with gr.Blocks() as demo:
        picker, _ = components.run_picker(ctx, "Evaluation runs", multiselect=True)
        jobs_page.build_jobs(ctx)
    job_picker = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "job-picker")
    for target in (picker, job_picker):
        for fn in _listeners_setting(demo, target):
            reads_it = any(i is target for i in fn.inputs)
            assert reads_it or {event for _, event in fn.targets} == {"load"}, fn.targets


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
    assert quiet[1:-1] == (SKIP,) * 11  # only the status line (its elapsed time) is sent
    events.emit("scoring", step=16, total=100)
    busy = jobs_page.poll(ctx, job.id, quiet[-1])
    assert "scoring 16/100" in busy[0] and busy[8] is not SKIP  # the activity grew
    assert jobs_page.poll(ctx, job.id + 1, busy[-1]) == (SKIP,) * 13  # not the job this panel shows


def test_a_poll_reads_the_job_s_store_row_once(tmp_path, monkeypatch):
    """The page's 2-second tick reads the store once (its list, whose row of the picked job the job's
    panel uses), and a poll or a pick of the panel alone reads the job's row once."""
    ctx = LabContext(tmp_path)
    job = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    ctx.store.update(job.id, status="running", started=time.time())
    *_, listed = jobs_page.refresh_all(ctx, job.id)
    *_, drawn = jobs_page.show(ctx, job.id, {})
    reads: list[str] = []
    for name in ("get", "list"):
        def counted(*args, _read=getattr(ctx.store, name), _name=name, **kwargs):
            reads.append(_name)
            return _read(*args, **kwargs)
        monkeypatch.setattr(ctx.store, name, counted)
    ctx.store.update(job.id, status="succeeded", finished=time.time())
    out = jobs_page.tick(ctx, job.id, listed, drawn)
    assert len(reads) == 1 and "**succeeded**" in out[4]  # the row the list read is the one shown
    for handler in (lambda: jobs_page.poll(ctx, job.id, drawn), lambda: jobs_page.show(ctx, job.id, {})):
        reads.clear()
        assert "**succeeded**" in handler()[0] and len(reads) == 1
    reads.clear()
    assert jobs_page.tick(ctx, job.id + 1, listed, {**drawn, "job": str(job.id + 1)})[4] == f"No job {job.id + 1}."
    assert len(reads) == 1  # a job the list lacks is gone: not looked up again


def test_a_job_s_controls_follow_its_status_and_a_cancel_is_no_error(tmp_path):
    """Issue 30: Cancel stayed red and clickable on a succeeded job ("Job 1 is now succeeded."),
    Resume was offered and refused, and a cancellation was listed as an error."""
    from jobs.scheduler import cancel

    ctx = LabContext(tmp_path)
    job = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    *_, stop, resume, sent = jobs_page.show(ctx, job.id, {})
    assert (stop["interactive"], stop["variant"], resume["interactive"]) == (True, "stop", False)  # queued
    ctx.store.update(job.id, status="running", started=time.time())
    ctx.store.update(job.id, status="succeeded", finished=time.time())
    *_, stop, resume, sent = jobs_page.poll(ctx, job.id, sent)  # the status changed under the page
    assert (stop["interactive"], stop["variant"], resume["interactive"]) == (False, "secondary", False)
    assert jobs_page.poll(ctx, job.id, sent)[-3:-1] == (SKIP, SKIP)  # and only then
    assert "nothing to cancel" in jobs_page.cancel_job(ctx, job.id)
    stopped = cancel(ctx.store, ctx.store.submit({"kind": "evaluate", "model": "bundled"}).id)
    row = jobs_page.jobs_table(ctx).set_index("id").loc[stopped.id]
    assert row["status"] == "cancelled" and row["error"] == ""  # its status says it; it went wrong nowhere
    text, *_, stop, resume, _ = jobs_page.show(ctx, stopped.id, {})
    assert "What went wrong" not in text and "cancelled before it started" in text
    assert (stop["interactive"], resume["interactive"]) == (False, True)  # a cancelled job can go on
    ctx.store.update(stopped.id, status="failed", error="out of memory")
    assert jobs_page.jobs_table(ctx).set_index("id").loc[stopped.id, "error"] == "out of memory"


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
    table, seen, _ = follow_results(ctx, None)
    assert table.empty and follow_results(ctx, seen) == (SKIP, seen, SKIP)
    _evaluation(tmp_path / "00001-evaluate")
    table, seen, _ = follow_results(ctx, seen)
    assert table["folder"].tolist() == ["00001-evaluate"] and follow_results(ctx, seen) == (SKIP, seen, SKIP)


def test_the_knowledge_page_says_what_fills_it_before_anything_has(tmp_path):
    """Issue 30: with no top-k store the Knowledge page was empty, with no hint that an `extract`
    job fills it (the hint came only once a store had been picked and unpicked)."""
    from ui import knowledge_page

    with gr.Blocks() as demo:
        knowledge_page.build_knowledge(LabContext(tmp_path))
    said = " ".join(b.value or "" for b in demo.blocks.values() if isinstance(b, gr.Markdown))
    assert "`extract` job" in said and "Launch" in said
    assert knowledge_page.knowledge_view(LabContext(tmp_path), None)[1] == knowledge_page.NO_STORE


def test_a_page_s_polls_run_the_moment_it_is_shown(demo):
    """Issue 30: Reliability opened empty for seconds before showing the run that had just
    finished: a page's timers start when its tab is shown, and a timer's first tick comes one
    period later. Every poll of a page also runs when its tab is selected."""
    from ui.app import timer_states, timers_in

    tabs = [b for b in demo.blocks.values() if isinstance(b, gr.Tab)]
    assert len(tabs) >= 10
    started = []
    for tab in tabs:
        selected = [fn for fn in demo.fns.values() if (tab._id, "select") in fn.targets]
        page = [t for fn in selected if getattr(fn.fn, "func", None) is timer_states for t in fn.fn.args[0]]
        ticked = {id(fn.fn) for fn in demo.fns.values() for t in page if (t._id, "tick") in fn.targets}
        assert ticked <= {id(fn.fn) for fn in selected}, tab.label
        started += page
    assert sorted(t._id for t in started) == sorted(t._id for t in timers_in(demo))  # each timer is one page's


def test_every_timer_is_mounted_with_the_app(demo):
    """A tab's children mount when it is first selected, and gradio can lose an update that reaches
    a component while it mounts: the one that starts the page's timers is sent on that select, and
    under load Reliability never listed a run that finished (:func:`ui.app.mount_with_app`)."""
    from ui.app import timers_in

    def in_a_tab(block) -> bool:
        return block is not None and (isinstance(block, gr.Tab) or in_a_tab(block.parent))

    every = timers_in(demo)
    assert len(every) >= 4 and not [t for t in every if in_a_tab(t.parent)]


def test_a_hidden_page_loads_nothing_with_the_app(demo):
    """Twelve run pickers, the Jobs page and the Results page each ran a server event as the app loaded (18 with
    the Life cycle page's note), and each event's status updates redraw every component's status in the browser:
    the page answered its first click after 8.4 s, against 4.9 s without them (bench/page_load.py).
    Those pages show the same when their tab is opened (the test above). Only the Life cycle page's note, which no
    poll draws, still loads with the app."""
    loading = [getattr(fn.fn, "func", fn.fn).__name__ for fn in demo.fns.values()
               if fn.fn is not None and any(event == "load" for _, event in fn.targets)]
    assert loading == ["empty_state"]


def test_the_plotting_code_is_fetched_as_the_app_loads(demo):
    """Issue 30: gradio fetched plotly.js (1.3 MB) only when the first figure arrived, and the first
    plot page opened stayed empty for seconds after its figure was ready (measured in Chromium:
    3.9 s from the tab's click to the diagram, 0.4 s once the code is fetched at load)."""
    loaders = [fn for fn in demo.fns.values() if fn.js and "PlotlyPlot-" in fn.js]
    assert len(loaders) == 1 and [event for _, event in loaders[0].targets] == ["load"]
    assert "import(" in loaders[0].js
