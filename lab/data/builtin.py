"""The built-in datasets: each one's original file format and its Hugging Face hub schema.

The hub copies rename fields and renumber answers (MedMCQA's ``cop`` is 1-based in the original
files and 0-based on the hub; CommonsenseQA's question is an object in the files and a string on
the hub), so each dataset has a converter per format. Formats are as documented in
``shared/data/SOURCES.md`` and on the hub dataset cards.
"""
from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Mapping

# The module, read at call time: importing lab.data.templates first runs this package's __init__ (it
# imports lab.data.record), and so this module, before lab.data.templates has defined anything.
from . import templates
from .registry import register
from .record import MCQRecord
from .rows import (NO_ANSWER, BadRow, Row, as_object, json_type, present, read_csv, read_json, row_id, string_list,
                   text_field)
from .spec import DatasetSpec

SPLITS = {"train": "train", "validation": "validation", "test": "test"}

# ---------------------------------------------------------------- CommonsenseQA, ARC, OpenBookQA
# AI2 layout: options carry their own labels (ARC uses "1".."4" for some questions, and has 3-5
# options), so the answer is found by matching answerKey against the labels, never by position.

AI2_FORMAT = ('JSON Lines: {"id", "question": {"stem", "choices": [{"label", "text"}, ...]}, '
              '"answerKey"} (the official AI2 release files)')


def _by_label(source: str, id_: str, question: str, labels: list[str], texts: list[str], key: Any,
              meta: dict[str, Any]) -> MCQRecord:
    if not texts:
        raise BadRow("no choices")
    if len(set(labels)) != len(labels):
        raise BadRow(f"repeated choice labels {labels}")
    if key is None or key == "":
        raise BadRow(f"{NO_ANSWER}: 'answerKey' is missing or empty")
    if not isinstance(key, str):
        raise BadRow(f"'answerKey' should be a string label, got {json_type(key)}")
    if key.strip() not in labels:
        raise BadRow(f"answerKey {key!r} is not one of the choice labels {', '.join(labels)}")
    return MCQRecord(id=id_, question=question, choices=tuple(texts), answer=labels.index(key.strip()),
                     source=source, labels=tuple(labels), meta=meta)


def _ai2_file_row(source: str, row: Any, default_id: str) -> MCQRecord:
    row = as_object(row)
    question = as_object(present(row, "question"), "'question'")
    choices = present(question, "choices", "question.choices")
    if not isinstance(choices, list):
        raise BadRow(f"'question.choices' should be a list, got {json_type(choices)}")
    labels, texts = [], []
    for i, choice in enumerate(choices):
        choice = as_object(choice, f"question.choices[{i}]")
        labels.append(text_field(choice, "label", f"question.choices[{i}].label"))
        texts.append(text_field(choice, "text", f"question.choices[{i}].text", allow_empty=True))
    meta = {k: v for k, v in row.items() if k not in ("id", "question", "answerKey")}
    if "question_concept" in question:  # CommonsenseQA
        meta["question_concept"] = question["question_concept"]
    return _by_label(source, row_id(row, default_id), text_field(question, "stem", "question.stem"),
                     labels, texts, row.get("answerKey"), meta)


def _ai2_hub_row(source: str, question_key: str, row: Mapping[str, Any], default_id: str) -> MCQRecord:
    choices = as_object(present(row, "choices"), "'choices'")
    labels = string_list(present(choices, "label", "choices.label"), "'choices.label'")
    texts = string_list(present(choices, "text", "choices.text"), "'choices.text'")
    if len(labels) != len(texts):
        raise BadRow(f"{len(labels)} choice labels for {len(texts)} choice texts")
    meta = {k: v for k, v in row.items() if k not in ("id", question_key, "choices", "answerKey")}
    return _by_label(source, row_id(row, default_id), text_field(row, question_key), labels, texts,
                     row.get("answerKey"), meta)


