"""The ``custom`` dataset: a user's own multiple-choice questions as JSON Lines, a JSON list or CSV.

The extension picks the format (``.csv``; ``.jsonl`` / ``.json``). Fields are JSON keys or CSV
header names, case-insensitive:

====================  =====================================================================
``question``          required, non-empty text
``choices``           a JSON list of option texts (in a CSV cell: the list written as JSON), or
``A``, ``B``, ...     one column (key) per option, ``a``, ``b``, ... also; trailing empty ones
                      are dropped, so 4-option rows can share a file with 5-option rows
``answer``            required; see :func:`resolve_answer` for how it is read
``id``                optional; default ``<file stem>-<line>``
``passage``           optional text the question is about (or ``context``)
====================  =====================================================================

Any other field is kept in ``MCQRecord.meta``.
"""
from __future__ import annotations

import json
from pathlib import Path
from string import ascii_lowercase
from typing import Any, Iterable, Iterator, Sequence

from lab.core.errors import DataError

from . import templates  # the module, read at call time: see the same import in .builtin
from .registry import register
from .record import MCQRecord
from .rows import (NO_ANSWER, TOO_DEEP, BadRow, Row, as_object, convert_rows, csv_rows, json_type, lone_surrogate,
                   read_json, row_id, text_field)
from .spec import DatasetSpec

EXPECTED = ("question; choices (a JSON list) or one column per option A, B, C, ...; answer (a letter, "
            "a 0-based index or the text of the right choice); optionally id and passage (or context)")
FORMAT = f"JSON Lines, a JSON list of objects, or CSV with a header, with the fields {EXPECTED}"


def resolve_answer(answer: Any, choices: Sequence[str]) -> int:
    """The 0-based index of the right choice. The first rule that applies wins:

    1. an integer (a JSON number): a 0-based index;
    2. a string equal to the text of exactly one choice (spaces around either ignored): that
       choice. It comes first so that with options "1", "2", "3" the answer "2" means the option
       "2", not the index 2;
    3. a single letter A-Z, either case: its position, A = 0;
    4. a string of digits: a 0-based index (CSV cells are always strings).

    Anything else — an index or letter beyond the choices, text that is no choice, a text that
    matches two choices — raises BadRow.
    """
    n = len(choices)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 <= answer < n:
            raise BadRow(f"answer index {answer} is outside 0..{n - 1} (answers as numbers are 0-based)")
        return answer
    if not isinstance(answer, str):
        raise BadRow("'answer' should be a letter, a 0-based index or a choice text, "
                     f"got {json_type(answer)}")
    text = answer.strip()
    matches = [i for i, choice in enumerate(choices) if choice.strip() == text]
    if len(matches) > 1:
        raise BadRow(f"answer {answer!r} matches choices {matches[0] + 1} and {matches[1] + 1}; "
                     "use a letter")
    if matches:
        return matches[0]
    last = templates.option_letter(n - 1)
    if len(text) == 1 and text.isascii() and text.isalpha():
        if ord(text.upper()) - ord("A") >= n:
            raise BadRow(f"answer {answer!r} is not among the {n} choices (A-{last})")
        return ord(text.upper()) - ord("A")
    if text.isascii() and text.isdigit():
        if int(text) >= n:
            raise BadRow(f"answer index {text} is outside 0..{n - 1} (answers as numbers are 0-based)")
        return int(text)
    raise BadRow(f"answer {answer!r} is not a letter A-{last}, a 0-based index 0..{n - 1} "
                 "or the text of a choice")


def _missing(columns: Iterable[str]) -> list[str]:
    present = set(columns)
    missing = [c for c in ("question", "answer") if c not in present]
    if "choices" not in present and "a" not in present:
        missing.append("choices (or option columns A, B, ...)")
    return missing


def _missing_message(missing: list[str], found: Iterable[str]) -> str:
    return (f"missing {', '.join(missing)}; found {', '.join(map(repr, found)) or 'nothing'}. "
            f"Expected: {EXPECTED}.")


