"""Instruction–response pairs for supervised fine-tuning (``sft``), in the shape TRL's SFTTrainer takes.

Instruction data is published in a few layouts, and a user's own file is in whichever their tool
wrote; each becomes one :class:`InstructionRecord` — a prompt (chat messages ending with a user turn)
and the assistant's completion — so that the trainer sees one shape whatever the file held. A file
holds one layout, the layout of its first good row; a later row of another layout is a bad row
(a mixed file is usually two files pasted together, and a chat row among Alpaca rows would
otherwise train on a different prompt format unnoticed). The layouts, each a JSON object per row
(JSON Lines, or one JSON list):

* Alpaca ``{"instruction", "input", "output"}`` — the prompt is the instruction, followed by
  ``"\\n\\n"`` and the input when there is one (``input`` may be ``""`` or absent);
* chat ``{"messages": [{"role": "system" | "user" | "assistant", "content": str}, ...]}`` ending
  with an assistant turn that follows a user turn — the prompt is every message before that turn;
* prompt–completion ``{"prompt": str, "completion": str}`` — the prompt one user message;
* Dolly ``{"instruction", "context", "response"}`` — databricks-dolly-15k's own rows, read as
  Alpaca's (its context in the place of Alpaca's input), so that its original file loads as it is.

Any other field (Dolly's ``category``) is kept in :attr:`InstructionRecord.meta`; an ``id`` names
the row, else ``<file stem>-<line>``. Files are read as every dataset of the lab is read
(:func:`lab.data.loading.load`, ``task="sft"``): ``files`` entries (paths, folders, globs, ``SPLIT=PATH``,
``bundled``), restricted reads, ``file:line`` and the reason for every bad row, skipped
(``on_bad_rows="skip"``, listed in :attr:`Load.problems`) or refused (``"error"``).
Datasets: ``alpaca`` (its bundled sample: 500 rows of Stanford Alpaca, CC BY-NC 4.0,
non-commercial), ``dolly`` (databricks-dolly-15k, CC BY-SA 3.0; its bundled sample: 193 short rows
spread over the file, all 8 categories) and ``instructions`` (a user's own files, so that a run on
them is not recorded under a published dataset's name).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Union

from lab.core.errors import DataError, RowProblem
from lab.core.limits import MAX_TOKENS

from .registry import register
from .rows import BadRow, as_object, json_type, not_utf8_at_line, present, read_json, row_id, text_field
from .spec import DatasetSpec
from .chat_templates import alpaca_prompt

SFT_TASK = "sft"
ROLES = ("system", "user", "assistant")
# Characters a row's texts may hold together: 16 for every token of the longest sequence the lab trains
# on (MAX_TOKENS), more than any tokenizer's tokens average, so a longer row could never be trained on
# whole. Refusing it at load keeps one runaway row (a file that is one huge line) out of the run.
MAX_CHARS = 16 * MAX_TOKENS
SHOWN = 40  # characters of a user's value (a role) quoted in a message: a field may hold megabytes
FORMAT = ('JSON Lines or a JSON list, one layout per file: Alpaca {"instruction", "input", "output"}, chat '
          '{"messages": [{"role", "content"}, ...]} ending with the assistant\'s turn, prompt-completion '
          '{"prompt", "completion"}, or Dolly {"instruction", "context", "response"}')

Message = dict[str, str]  # {"role": ..., "content": ...}, as chat templates and TRL take them


@dataclass(frozen=True)
class InstructionRecord:
    """One instruction–response pair.

    ``prompt``: the chat messages before the response (``{"role", "content"}``), ending with a user
    turn; ``completion``: the assistant's response, the text SFT learns. ``origin``: where the loader
    read it (``(file, line)``), for messages.
    """

    id: str
    prompt: tuple[Message, ...] = field(hash=False)
    completion: str
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    origin: Optional[tuple[str, int]] = field(default=None, compare=False, hash=False)

    @property
    def where(self) -> str:
        """``file:line`` of the row it came from, or "" for a record made in code."""
        return f"{self.origin[0]}:{self.origin[1]}" if self.origin else ""

    def example(self) -> dict[str, list[Message]]:
        """TRL's conversational prompt–completion example, what SFTTrainer trains on: the loss falls on
        the completion only, rendered by the model's own chat template. Fresh copies: ``datasets`` and
        the trainer may alter what they are given, and the record must not change."""
        return {"prompt": [dict(message) for message in self.prompt],
                "completion": [{"role": "assistant", "content": self.completion}]}

    def plain_example(self) -> dict[str, str]:
        """TRL's plain prompt–completion example, for a model without a chat template (a base model, as
        the alignment-calibration paper tunes): the prompt in Stanford Alpaca's form
        (:func:`lab.data.chat_templates.alpaca_prompt`); SFTTrainer appends the end-of-text token."""
        return {"prompt": alpaca_prompt(self.prompt), "completion": self.completion}


InstructionRow = Union[InstructionRecord, RowProblem]


def read_instructions(path: Path, source: str) -> Iterator[InstructionRow]:
    """One file's pairs and problems; a file with neither (empty), or not UTF-8, is refused, naming it."""
    layout = _FileLayout(source)
    found = False
    try:
        for row in read_json(path, layout.convert):
            found = True
            if layout.first_line is None and isinstance(row, InstructionRecord):
                layout.first_line = row.origin[1] if row.origin else 0
            yield row
    except UnicodeDecodeError as e:
        raise not_utf8_at_line(path, e) from None
    if not found:
        raise DataError(f"{path}: no rows in it: the file is empty (or holds only blank lines, or an empty "
                        f"list). Expected {FORMAT}.")


