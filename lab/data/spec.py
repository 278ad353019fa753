"""How one dataset is read: :class:`DatasetSpec`, the entry each dataset registers (:mod:`lab.data.loaders`).

Its own module, below the loaders and the bundled samples (:mod:`lab.data.samples`), which both read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .record import MCQRecord
from .rows import Row


@dataclass(frozen=True)
class DatasetSpec:
    """How to read one dataset, from its original files or from the hub."""

    name: str
    description: str
    hub_path: str | None  # for datasets.load_dataset; None = local files only
    hub_config: str | None
    hub_splits: dict[str, str]  # our canonical split name -> the hub's split name
    local_format: str  # one line on the original file format, quoted in errors
    read_file: Callable[[Path], Iterator[Row]]  # one original-format file -> records / problems
    # (hub row, default id) -> record; raises BadRow
    from_hub: Callable[[Mapping[str, Any], str], MCQRecord] | None
    extensions: tuple[str, ...] = (".jsonl", ".json")  # what a directory in data_files expands to
    # Datasets split into subjects by file (MMLU's <subject>_<split>.csv): the subject of a file.
    # `subject=` then picks files locally and is the hub config.
    subject_of_file: Callable[[Path], str] | None = None
    # The sample shipped in lab/data/bundled/ (``data_files: [bundled]``): (split, file or folder there).
    bundled: tuple[tuple[str, str], ...] = ()
    extra_splits: tuple[str, ...] = ()  # splits of its own beyond train/validation/test (synthetic's shifted)
    # The tasks it feeds (lab.data.texts.TEXT_TASKS beside "mcq"): multiple choice through load_records,
    # the token tasks (clm, facts) through lab.data.texts.load_texts.
    tasks: tuple[str, ...] = ("mcq",)
    # For clm / facts: (one local file, task) -> TextRecords and RowProblems, as read_file is for questions.
    read_texts: Callable[[Path, str], Iterator[Any]] | None = None
    own_splits: tuple[str, ...] = field(init=False)  # alias names this dataset keeps as real splits

    def __post_init__(self) -> None:
        own = tuple(name for name in ("dev", "val") if name in self.hub_splits) + self.extra_splits
        object.__setattr__(self, "own_splits", own)
