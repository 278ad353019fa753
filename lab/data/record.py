"""A question, the record every multiple-choice dataset is normalised to (a row that cannot be one:
:class:`lab.core.errors.RowProblem`), and :class:`Load`, what a load of any task returns.

Here rather than beside :func:`lab.data.loading.load`, so that lm-eval's source of questions
(:mod:`lab.data.harness`), which the loader imports, returns the same type.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from lab.core.errors import RowProblem


@dataclass(frozen=True)
class MCQRecord:
    """One multiple-choice (or yes/no) question.

    ``answer`` is a 0-based index into ``choices``; ``labels`` keeps the dataset's own option
    labels (ARC uses "1".."4" for some questions) so a prediction can be shown as the user's
    dataset names it, while prompts always letter the options A, B, C, ... by position.
    ``origin`` is where the loader read it (``(file, line)``, or ``(hub split, row index)``), so that
    later messages (a duplicate id, a question too long for the model) can point at the row.
    ``requests``: the (context, continuation) pairs an lm-eval task built for it, one per choice
    (:mod:`lab.data.harness`); its prompt is then the task's, and no template renders it.
    """

    id: str
    question: str
    choices: tuple[str, ...]
    answer: int
    source: str
    passage: Optional[str] = None
    labels: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    origin: Optional[tuple[str, int]] = field(default=None, compare=False, hash=False, repr=False)
    requests: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False, repr=False)

    @property
    def where(self) -> str:
        """``file:line`` of the row it came from, or "" for a record made in code."""
        return f"{self.origin[0]}:{self.origin[1]}" if self.origin else ""

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"record {self.id!r}: no choices")
        if not 0 <= self.answer < len(self.choices):
            raise ValueError(
                f"record {self.id!r}: answer index {self.answer} is outside 0..{len(self.choices) - 1}"
            )
        if self.requests and len(self.requests) != len(self.choices):
            raise ValueError(f"record {self.id!r}: {len(self.requests)} requests for {len(self.choices)} choices")
        if self.labels and len(self.labels) != len(self.choices):
            raise ValueError(f"record {self.id!r}: {len(self.labels)} labels for {len(self.choices)} choices")


@dataclass
class Load:
    """The usable records of one load, the rows that were skipped (each naming where and why), and where they
    came from, for the log and the run's records (e.g. "arc_easy validation from the bundled sample (...)").

    ``records`` are of the task's record type (:class:`lab.data.spec.TaskType`). ``tasks`` and ``groups``
    describe an lm-eval task's load (each leaf task's shots, split, metrics and size; each group's leaves),
    for the run's ``metrics.json``; a lab dataset's load leaves them empty.
    """

    records: list[Any]
    problems: list[RowProblem]
    source: str
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
