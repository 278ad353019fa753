"""Reading rows with their exact file and line, and the small checks every row converter shares.

Local files are read with plain ``json`` / ``csv`` rather than ``datasets``: a user with a broken
row needs ``file:line`` to fix it, and ``datasets`` reports neither (it fails the whole file, or
silently casts). Line numbers are 1-based physical lines, as an editor shows them; a CSV row whose
quoted cell spans several lines is reported at the line where it starts.

A converter turns one parsed row into an :class:`MCQRecord` or raises :class:`BadRow`; the
readers here turn ``BadRow`` into a :class:`RowProblem` so that one bad row never stops a file.
The checks every dataset shares (:func:`checked`: at least two choices) run here too, once for all
converters, and stamp each record with the file and line it came from.
"""
from __future__ import annotations

import csv
import json
import re
from dataclasses import is_dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Union

from lab.core.errors import DataError, RowProblem
from lab.core.reads import open_text, read_text

from .record import MCQRecord

Row = Union[MCQRecord, RowProblem]
Convert = Callable[[Any, str], Any]  # (parsed row, default id) -> a record of the task; raises BadRow

# Every "this row has no answer" reason starts with this, so that a file in which *every* row
# lacks an answer can be reported as an unlabelled split rather than as a pile of bad rows.
NO_ANSWER = "no answer"
# A one-option question is always "right" with confidence 1: it would score accuracy 1 and ECE 0.
MIN_CHOICES = 2
# Real rows nest 3 or 4 levels. A cap far below Python's recursion limit (~1000, where json.loads
# fails) also keeps a row's extra fields, carried into predictions.jsonl as `meta`, safe to write.
MAX_DEPTH = 100
TOO_DEEP = f"nested too deeply (JSON lists or objects more than {MAX_DEPTH} levels inside each other)"
SURROGATE = re.compile("[\ud800-\udfff]")  # a lone half of a UTF-16 pair, which a JSON escape can produce


class BadRow(Exception):
    """Raised by a converter for a row it cannot use; the message is the reason shown to the user."""


# ---------------------------------------------------------------- readers


def read_json(path: Path, convert: Convert) -> Iterator[Row]:
    """Records and problems from JSON Lines, or from a file holding one JSON list.

    Decided by the content, not the name: MedMCQA's own ``dev.json`` is JSON Lines.
    """
    with open_text(path) as f:
        is_list = f.read(1024).lstrip().startswith("[")
    return convert_rows(path, json_array_rows(path) if is_list else jsonl_rows(path), convert)


def read_csv(path: Path, convert: Convert) -> Iterator[Row]:
    """Records and problems from a headerless CSV file; ``convert`` receives the list of cells."""
    return convert_rows(path, csv_rows(path), convert)


def convert_rows(path: Path, rows: Iterable[tuple[int, Any]], convert: Convert) -> Iterator[Row]:
    """Apply ``convert`` to ``(line, row)`` pairs; a row given as a ``BadRow`` is already a problem.

    Each record is :func:`stamped` with its file and line (questions once they pass :func:`checked`).
    """
    for line, row in rows:
        try:
            if isinstance(row, BadRow):
                raise row
            yield stamped(convert(row, f"{path.stem}-{line}"), str(path), line)
        except BadRow as e:
            yield RowProblem(str(path), line, str(e))


def stamped(item: Any, file: str, line: int) -> Any:
    """A converter's record stamped with where it was read: a question once it passes :func:`checked`, any
    other record through :func:`located`."""
    return checked(item, file, line) if isinstance(item, MCQRecord) else located(item, file, line)


def checked(record: MCQRecord, file: str, line: int) -> MCQRecord:
    """``record`` stamped with where it was read, once it passes the checks every dataset shares.

    Here rather than in each converter, so that no dataset (local files or hub rows) can skip them.
    """
    if len(record.choices) < MIN_CHOICES:
        raise BadRow(f"only {len(record.choices)} choice: a question needs at least {MIN_CHOICES} options")
    return replace(record, origin=(file, line))


def located(item: Any, file: str, line: int) -> Any:
    """``item`` with ``origin=(file, line)`` if it is a dataclass with an unset ``origin`` field, else as is."""
    return replace(item, origin=(file, line)) if is_dataclass(item) and getattr(item, "origin", False) is None else item


