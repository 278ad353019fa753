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
from lab.core import stored
from lab.core.files import write_atomic
from lab.core.layout import SERIES_CSV, SERIES_FILE
from lab.data.harness import is_task
from lab.results.reports import csv_text

AXES = {"params": "parameters", "step": "training step", "stage": "stage", "seed": "training seed"}
CELL_COLUMNS = ("task", "x", "entry", "point", "stage", "seed", "step", "params", "model", "adapter", "revision", "n",
                "accuracy", "accuracy_low", "accuracy_high", "ece", "ece_low", "ece_high", "oracle_ece", "run")
METRIC_KEYS = ("accuracy", "accuracy_low", "accuracy_high", "ece", "ece_low", "ece_high", "oracle_ece")
# what pages group, list and name a cell by: each must be a number, a label or none
SCALAR_KEYS = ("entry", "point", "stage", "seed", "step", "params", "model", "adapter", "revision", "n", "run")
SUMMARY_COLUMNS = ("task", "entry", "x", "runs", "accuracy_mean", "accuracy_low", "accuracy_high", "ece_mean",
                   "ece_low", "ece_high")


def x_value(axis: str, cell: dict[str, Any]) -> Any:
    """Where a cell sits on ``axis``: its parameter count, step, stage label or training seed."""
    return cell.get({"params": "params", "step": "step", "stage": "stage", "seed": "seed"}[axis])


def summarize(axis: str, cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, model entry and x (per task and entry on the seed axis), the mean over replicates —
    the cells that differ only in their training seed — with a 95 % interval over them (none from a
    single run), in the order the cells first reach each group. The interval is kept as computed: over
    three seeds with a wide spread it can pass 0 or 1 (ECE 20 % ± 25 %), which says how little those
    seeds pin the mean down; cutting it to [0, 1] would hide that. Two entries at one x
    (two learning rates at step 200, two models of one size) stay apart."""
    groups: dict[tuple[str, Any, Any], list[dict[str, Any]]] = {}
    for cell in cells:
        if cell.get("ece") is None or cell.get("accuracy") is None:
            continue
        x = "all seeds" if axis == "seed" else cell.get("x")
        groups.setdefault((cell["task"], cell.get("entry"), x), []).append(cell)
    rows = []
    for (task, entry, x), members in groups.items():
        acc, acc_low, acc_high = mean_interval([c["accuracy"] for c in members])
        ece, ece_low, ece_high = mean_interval([c["ece"] for c in members])
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
    write_atomic(Path(out) / SERIES_CSV, csv_text(cells_frame(doc)))


def read(directory: Path, name: Optional[str] = None) -> Optional[dict[str, Any]]:
    """A series' ``series.json``, or None when absent, damaged (:mod:`lab.core.stored`) or not a series
    table. Cells that cannot be drawn (no task, a list where a name or a number belongs) are left out
    and named in ``problems``; ``name`` is what they call the series (default: the file's name)."""
    where = f"{name}/{SERIES_FILE}" if name else SERIES_FILE
    try:
        doc = stored.read_object(Path(directory) / SERIES_FILE, where)
    except (OSError, ValueError):
        return None
    if not (doc.get("axis") in AXES and isinstance(doc.get("cells"), list) and isinstance(doc.get("tasks"), list)):
        return None
    cells, problems = [], []
    for number, cell in enumerate(doc["cells"], start=1):
        problem = _cell_problem(doc["axis"], cell)
        if problem:
            problems.append(f"{where}: cell {number} left out: {problem}")
            continue
        cells.append({**cell, "x": x_value(doc["axis"], cell),
                      **{key: finite_or_none(cell.get(key)) for key in METRIC_KEYS}})
    return {**doc, "cells": cells, "summary": summarize(doc["axis"], cells), "problems": problems}


def _cell_problem(axis: str, cell: Any) -> Optional[str]:
    """Why a stored cell cannot be grouped, drawn or listed (one phrase), or None when it can."""
    if not isinstance(cell, dict):
        return f"expected an object, but got {type(cell).__name__}"
    if not isinstance(cell.get("task"), str):
        return f"expected 'task' to be a task's key, but got {type(cell.get('task')).__name__}"
    for key in ("x", *SCALAR_KEYS):
        value = x_value(axis, cell) if key == "x" else cell.get(key)
        if not _scalar(value):
            return f"expected {key!r} to be a name or a number, but got {type(value).__name__}"
    return None


def _scalar(value: Any) -> bool:
    """A value a cell may be grouped and drawn by: a number, a label, or none."""
    return value is None or isinstance(value, (int, float, str)) and not isinstance(value, bool)


def cells_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """The cells as a table, one row per (point, task), in :data:`CELL_COLUMNS` order."""
    return pd.DataFrame([{key: cell.get(key) for key in CELL_COLUMNS} for cell in doc["cells"]],
                        columns=list(CELL_COLUMNS))


def summary_frame(doc: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(doc["summary"], columns=list(SUMMARY_COLUMNS))


def dataset_label(dataset: Any, split: Any, shots: Any = None) -> str:
    """A dataset as the pages name it: ``obqa/test``; an lm-eval task by its name and shots,
    ``lm-eval:bundled_mmlu (5-shot)`` (a group's differing shots as ``0–5-shot``; None: the task's own,
    known once it ran). An lm-eval task reads the split its YAML names, so the config's is not shown. A lab
    dataset with examples: ``obqa/test (2-shot)``."""
    if not is_task(dataset):
        named = "/".join(str(p) for p in (dataset, split) if p)
        return f"{named} ({shots}-shot)" if shots else named
    return f"{dataset} ({shots}-shot)" if shots is not None else f"{dataset} (the task's own shots)"


def task_label(task: dict[str, Any]) -> str:
    """A task as a panel title: ``clm · text/test``, ``mcq · lm-eval:bundled_mmlu (5-shot)``."""
    return f"{task.get('task', 'mcq')} · {dataset_label(task.get('dataset'), task.get('split'), task.get('num_fewshot'))}"
