"""Texts for the token tasks of the alignment-calibration paper (§4): ``clm`` and ``facts``.

``clm`` (causal language modelling) scores the token at random positions of a text; ``facts``
(facts generation) the first token of each entity of an entity-annotated text. Both are read as
:class:`TextRecord`\\ s by :func:`lab.data.loading.load` (``task="clm"`` / ``"facts"``), as every dataset
is: the dataset registry (a dataset feeds the tasks it has a reader for, :attr:`DatasetSpec.readers`),
``files`` entries (paths, folders, globs, ``SPLIT=PATH``, ``bundled``), restricted reads, ``file:line``
for every bad row, skipped (``on_bad_rows="skip"``, listed in :attr:`Load.problems`) or refused
(``"error"``). A file with no document in it, or not UTF-8, is refused, naming it (and the line).

File formats:

* ``clm`` — plain text (``.txt``: documents separated by one or more blank lines; a document is
  named by its first line) or JSON Lines (or one JSON list) of objects with a ``text`` field.
* ``facts`` — JSON Lines ``{"text": …, "entities": [[start, end], …]}``: character offsets
  ``[start, end)`` into ``text``, 0-based, as T-REx's entity boundaries; an optional ``id``. Spans
  may come in any order (they are sorted); overlapping, reversed, empty or out-of-range spans make
  the row bad. For clm a facts file is read as texts, its entities ignored.

Other fields of a JSON row are kept in :attr:`TextRecord.meta`. A row without ``id`` is named
``<file stem>-<line>``, as multiple-choice rows are. Datasets: ``text`` (clm; its bundled sample is
Shakespeare), ``trex`` (facts and clm; its bundled sample is from T-REx) and ``synthetic``, whose
questions become statements (:func:`lab.data.synthetic.statement`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from lab.core.errors import DataError, RowProblem
from lab.core.reads import open_text

from .registry import register
from .rows import BadRow, as_object, json_type, not_utf8_at_line, read_json, row_id, text_field
from .spec import DatasetSpec, Reader

TEXT_TASKS = ("clm", "facts")
CLM_FORMAT = ("plain text (.txt: documents separated by blank lines) or JSON Lines with a 'text' field, "
              'e.g. {"text": "Once upon a time ..."}')
FACTS_FORMAT = ('JSON Lines with the text and its entities as character spans [start, end), e.g. '
                '{"text": "Paris is in France.", "entities": [[0, 5], [12, 18]]}, and an optional "id"')
SHOWN = 60  # characters of a bad value quoted in a message
# The longest document (characters) the token tasks take. A document is tokenised whole, and a fast tokenizer
# holds some 17 bytes per character while it does (a 200 MB line asked for 3.35 GB and the process died),
# whereas a model reads only its context: a few thousand to a hundred thousand tokens, i.e. well under this.
MAX_DOCUMENT_CHARS = 1_000_000


@dataclass(frozen=True)
class TextRecord:
    """One document of a token task.

    ``entities``: for facts, the character spans ``[start, end)`` of its entities in ``text``, in
    text order (sorted, never overlapping); empty for clm. ``origin``: where the loader read it
    (``(file, line)``, the line a document starts on), for messages.
    """

    id: str
    text: str
    entities: tuple[tuple[int, int], ...] = ()
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    origin: Optional[tuple[str, int]] = field(default=None, compare=False, hash=False)

    @property
    def where(self) -> str:
        """``file:line`` of the row or document it came from, or "" for a record made in code."""
        return f"{self.origin[0]}:{self.origin[1]}" if self.origin else ""


TextRow = Union[TextRecord, RowProblem]


def text_readers(read: Callable[..., Iterator[TextRow]], expected: str, tasks: Sequence[str]) -> dict[str, Reader]:
    """A dataset's readers for the token ``tasks``: ``read(path, task=...)``'s documents and problems, a file
    with neither refused, naming it and ``expected`` (the dataset's format), a file not UTF-8 naming the line."""
    return {task: partial(_documents, read=partial(read, task=task), expected=expected) for task in tasks}


def _documents(path: Path, read: Callable[[Path], Iterator[TextRow]], expected: str) -> Iterator[TextRow]:
    found = False
    try:
        for row in read(path):
            found = True
            yield row
    except UnicodeDecodeError as e:
        raise not_utf8_at_line(path, e) from None
    if not found:
        raise DataError(f"{path}: no document in it: the file is empty (or holds only blank lines). "
                        f"Expected {expected}.")


# ---------------------------------------------------------------- reading files


def read_text_file(path: Path, task: str, source: str = "text") -> Iterator[TextRow]:
    """A ``.txt`` file's documents (clm only: plain text marks no entities), or the rows of a JSON
    Lines file (or one JSON list, decided by the content as for questions)."""
    if path.suffix.lower() == ".txt":
        if task == "facts":
            raise DataError(f"{path}: a plain-text file marks no entities, so it cannot feed facts. "
                            f"Expected {FACTS_FORMAT}.")
        return plain_documents(path, source)
    return read_json(path, partial(text_row, task=task, source=source))


def plain_documents(path: Path, source: str = "text") -> Iterator[TextRow]:
    """The documents of a plain-text file: runs of non-blank lines, separated by one or more blank
    lines (a line of only spaces is blank), each named ``<file stem>-<its first line>``; the lines
    of a document are kept as written, joined by newlines."""
    with open_text(path) as f:
        lines: list[str] = []
        start = 0
        for line_no, line in enumerate(f, 1):
            if line.strip():
                if not lines:
                    start = line_no
                lines.append(line.rstrip("\r\n"))
            elif lines:
                yield _document(path, start, lines, source)
                lines = []
        if lines:
            yield _document(path, start, lines, source)


def _document(path: Path, start: int, lines: list[str], source: str) -> TextRow:
    text = "\n".join(lines)
    if len(text) > MAX_DOCUMENT_CHARS:
        return RowProblem(str(path), start, too_long(text))
    return TextRecord(f"{path.stem}-{start}", text, source=source, origin=(str(path), start))


def too_long(text: str) -> str:
    """Why a document over :data:`MAX_DOCUMENT_CHARS` is skipped, and what to do."""
    return (f"the document is {len(text):,} characters, over the {MAX_DOCUMENT_CHARS:,} a token task takes "
            "(it is tokenised whole, and a model reads only its context): split it into documents (in a .txt "
            "file, a blank line between them) or cut it")


def text_row(value: Any, default_id: str, task: str = "clm", source: str = "text") -> TextRecord:
    """One JSON row → a document; for facts with its entity spans, checked against its text."""
    row = as_object(value)
    text = text_field(row, "text")
    if len(text) > MAX_DOCUMENT_CHARS:
        raise BadRow(too_long(text))
    entities = entity_spans(row.get("entities"), text) if task == "facts" else ()
    meta = {k: v for k, v in row.items() if k not in ("id", "text", "entities")}
    return TextRecord(row_id(row, default_id), text, entities, source, meta)


def entity_spans(value: Any, text: str) -> tuple[tuple[int, int], ...]:
    """``[[start, end], …]`` → sorted spans, each a non-blank ``[start, end)`` inside ``text``, none
    overlapping another; raises ``BadRow`` naming the first span that is not."""
    if value is None:
        raise BadRow("missing 'entities': facts needs each entity's character span, [[start, end], ...]")
    if not isinstance(value, list):
        raise BadRow(f"'entities' should be a list of [start, end] spans, got {json_type(value)}")
    if not value:
        raise BadRow("'entities' is empty: facts needs at least one entity to predict")
    spans: list[tuple[int, int, int]] = []
    for i, span in enumerate(value):
        if not (isinstance(span, list) and len(span) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in span)):
            raise BadRow(f"entities[{i}] should be [start, end], two whole numbers (character offsets), got "
                         f"{_shown(span)}")
        start, end = span
        if end <= start:
            raise BadRow(f"entities[{i}] [{start}, {end}] is reversed or empty: end must be greater than start "
                         "(spans are [start, end), end excluded)")
        if start < 0 or end > len(text):
            raise BadRow(f"entities[{i}] [{start}, {end}] is out of range: the text has {len(text)} characters "
                         "(spans are 0-based [start, end) character offsets)")
        if not text[start:end].strip():
            raise BadRow(f"entities[{i}] [{start}, {end}] covers only whitespace")
        spans.append((start, end, i))
    spans.sort()
    for (s1, e1, i1), (s2, e2, i2) in zip(spans, spans[1:]):
        if s2 < e1:
            raise BadRow(f"entities[{i1}] [{s1}, {e1}] and entities[{i2}] [{s2}, {e2}] overlap "
                         f"({text[s2:min(e1, e2)]!r} is in both); an entity's first token must be one place")
    return tuple((s, e) for s, e, _ in spans)


