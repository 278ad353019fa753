"""A run folder's ``config.yaml`` read back (parsed once per version of the file), and the base model an
adapter was trained on, as the config of the job that made it names it.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Optional

from lab.core.layout import CONFIG_FILE
from lab.core.reads import inside
from lab.core.trained import started_from
from lab.core.yamlio import load_yaml

BASE_MODEL_KEYS = ("model", "student", "teacher")  # where a job's config names the model it trained


def read_config(directory: Path) -> Optional[dict[str, Any]]:
    """A run folder's ``config.yaml`` as a mapping (shared between callers: read it, never change it); None
    when absent, unreadable or no mapping."""
    path = Path(directory) / CONFIG_FILE
    try:
        stat = path.stat()
    except OSError:
        return None
    return _parsed_config(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1024)
def _parsed_config(path: Path, mtime_ns: int, size: int) -> Optional[dict[str, Any]]:
    """A config.yaml parsed once per version: the pickers walk the runs folder every few seconds, and
    YAML took 14 ms a file on a loaded 2-core CPU (80 adapters: 1.1 s of every walk)."""
    try:
        data = load_yaml(path.read_bytes(), str(path))
    except (OSError, ValueError):  # gone meanwhile, unreadable, or not YAML (ConfigError is a ValueError)
        return None
    return data if isinstance(data, dict) else None


def adapter_base(root: Path, adapter: Path) -> str:
    """The base model an adapter was trained on, as the config of the job that made it names it
    (the nearest ``config.yaml`` above the adapter, within ``root``; a ``run:<id>`` there, as it
    resolved when the job started); ``"bundled"`` when none does."""
    base = Path(os.path.realpath(root))
    for parent in Path(adapter).parents:
        if not inside(Path(os.path.realpath(parent)), (base,)):
            break
        data = read_config(parent)
        for key in BASE_MODEL_KEYS:
            if isinstance(data, dict) and isinstance(data.get(key), str):
                return started_from(parent, key) or data[key]  # a run:<id> means what it named at the start
    return "bundled"
