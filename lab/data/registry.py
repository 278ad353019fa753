"""The dataset registry: ``DATASETS``, every dataset's :class:`DatasetSpec` by name.

Each dataset is described by a :class:`DatasetSpec` — where it lives on the Hugging Face hub, how
to read its original files for each task type it feeds, how to read a hub row — and registered by
name in ``DATASETS``, as lm-evaluation-harness registers tasks: each reader module registers its own
when :mod:`lab.data` is imported, and :func:`lab.data.loading.load`, the file expansion
(:mod:`lab.data.files`) and the hub copies (:mod:`lab.data.hub_copy`) look them up here. What a
lookup by task says — the datasets that feed a task, the refusal of one that does not — lives here
with it, so that every list of "the datasets to use instead" is the registry's.
"""
from __future__ import annotations

from lab.core.errors import DataError
from lab.core.registry import Registry

from .spec import DatasetSpec, task_type

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
