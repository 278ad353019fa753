"""The dataset registry, and where a dataset's rows come from: its files, its bundled sample, the hub.

Each dataset is described by a :class:`DatasetSpec` — where it lives on the Hugging Face hub, how
to read its original files for each task type it feeds, how to read a hub row — and registered by
name in ``DATASETS``, as lm-evaluation-harness registers tasks. :func:`lab.data.loading.load` reads
every one through the helpers here: local files when they are given (:func:`files_for`), the hub
otherwise (:func:`from_hub`). Every error a user can cause (a missing file, a bad row, no network)
is a :class:`DataError` whose message says what was expected, what arrived and what to do.
"""
from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from lab.core.errors import DataError, RowProblem
from lab.core.hub import hub_offline_mode, hub_reachable
from lab.core.registry import Registry

from . import samples
from .rows import BadRow, stamped
from .spec import DatasetSpec, task_type
from .split import canonical_split

DATASETS: Registry[DatasetSpec] = Registry("dataset")


def register(spec: DatasetSpec) -> DatasetSpec:
    DATASETS.add(spec.name, spec)
    return spec


def dataset_names(task: str | None = None) -> list[str]:
    """The registered datasets that feed task type ``task`` (None: all of them), sorted (for dropdowns,
    --help and the refusals that list the datasets to use instead)."""
    if task is not None:
        task_type(task)
    return [name for name in DATASETS.names() if task is None or task in DATASETS.get(name).tasks]


def not_for_task(spec: DatasetSpec, task: str) -> DataError:
    """The refusal of a dataset for a task it does not feed: what it holds, and what to use instead (another
    task where evaluate's ``task`` field picks it, and always the datasets that feed this one)."""
    holds, wanted = spec.task_type.holds, task_type(task)
    others = ", ".join(dataset_names(task))
    if holds == wanted.holds:  # texts without entity spans, asked for facts
        return DataError(f"dataset {spec.name!r} holds texts without entity spans: it feeds task "
                         f"{' and '.join(spec.tasks)}; for {task} use one of: {others}.")
    if not wanted.picked_by_task:
        return DataError(f"dataset {spec.name!r} holds {holds}, not {wanted.holds}; for {task} use one of: {others}.")
    return DataError(f"dataset {spec.name!r} holds {holds}, not {wanted.holds}: use task {' or '.join(spec.tasks)}, "
                     f"or a dataset for {task}: {others}.")


def with_sample() -> list[str]:
    """The datasets whose sample ships in the package for ``data_files: [bundled]``, sorted. The preference
    pairs' sample is named in a field of its own (``preferences: [bundled]``), so it is not among them."""
    return [name for name in DATASETS.names()
            if DATASETS.get(name).bundled and DATASETS.get(name).task_type.files_field == "data_files"]


def log_skipped(problems: Sequence[RowProblem], log: Callable[[str], None], shown: int = 5) -> None:
    """Tell ``log`` of the first ``shown`` rows a load skipped, and how many more there were."""
    for problem in problems[:shown]:
        log(f"skipped {problem}")
    if len(problems) > shown:
        log(f"... and {len(problems) - shown} more skipped rows")


# ---------------------------------------------------------------- local files

# `split=path`: a bare word before "=", so that paths that merely contain "=" stay paths.
_NAMED_ENTRY = re.compile(r"([A-Za-z]\w*)=(.+)")


def split_entry(entry: str) -> tuple[str | None, str]:
    """``"test=/d/x.jsonl"`` → ``("test", "/d/x.jsonl")``; an entry naming an existing path is a path."""
    m = _NAMED_ENTRY.fullmatch(entry)
    if m and not os.path.exists(entry):
        return m[1], m[2]
    return None, entry


def files_for(spec: DatasetSpec, files: Sequence[str | os.PathLike[str]], source: str,
              subject: str | None) -> list[Path]:
    """The files holding split ``source``, expanded and (for ``subject``) filtered."""
    if isinstance(files, (str, os.PathLike)):  # one path given where a list was meant
        files = [files]
    by_split: dict[str | None, list[str]] = {}
    for entry in samples.expand(spec, map(os.fspath, files), with_sample()):
        split, path = split_entry(entry)
        if path == samples.BUNDLED:
            raise samples.misplaced(entry)
        key = None if split is None else canonical_split(split, spec.own_splits, f" in data file entry {entry!r}")
        by_split.setdefault(key, []).append(path)
    entries = by_split.get(None, []) + by_split.get(source, [])
    if not entries:
        raise _no_split(spec, source, sorted(k for k in by_split if k is not None),
                        all(samples.is_sample(Path(p)) for paths in by_split.values() for p in paths))
    paths = [path for entry in entries for path in _expand(entry, spec.extensions)]
    if subject is None:
        return paths
    assert spec.subject_of_file is not None  # load checked
    kept = [f for f in paths if spec.subject_of_file(f) == subject]
    if not kept:
        found = sorted({spec.subject_of_file(f) for f in paths})
        raise DataError(f"No {spec.name} file for subject {subject!r} among {len(paths)} files. "
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
        raise DataError(f"Data file not found: {entry!r} (looked for {path.resolve()}, which does not exist).")
    return [path]


def describe_files(files: list[Path]) -> str:
    """Where the rows came from: the file or folder, or "the bundled sample" and its file(s) in it."""
    if files and all(samples.is_sample(f) for f in files):
        where = describe_files([f.resolve().relative_to(samples.ROOT) for f in files])
        return f"the bundled sample ({where})"
    if len(files) == 1:
        return str(files[0])
    return f"{len(files)} files in {os.path.commonpath([str(f.parent) for f in files])}"


# ---------------------------------------------------------------- the hub


def from_hub(spec: DatasetSpec, task: str, split: str, source: str,
             subject: str | None) -> tuple[str, Iterator[Any]]:
    """Where split ``source`` of the hub copy is from, and its rows, read with ``datasets.load_dataset``; any
    failure becomes one DataError saying what to do instead. The copy holds what the dataset holds (its
    first task type): for another ``task`` there is none."""
    how = local_way(spec)
    if spec.hub_path is None or spec.from_hub is None or task != spec.tasks[0]:
        raise DataError(f"{spec.name} {spec.task_type.no_hub}: {how}")
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

    named = {"name": config} if config else {}  # a dataset of one configuration is loaded without naming one
    try:
        table = datasets.load_dataset(spec.hub_path, split=hub_split, **named)
    except Exception as e:  # offline, unknown config, cache trouble: all mean "use local files"
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(f"Could not load {spec.name} from the Hugging Face hub ({hub_name}): {reason}. "
                        f"If this machine is offline, {how}") from e
    return where, _hub_rows(spec.from_hub, table, hub_split)


def local_way(spec: DatasetSpec) -> str:
    """What to do instead of loading the hub copy: its files, or its bundled sample, in the field that names them."""
    field = spec.task_type.files_field
    return (f"set {field} (--{field.replace('_', '-')} on the command line) to its files, in this format: "
            f"{spec.local_format}{_bundled_hint(spec)}.")


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


def _hub_rows(convert: Callable[[Mapping[str, Any], str], Any], table: Iterable[Mapping[str, Any]],
              hub_split: str) -> Iterator[Any]:
    """Hub problems are located by split name and 0-based row index (``table[index]``)."""
    for index, row in enumerate(table):
        try:
            yield stamped(convert(row, f"{hub_split}-{index}"), hub_split, index)
        except BadRow as e:
            yield RowProblem(hub_split, index, str(e))
