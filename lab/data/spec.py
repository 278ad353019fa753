"""How one dataset is read (:class:`DatasetSpec`, the entry each dataset registers in :mod:`lab.data.registry`)
and what each task type it may feed is (:class:`TaskType`, in :data:`TASK_TYPES`).

Its own module, below the registry, the file expansion (:mod:`lab.data.files`), the hub copies
(:mod:`lab.data.hub_copy`) and the bundled samples (:mod:`lab.data.samples`), which all read it.
As in lm-evaluation-harness, where a task's config says how its documents are read and the registry maps
names to configs, a spec says which task types it feeds by the readers it has, one per task type, and
:func:`lab.data.loading.load` reads every dataset for every task through them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from lab.core.errors import DataError

# One original-format file -> the task's records and RowProblems, in file order (lazily: a file may be large).
Reader = Callable[[Path], Iterator[Any]]


@dataclass(frozen=True)
class TaskType:
    """One kind of data a job reads, and what its loads say in their sources and refusals.

    The record types: ``mcq`` :class:`lab.data.record.MCQRecord`, ``clm`` / ``facts``
    :class:`lab.data.texts.TextRecord`, ``sft`` :class:`lab.data.instructions.InstructionRecord`,
    ``preferences`` :class:`lab.data.preferences.PreferencePair`.
    """

    name: str
    holds: str  # what its datasets hold, as a refusal says it ("questions")
    default_split: str  # the split a load reads when none is named
    unit: str = "rows"  # what a load's source counts ("(570 rows, 0 skipped)") and a carve's parts hold
    usable: str = "rows"  # what a load with none says it lacks ("No usable rows in ...")
    named: bool = False  # whether the source names the task ("trex facts test from ..."): texts feed clm and facts
    # Whether evaluate's `task` field picks it, so that a refusal can point to another task as well as to
    # other datasets; sft and dpo jobs are of one task type, and only other datasets help there.
    picked_by_task: bool = True
    no_hub: str = "has no copy on the Hugging Face hub"  # after the dataset's name, when no files are given
    files_field: str = "data_files"  # the config field that names its files (and `bundled`)


TASK_TYPES: dict[str, TaskType] = {t.name: t for t in (
    TaskType("mcq", "questions", "test"),
    TaskType("clm", "texts", "test", unit="documents", named=True),
    TaskType("facts", "texts", "test", unit="documents", named=True),
    TaskType("sft", "instruction-response pairs", "train", picked_by_task=False, no_hub="is read from files only"),
    TaskType("preferences", "preference pairs", "train", unit="preference pairs", usable="preference pairs",
             picked_by_task=False, files_field="preferences"),
)}


def task_type(name: str) -> TaskType:
    """The task type called ``name``; any other name is a :class:`DataError` listing them."""
    if name not in TASK_TYPES:
        raise DataError(f"Unknown task {name!r}: expected one of {', '.join(TASK_TYPES)}.")
    return TASK_TYPES[name]


@dataclass(frozen=True)
class DatasetSpec:
    """How to read one dataset, from its original files or from the hub."""

    name: str
    description: str
    hub_path: str | None  # for datasets.load_dataset; None = local files only
    hub_config: str | None
    hub_splits: dict[str, str]  # our canonical split name -> the hub's split name
    local_format: str  # one line on the original file format, quoted in errors
    # The task types it feeds, each with its reader of one file; the first is what the dataset holds.
    readers: Mapping[str, Reader]
    # (hub row, default id) -> record (of its first task type); raises BadRow
    from_hub: Callable[[Mapping[str, Any], str], Any] | None
    extensions: tuple[str, ...] = (".jsonl", ".json")  # what a directory in data_files expands to
    # Datasets split into subjects by file (MMLU's <subject>_<split>.csv): the subject of a file.
    # `subject=` then picks files locally and is the hub config.
    subject_of_file: Callable[[Path], str] | None = None
    # The sample shipped in lab/data/bundled/ (``data_files: [bundled]``): (split, file or folder there).
    bundled: tuple[tuple[str, str], ...] = ()
    extra_splits: tuple[str, ...] = ()  # splits of its own beyond train/validation/test (synthetic's shifted)
    tasks: tuple[str, ...] = field(init=False)  # the readers' task types, in order
    own_splits: tuple[str, ...] = field(init=False)  # alias names this dataset keeps as real splits

    def __post_init__(self) -> None:
        unknown = [t for t in self.readers if t not in TASK_TYPES]
        if not self.readers or unknown:
            raise ValueError(f"dataset {self.name!r}: readers for {', '.join(unknown) or 'no task'}; "
                             f"task types: {', '.join(TASK_TYPES)}")
        object.__setattr__(self, "tasks", tuple(self.readers))
        own = tuple(name for name in ("dev", "val") if name in self.hub_splits) + self.extra_splits
        object.__setattr__(self, "own_splits", own)

    @property
    def task_type(self) -> TaskType:
        """The task type of what it holds (its first): whose files field names its files."""
        return TASK_TYPES[self.tasks[0]]