def _choices(row: dict[str, Any]) -> tuple[list[str], set[str]]:
    """The option texts and the fields they came from."""
    if "choices" in row:
        value, used = row["choices"], {"choices"}
        if value is None or (isinstance(value, str) and not value.strip()):
            value = []
        elif isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise BadRow('\'choices\' should be a JSON list such as ["red", "blue"], '
                             f'got {value[:60]!r}') from None
            except RecursionError:
                raise BadRow(f"'choices' is {TOO_DEEP}") from None
            why = lone_surrogate(value)
            if why is not None:
                raise BadRow(f"'choices': {why}")
        if not isinstance(value, list):
            raise BadRow(f"'choices' should be a list, got {json_type(value)}")
    else:
        letters = []
        for letter in ascii_lowercase:
            if letter not in row:
                break
            letters.append(letter)
        used = set(letters)
        value = [row[letter] for letter in letters]
        while value and (value[-1] is None or str(value[-1]).strip() == ""):
            value.pop()
    texts = []
    for i, option in enumerate(value, 1):
        if isinstance(option, bool) or not isinstance(option, (str, int, float)):
            raise BadRow(f"choice {i} should be text, got {json_type(option)}")
        if not str(option).strip():
            raise BadRow(f"choice {i} is empty")
        texts.append(str(option))
    if not texts:
        raise BadRow("no choices")
    return texts, used


def custom_row(row: Any, default_id: str) -> MCQRecord:
    """One question from a JSON object or a CSV row (a dict of its cells)."""
    row = {str(k).strip().lower(): v for k, v in as_object(row).items()}
    missing = _missing(row)
    if missing:
        raise BadRow(_missing_message(missing, row))
    question = text_field(row, "question")
    choices, used = _choices(row)
    answer = row["answer"]
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise BadRow(f"{NO_ANSWER}: 'answer' is empty")
    passage = row.get("passage", row.get("context"))
    if passage is not None and not isinstance(passage, str):
        raise BadRow(f"'passage' should be a string, got {json_type(passage)}")
    used |= {"question", "answer", "id", "passage", "context"}
    return MCQRecord(id=row_id(row, default_id), question=question, choices=tuple(choices),
                     answer=resolve_answer(answer, choices), source="custom", passage=passage or None,
                     meta={k: v for k, v in row.items() if k not in used})


def _read_csv(path: Path) -> Iterator[Row]:
    """A CSV with a header; a missing column is an error for the whole file, not for each row."""
    rows = csv_rows(path)
    header = next(rows, None)
    if header is None:
        return
    columns = [c.strip().lower() for c in header[1]]
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise DataError(f"{path}: the header repeats {', '.join(map(repr, repeated))} (names are "
                        "case-insensitive). Rename or remove the extra column.")
    missing = _missing(columns)
    if missing:
        raise DataError(f"{path}: {_missing_message(missing, header[1])}")

    def convert(cells: list[str], default_id: str) -> MCQRecord:
        if len(cells) != len(columns):
            raise BadRow(f"{len(cells)} columns, expected {len(columns)} as in the header")
        return custom_row(dict(zip(columns, cells)), default_id)

    yield from convert_rows(path, rows, convert)


def read_custom(path: Path) -> Iterator[Row]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _read_csv(path)
    if suffix in (".jsonl", ".json"):
        return read_json(path, custom_row)
    raise DataError(f"{path}: custom data must be .jsonl, .json or .csv (the extension picks the "
                    f"format), got {suffix or 'no extension'!r}. Rename the file to match its content.")


register(DatasetSpec(
    name="custom", description="Your own multiple-choice questions (JSON Lines, JSON list or CSV)",
    hub_path=None, hub_config=None, hub_splits={}, local_format=FORMAT, readers={"mcq": read_custom},
    from_hub=None, extensions=(".jsonl", ".json", ".csv")))
