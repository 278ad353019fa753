"""Which tokens of a text the token tasks read (``clm``, ``facts``: :mod:`lab.models.token_scoring`
scores them): a document's tokens as the model sees them with each token's place in the text, the
clm positions drawn with a seed, and the token that opens each entity. No torch: the worker plans
its targets before it loads a model.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

Span = tuple[int, int]  # [start, end) in characters of the text; (-1, -1): a token of no text character
NO_SPAN: Span = (-1, -1)


@dataclass(frozen=True)
class TokenDoc:
    """One document to score. ``ids``: its tokens as the model sees them (prefix + text, with the
    tokenizer's own special tokens); ``positions``: target positions p, 1 <= p < len(ids) — the model
    predicts ``ids[p]`` from ``ids[:p]``; ``entities``: for facts, the entity index of each position
    (same length as ``positions``), None for clm."""

    ids: list[int]
    positions: list[int]
    entities: Optional[list[Optional[int]]] = None


def encode(tokenizer, text: str, prefix: str = "") -> tuple[list[int], list[Span]]:
    """``prefix + text`` tokenised as one string (``add_special_tokens`` as the tokenizer does by
    default), and each token's character span in ``text``.

    One string, not the prefix and the text apart: that is the tokenisation the model reads. A
    special token (BOS) or a token wholly inside the prefix gets (-1, -1); a token that straddles
    the two (a prefix ending in a space, merged into the text's first word) gets the part in
    ``text``, starting at 0. Offsets need a fast (Rust) tokenizer; a slow one is refused.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"Expected a fast tokenizer (character offsets), but got {type(tokenizer).__name__}; "
                         "load it with use_fast=True")
    enc = tokenizer(prefix + text, return_offsets_mapping=True, return_special_tokens_mask=True)
    cut = len(prefix)
    spans: list[Span] = []
    for (start, end), special in zip(enc["offset_mapping"], enc["special_tokens_mask"]):
        spans.append(NO_SPAN if special or end <= cut or start == end else (max(start - cut, 0), end - cut))
    return list(enc["input_ids"]), spans


def clm_positions(n_tokens: int, count: int, min_context: int, rng: np.random.Generator) -> list[int]:
    """``count`` distinct positions drawn uniformly from [max(min_context, 1), n_tokens), ascending.

    Fewer when the document has fewer; [] when ``n_tokens <= min_context`` (or ``n_tokens <= 1``:
    position 0 has no context): the caller counts that document as skipped. ``min_context`` counts the
    document's tokens as the model sees them (prefix and BOS included). The draw consumes ``rng``, so one
    generator seeded with the run's seed and passed over the documents in file order reproduces a run.
    To stay inside a model's context of L tokens, pass ``min(n_tokens, L + 1)``: a target at p feeds p tokens.
    """
    if count < 0 or min_context < 0:
        raise ValueError(f"Expected `count` and `min_context` to be integers of at least 0, but got {count} and {min_context}")
    low = max(min_context, 1)
    if n_tokens <= low or count == 0:
        return []
    drawn = rng.choice(n_tokens - low, size=min(count, n_tokens - low), replace=False) + low
    return sorted(int(p) for p in drawn)


def with_bos(ids: list[int], spans: list[Span], bos: Optional[int]) -> tuple[list[int], list[Span]]:
    """``ids`` and ``spans`` with the ``bos`` token prepended when the first token is the text's own (a
    tokenizer that adds no special token, and no prefix): without it an entity that opens the text would
    sit at position 0, with nothing to be predicted from. Unchanged when ``bos`` is None (the tokenizer
    has none) or something already precedes the text."""
    if bos is None or not spans or spans[0] == NO_SPAN:
        return ids, spans
    return [bos, *ids], [NO_SPAN, *spans]


def facts_positions(spans: Sequence[Span],
                    entities: Sequence[Span]) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
    """(entity index, target position) for each entity of the text that has a target: the position of
    the token that holds the entity's first character, as :func:`encode`'s ``spans`` place it; and
    (entity index, why) for each that has none, for the caller to count and name.

    - A tokenizer that glues the preceding space to the word (byte-level BPE: " Paris") makes that
      merged token the target; the model reads the text up to the space's token boundary, which is
      the only boundary it ever sees there (paper §4: the entity's first token).
    - An entity that begins inside a token ("Paris" in "(Paris" tokenised as " (P", or a suffix of
      a word) still targets the token containing its first character: the context must end on a
      token boundary of the text's own tokenisation, and re-tokenising the text split at the entity
      would show the model a tokenisation it never meets. That target then also holds characters
      before the entity; such rows are rare with word-level entity spans.
    - An entity whose first character lies in no token (whitespace that a tokenizer trims from
      its offsets) targets the first token starting inside the entity.
    - Left out, with the reason: an entity whose target would be position 0 (the text's first token
      with no BOS or prefix before it, :func:`with_bos`: nothing to predict it from), one that no
      token covers (past the end of the text), and one with no token starting inside it.
    Spans are [start, end) character offsets; a negative start or ``end <= start`` is refused (the
    loader checks its rows; here it is a caller's mistake). Two entities may share a target.
    """
    text_tokens = [i for i, span in enumerate(spans) if span != NO_SPAN]
    ends = [spans[i][1] for i in text_tokens]  # non-decreasing along the text
    pairs, skipped = [], []
    for k, (start, end) in enumerate(entities):
        if start < 0 or end <= start:
            raise ValueError(f"Expected entity {k} to be a span [start, end) with 0 <= start < end, but got ({start}, {end})")
        # The first token ending after `start` (bisect over ends, so that of two byte-level tokens
        # sharing one multi-byte character's span, the first is taken).
        j = bisect_right(ends, start)
        if j == len(text_tokens):
            skipped.append((k, "no token of the text covers it"))
            continue
        position = text_tokens[j]
        if spans[position][0] >= end:
            skipped.append((k, "no token starts inside it"))
        elif position == 0:
            skipped.append((k, "it opens the text and the tokenizer has no BOS token to predict it from"))
        else:
            pairs.append((k, position))
    return pairs, skipped