# ---------------------------------------------------------------- the layouts


def _response(row: Mapping[str, Any], key: str, what: str | None = None) -> str:
    """The text to learn: a string with something in it (a blank one teaches the model to say nothing)."""
    value = present(row, key, what)
    if not isinstance(value, str):
        raise BadRow(f"{what or key!r} should be a string, got {json_type(value)}")
    if not value.strip():
        raise BadRow(f"empty response: {what or key!r} is blank, so there is nothing to learn")
    return value


def _with_input(row: Mapping[str, Any], instruction_key: str, input_key: str) -> list[Message]:
    """Alpaca's prompt: the instruction, then a blank line and the input where there is one."""
    instruction = text_field(row, instruction_key)
    extra = row.get(input_key)
    if extra is not None and not isinstance(extra, str):
        raise BadRow(f"{input_key!r} should be a string (or \"\", or absent), got {json_type(extra)}")
    return [{"role": "user", "content": f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction}]


def _alpaca(row: Mapping[str, Any]) -> tuple[list[Message], str]:
    return _with_input(row, "instruction", "input"), _response(row, "output")


def _dolly(row: Mapping[str, Any]) -> tuple[list[Message], str]:
    return _with_input(row, "instruction", "context"), _response(row, "response")


def _prompt_completion(row: Mapping[str, Any]) -> tuple[list[Message], str]:
    prompt = present(row, "prompt")
    if not isinstance(prompt, str):
        raise BadRow(f"'prompt' should be a string, got {json_type(prompt)} (a conversation goes in 'messages', "
                     "ending with the assistant's turn)")
    return [{"role": "user", "content": text_field(row, "prompt")}], _response(row, "completion")


def _message(value: Any, i: int) -> Message:
    message = as_object(value, f"messages[{i}]")
    role = present(message, "role", f"messages[{i}].role")
    if not isinstance(role, str):
        raise BadRow(f"'messages[{i}].role' should be a string, got {json_type(role)}")
    if role not in ROLES:
        shown = role if len(role) <= SHOWN else role[:SHOWN] + "…"
        raise BadRow(f"messages[{i}] has the unknown role {shown!r}: expected {', '.join(ROLES)}")
    content = present(message, "content", f"messages[{i}].content")
    if not isinstance(content, str):
        raise BadRow(f"'messages[{i}].content' should be a string, got {json_type(content)}")
    return {"role": role, "content": content}


def _chat(row: Mapping[str, Any]) -> tuple[list[Message], str]:
    messages = present(row, "messages")
    if not isinstance(messages, list):
        raise BadRow(f"'messages' should be a list of {{\"role\", \"content\"}} objects, got {json_type(messages)}")
    if not messages:
        raise BadRow("'messages' is empty: a chat row needs a user turn and the assistant's response")
    turns = [_message(value, i) for i, value in enumerate(messages)]
    last = len(turns) - 1
    if turns[last]["role"] != "assistant":
        raise BadRow(f"the last message, messages[{last}], is the {turns[last]['role']}'s: a chat row ends with the "
                     "assistant's response, the text to learn")
    if last == 0 or turns[last - 1]["role"] != "user":
        before = f"messages[{last - 1}] is the {turns[last - 1]['role']}'s" if last else "nothing comes before it"
        raise BadRow(f"the assistant's last turn, messages[{last}], answers no user turn ({before}): the prompt "
                     "must end with a user message")
    if not turns[last]["content"].strip():
        raise BadRow(f"empty response: messages[{last}], the assistant's last turn, is blank, so there is nothing "
                     "to learn")
    for i, turn in enumerate(turns[:last]):
        if turn["role"] != "system" and not turn["content"].strip():
            raise BadRow(f"messages[{i}], a {turn['role']} turn, is blank")
    return turns[:last], turns[last]["content"]


