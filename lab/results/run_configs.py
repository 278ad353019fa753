"""A run folder's ``config.yaml`` read back, and the base model an adapter was trained on, as the config of the job
that made it names it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from lab.core.layout import CONFIG_FILE
from lab.core.reads import inside
from lab.core.trained import started_from
from lab.core.yamlio import read_yaml_file

BASE_MODEL_KEYS = ("model", "student", "teacher")  # where a job's config names the model it trained


def read_config(directory: Path) -> Optional[dict[str, Any]]:
    """A run folder's ``config.yaml`` as a mapping, parsed once per version of the file
    (:func:`lab.core.yamlio.read_yaml_file`; shared between callers: read it, never change it); None when absent,
    unreadable or no mapping."""
    read = read_yaml_file(Path(directory) / CONFIG_FILE)
    return read[1] if read and isinstance(read[1], dict) else None


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
