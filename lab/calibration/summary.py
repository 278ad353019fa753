"""The metrics an evaluation reports, computed from its prediction rows alone.

What ``metrics.json`` holds is recomputable from ``predictions.jsonl``: these take the rows (``probs``,
``answer``, and for the controlled task ``meta.true_probs``) and nothing else, so an evaluation, a
training run's validation and a re-read of a stored run all compute the same figures.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from lab.calibration import confidence, metrics, oracle, selective
from lab.data import synthetic


def compute_metrics(rows: list[dict[str, Any]], n_bins: int, n_boot: int, seed: int,
                    edges: str = "right") -> dict[str, Any]:
    """Metrics from prediction rows alone: what ``metrics.json`` holds, recomputable from the file."""
    probs, mask = metrics.padded([np.asarray(r["probs"]) for r in rows])
    labels = np.array([r["answer"] for r in rows])
    return metrics.summarize(probs, labels, n_bins=n_bins, mask=mask, n_boot=n_boot, seed=seed, edges=edges)


def selective_metrics(rows: list[dict[str, Any]], n_boot: int, seed: int) -> dict[str, Any]:
    """Selective prediction from prediction rows: AURC, E-AURC, AUROC and accuracy at 50/80 %
    coverage of the top probability (with bootstrap intervals when ``n_boot`` > 0), and under
    ``signals`` the same for every confidence signal the rows can give (:mod:`lab.calibration.confidence`)."""
    probs, mask = metrics.padded([np.asarray(r["probs"]) for r in rows])
    correct = np.array([r["answer"] for r in rows]) == metrics.predictions(probs, mask)[0]
    signals = confidence.all_values(probs, mask, rows)
    per_signal = {name: selective.summary(conf, correct) for name, conf in signals.items()}
    top = selective.summary(signals[confidence.DEFAULT], correct, n_boot=n_boot, seed=seed)
    return {**top, "signals": per_signal}


def oracle_metrics(rows: list[dict[str, Any]], n_bins: int, edges: str) -> Optional[dict[str, Any]]:
    """For questions that carry their true answer distribution (``meta.true_probs``: the controlled
    task, :mod:`lab.data.synthetic`), the Bayes predictor's accuracy, ECE, NLL and Brier on them, and
    under ``expected`` its accuracy and ECE in closed form; None for any other data."""
    truths = synthetic.true_distributions(rows)
    if truths is None:
        return None
    labels = [r["answer"] for r in rows]
    return {**oracle.oracle(truths, labels, n_bins, edges), "expected": oracle.expected_oracle(truths, n_bins, edges)}
