"""Defects a newcomer's walk found (issue 43): a refusal that outlived its correction, placeholders
the Markdown renderer swallowed, messages that named the server's folders or offered an upload where
none can be made, token runs counted in questions, and an all-bad upload named as a split it is not."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab.data import DataError
from lab.jobkit import kinds
from lab.jobkit.paths import PathNotAllowed, Policy
from lab.results import analysis
from tests.helpers import write_token_run
from ui import cases_page, forms, launch_page, lifecycle_page
from ui.context import LabContext
from ui.messages import error
from ui.uploads import LISTED_PROBLEMS, accept_upload, refused_notes, upload_notes

pytestmark = pytest.mark.unit

GOOD = '{"id": "q1", "question": "Sky colour?", "choices": ["blue", "green"], "answer": "A"}\n'
SKIP = {"__type__": "update"}  # gr.skip(): the component is left as it is


# ---------------------------------------------------------------- 1. a refusal goes once a field changes
def _launch(tmp_path: Path):
    import gradio as gr

    with gr.Blocks() as demo:
        launch_page.build_launch(LabContext(tmp_path))
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    return demo, by_id


@pytest.mark.slow
def test_typing_in_a_field_clears_the_refusal_and_its_mark(tmp_path):
    demo, by_id = _launch(tmp_path)
    message, model = by_id["launch-message-evaluate"], by_id["evaluate-model"]
    wired = [fn for fn in demo.fns.values() if (model._id, "input") in fn.targets
             and fn.outputs and fn.outputs[0]._id == message._id]
    assert len(wired) == 1
    names = [f.name for f in forms.fields("evaluate")]
    assert len(wired[0].outputs) == 1 + len(names) + 1  # the message, every field's mark, "More options"
    refused = error("model: there is no job 99999 in runs (python -m jobs list shows the jobs)")
    marked = launch_page.field_marks("evaluate", refused)
    assert marked[names.index("model")]["elem_classes"] == [launch_page.REFUSED]  # as Submit left it
    cleared, *marks, more = wired[0].fn(refused)
    assert cleared == "" and all(m["elem_classes"] == [] for m in marks) and more == SKIP
    assert marks[names.index("model")]["info"] == launch_page._info("evaluate", forms.fields("evaluate")[names.index("model")])
    queued = "<div class='lab-ok'>✅ Job 3 queued (evaluate); follow it on the Jobs tab.</div>"
    assert all(update == SKIP for update in wired[0].fn(queued))  # still true: left, and nothing redrawn
    clearing = {target for fn in demo.fns.values() if getattr(fn.fn, "func", None) is launch_page.clear_refusal
                and fn.fn.args == ("evaluate",) for target, event in fn.targets if event == "input"}
    assert {by_id[f"evaluate-{n}"]._id for n in names} <= clearing  # every field, not the model's alone


# ---------------------------------------------------------------- 2. placeholders the renderer swallowed
def _outside_code(markdown: str) -> str:
    return re.sub(r"`[^`]*`", "", markdown)


def test_the_life_cycle_intro_keeps_its_run_reference_placeholder():
    assert "run:<id>" in lifecycle_page.INTRO
    assert not re.search(r"<[A-Za-z]", _outside_code(lifecycle_page.INTRO)), lifecycle_page.INTRO


def test_launch_field_infos_show_their_placeholders_as_typed():
    """Gradio 6 shows a field's info as text (a Chromium check on 6.31: ``run:<id>`` and ``<script>`` show
    literally, ``&#x27;`` too): escaping the help put ``&lt;id&gt;`` and ``&#x27;bundled&#x27;`` on the form."""
    infos = [launch_page._info(kind.name, f) for kind in kinds.all_kinds() for f in forms.fields(kind.name)]
    assert any("run:<id>" in info for info in infos)
    assert not [info for info in infos if re.search(r"&(lt|gt|amp|#x27|quot);", info)]


# ---------------------------------------------------------------- 3. only a data file can be uploaded
def test_a_model_outside_the_folders_is_not_told_to_upload_it(tmp_path):
    policy = Policy([tmp_path / "runs"])
    with pytest.raises(PathNotAllowed) as model:
        policy.check("model", Path("/elsewhere/nosuch-model"), "./nosuch-model")
    assert "Upload" not in str(model.value) and "Put it under one of those folders" in str(model.value)
    assert "--allow-path" in str(model.value)
    with pytest.raises(PathNotAllowed, match="Upload it on the Launch page"):
        policy.check("data_files[0]", Path("/elsewhere/q.jsonl"), "/elsewhere/q.jsonl")


# ---------------------------------------------------------------- 4. uploads named from the runs folder
def test_the_upload_quota_and_the_stored_note_name_runs_uploads_not_the_server_path(tmp_path):
    uploads = tmp_path / "runs" / "uploads"
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(GOOD)
    second.write_text(GOOD.replace("q1", "q2"))
    kept = accept_upload(first, "a.jsonl", uploads, max_files=1)
    notes = upload_notes(kept)
    assert f"<code>runs/uploads/{kept.path.name}</code>" in notes and str(tmp_path) not in notes
    with pytest.raises(DataError) as refused:
        accept_upload(second, "b.jsonl", uploads, max_files=1)
    assert "The upload folder runs/uploads holds 1 files" in str(refused.value)
    assert "Delete old uploads in runs/uploads" in str(refused.value) and str(tmp_path) not in str(refused.value)


# ---------------------------------------------------------------- 5. token runs count targets and documents
def test_a_token_run_counts_targets_not_questions(tmp_path):
    write_token_run(tmp_path / "00002-evaluate", n=20)
    _, _, note = cases_page.cases_view(LabContext(tmp_path), "00002-evaluate", "all", 0.0, 1.0, None)
    assert re.match(r"\*\*\d+ of 20 targets\.\*\*", note), note
    assert analysis.small_sample_warning(20, token=True).startswith("Only 20 targets: below 300")
    assert analysis.small_sample_warning(20).startswith("Only 20 questions")
    limit = next(f for f in forms.fields("evaluate") if f.name == "limit")
    assert "documents" in limit.help


# ---------------------------------------------------------------- 6. an all-bad upload
def test_an_all_bad_upload_names_no_split_and_lists_its_rows(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(f'{{"id": "q{i}", "question": "q?", "choices": ["only"], "answer": 0}}\n'
                           for i in range(LISTED_PROBLEMS + 3)))
    with pytest.raises(DataError) as refused:
        accept_upload(bad, "bad.jsonl", tmp_path / "runs" / "uploads")
    said = str(refused.value)
    assert "custom test" not in said and "test" not in said.split("Expected")[0]
    assert said.startswith(f"No usable questions in bad.jsonl: all {LISTED_PROBLEMS + 3} rows were rejected")
    notes = refused_notes(refused.value)
    assert notes.count("<li>bad.jsonl:") == LISTED_PROBLEMS and "<li>… and 3 more</li>" in notes
    assert "bad.jsonl:1:" in notes and f"bad.jsonl:{LISTED_PROBLEMS}:" in notes and "lab-upload-" not in notes
    assert notes.startswith("<div class='lab-error'>⚠️ No usable questions in bad.jsonl")
