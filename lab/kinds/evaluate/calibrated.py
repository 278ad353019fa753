"""A saved calibrator (:mod:`lab.calibration.calibrators`, fitted on another run in the workbench)
applied to the rows an evaluation just scored: multiple-choice questions, or a token run's targets.

Kept apart from scoring so both of the evaluation's writers (:mod:`lab.kinds.evaluate.run` and
:mod:`lab.kinds.evaluate.tokens`) report a calibrated run the same way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lab.calibration import calibrators, confidence, metrics
from lab.calibration.summary import token_arrays
from lab.calibration.token_temperature import TOKEN_GRID, TokenLogits
from lab.kinds.evaluate.config import EvalConfig


def apply_calibrator(rows: list[dict[str, Any]], cfg: EvalConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Copies of ``rows`` with their ``calibrated_confidence``, and the ``calibrated`` block of the
    metrics: ``cfg.calibrator``'s confidence scored as the workbench scores it, what the calibrator
    is, and how many of these questions (or targets) it was fitted on. Such overlap is recorded, not
    refused: the run is already paid for, and the warning travels with its numbers.

    A token run's prediction stays its top token; only the confidence is recalibrated. A calibrator
    that cannot apply here (fitted on the other kind of run, or a signal these rows cannot give)
    leaves the rows as they are and the block says why, rather than losing the evaluation at its
    last step."""
    cal = calibrators.load(Path(cfg.calibrator))
    tokens = confidence.token_rows(rows)
    if tokens:
        probs, _ = token_arrays(rows)
        mask = np.ones(probs.shape, dtype=bool)
    else:
        probs, mask = metrics.padded([r["probs"] for r in rows])
    logits = TokenLogits.from_rows(rows, TOKEN_GRID) if tokens else None  # at the grid the scoring pass used
    try:
        pred, conf = calibrators.apply(cal, probs, mask, rows, logits=logits)
    except ValueError as e:
        return rows, {"calibrator": cal.describe(), "error": str(e)}
    if tokens:
        correct = np.array([bool(r["correct"]) for r in rows])
    else:
        correct = pred == np.array([r["answer"] for r in rows])
    report = calibrators.confidence_report(conf, correct, cfg.bins, cfg.bin_edges, cfg.bootstrap or 1, cfg.seed)
    block = {**report, "calibrator": cal.describe(), "overlap": calibrators.overlap(cal, rows),
             "warning": calibrators.fitted_on_same(cal, rows)}
    return [{**r, "calibrated_confidence": float(c)} for r, c in zip(rows, conf)], block
