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

SELECTIVE_BOOT = 200  # bootstrap replicates for the AURC/AUROC intervals: each re-sorts the questions

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
    return oracle.oracle_report(truths, [r["answer"] for r in rows], n_bins, edges)


CW_ECE_UNDEFINED = ("class-wise ECE is not reported for token tasks: over a vocabulary of tens of thousands of "
                    "tokens almost every class is empty, and its binned estimate is then meaningless")


def token_arrays(rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """A token run's rows as (n, k + 1) probabilities — each target's top k over the vocabulary, then
    the ``rest`` mass — and the target's slot among them (k: outside the top k)."""
    vectors = np.array([list(r["top_probs"]) + [r["rest"]] for r in rows], dtype=np.float64)
    k = vectors.shape[1] - 1
    slots = np.array([r["top_ids"].index(r["target_id"]) if r["target_id"] in r["top_ids"] else k for r in rows],
                     dtype=np.int64)
    return vectors, slots


BRIER_UNAVAILABLE = ("Brier is not reported for this token run: it was evaluated before the lab kept each "
                     "target's Σ p² over the vocabulary, which the exact Brier needs (evaluate it again)")


def row_sum_sq(rows: list[dict[str, Any]]) -> Optional[np.ndarray]:
    """Each token row's ``sum_sq`` (Σ_v p_v² over the vocabulary at the run's temperature), or None when
    a row lacks it (a run evaluated before it was kept): its Brier is then unknown, not approximated."""
    values = [r.get("sum_sq") for r in rows]
    if not rows or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        return None
    return np.array(values, dtype=np.float64)


def token_scores(target_probs: Any, sum_sq: Optional[Any]) -> dict[str, Any]:
    """The exact Brier score over the whole vocabulary and the exact NLL of token targets.

    Brier (Brier 1950; the multi-class form of :func:`lab.calibration.metrics.brier`) of one target t is
    ``Σ_v (p_v − 1[v = t])² = Σ_v p_v² − 2 p_t + 1``: ``sum_sq`` (n,) gives the first term, the target's
    probability ``target_probs`` (n,) the second. With ``sum_sq`` None (a run that did not keep it) Brier
    is None and ``brier_note`` says why: the top-k tokens and a "rest" class would count a target outside
    the top k as right about the rest, 40 % too low on the bundled model. NLL is the target's own
    probability, floored as :func:`lab.calibration.metrics.nll` floors it.

    >>> token_scores([0.5], [0.5 ** 2 + 0.25 ** 2 + 0.25 ** 2])["brier"]  # (0.5 − 1)² + 0.25² + 0.25²
    0.375
    """
    target = np.asarray(target_probs, dtype=np.float64)
    scores: dict[str, Any] = {"nll": metrics.nll(target[:, None], np.zeros(len(target), dtype=np.int64))}
    if sum_sq is None:
        return {"brier": None, "brier_note": BRIER_UNAVAILABLE, **scores}
    squares = np.asarray(sum_sq, dtype=np.float64)
    if squares.shape != target.shape or not np.all(np.isfinite(squares)):
        raise ValueError(f"Expected one finite Σ p² per target ({target.shape}), but got {squares.shape}")
    return {"brier": float(np.mean(squares - 2 * target + 1)), **scores}


def token_metrics(rows: list[dict[str, Any]], n_bins: int, n_boot: int, seed: int,
                  edges: str = "right") -> dict[str, Any]:
    """What ``metrics.json`` holds for a token task (clm, facts), from its prediction rows alone, under
    the same keys as a multiple-choice run's (:func:`compute_metrics`).

    Each row is one target token: ``confidence`` (the top probability over the whole vocabulary),
    ``correct``, ``target_prob``, and the ``top_ids``/``top_probs`` of its top-k with ``rest`` = the
    mass outside them. The binned metrics and the bootstrap use confidence and correctness, as for
    multiple choice; NLL and Brier are exact over the whole vocabulary (the target's own probability,
    and each row's ``sum_sq``, :func:`token_scores`); class-wise ECE is undefined here (:data:`CW_ECE_UNDEFINED`)."""
    conf = np.array([r["confidence"] for r in rows], dtype=np.float64)
    correct = np.array([bool(r["correct"]) for r in rows])
    return {
        **metrics.summarize_confidence(conf, correct, n_bins, n_boot, seed, edges, scores={
            "cw_ece": None, "cw_ece_note": CW_ECE_UNDEFINED,
            **token_scores([r["target_prob"] for r in rows], row_sum_sq(rows)), "brier_over": "the whole vocabulary"}),
        **selective.summary(conf, correct, n_boot=min(n_boot, SELECTIVE_BOOT), seed=seed),
        "signals": {confidence.DEFAULT: selective.summary(conf, correct)},
    }
