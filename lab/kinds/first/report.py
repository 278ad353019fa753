"""``report.json`` and ``report.md``: every model on every dataset, laid out like FIRST's Table 1."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.results.reports import ROW_KEYS, SELECTIVE_HEAD
from lab.results.reports import pct as _pct
from lab.results.reports import selective_cells, write_files

SWEEP_KEYS = ("form", "objective", "n_bins", "bin_edges", "best", "best_ece", "best_nll", "identity_ece", "widened",
              "on_edge", "records")
SYMBOL = {"paper": "c", "logit": "T"}  # FIRST Eq. 4 calls its temperature c; the usual one is T
METHOD_NAMES = {"teacher": "Teacher", "finetune": "Fine-tune", "distill": "Distill (direct)",
                "distill_ls": "Distill + label smoothing", "first": "FIRST (temperature scaling)",
                "oracle": "Oracle distill (true distribution; upper bound)"}


def markdown(rows: list[dict[str, Any]], sweep: dict[str, Any]) -> str:
    sets = list(dict.fromkeys(_set(r) for r in rows))
    head = ["Method"]
    for s in sets:
        first = next(r for r in rows if _set(r) == s)
        where = "in-domain" if first["in_domain"] else "out-of-domain"
        head += [f"{s} ({where}, n={first['n']}) ECE ↓ [95% CI]", "Acc ↑", "Trust ↑", *SELECTIVE_HEAD]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in dict.fromkeys(r["method"] for r in rows):
        cells = [METHOD_NAMES.get(method, method)]
        for s in sets:
            r = next((r for r in rows if r["method"] == method and _set(r) == s), None)
            if r is None:
                cells += ["–"] * (3 + len(SELECTIVE_HEAD))
                continue
            ci = f" [{_pct(r['ece_ci_low'])}, {_pct(r['ece_ci_high'])}]" if r.get("ece_ci_low") is not None else ""
            cells += [f"{_pct(r['ece'])}{ci}", _pct(r["accuracy"]), _pct(r["trust"]), *selective_cells(r)]
        lines.append("| " + " | ".join(cells) + " |")
    c = SYMBOL.get(sweep["form"], "c")
    at_one = next((r["ece"] for r in sweep.get("records", []) if abs(r["value"] - 1.0) < 1e-9), None)
    widening = sweep_summary(sweep)
    note = (f"\nAll figures in percent. Temperature ({sweep['form']} form, minimising {sweep['objective']} on the "
            f"teacher's top-k at the validation answer positions): {c} = {sweep['best']:g}. "
            + (widening + " " if widening else "")
            + f"Teacher validation ECE: {_pct(sweep['identity_ece'])} without re-calibration "
            f"(top-k renormalised), {_pct(at_one)} at {c} = 1, {_pct(sweep['best_ece'])} at {c} = {sweep['best']:g}.\n")
    return "# FIRST: teacher and students\n\n" + "\n".join(lines) + "\n" + note


def sweep_summary(sweep: dict[str, Any]) -> str:
    """The sweep's widening in words ("" when the grid held the optimum): the reader of a
    temperature found past the grid it started from, or stuck on a hard bound, should know."""
    c = SYMBOL.get(sweep["form"], "c")
    said = [f"The optimum lay on the edge of the grid at {c} = {w['from']:g}, so the grid was widened "
            f"{w['side']} it as far as {c} = {w['to']:g}." for w in sweep.get("widened") or []]
    if sweep.get("on_edge"):
        said.append(f"{c} = {sweep['best']:g} is still on the edge of every value tried, a hard bound of the "
                    "search: the teacher's confidence may carry no signal to re-calibrate.")
    return " ".join(said)


def _set(row: dict[str, Any]) -> str:
    """The evaluation set a row belongs to (reports written before sets were named: its dataset)."""
    return row.get("set") or row["dataset"]


def write_report(out: Path, cfg, rows: list[dict[str, Any]], sweep: dict[str, Any]) -> dict[str, Any]:
    report = {"rows": [{k: r.get(k) for k in (*ROW_KEYS, "set")} for r in rows],
              "sweep": {k: sweep.get(k) for k in SWEEP_KEYS}, "config": cfg.to_dict()}
    return write_files(out, report, markdown(report["rows"], sweep))
