"""``report.json`` and ``report.md`` of the CFT protocol, laid out like the paper's Table 2.

One row per method: conf-ECE (with its bootstrap interval), cw-ECE and accuracy in-domain and on
each out-of-domain set, then the win rate on preference pairs (sum and per-token). The JSON holds
the same rows as the FIRST report (``rows``: one per method and set), the temperature the TS row
uses (``temperature``; its ``fits`` holds T fitted by ECE, as the paper does, and by NLL, each with
its validation ECE and NLL, since the two can disagree by a lot), each trained row's validation
ECE/accuracy after every epoch (``training``), and each RCFT row's E-steps (``esteps``: training
accuracy, mean confidence, per-bin accuracy and counts, and the share of training questions whose
M-step targets rank another option above the current top, A.4's condition).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from lab.results.predictions import LEGACY_BIN_EDGES
from lab.results.reports import SELECTIVE_HEAD, pct, row, selective_cells, write_files

NAMES = {"base": "Base model", "ts": "Temperature scaling", "ls": "Label smoothing", "cft": "CFT"}
SETS_SKIPPED = ("validation", "winrate")


def method_name(method: str) -> str:
    if method.startswith("rcft_"):
        return f"RCFT λ={method.removeprefix('rcft_')}"
    return NAMES.get(method, method)


def _lambda(method: str) -> Optional[float]:
    return float(method.removeprefix("rcft_")) if method.startswith("rcft_") else None


def markdown(report: dict[str, Any]) -> str:
    sets = list(dict.fromkeys(r["set"] for r in report["rows"]))
    head = ["Method"]
    for s in sets:
        first = next(r for r in report["rows"] if r["set"] == s)
        where = "in-domain" if first["in_domain"] else "out-of-domain"
        head += [f"{first['dataset']} ({where}, n={first['n']}) ECE ↓ [95% CI]", "cw-ECE ↓", "Acc ↑", *SELECTIVE_HEAD]
    head += ["Win rate ↑", "Win rate (per token) ↑"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, win in report["win_rate"].items():
        cells = [method_name(method)]
        for s in sets:
            r = next((r for r in report["rows"] if r["method"] == method and r["set"] == s), None)
            if r is None:
                cells += ["–"] * (3 + len(SELECTIVE_HEAD))
                continue
            ci = f" [{pct(r['ece_ci_low'])}, {pct(r['ece_ci_high'])}]" if r.get("ece_ci_low") is not None else ""
            cells += [f"{pct(r['ece'])}{ci}", pct(r["cw_ece"]), pct(r["accuracy"]), *selective_cells(r)]
        cells += [pct(win.get("win_rate")), pct(win.get("win_rate_norm"))]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["", "All figures in percent. Confidence: softmax over the option letters at the answer position "
             f"({report['config']['template']} prompt). Win rate: share of preference pairs where the model gives the chosen response a "
             f"higher log-probability than the rejected one (n = {next(iter(report['win_rate'].values())).get('n')}, "
             "responses cut to the configured token budget); temperature scaling leaves it unchanged."]
    tasks = [s for s in sets if str(s).startswith("lm-eval:")]
    if tasks:  # scored as lm-eval scores them, so their confidence is not the letters'
        notes[-1] += (f" On {', '.join(tasks)} (lm-eval tasks), confidence is the softmax over the options' summed "
                      "log-likelihoods after the task's own prompt (cloze, as lm-eval's acc).")
    if report.get("temperature"):
        notes += temperature_notes(report["temperature"])
    if report.get("training"):
        notes += ["", "Validation (pooled in-domain) after each epoch:", "",
                  "| Method | Epoch | ECE | Acc |", "|---|---|---|---|"]
        for method, history in report["training"].items():
            for h in history:
                notes.append(f"| {method_name(method)} | {h['epoch']:g} | {pct(h['ece'])} | {pct(h['accuracy'])} |")
    if report.get("esteps"):
        notes += ["", "RCFT E-steps on the training questions; the last column is the share whose rank-preserving "
                      "targets would put another option above the current top (acc below A.4's bound):", "",
                  "| Method | Step | Train acc | Mean conf | Rank broken in |", "|---|---|---|---|---|"]
        for method, steps in report["esteps"].items():
            for e in steps:
                notes.append(f"| {method_name(method)} | {e['step']} | {pct(e['train_accuracy'])} | "
                             f"{pct(e['confidence'])} | {pct(e.get('rank_violations'))} |")
    return "# CFT / RCFT: calibration-aware fine-tuning\n\n" + "\n".join(lines) + "\n" + "\n".join(notes) + "\n"


def temperature_notes(used: dict[str, Any]) -> list[str]:
    """The temperature fits as a small table: T by each objective, validation ECE and NLL before → after,
    the range the ECE search covered, and which fit the TS row uses."""
    fits = used.get("fits") or {used["objective"]: used}  # a run resumed from before both were fitted: its one fit
    edges = used.get("bin_edges", LEGACY_BIN_EDGES)
    lines = ["", f"Temperature scaling, fitted on {used['n']} validation questions ({used['bins']} bins, "
                 f"{edges}-closed); the TS row uses T by {used['objective'].upper()}:", "",
             "| Fitted by | T | Validation ECE | Validation NLL | Search |", "|---|---|---|---|---|"]
    for objective, fit in fits.items():
        lines.append(f"| {objective.upper()}{' (TS row)' if objective == used['objective'] else ''} | "
                     f"{fit['temperature']:.3f} | {pct(fit['ece_before'])} → {pct(fit['ece_after'])} | "
                     f"{fit['nll_before']:.4f} → {fit['nll_after']:.4f} | {_search(fit)} |")
    return lines


def _search(fit: dict[str, Any]) -> str:
    """Where the fit looked, and whether it had to go further than planned or stopped at a bound."""
    if fit.get("searched"):
        low, high = fit["searched"]
        where = f"grid T = {low:.3g}…{high:.3g}" + (", widened past an edge" if fit.get("widened") else "")
    else:
        where = "Brent over log T"
    bound = (" — at the bound: the fit wanted a more extreme T (a model whose confidence carries no signal is "
             "fitted flat, T → ∞)")
    return where + (bound if fit.get("at_bound") else "")


def write_report(out: Path, cfg, results: dict[str, dict[str, Any]], temperature: Optional[dict[str, Any]],
                 histories: dict[str, list], esteps: Optional[dict[str, list]] = None) -> dict[str, Any]:
    rows = []
    for method, sets in results.items():
        for set_name, metrics in sets.items():
            if set_name in SETS_SKIPPED:
                continue
            rows.append(row(method, metrics, set=set_name, in_domain=set_name == "in_domain", ece_lambda=_lambda(method)))
    win = {m: {k: sets["winrate"].get(k) for k in ("win_rate", "win_rate_norm", "ties", "n", "max_response_tokens")}
           for m, sets in results.items()}
    report = {"rows": rows, "temperature": temperature, "win_rate": win, "training": histories, "esteps": esteps or {},
              "config": cfg.to_dict()}
    return write_files(out, report, markdown(report))
