"""A series' table (:mod:`lab.kinds.series`): its cells, the means over seeds, and the files holding them.

A *cell* is one evaluation of one point (a model, a checkpoint, a stage, a seed) on one task: its
x value on the series' axis, its accuracy and ECE with their bootstrap intervals over questions, and
the name of its run directory (so a page opens it in Reliability). Cells of one task at the same x
that differ only in their training seed are *replicates*: the summary gives their mean with a 95 %
Student-t interval over seeds (:func:`lab.calibration.spread.mean_interval`). On the seed axis every
seed is its own x, and the summary is the mean over all of them.

``series.json`` holds ``axis``, ``tasks``, ``cells`` and ``summary``; ``series.csv`` the cells as a
table. Both are rewritten after every cell, so the Life cycle page draws a series while it runs.
No gradio and no model here: the runner writes through this module and the page reads through it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from lab.calibration.metrics import finite_or_none
from lab.calibration.spread import mean_interval
from lab.core.files import write_atomic
from lab.core.layout import SERIES_CSV, SERIES_FILE

AXES = {"params": "parameters", "step": "training step", "stage": "stage", "seed": "training seed"}
CELL_COLUMNS = ("task", "x", "point", "stage", "seed", "step", "params", "model", "adapter", "n", "accuracy",
                "accuracy_low", "accuracy_high", "ece", "ece_low", "ece_high", "oracle_ece", "run")
SUMMARY_COLUMNS = ("task", "x", "runs", "accuracy_mean", "accuracy_low", "accuracy_high", "ece_mean", "ece_low",
                   "ece_high")


def x_value(axis: str, cell: dict[str, Any]) -> Any:
    """Where a cell sits on ``axis``: its parameter count, step, stage label or training seed."""
    return cell.get({"params": "params", "step": "step", "stage": "stage", "seed": "seed"}[axis])


def summarize(axis: str, cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task and x (per task alone on the seed axis), the mean over replicates with a 95 % interval
    over them (none from a single run), in the order the cells first reach each group."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for cell in cells:
        if cell.get("ece") is None or cell.get("accuracy") is None:
            continue
        x = "all seeds" if axis == "seed" else cell["x"]
        groups.setdefault((cell["task"], x), []).append(cell)
    rows = []
    for (task, x), members in groups.items():
        acc, acc_low, acc_high = mean_interval([c["accuracy"] for c in members])
        ece, ece_low, ece_high = mean_interval([c["ece"] for c in members])
        rows.append({"task": task, "x": x, "runs": len(members), "accuracy_mean": acc, "accuracy_low": acc_low,
                     "accuracy_high": acc_high, "ece_mean": ece, "ece_low": ece_low, "ece_high": ece_high})
    return rows


def document(axis: str, tasks: list[dict[str, Any]], cells: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``series.json`` holds: ``cells`` with their x filled in, and their ``summary``."""
    placed = [{**cell, "x": x_value(axis, cell)} for cell in cells]
    return {"axis": axis, "axis_title": AXES[axis], "tasks": tasks, "cells": placed,
            "summary": summarize(axis, placed)}


def write(out: Path, doc: dict[str, Any]) -> None:
    """``series.json`` and ``series.csv`` into ``out``, each replaced whole."""
    write_atomic(Path(out) / SERIES_FILE, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    write_atomic(Path(out) / SERIES_CSV, cells_frame(doc).to_csv(index=False))


def read(directory: Path) -> Optional[dict[str, Any]]:
    """A series' ``series.json``, or None when absent, half-written or not a series table."""
    try:
        doc = json.loads((Path(directory) / SERIES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(doc, dict) and doc.get("axis") in AXES and isinstance(doc.get("cells"), list)
            and isinstance(doc.get("tasks"), list)):
        return None
    cells = [c for c in doc["cells"] if isinstance(c, dict) and isinstance(c.get("task"), str)]
    for cell in cells:
        for key in ("accuracy", "accuracy_low", "accuracy_high", "ece", "ece_low", "ece_high", "oracle_ece"):
            cell[key] = finite_or_none(cell.get(key))
    return {**doc, "cells": cells, "summary": summarize(doc["axis"], cells)}


def cells_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """The cells as a table, one row per (point, task), in :data:`CELL_COLUMNS` order."""
    return pd.DataFrame([{key: cell.get(key) for key in CELL_COLUMNS} for cell in doc["cells"]],
                        columns=list(CELL_COLUMNS))


def summary_frame(doc: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(doc["summary"], columns=list(SUMMARY_COLUMNS))


def task_label(task: dict[str, Any]) -> str:
    """A task as a panel title: ``clm · text/test``."""
    return f"{task.get('task', 'mcq')} · {task.get('dataset')}/{task.get('split')}"
