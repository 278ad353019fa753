""":func:`load`, the one way the lab reads a dataset, whatever the task type.

``load("arc_challenge", "test", ["data/arc/test.jsonl"])`` reads a dataset's original files, ``["bundled"]``
the sample that ships with the package, and no files the Hugging Face hub copy; ``task`` says what is read
(:data:`lab.data.spec.TASK_TYPES`: questions, clm / facts texts, sft's instruction pairs, preference pairs),
and the records are of its type. As lm-evaluation-harness builds every task through one registry and one
task API, every dataset goes through the same steps, once each: its :class:`DatasetSpec` looked up
(``DATASETS``), the dataset refused for a task it does not feed, the options checked, the split parsed,
the files (or the bundled sample) expanded or the hub copy opened, the rows read by the spec's reader for
the task, collected (a repeated id is a bad row), refused when none is usable (or, under
``on_bad_rows="error"``, when any is bad), then carved and limited. An lm-eval task (``lm-eval:<task>``) is
one more source of questions, built by :mod:`lab.data.harness`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence, TypeVar

from lab.core.errors import DataError, RowProblem
from lab.core.limits import MAX_ROWS

from . import harness
from .files import describe_files, files_for
from .hub_copy import from_hub
from .record import Load
from .registry import DATASETS, not_for_task
from .rows import NO_ANSWER, not_utf8
from .spec import DatasetSpec, Reader, task_type
from .split import carve, parse_split

MAX_LISTED_PROBLEMS = 5

T = TypeVar("T")  # a record of any task type


def load(dataset: str, split: str | None = None, files: Sequence[str | os.PathLike[str]] | None = None, *,
         task: str = "mcq", subject: str | None = None, on_bad_rows: Literal["skip", "error"] = "skip",
         seed: int = 0, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), limit: int | None = None,
         include: str | None = None, num_fewshot: int | None = None) -> Load:
    """One split of ``dataset`` as records of task type ``task`` (``mcq``, ``clm``, ``facts``, ``sft``,
    ``preferences``).

    ``files``: paths in the dataset's original format (``DATASETS.get(dataset).local_format``). An entry
    is a file, a directory (its files with the dataset's extensions, sorted), a glob, or ``split=path`` to
    say which split the path holds. Plain entries are the data of the split asked for (of SOURCE, for
    ``SOURCE:PART``). The entry ``bundled`` is the sample that ships with the package
    (:mod:`lab.data.samples`), every split of it. Without ``files`` the hub copy is loaded, where the
    dataset has one.

    ``split``: a split name or ``SOURCE:PART`` (see :mod:`lab.data.split`; None: the task type's default,
    ``test``, or ``train`` for sft and preferences); the carve uses ``fractions`` and ``seed``.
    ``subject`` picks MMLU subjects. Rows that cannot be used are skipped and listed in ``problems``
    (``on_bad_rows="skip"``) or raise (``"error"``). ``limit`` keeps the first N records after the split
    is taken.

    An lm-eval task (``dataset="lm-eval:<task>"``, questions only) is built by lm-eval from its YAML, which
    names its data and split: ``include`` adds a folder of task YAMLs, ``num_fewshot`` overrides the task's
    shots and ``limit`` keeps the first N documents of each task, as ``lm_eval --limit``. A lab dataset's
    few-shot examples are drawn by the evaluation (:mod:`lab.kinds.evaluate.fewshot`), not here.
    """
    kind = task_type(task)
    if harness.is_task(dataset):
        if task != "mcq":
            raise DataError(f"dataset {dataset!r} is an lm-eval task: it holds questions, not {kind.holds}: "
                            "use task mcq, or a lab dataset.")
        check_options(on_bad_rows, limit)
        return harness.read_task(dataset, include, num_fewshot, limit)
    spec = DATASETS.get(dataset)
    if task not in spec.tasks:
        raise not_for_task(spec, task)
    check_options(on_bad_rows, limit)
    subject = _subject(spec, subject)
    split = split or kind.default_split
    request = parse_split(split, spec.own_splits)
    if files:
        paths = files_for(spec, files, request.source, subject)
        where = f"{spec.name} {task + ' ' if kind.named else ''}{split} from {describe_files(paths)}"
        rows = _read_files(spec.readers[task], paths)
    else:
        where, rows = from_hub(spec, task, split, request.source, subject)
    records, problems = collect_rows(_at_most(MAX_ROWS, rows, where))
    check_loaded(spec, where, records, problems, on_bad_rows, local=bool(files), usable=kind.usable)
    where += f" ({len(records)} {kind.unit}, {len(problems)} skipped)"
    records, where = part_and_limit(records, where, request.part, fractions, seed, limit, kind.unit)
    return Load(records, problems, where)


def _subject(spec: DatasetSpec, subject: str | None) -> str | None:
    """``subject`` as the files name it (``High School Physics`` → ``high_school_physics``), for a dataset
    split into subjects; for any other, a subject is refused, naming the datasets that have them."""
    if subject is None:
        return None
    if spec.subject_of_file is None:
        with_subjects = [n for n in DATASETS if DATASETS.get(n).subject_of_file is not None]
        raise DataError(f"{spec.name} has no subjects; subject= applies to: {', '.join(with_subjects)}.")
    return subject.strip().lower().replace(" ", "_")


def check_options(on_bad_rows: str, limit: int | None) -> None:
    """The options every load shares: ``on_bad_rows`` skip or error, ``limit`` a positive integer or None."""
    if on_bad_rows not in ("skip", "error"):
        raise DataError(f"Expected on_bad_rows to be 'skip' or 'error', but got {on_bad_rows!r}.")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise DataError(f"Expected limit to be a positive integer or None, but got {limit!r}.")


def part_and_limit(records: list[T], where: str, part: str | None, fractions: tuple[float, float, float], seed: int,
                   limit: int | None, unit: str = "rows") -> tuple[list[T], str]:
    """The ``part`` of a seeded carve of ``records`` (None: all of them), then the first ``limit``;
    ``where`` (what was read) extended to say so. An empty part is refused, naming the carve."""
    if part is not None:
        records = carve(records, fractions, seed)[part]
        carve_name = f"a seed-{seed} {'/'.join(f'{f:g}' for f in fractions)} carve"
        if not records:
            raise DataError(f"{where}: the {part} part of {carve_name} is empty. Use more "
                            f"{unit} or a larger fraction for that part.")
        where += f", the {part} part of {carve_name}: {len(records)} {unit}"
    if limit is not None and limit < len(records):
        records = records[:limit]
        where += f", first {limit}"
    return records, where


def _read_files(read: Reader, files: Iterable[Path]) -> Iterator[Any]:
    """Every file's rows in turn; a file that cannot be read, or is not UTF-8, is refused, naming it."""
    for path in files:
        try:
            yield from read(path)
        except UnicodeDecodeError as e:
            raise not_utf8(path, e) from None
        except OSError as e:
            raise DataError(f"Cannot read {path}: {e.strerror or e}.") from None


def _at_most(most: int, rows: Iterable[T], where: str) -> Iterator[T]:
    """``rows``, refused as a whole once there are more than ``most`` (good and bad together)."""
    for count, row in enumerate(rows, 1):
        if count > most:
            raise DataError(f"{where}: more than {most:,} rows, the most one load reads. Give fewer or "
                            "smaller files; a part of them can be carved with split SOURCE:PART.")
        yield row


# ---------------------------------------------------------------- bad rows


def collect_rows(rows: Iterable[Any]) -> tuple[list[Any], list[RowProblem]]:
    """Records and problems, in order; a record whose id was seen before is a problem.

    Predictions are joined by id across runs (win rates, temperature fits, comparisons), so a
    second record under the same id would be matched to the wrong one. The first is kept.
    """
    records: list[Any] = []
    problems: list[RowProblem] = []
    first_seen: dict[str, Any] = {}
    for row in rows:
        if isinstance(row, RowProblem):
            problems.append(row)
        elif row.id in first_seen:
            problems.append(_duplicate(row, first_seen[row.id]))
        else:
            first_seen[row.id] = row
            records.append(row)
    return records, problems


def _duplicate(record: Any, first: Any) -> RowProblem:
    file, line = record.origin or ("?", 0)
    reason = f"duplicate id {record.id!r}: first seen at {first.where or '?'}"
    if first.origin and record.id == f"{Path(first.origin[0]).stem}-{first.origin[1]}":
        reason += " (rows without an id are named <file name>-<line>: two files share a name; give the rows ids)"
    else:
        reason += "; ids must be unique: give this row its own id, or remove it"
    return RowProblem(file, line, reason)


def check_loaded(spec: DatasetSpec, where: str, records: Sequence[Any], problems: list[RowProblem],
                 on_bad_rows: str, local: bool, usable: str = "rows") -> None:
    """Refuse data with no usable row (``usable``: what the task calls one), and bad rows under
    ``on_bad_rows="error"``."""
    expected = f" Expected {spec.local_format}." if local else ""
    if not records and not problems:
        raise DataError(f"No rows in {where}: it is empty.{expected}")
    if not records:
        if all(p.reason.startswith(NO_ANSWER) for p in problems):
            raise DataError(
                f"No usable rows in {where}: none of its {len(problems)} rows has an answer, so this "
                f"split is unlabelled (published without answers) and cannot be scored. The first: "
                f"{problems[0]}. Use a labelled split instead; for a test set, carve one from a "
                f"labelled split, e.g. split='dev:test'.",
                tuple(problems))
        raise DataError(f"No usable {usable} in {where}: all {len(problems)} rows were rejected. The "
                        f"first: {problems[0]}.{expected}", tuple(problems))
    if problems and on_bad_rows == "error":
        listed = "\n".join(f"  {p}" for p in problems[:MAX_LISTED_PROBLEMS])
        unlisted = len(problems) - MAX_LISTED_PROBLEMS
        more = f"\n  ... and {unlisted} more" if unlisted > 0 else ""
        raise DataError(f"{len(problems)} bad rows in {where} ({len(records)} usable):\n{listed}{more}\n"
                        "Fix them, or pass on_bad_rows='skip' to skip them (they are then listed in "
                        "Load.problems).", tuple(problems))


def log_skipped(problems: Sequence[RowProblem], log: Callable[[str], None], shown: int = 5) -> None:
    """Tell ``log`` of the first ``shown`` rows a load skipped, and how many more there were."""
    for problem in problems[:shown]:
        log(f"skipped {problem}")
    if len(problems) > shown:
        log(f"... and {len(problems) - shown} more skipped rows")
