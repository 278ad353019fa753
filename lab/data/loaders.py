"""The dataset registry and :func:`load_records`, the one way the lab reads multiple-choice data.

Each dataset is described by a :class:`DatasetSpec` — where it lives on the Hugging Face hub, how
to read its original files, how to read a hub row — and registered by name in ``DATASETS``, as
lm-evaluation-harness registers tasks. ``load_records`` reads local files when ``data_files`` are
given and the hub otherwise; every error a user can cause (a missing file, a bad row, no network)
is a :class:`DataError` whose message says what was expected, what arrived and what to do.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence, TypeVar

from lab.core.errors import DataError, RowProblem
from lab.core.hub import hub_offline_mode, hub_reachable
from lab.core.registry import Registry

from . import samples
from .record import MCQRecord
from .rows import NO_ANSWER, BadRow, Row, checked, not_utf8
from .spec import DatasetSpec
from .split import canonical_split, carve, parse_split

MAX_LISTED_PROBLEMS = 5

T = TypeVar("T")  # a record: MCQRecord, or a TextRecord (lab.data.texts)


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def register(spec: DatasetSpec) -> DatasetSpec:
    DATASETS.add(spec.name, spec)
    return spec


def dataset_names(task: str | None = "mcq") -> list[str]:
    """The registered datasets that feed ``task`` (multiple choice by default; None: all), sorted (for
    dropdowns and --help). :func:`lab.data.texts.text_dataset_names` is the same for clm / facts."""
    return [name for name in DATASETS.names() if task is None or task in DATASETS.get(name).tasks]


def not_for_task(spec: DatasetSpec, task: str) -> DataError:
    """The refusal of a dataset for a task it does not feed: what it holds, and the datasets that do."""
    kinds = {"mcq": "questions", "clm": "texts", "facts": "texts", "sft": "instruction-response pairs"}
    holds, wanted = kinds.get(spec.tasks[0], "data"), kinds.get(task, "data")
    others = ", ".join(dataset_names(task))
    if holds == wanted:  # texts without entity spans, asked for facts
        return DataError(f"dataset {spec.name!r} holds texts without entity spans: it feeds task "
                         f"{' and '.join(spec.tasks)}; for {task} use one of: {others}.")
    return DataError(f"dataset {spec.name!r} holds {holds}, not {wanted}: use task {' or '.join(spec.tasks)}, "
                     f"or a dataset for {task}: {others}.")


def with_sample() -> list[str]:
    """The datasets that ship a sample in the package (``data_files: [bundled]``), sorted."""
    return [name for name in DATASETS.names() if DATASETS.get(name).bundled]


@dataclass
class LoadResult:
    """The usable records, the rows that were skipped and why, and where they came from."""

    records: list[MCQRecord]
    problems: list[RowProblem]
    source: str  # e.g. "arc_challenge test from /data/test.jsonl (1172 rows, 0 skipped)"


def load_records(
    name: str,
    split: str = "test",
    data_files: Sequence[str | os.PathLike[str]] | None = None,
    *,
    subject: str | None = None,
    on_bad_rows: Literal["skip", "error"] = "skip",
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    limit: int | None = None,
) -> LoadResult:
    """Load one split of dataset ``name`` as :class:`MCQRecord`\\ s.

    ``data_files``: paths in the dataset's original format (``DATASETS.get(name).local_format``).
    An entry is a file, a directory (its files with the dataset's extensions, sorted), a glob, or
    ``split=path`` to say which split the path holds. Plain entries are the data of the split
    asked for (of SOURCE, for ``SOURCE:PART``). The entry ``bundled`` is the sample that ships
    with the package (:mod:`lab.data.samples`), every split of it. Without ``data_files`` the hub
    copy is loaded.

    ``split``: a split name or ``SOURCE:PART`` (see :mod:`lab.data.split`); the carve uses
    ``fractions`` and ``seed``. ``subject`` picks MMLU subjects. Rows that cannot be used are
    skipped and listed in ``problems`` (``on_bad_rows="skip"``) or raise (``"error"``).
    ``limit`` keeps the first N records after the split is taken.
    """
    spec = DATASETS.get(name)
    if "mcq" not in spec.tasks:
        raise not_for_task(spec, "mcq")
    check_options(on_bad_rows, limit)
    if subject is not None and spec.subject_of_file is None:
        with_subjects = [n for n in DATASETS if DATASETS.get(n).subject_of_file is not None]
        raise DataError(f"{name} has no subjects; subject= applies to: {', '.join(with_subjects)}.")
    subject = subject.strip().lower().replace(" ", "_") if subject is not None else None
    request = parse_split(split, spec.own_splits)

    if data_files:
        files = files_for(spec, data_files, request.source, subject)
        where = f"{name} {split} from {describe_files(files)}"
        rows = _read_files(spec, files)
    else:
        where, rows = _from_hub(spec, split, request.source, subject)
    records, problems = collect_rows(rows)
    check_loaded(spec, where, records, problems, on_bad_rows, local=bool(data_files))
    where += f" ({len(records)} rows, {len(problems)} skipped)"
    records, where = part_and_limit(records, where, request.part, fractions, seed, limit)
    return LoadResult(records, problems, where)


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


def log_skipped(problems: Sequence[RowProblem], log: Callable[[str], None], shown: int = 5) -> None:
    """Tell ``log`` of the first ``shown`` rows a load skipped, and how many more there were."""
    for problem in problems[:shown]:
        log(f"skipped {problem}")
    if len(problems) > shown:
        log(f"... and {len(problems) - shown} more skipped rows")


def check_options(on_bad_rows: str, limit: int | None) -> None:
    """The options every loader shares: ``on_bad_rows`` skip or error, ``limit`` a positive integer or None."""
    if on_bad_rows not in ("skip", "error"):
        raise DataError(f"Expected on_bad_rows to be 'skip' or 'error', but got {on_bad_rows!r}.")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise DataError(f"Expected limit to be a positive integer or None, but got {limit!r}.")


# ---------------------------------------------------------------- local files

# `split=path`: a bare word before "=", so that paths that merely contain "=" stay paths.
_NAMED_ENTRY = re.compile(r"([A-Za-z]\w*)=(.+)")


def split_entry(entry: str) -> tuple[str | None, str]:
    """``"test=/d/x.jsonl"`` → ``("test", "/d/x.jsonl")``; an entry naming an existing path is a path."""
    m = _NAMED_ENTRY.fullmatch(entry)
    if m and not os.path.exists(entry):
        return m[1], m[2]
    return None, entry


def files_for(spec: DatasetSpec, data_files: Sequence[str | os.PathLike[str]], source: str,
              subject: str | None) -> list[Path]:
    """The files holding split ``source``, expanded and (for ``subject``) filtered."""
    if isinstance(data_files, (str, os.PathLike)):  # one path given where a list was meant
        data_files = [data_files]
    by_split: dict[str | None, list[str]] = {}
    for entry in samples.expand(spec, map(os.fspath, data_files), with_sample()):
        split, path = split_entry(entry)
        if path == samples.BUNDLED:
            raise samples.misplaced(entry)
        key = None if split is None else canonical_split(split, spec.own_splits, f" in data file entry {entry!r}")
        by_split.setdefault(key, []).append(path)
    entries = by_split.get(None, []) + by_split.get(source, [])
    if not entries:
        raise _no_split(spec, source, sorted(k for k in by_split if k is not None),
                        all(samples.is_sample(Path(p)) for paths in by_split.values() for p in paths))
    files = [path for entry in entries for path in _expand(entry, spec.extensions)]
    if subject is None:
        return files
    assert spec.subject_of_file is not None  # load_records checked
    kept = [f for f in files if spec.subject_of_file(f) == subject]
    if not kept:
        found = sorted({spec.subject_of_file(f) for f in files})
        raise DataError(f"No {spec.name} file for subject {subject!r} among {len(files)} files. "
                        f"Subjects found: {', '.join(found)}.")
    return kept


def _no_split(spec: DatasetSpec, source: str, given: list[str], bundled: bool) -> DataError:
    """No entry holds split ``source``: name the splits there are, and how to get this one anyway."""
    if bundled:
        carve_from = "validation" if "validation" in given else given[0]
        return DataError(f"The bundled sample of {spec.name} has no {source!r} split; it has: {', '.join(given)}. "
                         f"Ask for one of those, or carve one from it, e.g. split '{carve_from}:{source}'.")
    return DataError(f"No data files for split {source!r}: the files given are for {', '.join(given)}. "
                     f"Pass {source}=PATH as well, or ask for one of those splits.")


def list_folder(path: Path, extensions: tuple[str, ...], shown: str) -> list[Path]:
    """The files in folder ``path`` ending in ``extensions``, sorted; none is a DataError."""
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(extensions))
    if not files:
        subdirs = sorted(p.name for p in path.iterdir() if p.is_dir())
        hint = f" It has the folders {', '.join(subdirs)}: pass one of them." if subdirs else ""
        raise DataError(f"The folder {shown!r} has no {' or '.join(extensions)} files.{hint}")
    return files


def _expand(entry: str, extensions: tuple[str, ...]) -> list[Path]:
    """A file, a directory (its files ending in ``extensions``, sorted) or a glob, as files.

    An existing path is taken as it is, so a config whose globs were already expanded (what the
    job store keeps) is never globbed again, even where a file name holds ``[`` or ``*``.
    """
    path = Path(entry).expanduser()
    if glob.has_magic(entry) and not os.path.lexists(path):
        matches = sorted(glob.glob(os.path.expanduser(entry), recursive=True))
        if not matches:
            raise DataError(f"No files match the pattern {entry!r}.")
        return [f for m in matches for f in (_expand(m, extensions) if os.path.isdir(m) else [Path(m)])]
    if path.is_dir():
        return list_folder(path, extensions, entry)
    if not path.is_file():
        raise DataError(f"Data file not found: {entry!r} (looked for {path.resolve()}).")
    return [path]


def describe_files(files: list[Path]) -> str:
    """Where the rows came from: the file or folder, or "the bundled sample" and its file(s) in it."""
    if files and all(samples.is_sample(f) for f in files):
        where = describe_files([f.resolve().relative_to(samples.ROOT) for f in files])
        return f"the bundled sample ({where})"
    if len(files) == 1:
        return str(files[0])
    return f"{len(files)} files in {os.path.commonpath([str(f.parent) for f in files])}"


def _read_files(spec: DatasetSpec, files: Iterable[Path]) -> Iterator[Row]:
    for path in files:
        try:
            yield from spec.read_file(path)
        except UnicodeDecodeError as e:
            raise not_utf8(path, e) from None
        except OSError as e:
            raise DataError(f"Cannot read {path}: {e.strerror or e}.") from None


# ---------------------------------------------------------------- the hub


def _from_hub(spec: DatasetSpec, split: str, source: str,
              subject: str | None) -> tuple[str, Iterator[Row]]:
    """Load split ``source`` with ``datasets.load_dataset``; any failure becomes one DataError."""
    how = local_way(spec)
    if spec.hub_path is None or spec.from_hub is None:
        raise DataError(f"{spec.name} has no copy on the Hugging Face hub: {how}")
    if source not in spec.hub_splits:
        available = ", ".join(spec.hub_splits)
        raise DataError(f"{spec.name} has no {source!r} split on the hub ({spec.hub_path}); it has: "
                        f"{available}. Ask for one of those, carve one (e.g. 'validation:test'), "
                        f"or {how}")
    hub_split = spec.hub_splits[source]
    config = subject or spec.hub_config
    hub_name = f"{spec.hub_path}, config {config or 'default'}, split {hub_split}"
    where = f"{spec.name} {split} from the Hugging Face hub ({hub_name})"
    if not hub_reachable() and not hub_offline_mode():
        # Fail at once rather than let load_dataset retry an unreachable hub for ~25 s. A user who
        # set HF_HUB_OFFLINE=1 asked for the local Hugging Face cache, which load_dataset reads.
        raise DataError(f"The Hugging Face hub cannot be reached to load {spec.name} ({hub_name}). {how[0].upper()}{how[1:]} "
                        "Or set HF_HUB_OFFLINE=1 to use a copy already in the local Hugging Face cache.")
    import datasets  # lazily: importing it takes seconds, and local files never need it

    try:
        table = datasets.load_dataset(spec.hub_path, config, split=hub_split)
    except Exception as e:  # offline, unknown config, cache trouble: all mean "use local files"
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(f"Could not load {spec.name} from the Hugging Face hub ({hub_name}): {reason}. "
                        f"If this machine is offline, {how}") from e
    return where, _hub_rows(spec.from_hub, table, hub_split)


def local_way(spec: DatasetSpec) -> str:
    """What to do instead of loading the hub copy: its files, or its bundled sample."""
    return (f"set data_files (--data-files on the command line) to its files, in this format: {spec.local_format}"
            f"{_bundled_hint(spec)}.")


def _in_hub_cache(hub_path: str) -> bool:
    """Whether ``load_dataset`` has left a copy of ``hub_path`` on this machine, found without
    importing ``datasets`` (seconds): its prepared tables (``<cache>/org___name``) or its download
    in the hub cache (``datasets--org--name``)."""
    from huggingface_hub import constants

    prepared = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets")
    return ((prepared / hub_path.replace("/", "___")).is_dir()
            or (Path(constants.HF_HUB_CACHE) / f"datasets--{hub_path.replace('/', '--')}").is_dir())


def hub_copy_problem(name: str) -> str | None:
    """Why the hub copy of dataset ``name`` cannot be loaded here (None: it can, or may): asked when a
    config names no data files, so that Submit refuses it instead of the job failing once started."""
    spec = DATASETS.get(name)
    meant = f"the Hugging Face hub copy of {spec.name}" + (f" ({spec.hub_path})" if spec.hub_path else "") + " is meant"
    if spec.hub_path is None or spec.from_hub is None:
        return f"{meant}, but {spec.name} has no copy on the Hugging Face hub: {local_way(spec)}"
    why = hub_unavailable(spec.hub_path)
    return None if why is None else f"{meant}, but {why}: {local_way(spec)}"


def hub_unavailable(hub_path: str) -> str | None:
    """Why ``load_dataset`` cannot read the hub dataset ``hub_path`` here (None: it can, or may): the hub out
    of reach, or ``HF_HUB_OFFLINE`` with no copy in the local cache. A lab dataset's hub copy and an lm-eval
    task's hub data (:func:`lab.data.harness.check_task`) are refused at submit by it alike."""
    if hub_reachable() or (hub_offline_mode() and _in_hub_cache(hub_path)):
        return None
    return ("HF_HUB_OFFLINE is set and the local Hugging Face cache has none" if hub_offline_mode()
            else "the Hugging Face hub cannot be reached from this machine")


def _bundled_hint(spec: DatasetSpec) -> str:
    """The offline way out, where the dataset has one: its bundled sample."""
    return f"; or to [bundled], the sample of {spec.name} that ships with the lab" if spec.bundled else ""


def _hub_rows(convert: Callable[[Mapping[str, Any], str], MCQRecord], table: Iterable[Mapping[str, Any]],
              hub_split: str) -> Iterator[Row]:
    """Hub problems are located by split name and 0-based row index (``table[index]``)."""
    for index, row in enumerate(table):
        try:
            yield checked(convert(row, f"{hub_split}-{index}"), hub_split, index)
        except BadRow as e:
            yield RowProblem(hub_split, index, str(e))


# ---------------------------------------------------------------- bad rows


def collect_rows(rows: Iterable[Row]) -> tuple[list[MCQRecord], list[RowProblem]]:
    """Records and problems, in order; a record whose id was seen before is a problem.

    Predictions are joined by id across runs (win rates, temperature fits, comparisons), so a
    second question under the same id would be matched to the wrong one. The first is kept.
    """
    records: list[MCQRecord] = []
    problems: list[RowProblem] = []
    first_seen: dict[str, MCQRecord] = {}
    for row in rows:
        if isinstance(row, RowProblem):
            problems.append(row)
        elif row.id in first_seen:
            problems.append(_duplicate(row, first_seen[row.id]))
        else:
            first_seen[row.id] = row
            records.append(row)
    return records, problems


def _duplicate(record: MCQRecord, first: MCQRecord) -> RowProblem:
    file, line = record.origin or ("?", 0)
    reason = f"duplicate id {record.id!r}: first seen at {first.where or '?'}"
    if first.origin and record.id == f"{Path(first.origin[0]).stem}-{first.origin[1]}":
        reason += " (rows without an id are named <file name>-<line>: two files share a name; give the rows ids)"
    else:
        reason += "; ids must be unique: give this row its own id, or remove it"
    return RowProblem(file, line, reason)


def check_loaded(spec: DatasetSpec, where: str, records: Sequence[Any], problems: list[RowProblem],
                 on_bad_rows: str, local: bool, listed_in: str = "LoadResult.problems") -> None:
    """Refuse data with no usable row, and bad rows under ``on_bad_rows="error"``."""
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
        raise DataError(f"No usable rows in {where}: all {len(problems)} rows were rejected. The "
                        f"first: {problems[0]}.{expected}", tuple(problems))
    if problems and on_bad_rows == "error":
        listed = "\n".join(f"  {p}" for p in problems[:MAX_LISTED_PROBLEMS])
        unlisted = len(problems) - MAX_LISTED_PROBLEMS
        more = f"\n  ... and {unlisted} more" if unlisted > 0 else ""
        raise DataError(f"{len(problems)} bad rows in {where} ({len(records)} usable):\n{listed}{more}\n"
                        "Fix them, or pass on_bad_rows='skip' to skip them (they are then listed in "
                        f"{listed_in}).", tuple(problems))
