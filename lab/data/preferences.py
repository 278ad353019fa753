"""Preference pairs (prompt, chosen, rejected): DPO's training data and CFT/RCFT's win-rate check (REFERENCE.md §3).

One dataset, ``ultrafeedback`` (task type ``preferences``), read as every dataset is, by
:func:`lab.data.loading.load`: from its hub copy, the default, ``argilla/ultrafeedback-binarized-preferences``;
from a user's own files, in the config's ``preferences`` field; or from ``bundled``, the package's own
offline stand-in (:data:`lab.data.samples.PREFERENCES`): OpenBookQA dev questions with the right answer
chosen over a wrong one — a check that fine-tuning keeps the model's preference for right answers, not
the paper's UltraFeedback alignment check. It reads the layouts these pairs are published in, decided per row:

* plain strings ``{"prompt", "chosen", "rejected"}`` — the UltraFeedback subset in
  ``shared/data`` and ``trl-lib``-style string datasets;
* chat messages ``{"prompt", "chosen": [{"role", "content"}, …], "rejected": […]}`` — e.g.
  ``HuggingFaceH4/ultrafeedback_binarized``: the response is the last assistant message, the
  prompt the ``prompt`` field or else the first user message;
* Argilla's ``{"instruction", "chosen_response", "rejected_response"}`` —
  ``argilla/ultrafeedback-binarized-preferences``, the hub default.

Local files are JSON Lines (or one JSON list) with ``file:line`` for bad rows, like every dataset's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping, Optional

from . import samples
from .registry import register
from .rows import BadRow, as_object, json_type, read_json, row_id, text_field
from .spec import DatasetSpec

DATASET = "ultrafeedback"  # the one dataset of preference pairs: what the preferences fields name
TASK = "preferences"
HUB_ID = "argilla/ultrafeedback-binarized-preferences"
FORMAT = ("JSON Lines or a JSON list of preference pairs: {\"prompt\", \"chosen\", \"rejected\"} as strings or "
          "chat messages, or Argilla's {\"instruction\", \"chosen_response\", \"rejected_response\"}")


@dataclass(frozen=True)
class PreferencePair:
    """One prompt with the response preferred and the one rejected. ``origin``: where the loader read it
    (``(file, line)``, or ``(hub split, row index)``), for messages."""

    id: str
    prompt: str
    chosen: str
    rejected: str
    origin: Optional[tuple[str, int]] = field(default=None, compare=False, hash=False, repr=False)

    @property
    def where(self) -> str:
        """``file:line`` of the row it came from, or "" for a pair made in code."""
        return f"{self.origin[0]}:{self.origin[1]}" if self.origin else ""


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


register(DatasetSpec(
    name=DATASET,
    description="preference pairs (prompt, chosen, rejected) for DPO and CFT's win rate, in the UltraFeedback "
                f"layouts; hub: {HUB_ID}; bundled: an offline stand-in, OpenBookQA dev questions with the right "
                "answer chosen over a wrong one",
    hub_path=HUB_ID, hub_config=None, hub_splits={"train": "train"}, local_format=FORMAT,
    readers={TASK: partial(read_json, convert=to_pair)}, from_hub=to_pair,
    bundled=(("train", str(samples.PREFERENCES.relative_to(samples.ROOT))),)))
