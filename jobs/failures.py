"""Turn a dead job's exit code and log tail into a one-line summary a user can act on."""
from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Optional

from lab.core.layout import LOG_FILE

TAIL_LINES = 40
TAIL_BYTES = 64 * 1024  # what a tail reads at most: 40 lines of a log, with room to spare

DISK_FULL_BYTES = 1 << 20  # less free than this where a job writes: nothing it writes can be trusted to land
DISK_FULL = "disk full: free space where the runs folder lives, then resume the job"
DISTRIBUTED = "distributed launch failed: check that every GPU is visible and the processes can reach each other"
# (pattern in the log, summary); the first match wins, so the most specific come first.
PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"No space left on device|database or disk is full|ENOSPC"), DISK_FULL),
    (re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory|DefaultCPUAllocator: can't allocate", re.I),
     "out of memory: lower the batch size or sequence length, use LoRA or bf16, or ask for more GPUs"),
    (re.compile(r"ModelLoadError|is not a local directory|Model directory .* does not exist|adapter_config\.json"),
     "model not found: check the model name or path (offline machines need a local directory or 'bundled')"),
    (re.compile(r"DataError|Data file not found|no usable rows|not among the choices|Unknown dataset"),
     "data error: check the dataset name, files and format"),
    (re.compile(r"NCCL|ProcessGroup|torch\.distributed"), DISTRIBUTED),
]
# torchrun's report when a rank of a multi-process launch died: which rank, and how it ended.
ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def log_tail(run_dir: Optional[str | Path], lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a job's ``log.txt`` (its stdout and stderr); "" for a job without
    a run directory or a log yet. Read from the end, so that a poll costs the same for a long job."""
    if not run_dir:
        return ""
    try:
        with open(Path(run_dir) / LOG_FILE, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:  # none yet, or unreadable (a run directory gone wrong): no tail to show
        return ""
    return "\n".join(text.splitlines()[-lines:])


def disk_full(run_dir: Path, free: int) -> str:
    """A job that ended unrecorded beside a full disk: the disk, not the job, is the news."""
    return f"disk full: {free:,} bytes free where {run_dir} lives when the job ended; free space, then resume the job"


def _killed(returncode: int) -> str:
    name = signal.Signals(-returncode).name
    if name == "SIGKILL":
        return "killed (SIGKILL): by a user, or by the operating system when memory ran out"
    return f"killed by {name}"


def classify(returncode: Optional[int], tail: str) -> str:
    """One line: what happened and, where we can tell, what to do. A multi-process launch names
    the rank that died first (the launcher then stops the others)."""
    root = ROOT_CAUSE.search(tail)
    for pattern, summary in PATTERNS:
        if pattern.search(tail) and not (root and summary == DISTRIBUTED):  # the launcher's trace says less
            return f"rank {root[1]}: {summary}" if root else summary
    if root:
        code = int(root[2])
        ended = _killed(code) if code < 0 else f"exit code {code}"
        return f"rank {root[1]} of the multi-process launch died, {ended}; the launcher stopped the other ranks"
    if returncode is not None and returncode < 0:
        return _killed(returncode)
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
    code = f"exit code {returncode}" if returncode is not None else "no exit code (not our child)"
    return f"crashed ({code}): {last[:200]}" if last else f"crashed ({code}) with an empty log"
