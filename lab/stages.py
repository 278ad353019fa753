"""Resumable pipeline stages: a stage that finished left ``done.json`` and is not run again.

The FIRST and CFT pipelines are each one job made of stages (train a model, evaluate it, …) in
sub-directories of the run directory. Rerunning the same config in the same directory skips the
finished ones, so an interrupted pipeline resumes where it stopped.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from lab.events import EventWriter
from lab.files import write_atomic
from lab.layout import DONE_FILE as DONE


def stage(directory: Path, events: EventWriter, name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``work`` unless ``directory`` holds its result already; returns the (stored) result."""
    marker = directory / DONE
    if marker.exists():
        events.emit("log", message=f"{name}: already done, reusing {directory}")
        return json.loads(marker.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    events.stage(name)
    result = work()
    write_atomic(marker, json.dumps(result, indent=2))
    return result
