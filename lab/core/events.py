"""A run's progress as JSON lines: appended by the worker, read incrementally by the UI and CLI.

One object per line, always with ``time`` (Unix seconds) and ``stage``; optional ``step``,
``total``, ``tokens``, ``tokens_total``, ``loss``, ``lr``, ``message`` and metric fields. An event
with ``step`` and ``total`` counts a stage's progress (``tokens``: the work done so far, where items
differ in cost, for the ETA); ``{"stage": "stage", "name": …}`` says that a stage with no count yet
began ("loading model bundled"), and ``start`` that the worker is alive. Readers keep a byte offset
and read only what was appended since, so a poll costs the size of the news, not of the file; a
last line still being written (no newline yet) is left for the next read.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from lab.core.layout import EVENTS_FILE

START = "start"  # the worker is alive (its first event, before any heavy import)
STAGE = "stage"  # a named stage began; it may count steps later under its own ``stage``


class EventWriter:
    """Appends events to ``path``; only rank 0 of a multi-process launch writes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.enabled = int(os.environ.get("RANK", "0")) == 0

    def emit(self, stage: str, **fields: Any) -> None:
        if not self.enabled:
            return
        line = json.dumps({"time": round(time.time(), 3), "stage": stage, **fields}, allow_nan=False)
        # One write() per line on a file opened for append: lines from one writer never interleave.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def stage(self, name: str) -> None:
        """Say that stage ``name`` began: the job's page shows it (and for how long) until a count comes."""
        self.emit(STAGE, name=name)


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Events appended to ``path`` since byte ``offset``, and the offset to pass next time."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return [], offset
    end = chunk.rfind(b"\n") + 1  # complete lines only
    events = []
    for raw in chunk[:end].splitlines():
        try:
            events.append(json.loads(raw))
        except json.JSONDecodeError:
            continue  # a torn line from a killed writer must not stop the reader
    return events, offset + end