@dataclass(frozen=True)
class Layout:
    """One layout: its name in messages, the fields that tell its rows apart, and how one is read."""

    name: str
    keys: tuple[str, ...]  # a row holding any of these is of this layout
    fields: tuple[str, ...]  # every field it reads (the rest go to meta)
    read: Callable[[Mapping[str, Any]], tuple[list[Message], str]]  # -> (prompt, completion); raises BadRow


LAYOUTS = (Layout("Alpaca", ("output", "input"), ("instruction", "input", "output"), _alpaca),
           Layout("chat", ("messages",), ("messages",), _chat),
           Layout("prompt-completion", ("prompt", "completion"), ("prompt", "completion"), _prompt_completion),
           Layout("Dolly", ("response", "context"), ("instruction", "context", "response"), _dolly))
ALPACA, DOLLY = LAYOUTS[0], LAYOUTS[3]


class _FileLayout:
    """The layout of one file: that of its first good row, against which every later row is read."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.layout: Optional[Layout] = None
        self.first_line: Optional[int] = None  # set by the reader when the first record comes out

    def of(self, row: Mapping[str, Any]) -> Layout:
        """The layout ``row`` is written in, told by its fields; a row with only ``instruction`` is
        Alpaca's or Dolly's, whichever the file is (Alpaca's before the file has one)."""
        found = [layout for layout in LAYOUTS if any(key in row for key in layout.keys)]
        if len(found) > 1:
            names = "; ".join(f"{lay.name}: {', '.join(k for k in lay.keys if k in row)}" for lay in found)
            raise BadRow(f"the row has the fields of {len(found)} layouts ({names}): keep one layout's fields")
        if found:
            return found[0]
        if "instruction" in row:
            return self.layout if self.layout in (ALPACA, DOLLY) else ALPACA
        raise BadRow(f"missing fields: no 'instruction', 'messages' or 'prompt'. Expected {FORMAT}")

    def convert(self, value: Any, default_id: str) -> InstructionRecord:
        row = as_object(value)
        layout = self.of(row)
        if self.layout is not None and layout is not self.layout:
            raise BadRow(f"a row of the {layout.name} layout in a file of {self.layout.name} rows (the layout of its "
                         f"first good row, line {self.first_line}): one file holds one layout; split it in two")
        prompt, completion = layout.read(row)
        size = sum(len(m["content"]) for m in prompt) + len(completion)
        if size > MAX_CHARS:
            raise BadRow(f"the row's texts hold {size:,} characters, more than the {MAX_CHARS:,} a row may hold")
        self.layout = layout
        meta = {k: v for k, v in row.items() if k != "id" and k not in layout.fields}
        return InstructionRecord(row_id(row, default_id), tuple(prompt), completion, self.source, meta)


# ---------------------------------------------------------------- the datasets

def _register(name: str, description: str, bundled: tuple[tuple[str, str], ...] = ()) -> None:
    register(DatasetSpec(name=name, description=description, hub_path=None, hub_config=None, hub_splits={},
                         local_format=FORMAT, readers={SFT_TASK: partial(read_instructions, source=name)},
                         from_hub=None, bundled=bundled))


_register("alpaca", "Stanford Alpaca instruction-response pairs (synthetic, text-davinci-003) for sft, in any of "
          "the instruction layouts; bundled: 500 rows of a random subset (train 400, validation 100), CC BY-NC 4.0: "
          "non-commercial use only", (("train", "alpaca/train.jsonl"), ("validation", "alpaca/validation.jsonl")))
_register("dolly", "databricks-dolly-15k instruction-response pairs (human-written, CC BY-SA 3.0) for sft: its "
          "original databricks-dolly-15k.jsonl, or any of the instruction layouts; bundled: 193 short rows spread over "
          "the file (train 145, validation 48), CC BY-SA 3.0",
          (("train", "dolly/train.jsonl"), ("validation", "dolly/validation.jsonl")))
_register("instructions", "your own instruction-response pairs for sft: Alpaca, chat messages, prompt-completion "
          "or Dolly rows, one layout per file")
