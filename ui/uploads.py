"""A user's own question file: checked, previewed and kept where jobs can read it.

Gradio keeps uploads in a temporary folder it may clean; a queued job reads its data later, in
another process. So an accepted upload is copied to ``<runs>/uploads/`` under a name made from its
content hash (the same file uploaded twice is stored once) and the job config names that copy.
The temporary file is read with the ``custom`` dataset's own loader *before* anything is stored,
so the user sees the parsed questions and every bad row (``file:line: reason``) before submitting,
and a refused file leaves nothing behind. The folder has a quota, since every upload stays.
"""
from __future__ import annotations

import hashlib
import html
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lab.core.files import write_atomic
from lab.core.reads import shown
from lab.data import DataError, MCQRecord, load
from lab.data.custom import FORMAT
from lab.data.templates import option_letter

ALLOWED_SUFFIXES = (".jsonl", ".json", ".csv")
MAX_BYTES = 20 * 1024 * 1024  # one file
MAX_TOTAL_BYTES = 1024**3  # the whole upload folder
MAX_FILES = 1000  # in the upload folder
PREVIEW_ROWS = 8
LISTED_PROBLEMS = 10  # skipped rows shown after an upload


@dataclass(frozen=True)
class Upload:
    path: Path  # the stored copy
    name: str  # how a page names it: from the runs folder (runs/uploads/…), never the server's path
    n_questions: int
    problems: list[str]
    preview: pd.DataFrame


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name)[:80] or "upload"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _check_quota(uploads: Path, size: int, max_total_bytes: int, max_files: int) -> None:
    """Refuse a new file that would take the folder past ``max_files`` files or ``max_total_bytes``."""
    stored = [p.stat().st_size for p in uploads.iterdir() if p.is_file()] if uploads.is_dir() else []
    folder = shown(uploads, [uploads.parent])  # runs/uploads: the page is no place for the server's path
    what = f"The upload folder {folder} holds {len(stored)} files ({_size(sum(stored))})"
    todo = f"Delete old uploads in {folder} (keep those a queued job still reads) and upload again."
    if len(stored) + 1 > max_files:
        raise DataError(f"{what}; the limit is {max_files} files. {todo}")
    if sum(stored) + size > max_total_bytes:
        raise DataError(f"{what}; this file ({_size(size)}) would take it past the limit of "
                        f"{_size(max_total_bytes)} in all. {todo}")


def _read(temp_path: Path, name: str) -> tuple[list[MCQRecord], list[str]]:
    """The records and the skipped rows (as text) of the temporary file, read by :func:`lab.data.load`
    under the uploaded name: its extension picks the format, and messages show it, not a temp path."""
    with tempfile.TemporaryDirectory(prefix="lab-upload-") as folder:
        named = Path(folder) / _safe_name(name)
        named.symlink_to(temp_path.resolve())
        try:
            data = load("custom", "test", [str(named)])
        except DataError as e:
            raise _refused(e, str(named), name) from None
        return data.records, [str(p).replace(str(named), name) for p in data.problems]


def _refused(e: DataError, named: str, name: str) -> DataError:
    """The loader's refusal as the upload box says it: of the file by its own name, not of a dataset
    split ("custom test" is only how the check reads it, not the split the form will run), its rejected
    rows all kept so :func:`refused_notes` can list them."""
    problems = tuple(str(p).replace(named, name) for p in e.problems)
    if not problems:
        return DataError(str(e).replace(f"custom test from {named}", name).replace(named, name))
    return DataError(f"No usable questions in {name}: all {len(problems)} rows were rejected, so nothing was "
                     f"stored. The first: {problems[0]}. Fix them and upload it again. Expected {FORMAT}.", problems)


def accept_upload(temp_path: str | Path, original_name: str, uploads: Path, *,
                  max_total_bytes: int = MAX_TOTAL_BYTES, max_files: int = MAX_FILES) -> Upload:
    """Validate an uploaded question file and store it; raises ``DataError`` with what is wrong.

    Nothing is written under ``uploads`` until the file has been read whole and found usable, and
    a write that fails midway is removed (:func:`lab.core.files.write_atomic`).
    """
    temp_path = Path(temp_path)
    name = Path(original_name).name
    suffix = Path(original_name).suffix.lower()
    if suffix not in ALLOWED_SUFFIXES:
        raise DataError(f"{name}: expected a {', '.join(ALLOWED_SUFFIXES)} file, got {suffix or 'no extension'!r}")
    size = temp_path.stat().st_size
    if size > MAX_BYTES:
        raise DataError(f"{name} is {size / 2**20:.1f} MiB; the limit is {MAX_BYTES // 2**20} MiB. "
                        "Split it into smaller files.")
    content = temp_path.read_bytes()
    target = uploads / f"{hashlib.sha256(content).hexdigest()[:16]}-{Path(_safe_name(name)).stem}{suffix}"
    stored = target.exists()  # the same content was uploaded before: nothing new to store
    if not stored:
        _check_quota(uploads, len(content), max_total_bytes, max_files)
    records, problems = _read(temp_path, name)
    if not stored:
        uploads.mkdir(parents=True, exist_ok=True)
        write_atomic(target, content)
    preview = pd.DataFrame([{"id": r.id, "question": r.question, "options": " | ".join(r.choices),
                             "answer": option_letter(r.answer)}
                            for r in records[:PREVIEW_ROWS]])
    return Upload(target, shown(target, [uploads.parent]), len(records), problems, preview)


def upload_notes(upload: Upload) -> str:
    """What the launch page shows after an accepted upload, as HTML with every quoted text escaped.

    Skipped-row reasons quote the file's content (``<img onerror=…>`` in a question must show as
    text); one line, so that no Markdown around it reads the file's text as Markdown either.
    """
    notes = (f"✅ {upload.n_questions} questions read; stored as <code>{html.escape(upload.name)}</code> "
             "and set as the data file.")
    if upload.problems:
        notes += f" {len(upload.problems)} rows skipped:{_listed(upload.problems)}"
    return f"<div class='lab-ok'>{notes}</div>"


def refused_notes(e: DataError) -> str:
    """What the launch page shows for a refused upload, as HTML: the reason, then the first
    ``LISTED_PROBLEMS`` rejected rows as an accepted upload lists its skipped ones (every text escaped)."""
    listed = _listed([str(p) for p in e.problems]) if e.problems else ""
    return f"<div class='lab-error'>⚠️ {html.escape(' '.join(str(e).split()))}{listed}</div>"


def _listed(problems: list[str]) -> str:
    """Up to ``LISTED_PROBLEMS`` rows' reasons as one line of HTML (no Markdown reads the file's text)."""
    items = "".join(f"<li>{html.escape(' '.join(p.split()))}</li>" for p in problems[:LISTED_PROBLEMS])
    more = f"<li>… and {len(problems) - LISTED_PROBLEMS} more</li>" if len(problems) > LISTED_PROBLEMS else ""
    return f"<ul>{items}{more}</ul>"
