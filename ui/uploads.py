"""A user's own question file: checked, previewed and kept where jobs can read it.

Gradio keeps uploads in a temporary folder it may clean; a queued job reads its data later, in
another process. So an accepted upload is copied to ``<runs>/uploads/`` under a name made from its
content hash (the same file uploaded twice is stored once) and the job config names that copy.
Before anything is stored the file is read with the ``custom`` dataset's own loader, so the user
sees the parsed questions and every bad row (``file:line: reason``) before submitting.
"""
from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lab.data import DataError, load_records

ALLOWED_SUFFIXES = (".jsonl", ".json", ".csv")
MAX_BYTES = 20 * 1024 * 1024
PREVIEW_ROWS = 8


@dataclass(frozen=True)
class Upload:
    path: Path  # the stored copy
    n_questions: int
    problems: list[str]
    preview: pd.DataFrame


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name)[:80] or "upload"


def accept_upload(temp_path: str | Path, original_name: str, uploads: Path) -> Upload:
    """Validate an uploaded question file and store it; raises ``DataError`` with what is wrong."""
    temp_path = Path(temp_path)
    suffix = Path(original_name).suffix.lower()
    if suffix not in ALLOWED_SUFFIXES:
        raise DataError(f"{original_name}: expected a {', '.join(ALLOWED_SUFFIXES)} file, got {suffix or 'no extension'!r}")
    size = temp_path.stat().st_size
    if size > MAX_BYTES:
        raise DataError(f"{original_name} is {size / 2**20:.1f} MiB; the limit is {MAX_BYTES // 2**20} MiB")
    digest = hashlib.sha256(temp_path.read_bytes()).hexdigest()[:16]
    uploads.mkdir(parents=True, exist_ok=True)
    target = uploads / f"{digest}-{Path(_safe_name(original_name)).stem}{suffix}"
    if not target.exists():
        shutil.copyfile(temp_path, target)
    try:
        data = load_records("custom", "test", [str(target)])
    except DataError:
        target.unlink(missing_ok=True)  # nothing usable in it: do not keep it
        raise
    preview = pd.DataFrame([{"id": r.id, "question": r.question, "options": " | ".join(r.choices),
                             "answer": "ABCDEFGHIJ"[r.answer] if r.answer < 10 else r.answer}
                            for r in data.records[:PREVIEW_ROWS]])
    problems = [str(p).replace(str(target), original_name) for p in data.problems]
    return Upload(target, len(data.records), problems, preview)
