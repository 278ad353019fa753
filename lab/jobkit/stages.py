"""Resumable pipeline stages: a stage that finished left ``done.json`` and is not run again.

The FIRST and CFT pipelines are each one job made of stages (train a model, evaluate it, …) in
sub-directories of the run directory. Rerunning the same config in the same directory skips the
finished ones, so an interrupted pipeline resumes where it stopped.

Under a multi-process launch a stage is either collective (training, extraction: every rank takes
its share, :mod:`lab.models.distributed`) or rank 0's alone (evaluation, reports: the other ranks wait for
its ``done.json`` and read the result from it); either way only rank 0 writes the marker.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from lab.core.events import EventWriter
from lab.core.files import write_atomic
from lab.core.layout import DONE_FILE as DONE
from lab.models import distributed


def stage(directory: Path, events: EventWriter, name: str, work: Callable[[], dict[str, Any]],
          collective: bool = False) -> dict[str, Any]:
    """Run ``work`` unless ``directory`` holds its result already; returns the (stored) result.

    ``collective``: every rank of a multi-process launch runs ``work`` together; otherwise rank 0
    runs it and the others wait for its result."""
    marker = directory / DONE
    if collective:
        distributed.barrier()  # every rank sees the same marker, or the same absence of it
    if marker.exists():
        events.emit("log", message=f"{name}: already done, reusing {directory}")
        return json.loads(marker.read_text())
    if not collective and not distributed.is_main():
        distributed.wait_for(marker)
        return json.loads(marker.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    events.stage(name)
    result = work()
    if distributed.is_main():
        write_atomic(marker, json.dumps(result, indent=2))
    if collective:
        distributed.barrier()
    return result