def _ai2(name: str, description: str, hub_path: str, hub_config: str | None,
         question_key: str, bundled: tuple[tuple[str, str], ...] = ()) -> DatasetSpec:
    return DatasetSpec(
        name=name, description=description, hub_path=hub_path, hub_config=hub_config, hub_splits=SPLITS,
        local_format=AI2_FORMAT, readers={"mcq": partial(read_json, convert=partial(_ai2_file_row, name))},
        from_hub=partial(_ai2_hub_row, name, question_key), bundled=bundled)


# The bundled samples (lab/data/bundled/SOURCES.md): (split, file or folder under lab/data/bundled/).
register(_ai2("csqa", "CommonsenseQA: 5-way commonsense questions (Talmor et al. 2019); its test "
              "split is unlabelled", "tau/commonsense_qa", None, "question"))
register(_ai2("obqa", "OpenBookQA (main): 4-way elementary science questions (Mihaylov et al. 2018)",
              "allenai/openbookqa", "main", "question_stem",
              (("train", "openbookqa/train.jsonl"), ("validation", "openbookqa/dev.jsonl"),
               ("test", "openbookqa/test.jsonl"))))
register(_ai2("arc_challenge", "ARC-Challenge: grade-school science, 3-5 options (Clark et al. 2018)",
              "allenai/ai2_arc", "ARC-Challenge", "question",
              (("validation", "arc_challenge/dev.jsonl"), ("test", "arc_challenge/test.jsonl"))))
register(_ai2("arc_easy", "ARC-Easy: grade-school science, 3-5 options (Clark et al. 2018)",
              "allenai/ai2_arc", "ARC-Easy", "question", (("validation", "arc_easy/dev.jsonl"),)))

# ---------------------------------------------------------------- BoolQ
# Yes/no questions over a passage. The files and the hub agree except that only the files carry
# `title`, so one converter reads both.


def _boolq_row(row: Any, default_id: str) -> MCQRecord:
    row = as_object(row)
    answer = row.get("answer")
    if answer is None:
        raise BadRow(f"{NO_ANSWER}: 'answer' is missing")
    if not isinstance(answer, bool):
        raise BadRow(f"'answer' should be true or false, got {json_type(answer)}")
    meta = {"title": row["title"]} if "title" in row else {}
    return MCQRecord(id=row_id(row, default_id), question=text_field(row, "question"),
                     choices=("No", "Yes"), answer=int(answer), source="boolq",
                     passage=text_field(row, "passage"), meta=meta)


register(DatasetSpec(
    name="boolq", description="BoolQ: yes/no questions about a Wikipedia passage (Clark et al. 2019)",
    hub_path="google/boolq", hub_config=None, hub_splits={"train": "train", "validation": "validation"},
    local_format=('JSON Lines: {"question", "title", "answer": true/false, "passage"} '
                  '(the official dev.jsonl)'),
    readers={"mcq": partial(read_json, convert=_boolq_row)}, from_hub=_boolq_row,
    bundled=(("validation", "boolq/dev.jsonl"),)))

# ---------------------------------------------------------------- MMLU
# The original hendrycks layout: one headerless CSV per subject and split, <subject>_<split>.csv.

_MMLU_FILE = re.compile(r"(.+)_(dev|val|validation|test|train)")


def mmlu_subject(path: Path) -> str:
    """``abstract_algebra_test.csv`` -> ``abstract_algebra``."""
    m = _MMLU_FILE.fullmatch(path.stem)
    return m[1] if m else path.stem


def _mmlu_file_row(subject: str, cells: list[str], default_id: str) -> MCQRecord:
    if len(cells) != 6:
        raise BadRow(f"{len(cells)} columns, expected 6: question, options A, B, C, D, answer letter")
    question, *options, letter = cells
    if not question.strip():
        raise BadRow("empty question")
    if not letter.strip():
        raise BadRow(f"{NO_ANSWER}: the answer column is empty")
    letters = templates.option_letters(len(options))  # A, B, C, D
    if letter.strip() not in letters:
        raise BadRow(f"answer {letter!r} should be one of {', '.join(letters)}")
    return MCQRecord(id=default_id, question=question, choices=tuple(options),
                     answer=letters.index(letter.strip()), source="mmlu", labels=tuple(letters),
                     meta={"subject": subject})


