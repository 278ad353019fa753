"""Reading back what runs stored: every JSON and JSON-lines file bounded in size and depth, and every
problem named by file and line.

The web server reads what jobs wrote under the runs folder, and so whatever anyone who can write
there put in it. ``json.loads`` of a document 100,000 levels deep raises RecursionError, which is no
ValueError and was caught nowhere: one such ``metrics.json`` broke every run picker. A value a few
hundred levels deep parses, then overflows whatever walks it next (``repr``, ``json.dumps``, the
browser's serializer). So each stored file is read here: at most ``max_bytes`` of it, UTF-8, JSON,
nested at most :data:`MAX_DEPTH` levels. A whole document that fails is a :class:`StoredFileError`
(a ValueError, which every reader already catches); a JSON-lines file gives its good lines and
names each bad one, so a page draws the rest. Messages name a file as the caller calls it (a run's
name under the runs folder, or the file's own name), never by its absolute path on the server.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple, Optional

MAX_DEPTH = 32  # levels of nesting in a stored value; predictions.jsonl's rows have 4 (row → top_tokens → entry)
MAX_JSON_BYTES = 64 << 20  # a JSON document: metrics.json, series.json, calibrator.json, compare.json
MAX_LINES_BYTES = 2 << 30  # a JSON-lines file: predictions.jsonl (a token run with log Z at 121 temperatures is large)
SHOWN_PROBLEMS = 3  # bad lines a message lists before it says how many more there are


class StoredFileError(ValueError):
    """A stored file that cannot be read back: too large, not UTF-8, not JSON, or nested too deep."""


class Lines(NamedTuple):
    """A JSON-lines file read back: ``rows`` (line number, value) of the good lines, ``problems`` one
    sentence per bad line (``predictions.jsonl:7: not valid JSON (…)``)."""

    rows: list[tuple[int, Any]]
    problems: list[str]


def depth(value: Any) -> int:
    """How many levels of lists and objects ``value`` nests (a number or a string: 0), walked without
    recursion so that a deep value cannot overflow the walk itself."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            break  # deep enough to refuse: the rest need not be walked
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def parse(text: str | bytes, where: str) -> Any:
    """One JSON value from ``text``, refused past :data:`MAX_DEPTH` levels; ``where`` names it in the error."""
    try:
        value = json.loads(text.decode("utf-8-sig") if isinstance(text, bytes) else text)
    except RecursionError:
        raise StoredFileError(f"{where}: nested deeper than {MAX_DEPTH} levels; no file the lab writes is, so "
                              "it was not written by a job: remove it or rerun the job that owns it") from None
    except UnicodeDecodeError as e:
        raise StoredFileError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start}); was the file cut "
                              "short while it was written?") from None
    except json.JSONDecodeError as e:
        raise StoredFileError(f"{where}: not valid JSON ({e.msg}, line {e.lineno}); is it still being "
                              "written?") from None
    if depth(value) > MAX_DEPTH:
        raise StoredFileError(f"{where}: nested deeper than {MAX_DEPTH} levels; no file the lab writes is, so "
                              "it was not written by a job: remove it or rerun the job that owns it")
    return value


def _read_bytes(path: Path, max_bytes: int, where: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StoredFileError(f"{where}: larger than {max_bytes >> 20} MiB, more than any run writes; it is not "
                              "read (remove it, or rerun the job that owns it)")
    return data


def read_json(path: Path, name: Optional[str] = None, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value stored in ``path``; ``name`` is what errors call it (default: the file's own name).
    Raises OSError (missing, unreadable) or :class:`StoredFileError`."""
    where = name or Path(path).name
    return parse(_read_bytes(Path(path), max_bytes, where), where)


def read_object(path: Path, name: Optional[str] = None, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """:func:`read_json` of a file that must hold one JSON object (every document a run writes does)."""
    where = name or Path(path).name
    value = read_json(path, where, max_bytes)
    if not isinstance(value, dict):
        raise StoredFileError(f"{where}: expected a JSON object, but got {type(value).__name__}")
    return value


def read_lines(path: Path, name: Optional[str] = None, max_bytes: int = MAX_LINES_BYTES,
               objects: bool = True) -> Lines:
    """Every non-blank line of a JSON-lines file, parsed on its own: a torn UTF-8 line, one that is no
    JSON, nested too deep, or (``objects``) no object is named in ``problems`` and left out. Raises
    OSError, or :class:`StoredFileError` for a file over ``max_bytes``."""
    where = name or Path(path).name
    rows, problems = [], []
    for number, raw in enumerate(_read_bytes(Path(path), max_bytes, where).split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            value = parse(raw, f"{where}:{number}")
        except StoredFileError as e:
            problems.append(str(e))
            continue
        if objects and not isinstance(value, dict):
            problems.append(f"{where}:{number}: expected a JSON object, but got {type(value).__name__}")
            continue
        rows.append((number, value))
    return Lines(rows, problems)


def summary(problems: list[str]) -> str:
    """Bad lines in one sentence: the first :data:`SHOWN_PROBLEMS`, then how many more."""
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    more = len(problems) - SHOWN_PROBLEMS
    return shown + (f"; and {more} more bad line{'s' if more > 1 else ''}" if more > 0 else "")
