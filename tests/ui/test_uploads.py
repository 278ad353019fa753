"""Uploads (ui/uploads.py): checked before anything is stored, nothing left behind on a refusal,
a quota on the folder, and the notes shown after an upload escaped."""
import json
import os
from pathlib import Path

import pytest

from lab.data import DataError
from ui.uploads import accept_upload, upload_notes

pytestmark = pytest.mark.unit

GOOD = '{"id": "q1", "question": "Sky colour?", "choices": ["blue", "green"], "answer": "A"}\n'
DEEP = "[" * 100_000 + "]" * 100_000


def stored(uploads: Path) -> list[str]:
    return sorted(p.name for p in uploads.iterdir()) if uploads.exists() else []


@pytest.mark.parametrize("name, content, message", [
    ("broken.jsonl", b"{not json\n", "No usable questions in broken.jsonl: all 1 rows were rejected"),
    ("latin1.csv", "question,A,B,answer\ncaf\xe9?,x,y,A\n".encode("latin-1"), "latin1.csv is not UTF-8 text"),
    ("deep.jsonl", ('{"question": ' + DEEP + "}\n").encode(), "The first: deep.jsonl:1: nested too deeply"),
    ("deep.json", DEEP.encode(), "deep.json:1: the list element that starts here is nested too deeply"),
    ("one.jsonl", b'{"question": "q?", "choices": ["only"], "answer": 0}\n', "only 1 choice"),
    ("empty.csv", b"", "No rows"),
])
def test_a_refused_upload_leaves_nothing_behind(tmp_path, name, content, message):
    temp = tmp_path / name
    temp.write_bytes(content)
    with pytest.raises(DataError, match=message) as err:
        accept_upload(temp, name, tmp_path / "uploads")
    assert stored(tmp_path / "uploads") == []
    assert "lab-upload-" not in str(err.value)  # the temporary name of the check is never shown


def test_a_write_that_fails_midway_is_removed(tmp_path, monkeypatch):
    temp = tmp_path / "mine.jsonl"
    temp.write_text(GOOD)

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        accept_upload(temp, "mine.jsonl", tmp_path / "uploads")
    assert stored(tmp_path / "uploads") == []


def test_the_quota_names_its_limit_and_what_to_do(tmp_path):
    uploads = tmp_path / "uploads"
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(GOOD)
    second.write_text(GOOD.replace("q1", "q2"))
    kept = accept_upload(first, "a.jsonl", uploads, max_files=1)
    with pytest.raises(DataError, match=f"holds 1 files .*; the limit is 1 files. Delete old uploads in {uploads.parent.name}/uploads"):
        accept_upload(second, "b.jsonl", uploads, max_files=1)
    assert accept_upload(first, "a.jsonl", uploads, max_files=1).path == kept.path  # already stored: no new file
    limit = len(GOOD) + 10
    with pytest.raises(DataError, match=rf"would take it past the limit of {limit} bytes in all\. Delete old uploads"):
        accept_upload(second, "b.jsonl", uploads, max_total_bytes=limit)
    assert stored(uploads) == [kept.path.name]


def test_rows_are_reported_under_the_uploaded_name(tmp_path):
    temp = tmp_path / "tmpab12.jsonl"
    temp.write_text(GOOD + GOOD)
    up = accept_upload(temp, "/tmp/gradio/x/mine.jsonl", tmp_path / "uploads")
    assert up.problems == ["mine.jsonl:2: duplicate id 'q1': first seen at mine.jsonl:1; ids must be unique: "
                           "give this row its own id, or remove it"]
    assert up.path.read_text() == GOOD + GOOD and up.path.name.endswith("-mine.jsonl")


def test_upload_notes_escape_the_file_content(tmp_path):
    attack = "<img src=x onerror=alert(1)>"
    temp = tmp_path / "x.jsonl"
    temp.write_text(GOOD + json.dumps({"question": "q?", "choices": ["a", "b"], "answer": attack}) + "\n")
    up = accept_upload(temp, "<b>x.jsonl", tmp_path / "uploads")
    notes = upload_notes(up)
    assert "<img" not in notes and "<b>" not in notes
    assert "&lt;img src=x onerror=alert(1)&gt;" in notes and "&lt;b&gt;x.jsonl:2" in notes
    assert notes.startswith("<div class='lab-ok'>✅ 1 questions read; stored as <code>")
    assert "and set as the data file. 1 rows skipped:<ul><li>" in notes and "\n" not in notes
