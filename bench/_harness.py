"""What every bench shares: its parser, one clock, seeding, and the results file it writes.

A results file is only worth keeping with what produced it, so :func:`write_result` puts the exact
command and the machine (CPU model, cores, GPU, torch and transformers versions) at its top; before
this module those lines were typed by hand after a shell redirection, and some files lacked them.
Durations are measured with :class:`Timer` (``time.perf_counter``: monotonic and the finest clock;
``time.time`` can step when the system clock is set). This module imports only the standard library
and the lab's YAML reader, so that ``bench.gpu`` runs on a lent GPU machine with torch and a few wheels.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

from lab.core.yamlio import load_yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


class Only(NamedTuple):
    """A bench's ``--only``: run a part of what it runs (seeds, sections, tasks)."""

    metavar: str
    help: str
    type: Callable[[str], Any] = str


def parser(doc: str, *, out: Optional[Path] = None, out_help: str = "the results file",
           seeds: Optional[int] = None, only: Optional[Only] = None) -> argparse.ArgumentParser:
    """A bench's parser: its docstring's first line as description, and the options benches share where
    the bench has such a notion: ``--out`` (default ``out``), ``--seeds N`` (seeds 0 … N-1), ``--only``.
    Each bench adds its own options to it."""
    made = argparse.ArgumentParser(prog=shlex.join(_program()), description=doc.splitlines()[0])
    if out is not None:
        made.add_argument("--out", type=Path, default=out, help=f"{out_help} (default: {shown(out)})")
    if seeds is not None:
        made.add_argument("--seeds", type=int, default=seeds,
                          help="training seeds 0 … N-1 (at least 2 for an interval)")
    if only is not None:
        made.add_argument("--only", type=only.type, nargs="+", metavar=only.metavar, help=only.help)
    return made


def shown(path: Path) -> str:
    """A path as a bench prints it: relative to the checkout when inside it."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def preset(name: str) -> dict[str, Any]:
    """A shipped preset, ``examples/NAME.yaml``, that a bench builds its jobs from."""
    return load_yaml((REPO / "examples" / f"{name}.yaml").read_text(), name)


def seed(value: int) -> None:
    """Seed Python's, numpy's and (where installed) torch's generators: a bench's random draws repeat."""
    import numpy as np

    random.seed(value)
    np.random.seed(value)
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(value)


class Timer:
    """Seconds since it was made, by ``time.perf_counter``."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def sync() -> None:
    """Wait for the GPU's queued work, where torch is in use with one: a timing must include it."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes, the GPU synchronised before and after."""
    sync()
    timer = Timer()
    fn()
    sync()
    return timer.seconds


class Transcript:
    """What a bench prints, kept line by line: its results file holds the same lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, *texts: str) -> None:
        for text in texts:
            print(text, flush=True)
            self.lines.append(text)


def _program() -> list[str]:
    """How this bench was started: ``python -m bench.NAME``."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return ["python", "-m", spec.name.removesuffix(".__main__")] if spec is not None else ["python", sys.argv[0]]


def command() -> str:
    """This process's command line as a user types it: ``python -m bench.NAME ARGS``."""
    return shlex.join([*_program(), *sys.argv[1:]])


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> str:
    """The CPU model and cores, the GPU where torch is in use with one, and the torch and transformers versions
    (torch's own where it is imported: the installed metadata leaves out a build tag such as ``+cu130``)."""
    torch = sys.modules.get("torch")
    gpu = f", {torch.cuda.get_device_name()}" if torch is not None and torch.cuda.is_available() else ""
    version = torch.__version__ if torch is not None else _version("torch")
    return f"{_cpu_model()}, {os.cpu_count()} cores{gpu}; torch {version}, transformers {_version('transformers')}"


def write_result(path: Path, lines: Sequence[str], kept: str = "") -> None:
    """Write a results file: ``kept`` (earlier runs a bench appends to), then the command, the date and
    the machine, then ``lines``. A ``.md`` file gets the command in backticks, any other a ``#`` line."""
    when = f"{time.strftime('%Y-%m-%d %H:%M')}; {machine()}"
    head = [f"`{command()}` — {when}", ""] if path.suffix == ".md" else [f"# {command()} — {when}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(kept + "\n".join([*head, *lines]) + "\n", encoding="utf-8")
