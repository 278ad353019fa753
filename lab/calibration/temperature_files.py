"""A fitted temperature as a file: ``temperature.json``, written by a fit and read back by evaluation,
the UI and reports, or a temperature given as a number."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lab.calibration.temperature import TemperatureFit
from lab.core import stored
from lab.core.files import write_atomic
from lab.core.layout import TEMPERATURE_FILE
from lab.core.limits import TEMPERATURE_RANGE
from lab.core.reads import read_text, shown_here


def save_temperature(path: Path, fit: TemperatureFit, **provenance: Any) -> Path:
    """Write ``temperature.json`` (``path`` a directory or a file): the fit plus where it came from."""
    path = Path(path)
    target = path / TEMPERATURE_FILE if path.is_dir() or not path.suffix else path
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, json.dumps({**asdict(fit), "form": "logit", **provenance}, indent=2) + "\n")
    return target


def load_temperature(source: float | int | str | Path | None) -> Optional[float]:
    """A temperature from a number, a ``temperature.json`` or a run directory holding one."""
    if source is None:
        return None
    if isinstance(source, str):
        try:
            source = float(source)  # "1.5" from the command line
        except ValueError:
            pass
    if isinstance(source, (int, float)) and not isinstance(source, bool):
        value = float(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / TEMPERATURE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"No temperature file at {shown_here(path)}: fit one first (the CFT job's ts/ "
                                    "directory or the temperature lab's save button writes it)")
        text = read_text(path, encoding="utf-8")
        try:
            value = float(stored.parse(text, TEMPERATURE_FILE)["temperature"])  # depth-bounded: any file may come
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{shown_here(path)} is not a temperature file (expected JSON with a 'temperature' "
                             f"number): {e}") from None
    low, high = TEMPERATURE_RANGE
    if not (np.isfinite(value) and low <= value <= high):
        raise ValueError(f"Expected a temperature from {low:g} to {high:g}, but got {value!r}")
    return value
