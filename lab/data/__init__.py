"""Datasets: the registry, the one loader, the bundled samples and the record types.

``load("arc_challenge", "test", ["data/arc/test.jsonl"])`` reads a dataset's original files; ``["bundled"]``
the sample that ships with the package; without files it reads the Hugging Face hub copy. ``task`` says
what is read, and each task type has its record type: ``mcq`` (the default) :class:`MCQRecord`\\ s, the
token tasks ``clm`` and ``facts`` :class:`TextRecord`\\ s, ``sft`` :class:`InstructionRecord`\\ s,
``preferences`` :class:`lab.data.preferences.PreferencePair`\\ s; an lm-eval task (``lm-eval:<task>``)
gives questions too. ``dataset_names(task)`` lists the datasets that feed a task. Importing this package
registers the datasets: the built-in ones, ``custom`` and ``synthetic`` (the controlled task), the texts
``text`` and ``trex`` (:mod:`lab.data.texts`), the instruction–response pairs ``alpaca``, ``dolly`` and
``instructions`` (:mod:`lab.data.instructions`) and the preference pairs ``ultrafeedback``
(:mod:`lab.data.preferences`).
"""
from lab.core.errors import DataError

from . import builtin, custom, harness, instructions, preferences, synthetic, texts  # noqa: F401  (they register themselves)
from .instructions import InstructionRecord
from .registry import DATASETS, dataset_names, with_sample
from .loading import load
from .record import Load, MCQRecord
from .spec import TASK_TYPES, DatasetSpec
from .split import carve
from .texts import TextRecord

DATASETS.add_family(harness.PREFIX, "<task>", "evaluate, series tasks, sft and dpo calibration tasks and FIRST's and "
                    "CFT's out-of-domain sets (lm-evaluation-harness tasks)")

__all__ = ["DATASETS", "DataError", "DatasetSpec", "InstructionRecord", "Load", "MCQRecord", "TASK_TYPES",
           "TextRecord", "carve", "dataset_names", "load", "with_sample"]
