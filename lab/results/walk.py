"""The walk of a runs directory, and its one depth rule: which folders are entered and how far down.

The catalogue (:mod:`lab.results.runs`) lists what this walk reaches and resolves a name from a browser only
where the walk could have reached it, so the two never disagree about what is in the runs directory.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from lab.core.layout import CHECKPOINTS_DIR, SNAPSHOTS_DIR

# runs/<job>/models/<row>/ and runs/<job>/eval/<row>-<set>/ are depth 3, an sft run's calibration/step-<n>/<task>/
# depth 4, and 5 in a pipeline run here (lab run pipeline.yaml --out runs/<name>); checkpoints are never entered
MAX_DEPTH = 5


def entered(name: str) -> bool:
    """Folders the walk goes into: not hidden, not a trainer's checkpoints or snapshots (never offered as a model)."""
    return not name.startswith(".") and name not in (CHECKPOINTS_DIR, SNAPSHOTS_DIR) and not name.startswith("checkpoint-")


def walk(directory: Path, depth: int) -> Iterator[tuple[Path, set[str], set[str]]]:
    """(folder, its file names, its sub-folder names) for ``directory`` and ``depth`` levels below it."""
    try:
        with os.scandir(directory) as listing:
            entries = list(listing)
    except OSError:  # removed or unreadable while we looked: a job may be cleaning up
        return
    kinds = [(e.name, _kind(e)) for e in entries]
    files = {name for name, kind in kinds if kind == "file"}
    folders = {name for name, kind in kinds if kind == "folder" and entered(name)}
    yield directory, files, folders
    if depth > 0:
        for name in sorted(folders):
            yield from walk(directory / name, depth - 1)


def _kind(entry: os.DirEntry) -> str:
    """What an entry is: ``"folder"`` (a real one, not a link to one), ``"file"``, or ``""`` (anything
    else, or gone meanwhile)."""
    try:
        if entry.is_dir(follow_symlinks=False):
            return "folder"
        return "file" if entry.is_file() else ""
    except OSError:
        return ""
