"""bench.gpu's small form, on this machine: every section runs and is written, and nothing is left running.

A lent GPU machine gives the bench one call, which waits for every process it started: a section
that breaks, or a process left behind, would cost the whole run. The small form runs the same code
paths at toy sizes (about a minute on two cores) as its own process, as a device call does; each
process it starts carries a marker in its environment, so one left behind is found even after its
parent has exited and it was re-parented."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.model, pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("## Setup", "## Token tasks and a series", "## Scoring throughput", "## Fine-tuning throughput and MFU",
            "## Peak memory against pre-flight", "## Alignment stages: sft and dpo, peak memory against the estimates",
            "## first and cft end to end", "## Evaluation parity, bf16 against fp32", "## Clean exit")
MARKER = "GPU_BENCH_TEST_RUN"


def _marked(token: str) -> list[psutil.Process]:
    """Processes whose environment carries ``MARKER=token`` (those of other users cannot be read: not ours)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARKER) == token:
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_small_form_runs_every_section_and_leaves_nothing_running(tmp_path):
    token = uuid.uuid4().hex
    run = subprocess.run([sys.executable, "-m", "bench.gpu", "--small", "--out", str(tmp_path)], cwd=REPO,
                         env={**os.environ, MARKER: token}, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not _marked(token), "bench.gpu left processes running"
    (results,) = tmp_path.glob("gpu_*-small.md")
    text = results.read_text()
    positions = [text.find(section) for section in SECTIONS]
    assert -1 not in positions and positions == sorted(positions), f"sections missing or out of order: {positions}"
    assert "**failed**" not in text and "skipped: the" not in text
    assert text.count("**succeeded**") == 8  # sft and dpo, full and LoRA; first and cft; the series, run and again
    assert "**0 of them redone**" in text  # the series' second run redid no cell
    assert "child processes left at the end: none" in text
    assert "This is the small form" in text