def too_deep(value: Any) -> bool:
    """Whether ``value`` nests lists / objects more than ``MAX_DEPTH`` levels (iteratively: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > MAX_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def lone_surrogate(value: Any) -> str | None:
    """A sentence naming the first string of ``value`` (keys included) that holds a lone surrogate, or None.

    JSON's ``"\\ud800"`` escape decodes to half of a UTF-16 pair, which is no Unicode character: a tokenizer
    and UTF-8 (``predictions.jsonl``) both refuse it, so such a row is skipped here, before it reaches them.
    Iterative, as :func:`too_deep`."""
    stack: list[tuple[Any, str]] = [(value, "")]  # (item, its path in the row: "text", "meta.tags[2]")
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            found = SURROGATE.search(item)
            if found:
                return (f"{repr(path) if path else 'the row'} holds a lone surrogate ({found.group()!r}, half of a "
                        "UTF-16 pair: no character), which no tokenizer or UTF-8 file can hold; escape a character "
                        "outside the BMP as a pair (\\ud83d\\ude00) or write it as is")
        elif isinstance(item, dict):
            for key, child in item.items():
                if SURROGATE.search(str(key)):
                    return f"a key {'of the row' if not path else f'in {path!r}'} holds a lone surrogate ({key!r})"
                stack.append((child, f"{path}.{key}" if path else str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def row_problem(value: Any) -> Any:
    """``value`` as parsed, or a :class:`BadRow` when it is too deep or holds a lone surrogate."""
    if too_deep(value):
        return BadRow(TOO_DEEP)
    why = lone_surrogate(value)
    return value if why is None else BadRow(why)


def jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line, parsed value)`` per non-blank line; a line that is not JSON comes as a ``BadRow``."""
    with open_text(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                yield line_no, BadRow(f"invalid JSON: {e.msg} at column {e.colno}")
            except RecursionError:
                yield line_no, BadRow(TOO_DEEP)
            else:
                yield line_no, row_problem(value)


def csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(first physical line, cells)`` per CSV row; blank lines are skipped.

    A CSV error (an unterminated quote, a NUL byte) leaves the reader nowhere to resume, so it
    stops the file with a DataError at that line instead of becoming a row problem.
    """
    with open_text(path, newline="") as f:
        reader = csv.reader(f)
        start = 1
        try:
            for cells in reader:
                if cells:
                    yield start, cells
                start = reader.line_num + 1
        except csv.Error as e:
            if "field larger than field limit" in str(e):
                raise DataError(f"{path}:{start}: a cell is longer than {csv.field_size_limit():,} characters, "
                                "the most the CSV reader takes. Shorten it: a question that long would "
                                "not fit in a model's context anyway.") from None
            raise DataError(f"{path}:{start}: this CSV cannot be parsed ({e}). Check the quoting "
                            "around that line: a cell that contains commas or line breaks must be "
                            'wrapped in double quotes, and a quote inside it doubled ("").') from None


_WS = re.compile(r"\s*")


def json_array_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line, element)`` for each element of a file that starts with ``[``.

    Decoded element by element (``raw_decode``) so that each element keeps the line it starts on.
    A syntax error ends the list, so it is a DataError for the file rather than a row problem; so
    does an element too deep for the decoder, which cannot then tell where the element ends.
    """
    text = read_text(path)
    decoder = json.JSONDecoder()
    pos = _WS.match(text).end() + 1  # past the "["
    line, counted = 1, 0
    while True:
        pos = _WS.match(text, pos).end()
        if text.startswith("]", pos):
            return
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg}). A .json file must hold one "
                            "JSON list of objects, or one object per line (JSON Lines).") from None
        except RecursionError:
            raise DataError(f"{path}:{line}: the list element that starts here is {TOO_DEEP}, so the "
                            "file cannot be read. A .json file must hold one JSON list of objects, or "
                            "one object per line (JSON Lines).") from None
        yield line, row_problem(value)
        pos = _WS.match(text, pos).end()
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("]", pos):
            lineno = text.count("\n", 0, pos) + 1
            raise DataError(f"{path}:{lineno}: expected ',' or ']' after a list element. A .json "
                            "file must hold one JSON list of objects, or one object per line.")


def not_utf8(path: Path, error: UnicodeDecodeError) -> DataError:
    """The error for a file that is not UTF-8 text (all readers decode UTF-8, with or without BOM)."""
    return DataError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}). "
                     "Save it as UTF-8 and try again.")


def not_utf8_at_line(path: Path, error: UnicodeDecodeError) -> DataError:
    """:func:`not_utf8` naming ``file:line``: the file decoded again line by line, since the error of a
    streaming decode counts bytes from the start of a read buffer, not of the file or a line."""
    found = first_bad_utf8(path)
    if found is None:  # not reproducible line by line (the file changed meanwhile): the plain message
        return not_utf8(path, error)
    line, column, reason = found
    return DataError(f"{path}:{line}: not UTF-8 text ({reason} at byte {column} of that line). "
                     "Save the file as UTF-8 and try again.")


def first_bad_utf8(path: Path) -> tuple[int, int, str] | None:
    """(line, 1-based byte in that line, reason) of the first bytes of ``path`` that are not UTF-8, or None.

    Read as Latin-1, which maps every byte to one character and back, so each line's bytes are exactly
    the file's; line breaks (LF, CR, CRLF) are ASCII and never part of a multi-byte UTF-8 character.
    """
    with open_text(path, encoding="latin-1") as f:
        for line_no, text in enumerate(f, 1):
            try:
                text.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError as e:
                return line_no, e.start + 1, e.reason
    return None


# ---------------------------------------------------------------- field checks


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages about wrong types."""
    for kind, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"),
                       (list, "a list"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def as_object(value: Any, what: str = "row") -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadRow(f"{what} should be a JSON object, got {json_type(value)}")
    return value


def present(row: Mapping[str, Any], key: str, what: str | None = None) -> Any:
    """``row[key]``, which must exist and not be null."""
    if row.get(key) is None:
        raise BadRow(f"missing {what or key!r}")
    return row[key]


def text_field(row: Mapping[str, Any], key: str, what: str | None = None, *,
               allow_empty: bool = False) -> str:
    """A string field; empty (or blank) is refused unless ``allow_empty``."""
    value = present(row, key, what)
    if not isinstance(value, str):
        raise BadRow(f"{what or key!r} should be a string, got {json_type(value)}")
    if not allow_empty and not value.strip():
        raise BadRow(f"empty {what or key!r}")
    return value


def string_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRow(f"{what} should be a list of strings, got {json_type(value)}")
    return value


def row_id(row: Mapping[str, Any], default: str) -> str:
    """The row's own ``id`` if it has one, else the default (file stem and line, or split and index)."""
    value = row.get("id")
    return default if value is None or value == "" else str(value)
