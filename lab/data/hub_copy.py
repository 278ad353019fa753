"""A dataset's Hugging Face hub copy: read when a load names no files, and checked before a job starts.

:func:`lab.data.loading.load` reads the hub copy through :func:`from_hub` when no files are given, and
Submit asks :func:`hub_copy_problem` (for an lm-eval task's hub data, :func:`hub_unavailable`), so that a
job that could not reach its data is refused rather than failing once started. ``datasets`` is imported
only when a copy is read (importing it takes seconds); every failure — an unreachable hub, a split or
config the copy lacks, a load that breaks — is one :class:`DataError` that says what to do instead: the
dataset's local files or its bundled sample (:func:`local_way`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from lab.core.errors import DataError, RowProblem
from lab.core.hub import hub_offline_mode, hub_reachable

from .registry import DATASETS
from .rows import BadRow, stamped
from .spec import DatasetSpec


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
