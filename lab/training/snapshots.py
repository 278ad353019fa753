"""A training run's weights along the way, for a series over training steps (the alignment-calibration
paper's Figure 4: ECE against pre-training steps).

The Trainer keeps only the last checkpoint (:data:`~lab.training.config.KEPT_CHECKPOINTS`, with the
optimizer's state: three times the weights), so a run with ``snapshots: true`` also writes the weights
alone at every save into ``snapshots/step-N/model/`` (full training, with the tokenizer) or
``snapshots/step-N/adapter/`` (LoRA), each moved into place whole. :func:`training_points` reads them
back in step order, with the run's base model as step 0 — no torch here, a series reads them before
loading anything.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lab.core.errors import DataError
from lab.core.layout import ADAPTER_DIR, MODEL_DIR, SNAPSHOTS_DIR
from lab.core.trained import base_model, saved_weights

STEP = re.compile(r"step-(\d+)")


@dataclass(frozen=True)
class TrainedPoint:
    """One state of a trained model, as ``load_model`` takes it: ``model`` (a folder, or the base
    model's name for an adapter), ``adapter`` (a LoRA folder or None), at optimiser ``step``."""

    step: int
    model: str
    adapter: Optional[str]


def save_snapshot(model: Any, tokenizer: Any, folder: Path, step: int, lora: bool) -> Path:
    """Write ``model``'s weights (an adapter's alone for LoRA) as ``folder/step-<step>/``, replacing one
    a killed run left there; written beside it first and renamed, so a snapshot is whole or absent."""
    target = folder / f"step-{step}"
    partial = folder / f".step-{step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    weights = partial / (ADAPTER_DIR if lora else MODEL_DIR)
    model.save_pretrained(weights)
    if not lora:
        tokenizer.save_pretrained(weights)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return target


def snapshots(run_dir: Path) -> list[TrainedPoint]:
    """The whole snapshots of ``run_dir``, in step order."""
    base = base_model(run_dir)
    found = []
    folder = Path(run_dir) / SNAPSHOTS_DIR
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = STEP.fullmatch(entry.name)
        weights = saved_weights(entry, base) if match and entry.is_dir() and not entry.is_symlink() else None
        if weights is not None:
            found.append(TrainedPoint(int(match[1]), *weights))
    return sorted(found, key=lambda p: p.step)


def final_weights(run_dir: Path) -> TrainedPoint:
    """The weights a finished run saved (``model/`` or ``adapter/``), at its last snapshot's step (0
    when it kept none)."""
    run_dir = Path(run_dir)
    weights = saved_weights(run_dir, base_model(run_dir))
    if weights is None:
        raise DataError(f"{run_dir}: no trained weights ({MODEL_DIR}/ or {ADAPTER_DIR}/); has the run finished?")
    kept = snapshots(run_dir)
    return TrainedPoint(kept[-1].step if kept else 0, *weights)


def training_points(run_dir: Path) -> list[TrainedPoint]:
    """A run's states in step order: its base model at step 0, then every snapshot. A run without
    snapshots is refused, saying how to keep them."""
    run_dir = Path(run_dir)
    kept = snapshots(run_dir)
    if not kept:
        raise DataError(f"{run_dir}: the run kept no snapshots; train it with snapshots: true for a series over steps")
    return [TrainedPoint(0, base_model(run_dir), None), *kept]
