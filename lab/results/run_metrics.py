"""A run's ``metrics.json`` read back: the mapping, why it cannot be read, and the shots it was evaluated with.

Pages poll the runs directory, and a job may be writing or have been killed mid-write: a reader here gets
None for a file it cannot use, and :func:`metrics_problem` the one sentence that names why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from lab.core import stored
from lab.core.layout import METRICS_FILE


def read_metrics(directory: Path) -> Optional[dict[str, Any]]:
    """``metrics.json`` of ``directory`` as a dict, or None when missing, half-written, too large or deep,
    or not an object (:mod:`lab.core.stored`; :func:`metrics_problem` says which)."""
    try:
        return stored.read_object(Path(directory) / METRICS_FILE)
    except (OSError, ValueError):
        return None


def metrics_problem(directory: Path, name: str) -> Optional[str]:
    """Why ``metrics.json`` of the run called ``name`` cannot be read (one sentence naming it), or None."""
    try:
        stored.read_object(Path(directory) / METRICS_FILE, f"{name}/{METRICS_FILE}")
    except OSError as e:
        return f"{name}/{METRICS_FILE}: cannot be read ({e.strerror or type(e).__name__})"
    except ValueError as e:
        return str(e)
    return None


def shots_of(data: dict[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """A few-shot run's (shots, split) from its ``metrics.json``: an lm-eval run's tasks' few-shot count ("5",
    or "0–5" where a group's tasks differ) and their split where they share one; a lab dataset's ``fewshot``
    count (its split is the config's); (None, None) for a zero-shot run of a lab dataset."""
    tasks = data.get("lm_eval", {}).get("tasks") if isinstance(data.get("lm_eval"), dict) else None
    about = [t for t in tasks.values() if isinstance(t, dict)] if isinstance(tasks, dict) else []
    own = data.get("fewshot") if isinstance(data.get("fewshot"), dict) else {}  # a lab dataset's shots
    if not about and isinstance(own.get("num_fewshot"), int) and not isinstance(own["num_fewshot"], bool):
        about = [{"shots": own["num_fewshot"]}]
    shots = sorted({t["shots"] for t in about if isinstance(t.get("shots"), int) and not isinstance(t["shots"], bool)})
    splits = {t["split"] for t in about if isinstance(t.get("split"), str)}
    said = None if not shots else str(shots[0]) if len(shots) == 1 else f"{shots[0]}–{shots[-1]}"
    return said, splits.pop() if len(splits) == 1 else None
