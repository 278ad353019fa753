"""Preference pairs (prompt, chosen, rejected) for the win-rate check of CFT/RCFT (REFERENCE.md §3).

Reads the layouts these pairs are published in, decided per row:

* plain strings ``{"prompt", "chosen", "rejected"}`` — the UltraFeedback subset in
  ``shared/data`` and ``trl-lib``-style string datasets;
* chat messages ``{"prompt", "chosen": [{"role", "content"}, …], "rejected": […]}`` — e.g.
  ``HuggingFaceH4/ultrafeedback_binarized``: the response is the last assistant message, the
  prompt the ``prompt`` field or else the first user message;
* Argilla's ``{"instruction", "chosen_response", "rejected_response"}`` —
  ``argilla/ultrafeedback-binarized-preferences``, the hub default.

Local files are JSON Lines (or one JSON list) with ``file:line`` for bad rows, like the MCQ loaders.
The entry ``bundled`` is the package's own offline stand-in (:data:`lab.data.samples.PREFERENCES`):
OpenBookQA dev questions with the right answer chosen over a wrong one — a check that fine-tuning
keeps the model's preference for right answers, not the paper's UltraFeedback alignment check.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from lab.core.errors import DataError, RowProblem
from lab.core.hub import hub_offline_mode, hub_reachable
from lab.core.reads import open_text

from . import samples
from .rows import BadRow, as_object, convert_rows, json_array_rows, json_type, jsonl_rows, not_utf8, row_id, text_field

HUB_ID = "argilla/ultrafeedback-binarized-preferences"
HUB_SPLIT = "train"


@dataclass(frozen=True)
class PreferencePair:
    id: str
    prompt: str
    chosen: str
    rejected: str


def _response(value: Any, what: str) -> str:
    if isinstance(value, str):
        if not value.strip():
            raise BadRow(f"empty {what!r}")
        return value
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        replies = [m.get("content") for m in value if m.get("role") == "assistant"]
        if replies and isinstance(replies[-1], str) and replies[-1].strip():
            return replies[-1]
        raise BadRow(f"{what!r} has no non-empty assistant message")
    raise BadRow(f"{what!r} should be a string or a list of chat messages, got {json_type(value)}")


def _prompt(row: Mapping[str, Any]) -> str:
    if isinstance(row.get("prompt"), str):
        return text_field(row, "prompt")
    if isinstance(row.get("instruction"), str):
        return text_field(row, "instruction")
    chosen = row.get("chosen")
    if isinstance(chosen, list):
        for message in chosen:
            if isinstance(message, Mapping) and message.get("role") == "user" and isinstance(message.get("content"), str):
                return message["content"]
    raise BadRow("missing 'prompt' (or 'instruction', or a user message in 'chosen')")


def to_pair(value: Any, default_id: str) -> PreferencePair:
    """One row in any of the module's layouts → a pair; raises ``BadRow`` with the reason."""
    row = as_object(value)
    if "chosen_response" in row or "rejected_response" in row:
        chosen, rejected = row.get("chosen_response"), row.get("rejected_response")
    else:
        chosen, rejected = row.get("chosen"), row.get("rejected")
    if chosen is None or rejected is None:
        raise BadRow("missing 'chosen' / 'rejected' (or 'chosen_response' / 'rejected_response')")
    pair = PreferencePair(row_id(row, default_id), _prompt(row), _response(chosen, "chosen"), _response(rejected, "rejected"))
    if pair.chosen == pair.rejected:
        raise BadRow("'chosen' and 'rejected' are the same text: the pair says nothing")
    return pair


Item = Union[PreferencePair, RowProblem]


def _read(path: Path) -> Iterator[Item]:
    if not path.is_file():
        raise DataError(f"Preference file {path} does not exist.")
    try:
        with open_text(path) as f:
            is_list = f.read(1024).lstrip().startswith("[")
        yield from convert_rows(path, json_array_rows(path) if is_list else jsonl_rows(path), to_pair)
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from None


def _from_hub(hub_id: str, split: str) -> Iterator[Item]:
    if not hub_reachable() and not hub_offline_mode():
        raise DataError(f"The Hugging Face hub cannot be reached to load {hub_id}. Pass local JSON Lines files with "
                        "prompt / chosen / rejected fields instead (e.g. ultrafeedback_binarized_subset/eval.jsonl).")
    import datasets

    try:
        table = datasets.load_dataset(hub_id, split=split)
    except Exception as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(f"Could not load {hub_id} ({split}) from the Hugging Face hub: {reason}") from e
    for index, row in enumerate(table):
        try:
            yield to_pair(row, f"{split}-{index}")
        except BadRow as e:
            yield RowProblem(split, index, str(e))


def load_pairs(data_files: Optional[Sequence[str]] = None, limit: Optional[int] = None, hub_id: str = HUB_ID,
               split: str = HUB_SPLIT) -> tuple[list[PreferencePair], list[RowProblem]]:
    """Pairs from local files (in order; ``bundled`` is the package's pairs), else from the hub; bad
    rows are skipped and returned."""
    if data_files:
        data_files = [str(samples.PREFERENCES) if f == samples.BUNDLED else f for f in data_files]
    items: Iterator[Item] = (item for f in data_files for item in _read(Path(f))) if data_files else _from_hub(hub_id, split)
    pairs: list[PreferencePair] = []
    problems: list[RowProblem] = []
    for item in items:
        (problems if isinstance(item, RowProblem) else pairs).append(item)
        if limit is not None and len(pairs) >= limit:
            break
    if not pairs:
        where = ", ".join(map(str, data_files)) if data_files else hub_id
        first = f" First problem: {problems[0]}" if problems else ""
        raise DataError(f"No usable preference pairs in {where}.{first}", tuple(problems))
    return pairs, problems
