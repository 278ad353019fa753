"""What the pipelines' ``report.json`` / ``report.md`` writers share, and the one writer of every CSV the lab
hands out (Results' export, a series' ``series.csv``, Compare's export)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from lab.core.files import write_atomic
from lab.core.layout import REPORT_JSON, REPORT_MD

ROW_KEYS = ("method", "dataset", "split", "in_domain", "n", "accuracy", "ece", "ece_ci_low", "ece_ci_high",
            "cw_ece", "nll", "trust", "temperature", "aurc", "auroc")
# A spreadsheet runs a cell starting with one of these as a formula (=HYPERLINK(…), +cmd|…, @SUM…); a tab or a
# carriage return first hides such a start from a check of the first character alone (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
SELECTIVE_HEAD = ["AURC ↓", "AUROC ↑"]  # the columns of selective prediction every report table ends a set with


def pct(x: Any, percent_sign: bool = False) -> str:
    """A fraction as a percentage with one decimal, or an en dash for a missing value: the one
    formatter of the reports and the pages, so that a figure reads the same wherever it is shown.
    ``percent_sign``: end it in "%", as the pages do; the reports' tables leave it out."""
    return "–" if x is None else f"{100 * x:.1f}" + ("%" if percent_sign else "")


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


def _inert(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula, with a single quote before it (shown as
    text, the quote hidden); anything else, numbers included, as it is."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def csv_text(frame: pd.DataFrame) -> str:
    """``frame`` as CSV text (no index) whose text cells and headers (run names, questions, model
    names: anything a user or a file could set) no spreadsheet runs as a formula. Lines end in CRLF
    (RFC 4180), so that a cell holding a carriage return is quoted and cannot start a row of its own."""
    safe = frame.map(_inert)
    safe.columns = [_inert(str(column)) for column in frame.columns]
    return safe.to_csv(index=False, lineterminator="\r\n")
