"""The Bayes-optimal predictor of a task whose true answer distributions are known (the controlled
task, :mod:`lab.data.synthetic`): what a perfectly calibrated model scores on the same questions.

It answers the argmax of each question's true distribution with its max as confidence, so its
population ECE is 0; on a finite sample its binned ECE is the estimator's own bias, the floor a
trained model's ECE is read against.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from lab.calibration import metrics


def oracle(true_probs: Any, labels: Any, n_bins: int = 10, edges: str = "right") -> dict[str, float]:
    """How the Bayes-optimal predictor (argmax and max of the true distribution) does on a sample:
    its accuracy, binned ECE, NLL and Brier against the stated answers."""
    probs, mask = metrics.padded(true_probs)
    labels = np.asarray(labels)
    pred, conf = metrics.predictions(probs, mask)
    correct = pred == labels
    return {"accuracy": float(correct.mean()), "ece": metrics.ece(conf, correct, n_bins, edges=edges),
            "nll": metrics.nll(probs, labels), "brier": metrics.brier(probs, labels, mask)}


def expected_oracle(true_probs: Any, n_bins: int = 10, edges: str = "right") -> dict[str, float]:
    """The Bayes predictor's expected accuracy and expected binned ECE over the label noise, for these
    questions, in closed form: in each bin, the number of right answers is a sum of independent
    Bernoulli(q_i) (Poisson binomial, computed exactly), and ECE's bin term is E|S − Σ q_i| / n.
    Its population ECE is 0: what remains is the binned estimator's upward bias at this n."""
    probs, mask = metrics.padded(true_probs)
    conf = metrics.predictions(probs, mask)[1]
    bins = metrics.bin_indices(conf, n_bins, edges=edges)
    expected_ece = 0.0
    for b in np.unique(bins):
        q = conf[bins == b]
        pmf = _poisson_binomial(q)
        expected_ece += float(np.abs(np.arange(q.size + 1) - q.sum()) @ pmf)
    return {"accuracy": float(conf.mean()), "ece": expected_ece / conf.size, "population_ece": 0.0}


def oracle_report(true_probs: Any, labels: Any, n_bins: int, edges: str) -> dict[str, Any]:
    """The oracle block of an evaluation's ``metrics.json``, one home for the multiple-choice and the token
    runs: the Bayes predictor's figures on the sample (:func:`oracle`) and, under ``expected``, their closed
    form over the label noise (:func:`expected_oracle`)."""
    return {**oracle(true_probs, labels, n_bins, edges), "expected": expected_oracle(true_probs, n_bins, edges)}


def _poisson_binomial(q: Sequence[float]) -> np.ndarray:
    """P(S = s), s = 0..n, for S a sum of independent Bernoulli(q_i): one convolution per trial."""
    pmf = np.array([1.0])
    for p in q:
        pmf = np.convolve(pmf, [1 - p, p])
    return pmf
