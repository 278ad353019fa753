"""Few-shot examples for the lab's own multiple-choice datasets: K solved questions drawn from
``fewshot_split`` and put before every scored question (lm-eval tasks draw theirs in
:mod:`lab.data.harness`, as lm-eval does).

How they are drawn, and where that departs from lm-eval's default sampler:

* lm-eval's ``ContextSampler`` (``lm_eval/api/samplers.py``) draws anew for every document from one
  ``Random(seed)``, so each question gets other examples, and which depends on the documents' order;
  its ``first_n`` sampler (MMLU's) gives every document the same first K.
* Here the K examples are drawn once, ``random.Random(seed).sample(pool, K)``, and the same ones go
  before every question: the questions of a run then differ by themselves alone, so a calibration
  figure is not also an average over draws, and the run stores the K ids (``metrics.json``'s
  ``fewshot``), which rebuild every prompt. Another ``seed`` draws other examples: a series over seeds
  says how far the choice of examples moves a figure.
* Questions that carry a subject (MMLU) get examples of their own subject, as MMLU 5-shot does, each
  subject seeded by ``"{seed}/{subject}"``, so its examples do not depend on which other subjects are
  scored. MMLU's ``dev`` split holds five per subject: 5-shot uses all five, in a seeded order (lm-eval's
  ``first_n`` keeps the file's order).
* No example is a scored question: the config refuses a ``fewshot_split`` that reads the scored rows
  (:func:`lab.kinds.evaluate.config.shares_rows`), and a pool record whose id is scored is left out here too.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

from lab.core.errors import DataError
from lab.data import load
from lab.data.loading import log_skipped
from lab.data.record import MCQRecord
from lab.kinds.evaluate.config import EvalConfig


@dataclass(frozen=True)
class Shots:
    """The examples of a run, by subject (None: records without one), and what ``metrics.json`` says of them."""

    by_subject: dict[Optional[str], list[MCQRecord]]
    info: dict[str, Any]

    def of(self, record: MCQRecord) -> list[MCQRecord]:
        """The examples that go before ``record``."""
        return self.by_subject[subject_of(record)]


def subject_of(record: MCQRecord) -> Optional[str]:
    """The subject a record's examples share (MMLU's), or None."""
    return record.meta.get("subject") or None


def draw(cfg: EvalConfig, scored: list[MCQRecord], log: Callable[[str], None] = print) -> Optional[Shots]:
    """The ``cfg.num_fewshot`` examples for ``scored`` from ``cfg.fewshot_split`` (None when none are asked for);
    a :class:`DataError` where a subject's pool, less the scored questions, holds fewer than asked."""
    if not cfg.num_fewshot:
        return None
    pool = load(cfg.dataset, cfg.fewshot_split, cfg.data_files or None, subject=cfg.subject,
                on_bad_rows=cfg.on_bad_rows, seed=cfg.seed)
    log_skipped(pool.problems, log)
    scored_ids = {r.id for r in scored}
    candidates = [r for r in pool.records if r.id not in scored_ids]
    subjects = sorted({subject_of(r) for r in scored}, key=lambda s: s or "")
    by_subject = {s: _sample(cfg, [r for r in candidates if subject_of(r) == s], s) for s in subjects}
    info: dict[str, Any] = {"num_fewshot": cfg.num_fewshot, "split": cfg.fewshot_split, "seed": cfg.seed,
                            "source": pool.source}
    if subjects == [None]:
        info["ids"] = [r.id for r in by_subject[None]]
    else:
        info["ids_by_subject"] = {s or "": [r.id for r in shots] for s, shots in by_subject.items()}
    log(f"{cfg.num_fewshot} few-shot examples before each question, drawn with seed {cfg.seed} from {pool.source}")
    return Shots(by_subject, info)


def _sample(cfg: EvalConfig, members: list[MCQRecord], subject: Optional[str]) -> list[MCQRecord]:
    """``cfg.num_fewshot`` of ``members``, seeded by the config's seed (and the subject)."""
    if len(members) < cfg.num_fewshot:
        of = f" of subject {subject!r}" if subject else ""
        raise DataError(f"num_fewshot: {cfg.num_fewshot} examples asked for, but fewshot_split {cfg.fewshot_split!r} "
                        f"of {cfg.dataset} holds {len(members)} questions{of} that are not scored. Lower num_fewshot, "
                        "or name a fewshot_split with more questions")
    rng = random.Random(cfg.seed if subject is None else f"{cfg.seed}/{subject}")
    return rng.sample(members, cfg.num_fewshot)
