"""A run's progress as JSON lines: appended by the worker, read incrementally by the UI and CLI.

One object per line, always with ``time`` (Unix seconds) and ``stage``; optional ``step``,
``total``, ``tokens``, ``tokens_total``, ``loss``, ``lr``, ``message`` and metric fields. An event
with ``step`` and ``total`` counts a stage's progress (``tokens``: the work done so far, where items
differ in cost, for the ETA); ``{"stage": "stage", "name": …}`` says that a stage with no count yet
began ("loading model bundled"), and ``start`` that the worker is alive. Readers keep a byte offset
and read only what was appended since, so a poll costs the size of the news, not of the file; a
last line still being written (no newline yet) is left for the next read. A line that is no event —
not a JSON object, torn UTF-8, a ``time`` that is no number, nested past :data:`MAX_DEPTH` — is
skipped and named (:func:`read_events_checked`), never raised: the pages and the store's rebuild read
every run's file, and one job's file must not stop them.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lab.core.stored import depth

START = "start"  # the worker is alive (its first event, before any heavy import)
STAGE = "stage"  # a named stage began; it may count steps later under its own ``stage``
QUEUED = "queued"  # queued again (resumed): a ``start`` before it is an earlier attempt's


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


MAX_LINE_BYTES = 1 << 20  # an event is a few hundred bytes; a longer line is no event the lab wrote
MAX_DEPTH = 16  # events are flat, a list or two deep; deeper is no event the lab wrote


@dataclass(frozen=True)
class EventsRead:
    """What one read of ``events.jsonl`` found: the events, the offset to pass next time, and each line
    skipped as no event, named by its byte offset and why (``byte 812: not a JSON object (list)``)."""

    events: list[dict[str, Any]]
    offset: int
    skipped: list[str]


def _problem(raw: bytes) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """A line as an event, or why it is none: a reader that trusted it would fail on it (a list has no
    ``get``, a ``time`` of text takes no arithmetic, a 100,000-deep line overflows ``json.loads``)."""
    if len(raw) > MAX_LINE_BYTES:
        return None, f"longer than {MAX_LINE_BYTES} bytes"
    try:
        event = json.loads(raw)
    except RecursionError:
        return None, "nested too deeply to read"
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError: torn UTF-8
        return None, f"not JSON ({type(e).__name__})"
    if not isinstance(event, dict):
        return None, f"not a JSON object ({type(event).__name__})"
    time_ = event.get("time")
    if isinstance(time_, bool) or not isinstance(time_, (int, float)) or not math.isfinite(time_):
        return None, f"its time is not a number ({time_!r:.40})"
    if not isinstance(event.get("stage"), str):
        return None, f"its stage is not text ({event.get('stage')!r:.40})"
    if depth(event) > MAX_DEPTH:
        return None, f"nested more than {MAX_DEPTH} deep"
    return event, None


def read_events_checked(path: Path, offset: int = 0) -> EventsRead:
    """Events appended to ``path`` since byte ``offset``, with the lines that are no event skipped and
    named: a torn line from a killed writer, or one a job wrote that no reader could use, must not
    stop the reader (the store's rebuild, the pages' polls)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return EventsRead([], offset, [])
    end = chunk.rfind(b"\n") + 1  # complete lines only
    events, skipped, at = [], [], offset
    for raw in chunk[:end].split(b"\n")[:-1]:
        event, why = _problem(raw) if raw.strip() else (None, None)
        if event is not None:
            events.append(event)
        elif why is not None:
            skipped.append(f"byte {at}: {why}")
        at += len(raw) + 1
    return EventsRead(events, offset + end, skipped)


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Events appended to ``path`` since byte ``offset``, and the offset to pass next time; lines that
    are no event are skipped (:func:`read_events_checked` names them)."""
    read = read_events_checked(path, offset)
    return read.events, read.offset
