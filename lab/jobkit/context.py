"""What a kind's runner is handed: :class:`RunContext`, the part of a running job it may use.

A protocol, below both the kinds registry (:meth:`lab.jobkit.kinds.JobKind.run` names it) and the
worker (:class:`lab.jobkit.worker.JobContext` is the one every job gets), so that the registry names
the type without importing the worker, which imports the registry.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from lab.core.events import EventWriter


class RunContext(Protocol):
    """A running job's directory, its event stream, the stop flag, its log and its progress counters."""

    run_dir: Path
    events: EventWriter

    def should_stop(self) -> bool: ...

    def log(self, message: str) -> None: ...

    def announce(self, name: str) -> None: ...

    def progress(self, stage: str) -> Callable[[int], Any]: ...
