"""The bundled samples (``lab/data/bundled/``) in the Hugging Face hub's schema of each dataset, so
that the task YAMLs beside this file keep lm-eval's own ``doc_to_text`` / ``doc_to_choice`` /
``doc_to_target`` for the hub copy and run offline. Each function is a task's ``custom_dataset``
(lm-eval calls it with the task's ``dataset_kwargs`` and ``metadata``) and returns a DatasetDict.

Only the columns the prompts read are built; rows keep their files' order, as the hub copies do.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import datasets

ROOT = Path(__file__).resolve().parent.parent  # lab/data/bundled
MMLU_SPLITS = {"dev": "dev", "validation": "val"}  # split → the sample's folder (and file suffix)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _ai2_rows(path: Path, stem_key: str) -> list[dict[str, Any]]:
    """AI2's original question files (ARC, OpenBookQA) as the hub's rows: ``choices`` as {text, label} lists."""
    rows = []
    for row in _jsonl(path):
        choices = row["question"]["choices"]
        rows.append({"id": row["id"], stem_key: row["question"]["stem"], "answerKey": row["answerKey"],
                     "choices": {"text": [c["text"] for c in choices], "label": [c["label"] for c in choices]}})
    return rows


def _dataset(splits: dict[str, list[dict[str, Any]]]) -> datasets.DatasetDict:
    return datasets.DatasetDict({split: datasets.Dataset.from_list(rows) for split, rows in splits.items()})


def arc(sample: str, **_: Any) -> datasets.DatasetDict:
    """allenai/ai2_arc's schema; the sample's dev file is the validation split, its test file the test split."""
    files = {"validation": "dev.jsonl", "test": "test.jsonl"}
    return _dataset({split: _ai2_rows(ROOT / sample / name, "question")
                     for split, name in files.items() if (ROOT / sample / name).is_file()})


def openbookqa(**_: Any) -> datasets.DatasetDict:
    """allenai/openbookqa (main)'s schema over the sample's train, dev and test files."""
    files = {"train": "train.jsonl", "validation": "dev.jsonl", "test": "test.jsonl"}
    return _dataset({split: _ai2_rows(ROOT / "openbookqa" / name, "question_stem") for split, name in files.items()})


def boolq(**_: Any) -> datasets.DatasetDict:
    """aps/super_glue (boolq)'s schema: ``label`` 1 for yes, 0 for no."""
    rows = [{"question": r["question"], "passage": r["passage"], "label": int(r["answer"]), "idx": i}
            for i, r in enumerate(_jsonl(ROOT / "boolq" / "dev.jsonl"))]
    return _dataset({"validation": rows})


def mmlu(subject: str, **_: Any) -> datasets.DatasetDict:
    """cais/mmlu's schema for one subject: its dev file (the 5 shots) and its val file."""
    splits = {}
    for split, folder in MMLU_SPLITS.items():
        with open(ROOT / "mmlu" / folder / f"{subject}_{folder}.csv", encoding="utf-8", newline="") as f:
            splits[split] = [{"question": q, "subject": subject, "choices": [a, b, c, d], "answer": "ABCD".index(key)}
                             for q, a, b, c, d, key in csv.reader(f)]
    return _dataset(splits)