def _shown(value: Any) -> str:
    try:
        shown = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        shown = repr(value)
    return shown if len(shown) <= SHOWN else shown[:SHOWN] + "…"


# ---------------------------------------------------------------- the datasets

register(DatasetSpec(
    name="text",
    description="plain texts for clm (the token at random positions): .txt documents separated by blank "
                "lines, or JSON Lines with a 'text' field; bundled: Shakespeare (public domain)",
    hub_path=None, hub_config=None, hub_splits={}, local_format=CLM_FORMAT,
    readers=text_readers(partial(read_text_file, source="text"), CLM_FORMAT, ("clm",)), from_hub=None,
    extensions=(".txt", ".jsonl", ".json"),
    bundled=(("validation", "text/validation.txt"), ("test", "text/test.txt"))))

register(DatasetSpec(
    name="trex",
    description="entity-annotated texts for facts (each entity's first token) and clm: JSON Lines "
                "{text, entities: [[start, end], ...]}; bundled: sentences of the T-REx sample (CC BY-SA 4.0)",
    hub_path=None, hub_config=None, hub_splits={}, local_format=FACTS_FORMAT,
    readers=text_readers(partial(read_text_file, source="trex"), FACTS_FORMAT, ("facts", "clm")), from_hub=None,
    extensions=(".jsonl", ".json"), bundled=(("test", "trex/test.jsonl"),)))
