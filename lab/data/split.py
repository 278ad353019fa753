"""Split names, and the deterministic carve of one split into train / validation / test.

A split is asked for in one of two forms:

* a name — ``train``, ``validation`` or ``test``. ``dev`` and ``val`` are aliases of
  ``validation``, except where a dataset keeps a ``dev`` split of its own (MMLU: 5 few-shot
  examples per subject, distinct from its validation split);
* ``SOURCE:PART`` — the PART (train, validation or test) of a :func:`carve` of the split SOURCE,
  e.g. ``dev:validation``. This is how a dataset that ships only a dev split (BoolQ, MedMCQA
  here) still gives a validation set for fitting a temperature and a disjoint test set.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Collection, Sequence

from lab.core.errors import DataError

from .record import MCQRecord

SPLITS = ("train", "validation", "test")
ALIASES = {"dev": "validation", "val": "validation"}


@dataclass(frozen=True)
class SplitRequest:
    """What to read (``source``, a canonical split name) and which carved part to keep, if any."""

    source: str
    part: str | None = None


def canonical_split(name: str, own: Collection[str] = (), where: str = "") -> str:
    """The canonical name of split ``name``; ``own`` lists aliases the dataset keeps as real splits."""
    key = name.strip().lower()
    if key in SPLITS or key in own:
        return key
    if key in ALIASES:
        return ALIASES[key]
    valid = [*SPLITS, *own] + [f"{a} (= {c})" for a, c in ALIASES.items() if a not in own]
    raise DataError(f"Unknown split {name!r}{where}. Expected one of: {', '.join(valid)}; "
                    "or SOURCE:PART for a part of a carved split, e.g. 'dev:validation'.")


def parse_split(split: str, own: Collection[str] = ()) -> SplitRequest:
    """Parse ``name`` or ``SOURCE:PART`` (see the module docstring)."""
    source, colon, part = split.partition(":")
    if not colon:
        return SplitRequest(canonical_split(source, own))
    # The carve always makes train/validation/test, so PART never takes a dataset's own names.
    return SplitRequest(canonical_split(source, own, f" in {split!r}"),
                        canonical_split(part, (), f" (the part) in {split!r}"))


def carve(records: Sequence[MCQRecord], fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
          seed: int = 0) -> dict[str, list[MCQRecord]]:
    """Split ``records`` into disjoint ``train`` / ``validation`` / ``test`` parts that cover them.

    A seeded shuffle of the positions (``random.Random(seed)``, which does not depend on Python's
    hash seed, so every run and machine gets the same parts), cut at ``round(n·f_train)`` and
    ``round(n·(f_train + f_validation))``. Each part keeps the records' original order, so a part
    reads as a subset of its source and ``limit`` takes the part's first rows.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise DataError(f"Expected `fractions` to be three non-negative numbers (train, validation, "
                        f"test) that sum to 1, but got {tuple(fractions)}.")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    cut1 = round(len(records) * fractions[0])
    cut2 = round(len(records) * (fractions[0] + fractions[1]))
    parts = {"train": order[:cut1], "validation": order[cut1:cut2], "test": order[cut2:]}
    return {name: [records[i] for i in sorted(idx)] for name, idx in parts.items()}
