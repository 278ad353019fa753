"""Disk space: what is free where a file goes, what a folder holds, and the ranks' refusal before a write.

One home for every such question, the job system's included: :mod:`jobs.preflight` (will the
checkpoints fit?) and :mod:`jobs.scheduler` (can the worker write at all?) ask it too, so this
module stays free of torch — the web server imports :mod:`jobs` without it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from lab.core.errors import DiskFull
from lab.models import distributed
from lab.models.weights import size_text


def free_bytes(path: Path) -> int:
    """Free bytes on the disk ``path`` is on; OSError where it cannot be read (a missing path among them)."""
    return shutil.disk_usage(path).free


def free_bytes_for(folder: Path) -> int:
    """Free bytes on the disk ``folder`` is (or will be) on: its nearest existing ancestor's."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return free_bytes(folder)


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``: a checkpoint as written, beside its estimate."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def ensure_room(folder: Path, need: float, what: str, hint: str = "") -> None:
    """Raise :class:`DiskFull` on every rank when rank 0 (which writes) sees less than ``need``
    bytes free where ``folder`` goes: a clear failure before writing, not a disk filled mid-file."""
    free = free_bytes_for(folder) if distributed.is_main() else 0
    if distributed.agree(distributed.is_main() and free < need):
        raise DiskFull(f"disk full: {what} needs {size_text(need)}, {size_text(free)} free in {folder}; "
                       f"free space{hint}, then resume the job")
