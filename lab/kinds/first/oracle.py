"""The oracle teacher: the question's true answer distribution in place of a teacher's top-k.

Where the data says how uncertain each answer is (the controlled task, :mod:`lab.data.synthetic`),
the best a distilled student can be taught is that distribution itself. FIRST's upper bound is
then a student distilled directly from a store whose answer positions hold the true
probabilities of the option letters; every other position keeps the fine-tuned teacher's rows
(with a completion-only loss only the answer and the end-of-sequence token are trained).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from lab.kinds.extract.store import derive_store

FLOOR = float(np.log(1e-12))  # the log-probability of a slot beyond the options: nothing, yet a finite number


def oracle_rows(ids: np.ndarray, logprobs: np.ndarray, answer_pos: int, option_ids: Sequence[int],
                truth: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """A sequence's rows (T, k) with row ``answer_pos`` set to ``truth`` over ``option_ids``, most
    likely first as a top-k is; the slots past the options keep other ids at :data:`FLOOR`."""
    ids, logprobs = ids.copy(), logprobs.copy()
    k = ids.shape[1]
    order = np.argsort(-np.asarray(truth, dtype=np.float64), kind="stable")[:k]
    options = set(option_ids)
    others = [i for i in ids[answer_pos] if i not in options]
    ids[answer_pos, : len(order)] = [option_ids[j] for j in order]
    logprobs[answer_pos, : len(order)] = np.log(np.asarray(truth, dtype=np.float64)[order])
    ids[answer_pos, len(order):] = others[: k - len(order)]
    logprobs[answer_pos, len(order):] = FLOOR
    return ids, logprobs


def missing_truth(truths: Sequence[Optional[list[float]]]) -> Optional[str]:
    """Why these training questions cannot have an oracle teacher (None when they can)."""
    lacking = sum(not isinstance(t, list) for t in truths)
    if not truths or lacking:
        return (f"the oracle student needs every training question's true answer distribution (`true_probs`, as "
                f"the synthetic dataset's questions carry), but {lacking} of {len(truths)} have none; "
                "drop `oracle` from students or train on the synthetic dataset")
    return None


def write_oracle_store(teacher_store: Path, out_dir: Path, examples: Sequence[dict[str, Any]],
                       truths: Sequence[list[float]]) -> dict:
    """The teacher's store over ``examples`` (built as the students train on them) with each
    answer position set to its record's true distribution (``truths[example["record"]]``)."""
    for example in examples:
        if len(example["option_ids"]) != len(truths[example["record"]]):
            raise ValueError("the oracle teacher needs a letter template whose options are one token each at one "
                             f"position; record {example['record']} has {len(example['option_ids'])} such options "
                             f"for {len(truths[example['record']])} probabilities")

    def edit(i: int, ids: np.ndarray, logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e = examples[i]
        return oracle_rows(ids, logprobs, e["answer_pos"], e["option_ids"], truths[e["record"]])

    return derive_store(teacher_store, out_dir, edit, {"model": "oracle", "teacher_answer_rows": "replaced by "
                                                       "the true answer distribution"})
