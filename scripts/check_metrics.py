"""Recompute a run's metrics.json from its predictions.jsonl with independent implementations.

    python scripts/check_metrics.py RUN_DIR

ECE and MCE come from Guo et al.'s definition written out as a loop over bins
``(m−1)/M < c ≤ m/M`` for runs binned that way (``bin_edges: right``, the default) and from
torchmetrics for left-closed runs (``bin_edges: left``, and runs written before the field
existed); Brier and NLL from their textbook formulas, accuracy from the predictions themselves;
AUROC from scikit-learn's ``roc_auc_score`` and AURC as the mean error rate of the k most confident
answers by a plain sort (compared only when no two confidences tie: with ties ours is the mean over
their orders); none of lab.calibration.metrics or lab.calibration.selective is used. Exits 1 when any figure differs by more than 1e-6. torchmetrics puts
a confidence of exactly 1.0 in a bin of its own (our last bin is closed), so on a left-closed run
ECE/MCE are compared only when none occur. Needs the test extras (requirements-test.txt).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torchmetrics.functional.classification import multiclass_calibration_error

TOLERANCE = 1e-6


def guo_ece_mce(conf: np.ndarray, correct: np.ndarray, n_bins: int) -> tuple[float, float]:
    """ECE and MCE over bins ``(m−1)/M < c ≤ m/M`` (a confidence of 0 joins the first), by loops."""
    ece, mce = 0.0, 0.0
    for m in range(1, n_bins + 1):
        lower, upper = (m - 1) / n_bins, m / n_bins
        members = [i for i, c in enumerate(conf) if lower < c <= upper or (m == 1 and c == 0.0)]
        if members:
            gap = abs(float(np.mean(correct[members])) - float(np.mean(conf[members])))
            ece += len(members) / len(conf) * gap
            mce = max(mce, gap)
    return ece, mce


def independent_metrics(rows: list[dict], n_bins: int, bin_edges: str) -> dict[str, float]:
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
    if bin_edges == "right":
        conf = probs.max(1)
        found["ece"], found["mce"] = guo_ece_mce(conf, (probs.argmax(1) == y).astype(float), n_bins)
    elif probs.max(1).max() < 1.0:
        found["ece"] = float(multiclass_calibration_error(**tm, norm="l1"))
        found["mce"] = float(multiclass_calibration_error(**tm, norm="max"))
    found["trust"] = found["accuracy"] - found.get("ece", float("nan"))
    conf, right = probs.max(1), probs.argmax(1) == y
    if 0 < right.sum() < len(right):
        found["auroc"] = float(roc_auc_score(right, conf))
    if len(np.unique(conf)) == len(conf):
        ranked = right[np.argsort(-conf)]
        found["aurc"] = float(np.mean([1 - ranked[:k].mean() for k in range(1, len(ranked) + 1)]))
    return found


def check(run: Path) -> bool:
    metrics = json.loads((run / "metrics.json").read_text())
    rows = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    ok = metrics["n"] == len(rows)
    edges = metrics.get("bin_edges", "left")  # runs written before the field existed were left-closed
    print(f"{run}: n={metrics['n']} (predictions: {len(rows)}), {metrics['n_bins']} bins, {edges}-closed")
    print(f"{'metric':<10}{'metrics.json':>16}{'independent':>16}{'|diff|':>12}")
    for key, value in independent_metrics(rows, metrics["n_bins"], edges).items():
        if np.isnan(value) or key not in metrics:  # a run written before AURC/AUROC were recorded
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
