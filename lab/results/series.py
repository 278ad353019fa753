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
CELL_COLUMNS = ("task", "x", "entry", "point", "stage", "seed", "step", "params", "model", "adapter", "revision", "n",
                "accuracy", "accuracy_low", "accuracy_high", "ece", "ece_low", "ece_high", "oracle_ece", "run")
SUMMARY_COLUMNS = ("task", "entry", "x", "runs", "accuracy_mean", "accuracy_low", "accuracy_high", "ece_mean",
                   "ece_low", "ece_high")


def x_value(axis: str, cell: dict[str, Any]) -> Any:
    """Where a cell sits on ``axis``: its parameter count, step, stage label or training seed."""
    return cell.get({"params": "params", "step": "step", "stage": "stage", "seed": "seed"}[axis])


def _unit_interval(estimate: tuple[float, Optional[float], Optional[float]]) -> tuple[float, Optional[float],
                                                                                      Optional[float]]:
    """A t-interval of a mean of rates, cut to [0, 1]: with three seeds and a wide spread it reaches
    below 0 (ECE 20 % ± 19 %), where no rate can be."""
    mean, low, high = estimate
    return mean, None if low is None else max(low, 0.0), None if high is None else min(high, 1.0)


def summarize(axis: str, cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, model entry and x (per task and entry on the seed axis), the mean over replicates —
    the cells that differ only in their training seed — with a 95 % interval over them (none from a
    single run; cut to [0, 1]), in the order the cells first reach each group. Two entries at one x
    (two learning rates at step 200, two models of one size) stay apart."""
    groups: dict[tuple[str, Any, Any], list[dict[str, Any]]] = {}
    for cell in cells:
        if cell.get("ece") is None or cell.get("accuracy") is None:
            continue
        x = "all seeds" if axis == "seed" else cell.get("x")
        groups.setdefault((cell["task"], cell.get("entry"), x), []).append(cell)
    rows = []
    for (task, entry, x), members in groups.items():
        acc, acc_low, acc_high = _unit_interval(mean_interval([c["accuracy"] for c in members]))
        ece, ece_low, ece_high = _unit_interval(mean_interval([c["ece"] for c in members]))
        rows.append({"task": task, "entry": entry, "x": x, "runs": len(members), "accuracy_mean": acc,
                     "accuracy_low": acc_low,
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
    cells = [{**c, "x": x_value(doc["axis"], c)} for c in doc["cells"]
             if isinstance(c, dict) and isinstance(c.get("task"), str)]
    cells = [c for c in cells if _scalar(c["x"]) and _scalar(c.get("entry"))]
    for cell in cells:
        for key in ("accuracy", "accuracy_low", "accuracy_high", "ece", "ece_low", "ece_high", "oracle_ece"):
            cell[key] = finite_or_none(cell.get(key))
    return {**doc, "cells": cells, "summary": summarize(doc["axis"], cells)}


def _scalar(value: Any) -> bool:
    """A value a cell may be grouped and drawn by: a number, a label, or none."""
    return value is None or isinstance(value, (int, float, str)) and not isinstance(value, bool)


def cells_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """The cells as a table, one row per (point, task), in :data:`CELL_COLUMNS` order."""
    return pd.DataFrame([{key: cell.get(key) for key in CELL_COLUMNS} for cell in doc["cells"]],
                        columns=list(CELL_COLUMNS))


def summary_frame(doc: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(doc["summary"], columns=list(SUMMARY_COLUMNS))


def task_label(task: dict[str, Any]) -> str:
    """A task as a panel title: ``clm · text/test``."""
    return f"{task.get('task', 'mcq')} · {task.get('dataset')}/{task.get('split')}"
