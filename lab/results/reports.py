"""What the pipelines' ``report.json`` / ``report.md`` writers share."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.core.files import write_atomic
from lab.core.layout import REPORT_JSON, REPORT_MD

ROW_KEYS = ("method", "dataset", "split", "in_domain", "n", "accuracy", "ece", "ece_ci_low", "ece_ci_high",
            "cw_ece", "nll", "trust", "temperature", "aurc", "auroc")
SELECTIVE_HEAD = ["AURC ↓", "AUROC ↑"]  # the columns of selective prediction every report table ends a set with


def pct(x: Any) -> str:
    """A fraction as a percentage with one decimal, or an en dash for a missing value."""
    return "–" if x is None else f"{100 * x:.1f}"


def selective_cells(r: dict[str, Any]) -> list[str]:
    """A row's AURC and AUROC in percent (en dashes for a run evaluated before they were recorded)."""
    return [pct(r.get("aurc")), pct(r.get("auroc"))]


def row(method: str, metrics: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One report row: the method and the metrics every table shows."""
    return {"method": method, **{k: metrics.get(k) for k in ROW_KEYS if k != "method"}, **extra}


def write_files(out: Path, report: dict[str, Any], markdown: str) -> dict[str, Any]:
    write_atomic(out / REPORT_JSON, json.dumps(report, indent=2) + "\n")
    write_atomic(out / REPORT_MD, markdown)
    return report
