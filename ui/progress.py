"""Job progress from the workers' event files, read incrementally (no Gradio here).

A worker appends JSON lines to ``events.jsonl``; the UI polls every two seconds. Re-reading
whole files on every poll grows with the job's length, so :class:`EventCache` keeps, per file,
the byte offset already read and the events so far, and each poll reads only what was appended.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lab.events import EVENTS_FILE, read_events

PROGRESS_KEYS = ("step", "total")


@dataclass
class _Entry:
    offset: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)


class EventCache:
    """Events of many run directories, each file read from where the last poll stopped."""

    def __init__(self) -> None:
        self._entries: dict[Path, _Entry] = {}
        self._lock = threading.Lock()

    def events(self, run_dir: Optional[str | Path]) -> list[dict[str, Any]]:
        if not run_dir:
            return []
        path = Path(run_dir) / EVENTS_FILE
        with self._lock:
            entry = self._entries.setdefault(path, _Entry())
            new, entry.offset = read_events(path, entry.offset)
            entry.events.extend(new)
            return entry.events


@dataclass(frozen=True)
class Progress:
    stage: str
    step: int
    total: int
    eta_s: Optional[float]

    @property
    def text(self) -> str:
        pct = 100 * self.step / self.total if self.total else 0
        eta = f", ETA {format_seconds(self.eta_s)}" if self.eta_s is not None else ""
        return f"{self.stage} {self.step}/{self.total} ({pct:.0f}%){eta}"


def format_seconds(seconds: Optional[float]) -> str:
    if seconds is None:
        return ""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def progress(events: list[dict[str, Any]]) -> Optional[Progress]:
    """The latest counted step and an ETA from the rate since that stage's first counted step."""
    last = next((e for e in reversed(events) if all(k in e for k in PROGRESS_KEYS) and e.get("total")), None)
    if last is None:
        return None
    same = [e for e in events if e.get("stage") == last["stage"] and "step" in e and "total" in e]
    first = same[0]
    eta = None
    done = last["step"] - first["step"]
    if done > 0 and last["step"] < last["total"]:
        eta = (last["time"] - first["time"]) / done * (last["total"] - last["step"])
    return Progress(last["stage"], int(last["step"]), int(last["total"]), eta)

