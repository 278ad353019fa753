"""Validation during training: the letter-scoring metrics of the model in training, and what the trackers get.

After every epoch (and every ``eval_steps`` steps if set) the model scores the validation
questions (letter scoring, no gradients) and an ``eval`` event carries their ECE and accuracy —
REFERENCE.md §4: ECE grows with fine-tuning epochs, and users should see it happen.
"""
from __future__ import annotations

from typing import Any, Sequence

from lab.calibration.summary import compute_metrics
from lab.data.record import MCQRecord
from lab.data.templates import get_template
from lab.models import distributed
from lab.models.scoring import score_letter

TRACKED = ("accuracy", "ece", "nll", "brier")  # validation metrics a tracker plots beside the loss


def letter_probs(model, tokenizer, records: Sequence[MCQRecord], template: str) -> list:
    """Option probabilities of ``records`` under ``model`` in eval mode, restoring its mode after.

    Under a multi-process launch each rank scores its share and every rank gets them all, in order (under
    FSDP every rank scores them all: each forward pass is a collective)."""
    render = get_template(template).render

    def score(share: list[MCQRecord]) -> list:
        was_training = model.training
        model.eval()
        scores = score_letter(model, tokenizer, [render(r, tokenizer) for r in share])
        model.train(was_training)
        return [s.probs for s in scores]

    return distributed.map_sharded(score, records, lockstep=distributed.in_lockstep(model))


def validation_metrics(model, tokenizer, records: Sequence[MCQRecord], template: str, bins: int,
                       bin_edges: str = "right") -> dict[str, Any]:
    """Letter-scoring accuracy and calibration of ``model`` on ``records`` (no bootstrap: cheap)."""
    probs = letter_probs(model, tokenizer, records, template)
    rows = [{"probs": p, "answer": r.answer} for r, p in zip(records, probs)]
    m = compute_metrics(rows, bins, n_boot=0, seed=0, edges=bin_edges)
    return {k: m[k] for k in ("n", "accuracy", "ece", "cw_ece", "nll", "brier", "trust")}


def tracked(metrics: dict[str, Any]) -> dict[str, float]:
    """What a validation gives the trackers: ``eval_<metric>`` of its headline figures and, for a
    stage measuring several calibration tasks (``tasks``: sft, dpo), ``eval_<task>_<metric>`` of each,
    so a tracker plots every task's ECE beside the loss, not the first task's only."""
    logged = {f"eval_{k}": float(v) for k, v in metrics.items() if k in TRACKED and v is not None}
    for key, task in (metrics.get("tasks") or {}).items():
        logged.update({f"eval_{key}_{k}": float(v) for k, v in task.items() if k in TRACKED and v is not None})
    return logged
