"""Multiple-choice data: the dataset registry and the loader.

``load_records("arc_challenge", "test", ["data/arc/test.jsonl"])`` reads a dataset's original
files; ``["bundled"]`` the sample that ships with the package; without files it reads the Hugging
Face hub copy. Every dataset becomes a list of :class:`MCQRecord`. Importing this package
registers the built-in datasets, ``custom`` and ``synthetic`` (the controlled task).
"""
from lab.core.errors import DataError

from . import builtin, custom, synthetic  # noqa: F401  (they register themselves in DATASETS)
from .loaders import DATASETS, DatasetSpec, LoadResult, dataset_names, load_records, with_sample
from .record import MCQRecord, RowProblem
from .split import carve

__all__ = ["DATASETS", "DataError", "DatasetSpec", "LoadResult", "MCQRecord", "RowProblem", "carve",
           "dataset_names", "load_records", "with_sample"]
