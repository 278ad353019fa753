"""Held-out recalibration and selective prediction on two real evaluations (validation and test of
one model and task): what the README's "When to trust an answer" figures come from.

    python -m bench.recalibration                 # evaluates the bundled model on bundled OBQA first
    python -m bench.recalibration --val V --test T [--out bench/results/recalibration_cpu.md]

For each calibrator (lab.calibration.calibrators): the test run's ECE (95 % bootstrap interval), smooth ECE,
top-label Brier and NLL before and after, fitted on the validation run; and, for contrast, the
same calibrator fitted on the test questions themselves and scored there (what the workbench
refuses): how much in-sample fitting flatters. Then AURC / E-AURC / AUROC of each confidence signal
on the test run. Without --val/--test it first runs `python -m lab evaluate` on the bundled model
(cloze, OpenBookQA validation and test, 500 questions each; about 8 minutes on two cores).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench._harness import REPO, RESULTS, Timer, parser, shown, write_result
from lab.calibration import calibrators, confidence, metrics, selective
from lab.results import predictions
from lab.results.reports import pct


def _evaluate(split: str, out: Path) -> Path:
    if not (out / "metrics.json").is_file():
        subprocess.run([sys.executable, "-m", "lab", "evaluate", "--model", "bundled", "--dataset", "obqa",
                        "--data-files", "bundled", "--split", split, "--out", str(out)], check=True, cwd=REPO)
    return out


def _pct(report: dict) -> str:
    """A report's ECE in percent with its bootstrap interval."""
    return f"{pct(report['ece'])} [{pct(report['ece_ci_low'])}, {pct(report['ece_ci_high'])}]"


def main() -> None:
    options = parser(__doc__, out=RESULTS / "recalibration_cpu.md")
    options.add_argument("--val", type=Path, help="evaluation run to fit on")
    options.add_argument("--test", type=Path, help="evaluation run to apply to")
    options.add_argument("--work", type=Path, default=REPO / "runs" / "bench-recalibration")
    args = options.parse_args()
    timer = Timer()
    val = args.val or _evaluate("validation", args.work / "val")
    test = args.test or _evaluate("test", args.work / "test")
    v, t = predictions.load_predictions(val), predictions.load_predictions(test)
    vp, tp = predictions.reported_probs(v), predictions.reported_probs(t)

    lines = ["# Held-out recalibration", "",
             f"Fit on `{shown(val)}` (n = {len(v.labels)}), applied to `{shown(test)}` (n = {len(t.labels)}); "
             "the bundled model, cloze scoring, bundled OpenBookQA unless given; shared questions: "
             f"{calibrators.overlap(calibrators.fit('histogram', vp, v.mask, v.labels, v.rows), t.rows)}.", "",
             "| Method | test ECE % before [95% CI] | after, fitted on validation | after, fitted on test itself "
             "(refused by the workbench) | smECE after | Brier (top label) before → after | NLL before → after |",
             "|---|---|---|---|---|---|---|"]
    for method in calibrators.METHODS.in_order():
        cal = calibrators.fit(method, vp, v.mask, v.labels, v.rows)
        held = calibrators.before_after(cal, tp, t.mask, t.labels, t.rows, edges=t.bin_edges)
        own = calibrators.fit(method, tp, t.mask, t.labels, t.rows)
        own.questions = []  # only to measure what the guard prevents: in-sample fitting
        flattered = calibrators.before_after(own, tp, t.mask, t.labels, t.rows, edges=t.bin_edges)
        b, a = held["before"], held["after"]
        lines.append(f"| {calibrators.METHODS.get(method).title} | {_pct(b)} | {_pct(a)} | {_pct(flattered['after'])} "
                     f"| {100 * a['smece']:.1f} | {b['brier']:.3f} → {a['brier']:.3f} | {b['nll']:.3f} → {a['nll']:.3f} |")
    lines += ["", "Selective prediction on the test run, per confidence signal:", "",
              "| Signal | AURC ↓ [95% CI] | E-AURC ↓ | AUROC ↑ [95% CI] | accuracy at 50 % coverage | at 80 % | all |",
              "|---|---|---|---|---|---|---|"]
    correct = metrics.predictions(tp, t.mask)[0] == t.labels
    for name in confidence.available(tp, t.mask, t.rows):
        conf = confidence.values(name, tp, t.mask, t.rows)
        s = selective.summary(conf, correct, n_boot=1000)
        auroc = "–" if s["auroc"] is None else f"{s['auroc']:.3f} [{s['auroc_ci'][0]:.3f}, {s['auroc_ci'][1]:.3f}]"
        lines.append(f"| {confidence.SIGNALS.get(name).title} | {s['aurc']:.3f} [{s['aurc_ci'][0]:.3f}, "
                     f"{s['aurc_ci'][1]:.3f}] | {s['e_aurc']:.3f} | {auroc} | {s['acc_at_50']:.3f} | "
                     f"{s['acc_at_80']:.3f} | {correct.mean():.3f} |")
    lines += ["", f"{timer.seconds:.0f} s in all."]
    write_result(args.out, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