def _read_mmlu_file(path: Path) -> Iterator[Row]:
    return read_csv(path, partial(_mmlu_file_row, mmlu_subject(path)))


def _mmlu_hub_row(row: Mapping[str, Any], default_id: str) -> MCQRecord:
    choices = string_list(present(row, "choices"), "'choices'")
    if not choices:
        raise BadRow("no choices")
    answer = row.get("answer")
    if answer is None:
        raise BadRow(f"{NO_ANSWER}: 'answer' is missing")
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
        raise BadRow(f"'answer' should be a 0-based index below {len(choices)}, got {answer!r}")
    return MCQRecord(id=default_id, question=text_field(row, "question"), choices=tuple(choices),
                     answer=answer, source="mmlu", labels=tuple(templates.option_letters(len(choices))),
                     meta={"subject": row.get("subject", "")})


register(DatasetSpec(
    name="mmlu", description="MMLU: 4-way exam questions in 57 subjects (Hendrycks et al. 2021)",
    hub_path="cais/mmlu", hub_config="all",
    hub_splits={"test": "test", "validation": "validation", "dev": "dev", "train": "auxiliary_train"},
    local_format=("headerless CSV, one file per subject named <subject>_<split>.csv, 6 columns: "
                  "question, options A, B, C, D, answer letter (the original data/ folders; pass "
                  "e.g. data/test)"),
    readers={"mcq": _read_mmlu_file}, from_hub=_mmlu_hub_row, extensions=(".csv",),
    subject_of_file=mmlu_subject, bundled=(("dev", "mmlu/dev"), ("validation", "mmlu/val"))))

# ---------------------------------------------------------------- MedMCQA
# The original files number the correct option (`cop`) from 1 (= opa); the hub from 0, with -1
# for its unlabelled test split.

_OPTIONS = ("opa", "opb", "opc", "opd")


def _medmcqa_row(first: int, row: Any, default_id: str) -> MCQRecord:
    row = as_object(row)
    options = tuple(text_field(row, key, allow_empty=True) for key in _OPTIONS)
    cop = row.get("cop")
    if cop is None or cop == -1:
        raise BadRow(f"{NO_ANSWER}: 'cop' is {'missing' if cop is None else cop}")
    if not isinstance(cop, int) or isinstance(cop, bool):
        raise BadRow(f"'cop' should be a number, got {json_type(cop)}")
    if not first <= cop < first + len(options):
        numbering = "the original files number opa as 1" if first == 1 else "the hub numbers opa as 0"
        raise BadRow(f"'cop' {cop} is outside {first}..{first + len(options) - 1} ({numbering})")
    meta = {k: row[k] for k in ("subject_name", "topic_name", "choice_type", "exp") if k in row}
    return MCQRecord(id=row_id(row, default_id), question=text_field(row, "question"), choices=options,
                     answer=cop - first, source="medmcqa",
                     labels=tuple(templates.option_letters(len(options))), meta=meta)


register(DatasetSpec(
    name="medmcqa", description="MedMCQA: 4-way medical entrance exam questions (Pal et al. 2022)",
    hub_path="openlifescienceai/medmcqa", hub_config=None, hub_splits=SPLITS,
    local_format=("JSON Lines with question, opa, opb, opc, opd, cop (1-4, 1 = opa), choice_type, exp, "
                  "subject_name, topic_name, id (the official dev.json)"),
    readers={"mcq": partial(read_json, convert=partial(_medmcqa_row, 1))}, from_hub=partial(_medmcqa_row, 0),
    bundled=(("validation", "medmcqa/dev.jsonl"),)))
