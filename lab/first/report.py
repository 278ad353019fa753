"""``report.json`` and ``report.md``: every model on every dataset, laid out like FIRST's Table 1."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.reports import ROW_KEYS, pct as _pct, write_files
SWEEP_KEYS = ("form", "objective", "best", "best_ece", "best_nll", "identity_ece", "on_edge", "records")
METHOD_NAMES = {"teacher": "Teacher", "finetune": "Fine-tune", "distill": "Distill (direct)",
                "distill_ls": "Distill + label smoothing", "first": "FIRST (temperature scaling)"}


def markdown(rows: list[dict[str, Any]], sweep: dict[str, Any]) -> str:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    head = ["Method"]
    for d in datasets:
        n = next(r["n"] for r in rows if r["dataset"] == d)
        where = "in-domain" if next(r["in_domain"] for r in rows if r["dataset"] == d) else "out-of-domain"
        head += [f"{d} ({where}, n={n}) ECE ↓ [95% CI]", "Acc ↑", "Trust ↑"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in dict.fromkeys(r["method"] for r in rows):
        cells = [METHOD_NAMES.get(method, method)]
        for d in datasets:
            r = next((r for r in rows if r["method"] == method and r["dataset"] == d), None)
            if r is None:
                cells += ["–"] * 3
                continue
            ci = f" [{_pct(r['ece_ci_low'])}, {_pct(r['ece_ci_high'])}]" if r.get("ece_ci_low") is not None else ""
            cells += [f"{_pct(r['ece'])}{ci}", _pct(r["accuracy"]), _pct(r["trust"])]
        lines.append("| " + " | ".join(cells) + " |")
    edge = " (on the edge of the grid: widen it)" if sweep.get("on_edge") else ""
    at_one = next((r["ece"] for r in sweep.get("records", []) if abs(r["value"] - 1.0) < 1e-9), None)
    note = (f"\nAll figures in percent. Temperature ({sweep['form']} form, minimising {sweep['objective']} on the "
            f"teacher's top-k at the validation answer positions): c = {sweep['best']:g}{edge}. Teacher validation "
            f"ECE: {_pct(sweep['identity_ece'])} without re-calibration (top-k renormalised), {_pct(at_one)} at c = 1, "
            f"{_pct(sweep['best_ece'])} at c = {sweep['best']:g}.\n")
    return "# FIRST: teacher and students\n\n" + "\n".join(lines) + "\n" + note


def write_report(out: Path, cfg, rows: list[dict[str, Any]], sweep: dict[str, Any]) -> dict[str, Any]:
    report = {"rows": [{k: r.get(k) for k in ROW_KEYS} for r in rows],
              "sweep": {k: sweep.get(k) for k in SWEEP_KEYS}, "config": cfg.to_dict()}
    return write_files(out, report, markdown(report["rows"], sweep))
