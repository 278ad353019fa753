"""An opening several questions share (a few-shot block, a task's description) run once: the groups
that share one (:func:`shared_prefixes`, :func:`plan_shared`), its KV cache kept while a group's
batches run (:class:`Opening`), a batch's context pass on it (:func:`context_pass`) and the options'
tokens fed on a context's cache (:func:`continuation_logprobs`). :mod:`lab.models.scoring` scores
with them.
"""
from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Optional, Sequence

import torch

from lab.models.batching import Encoded, index_device, left_padded, plan_batches, scored_length

MIN_SHARED = 64  # tokens of context a group of questions must share for it to run once (plan_shared)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def shared_prefixes(contexts: Sequence[Sequence[int]], min_shared: int = MIN_SHARED) -> dict[int, int]:
    """For each question whose context opens with the same ``min_shared`` or more tokens as another's, the
    length of the opening its group shares (question index → tokens); the others are absent.

    A few-shot prompt repeats its examples and the task's description before every question (MMLU 5-shot:
    85 % of its context tokens), so a group's opening runs once and each question runs only its own part
    after it (:func:`lab.models.scoring.score_cloze`). Sorted contexts make each group one run: the common opening of a run's
    first and last contexts is the shortest one between neighbours. Every member keeps a token of its own,
    the one whose logits predict its options."""
    order = sorted(range(len(contexts)), key=lambda i: contexts[i])
    shared: dict[int, int] = {}
    start = 0
    while start < len(order):
        end, length = start + 1, None
        while end < len(order):
            common = _common(contexts[order[start]], contexts[order[end]])
            if common < min_shared:
                break
            length, end = common, end + 1
        members = order[start:end]
        if length is not None:
            length = min(length, *(len(contexts[i]) - 1 for i in members))
            if length >= min_shared:
                shared.update((i, length) for i in members)
        start = end
    return shared


def plan_shared(encoded: Sequence[Encoded], scoring: str, batch_size: int, max_tokens: Optional[int] = None
                ) -> tuple[list[list[int]], dict[int, int]]:
    """:func:`lab.models.batching.plan_batches` for :func:`lab.models.scoring.score_cloze` or
    :func:`lab.models.scoring.score_letter` (``scoring``) with shared openings
    (:func:`shared_prefixes`): the batches (a batch never mixes groups, and is planned on the questions' own
    parts) and each question's shared length."""
    shared = shared_prefixes([context for context, _ in encoded])
    groups: dict[tuple, list[int]] = {}
    for i in range(len(encoded)):
        length = shared.get(i, 0)
        groups.setdefault((length, tuple(encoded[i][0][:length])), []).append(i)
    batches: list[list[int]] = []
    for (length, _), members in groups.items():
        own = [scored_length(encoded[i], scoring) - length for i in members]
        batches += [[members[j] for j in batch] for batch in plan_batches(own, batch_size, max_tokens)]
    return batches, shared


@functools.lru_cache(maxsize=None)
def _cache_keyword(forward_of: type) -> str:
    """What a model class's ``forward`` calls its KV cache: transformers 5 renamed
    ``past_key_values`` to ``cache``, and the old name, still taken, puts a FutureWarning and a
    notice into every cloze job's log. The requirements allow releases on both sides of the rename."""
    return "cache" if "cache" in inspect.signature(forward_of.forward).parameters else "past_key_values"


def _base_class(model: torch.nn.Module) -> type:
    """The class whose ``forward`` reads the cache: a LoRA wrapper (peft) hands it on by keyword."""
    return type(model.get_base_model() if hasattr(model, "get_base_model") else model)


def output_cache(out: Any) -> Any:
    """The KV cache of a forward pass's output, by the name it has there (see :func:`_cache_keyword`)."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def context_pass(model: torch.nn.Module, contexts: list[list[int]], length: int, opening: "Opening", pad: int,
                  keep_cache: bool) -> tuple[Any, torch.Tensor]:
    """One forward pass over a batch's contexts, logits at their last token: the whole contexts, or (``length``
    > 0) only their own parts after the opening they share, on its cache (:class:`Opening`). Returns the
    output (its cache, where kept, for the options' pass) and the attention mask over the whole contexts."""
    device = opening.device
    ids, mask, pos = left_padded([c[length:] for c in contexts], pad, device)
    extra = {}
    if length:  # padding then sits between the opening and each own part, masked out
        pos = pos + length
        mask = torch.cat([torch.ones((len(contexts), length), dtype=mask.dtype, device=device), mask], dim=1)
        extra = {_cache_keyword(_base_class(model)): opening.cache(contexts[0][:length], len(contexts))}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1,
                use_cache=keep_cache or bool(length), **extra)
    return out, mask


class Opening:
    """The KV cache of the opening a group of questions shares, run once per group (the last one is kept:
    :func:`plan_shared` puts a group's batches one after another)."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.tokens: Optional[list[int]] = None
        self.kv: Any = None

    def cache(self, tokens: list[int], rows: int) -> Any:
        """A copy of the opening's cache with a row for each of ``rows`` questions."""
        if tokens != self.tokens:
            ids = torch.tensor([tokens], device=self.device)
            out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1, use_cache=True)
            self.tokens, self.kv = tokens, output_cache(out)
        cache = copy.deepcopy(self.kv)
        cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=index_device(self.model)))
        return cache


def continuation_logprobs(model: torch.nn.Module, context_cache, context_mask: torch.Tensor,
                           rows: list[tuple[int, list[int]]], pad: int) -> list[float]:
    """Σ log p(option tokens 2..L) for ``rows`` of (context row, option tokens), on the shared cache.

    The first option token's log-prob comes from the context pass itself; here each row feeds its
    option's tokens but the last, after its question's cached context.
    """
    device, index = context_mask.device, index_device(model)
    owner = torch.tensor([b for b, _ in rows], device=index)
    cache = copy.deepcopy(context_cache)  # batch_select_indices works in place; other chunks need the original
    cache.batch_select_indices(owner)  # (B, …) → (R, …): each option row gets its question's context
    width = max(len(cont) for _, cont in rows) - 1
    inp = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    keep = torch.zeros((len(rows), width), dtype=torch.bool, device=index)
    for r, (_, cont) in enumerate(rows):
        inp[r, : len(cont) - 1] = torch.tensor(cont[:-1], device=device)
        keep[r, : len(cont) - 1] = True
    ctx_len = context_mask.sum(-1)[owner]  # (R,)
    step_mask = torch.cat([context_mask[owner], keep.long().to(device)], dim=1)
    step_pos = ctx_len[:, None] + torch.arange(width, device=device)[None, :]
    logits = model(
        input_ids=inp, attention_mask=step_mask, position_ids=step_pos, logits_to_keep=keep, use_cache=True,
        **{_cache_keyword(_base_class(model)): cache},
    ).logits  # (Σ kept positions, V), row-major over `keep`
    logp = torch.log_softmax(logits.reshape(-1, logits.shape[-1]).float(), dim=-1)
    targets = torch.cat([torch.tensor(cont[1:]) for _, cont in rows]).to(logp.device)
    token_lp = logp.gather(1, targets[:, None]).squeeze(1).tolist()
    sums, cursor = [], 0
    for _, cont in rows:
        sums.append(sum(token_lp[cursor : cursor + len(cont) - 1]))
        cursor += len(cont) - 1
    return sums
