"""What a training run leaves and what it trained from, read from its directory without torch.

A ``finetune``, ``sft`` or ``dpo`` run (and a series' training entry) saves its final weights as
``model/`` (full weights, with the tokenizer) or ``adapter/`` (LoRA, on the model it trained from).
That model is its config's ``model``, unless the config named another job's result (``run:<id>``):
then it is what the reference named when the run started, which ``start.json`` records
(:mod:`lab.jobkit.chain`): the config alone no longer says which weights an adapter belongs to.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from lab.core.errors import DataError
from lab.core.layout import ADAPTER_DIR, CONFIG_FILE, MODEL_DIR, START_FILE
from lab.core.yamlio import load_yaml

HF_CONFIG, ADAPTER_CONFIG = "config.json", "adapter_config.json"  # what save_pretrained writes, by kind


def run_config(run_dir: Path) -> dict[str, Any]:
    """A training run's ``config.yaml``; refused when it is none or names no model."""
    path = Path(run_dir) / CONFIG_FILE
    try:
        data = load_yaml(path.read_bytes(), str(path))
    except OSError:
        raise DataError(f"{run_dir}: not a training run (no {CONFIG_FILE})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), str):
        raise DataError(f"{path}: not a training run's config (no model)")
    return data


def started_from(run_dir: Path, field: str = "model") -> Optional[str]:
    """What ``field`` (a ``run:<id>``) named when the run started, from ``start.json``; None when it
    named no other job's result, or the record is unreadable."""
    try:
        record = json.loads((Path(run_dir) / START_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = record.get(field) if isinstance(record, dict) else None
    model = entry.get("model") if isinstance(entry, dict) else None
    return model if isinstance(model, str) else None


def base_model(run_dir: Path) -> str:
    """The model a training run started from: what its ``run:<id>`` named, or its config's model."""
    return started_from(run_dir) or run_config(run_dir)["model"]


def saved_weights(directory: Path, base: str) -> Optional[tuple[str, Optional[str]]]:
    """(model, adapter) as ``load_model`` takes them, of a folder holding ``model/`` (full weights) or
    ``adapter/`` (on ``base``); None when it holds neither."""
    if (directory / MODEL_DIR / HF_CONFIG).is_file():
        return str(directory / MODEL_DIR), None
    if (directory / ADAPTER_DIR / ADAPTER_CONFIG).is_file():
        return base, str(directory / ADAPTER_DIR)
    return None
