"""Recompute a run's metrics.json from its predictions.jsonl with independent implementations.

    python scripts/check_metrics.py RUN_DIR

ECE and MCE come from torchmetrics, Brier and NLL from their textbook formulas, accuracy
from the predictions themselves; none of lab.metrics is used. Exits 1 when any figure differs
by more than 1e-6. torchmetrics puts a confidence of exactly 1.0 in a bin of its own (our last
bin is closed), so such a run is reported and ECE/MCE are compared on it only when none occur.
Needs the test extras (requirements-test.txt).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from torchmetrics.functional.classification import multiclass_calibration_error

TOLERANCE = 1e-6


def independent_metrics(rows: list[dict], n_bins: int) -> dict[str, float]:
    width = max(len(r["probs"]) for r in rows)
    probs = np.array([r["probs"] + [0.0] * (width - len(r["probs"])) for r in rows])  # (n, K)
    y = np.array([r["answer"] for r in rows])
    onehot = np.eye(width)[y]
    tm = dict(preds=torch.tensor(probs), target=torch.tensor(y), num_classes=width, n_bins=n_bins)
    found = {
        "accuracy": float(np.mean(probs.argmax(1) == y)),
        "brier": float(np.mean(((probs - onehot) ** 2).sum(1))),
        "nll": float(np.mean(-np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, None)))),
    }
    if probs.max(1).max() < 1.0:
        found["ece"] = float(multiclass_calibration_error(**tm, norm="l1"))
        found["mce"] = float(multiclass_calibration_error(**tm, norm="max"))
    found["trust"] = found["accuracy"] - found.get("ece", float("nan"))
    return found


def check(run: Path) -> bool:
    metrics = json.loads((run / "metrics.json").read_text())
    rows = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    ok = metrics["n"] == len(rows)
    print(f"{run}: n={metrics['n']} (predictions: {len(rows)}), {metrics['n_bins']} bins")
    print(f"{'metric':<10}{'metrics.json':>16}{'independent':>16}{'|diff|':>12}")
    for key, value in independent_metrics(rows, metrics["n_bins"]).items():
        if np.isnan(value):
            continue
        diff = abs(metrics[key] - value)
        ok &= diff <= TOLERANCE
        print(f"{key:<10}{metrics[key]:>16.8f}{value:>16.8f}{diff:>12.2e}")
    print("agree" if ok else "DISAGREE")
    return ok


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(0 if check(Path(sys.argv[1])) else 1)
