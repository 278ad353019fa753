"""Multiple-choice data: the dataset registry and the loader.

``load_records("arc_challenge", "test", ["data/arc/test.jsonl"])`` reads a dataset's original
files; ``["bundled"]`` the sample that ships with the package; without files it reads the Hugging
Face hub copy. Every dataset becomes a list of :class:`MCQRecord`. Importing this package
registers the built-in datasets, ``custom`` and ``synthetic`` (the controlled task), and the
datasets of texts for the token tasks, ``text`` and ``trex`` (:mod:`lab.data.texts`: ``load_texts``), and
the instruction–response pairs of supervised fine-tuning, ``alpaca``, ``dolly`` and ``instructions``
(:mod:`lab.data.instructions`: ``load_instructions``).
"""
from lab.core.errors import DataError

from . import builtin, custom, harness, instructions, synthetic, texts  # noqa: F401  (they register themselves)
from .instructions import SFT_TASK, InstructionLoad, InstructionRecord, load_instructions
from .loaders import DATASETS, LoadResult, dataset_names, load_records, with_sample
from .record import MCQRecord
from .spec import DatasetSpec
from .split import carve
from .texts import TEXT_TASKS, TextLoad, TextRecord, load_texts, text_dataset_names

DATASETS.add_family(harness.PREFIX, "<task>", "evaluate, series tasks, sft and dpo calibration tasks and FIRST's and "
                    "CFT's out-of-domain sets (lm-evaluation-harness tasks)")

__all__ = ["DATASETS", "DataError", "DatasetSpec", "InstructionLoad", "InstructionRecord", "LoadResult", "MCQRecord",
           "SFT_TASK", "TEXT_TASKS", "TextLoad", "TextRecord", "carve", "dataset_names",
           "load_instructions", "load_records", "load_texts", "text_dataset_names", "with_sample"]
