"""What a scorer feeds a model, and in what batches: prompts tokenised in context (as lm-eval splits
them), their lengths against the model's context, batches planned longest-first under a budget of
padded tokens (:data:`BATCH_TOKENS`), padding, the device an input goes to, and progress within a
forward pass (:func:`layer_progress`). The scorers are :mod:`lab.models.scoring` and
:mod:`lab.models.token_scoring`; openings shared by several questions, :mod:`lab.models.shared_opening`.

A caller that wants the questions' lengths checked against the model's context before the first
forward pass tokenises with :func:`encode_prompts`, calls :func:`check_context` and hands the same
encoding to the scorer (``encoded=``), so nothing is tokenised twice.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from lab.core.errors import DataError, ScoringError
from lab.data.templates import Prompt
from lab.models.loading import dispatched, input_device

Progress = Optional[Callable[[int], None]]
Encoded = tuple[list[int], list[list[int]]]  # (context ids, each option's continuation ids)

# Tokenizers that set no limit report transformers' VERY_LARGE_INTEGER (1e30): that is no limit.
SANE_MAX_LENGTH = 10_000_000
MAX_LISTED = 5  # questions named in a too-long error

# Padded tokens per forward pass at most, by device type; a type not listed: batch_size alone.
# On a CPU it cuts the batches of the longest passages (16 BoolQ passages pad to 13,200 tokens, a
# minute on two cores), so questions are counted at least every few seconds and less is padded
# (BoolQ: 22,357 tokens run instead of 28,620, one pass more in 100 questions). Not smaller: on a
# busy CPU each pass costs seconds of its own (512 tokens made BoolQ 3 times slower, measured).
# A GPU is left to batch_size: users raise it there for throughput.
BATCH_TOKENS = {"cpu": 4096}


def _encode(tokenizer, texts: list[str], chat: bool) -> list[list[int]]:
    # A chat-rendered prompt already holds its special tokens; plain prompts get the
    # tokenizer's own (e.g. Llama's BOS), as the model saw in training.
    return tokenizer(texts, add_special_tokens=not chat)["input_ids"]


def split_pairs(tokenizer, prompt: Prompt, strict: bool = False) -> tuple[list[int], list[list[int]]]:
    """Context ids and each option's continuation ids, tokenised in context.

    As lm-evaluation-harness does: encode context + option whole and take what follows the
    context's own tokens, so an option is split the way the model would see it after the prompt.
    A trailing space of the context moves to the options (most tokenizers glue it to the next word);
    a trailing newline stays, since it is its own token and moving it would make every option start
    with it (an lm-eval request moves all trailing whitespace, as lm-eval does: ``Prompt.spaces``). ``strict`` refuses a split where the option's tokens merge into the context's last token,
    which would score the wrong position (letter scoring needs the exact answer position).
    """
    text, options = prompt.text, list(prompt.options)
    stripped = text.rstrip(prompt.spaces)
    if stripped != text:
        options = [text[len(stripped):] + o for o in options]
        text = stripped
    context, *wholes = _encode(tokenizer, [text] + [text + o for o in options], prompt.chat)
    continuations = []
    for option, whole in zip(prompt.options, wholes):
        cont = whole[len(context):]
        if strict and whole[: len(context)] != context:
            raise ScoringError(
                f"option {option!r} merges with the end of the prompt {text[-40:]!r} when tokenised; "
                "end the template's prompt where a new token starts (e.g. after '(' or ':')"
            )
        if not cont:
            raise ScoringError(f"option {option!r} adds no token after the prompt {text[-40:]!r}")
        continuations.append(cont)
    return context, continuations


def encode_prompts(tokenizer, prompts: Sequence[Prompt], scoring: str) -> list[Encoded]:
    """Each prompt split as the scorer for ``scoring`` ("letter" or "cloze") splits it."""
    return [split_pairs(tokenizer, p, strict=scoring == "letter") for p in prompts]


def scored_length(encoded: Encoded, scoring: str) -> int:
    """Tokens the model reads for one question: the prompt (letter), or prompt + longest option (cloze).

    Cloze feeds all but an option's last token, so this is one more than it needs: a safe bound.
    """
    context, continuations = encoded
    return len(context) if scoring == "letter" else len(context) + max(len(c) for c in continuations)


def context_limit(model: torch.nn.Module, tokenizer) -> Optional[tuple[int, str]]:
    """The most tokens ``model`` can read and where that number comes from; None if it says nothing.

    ``max_position_embeddings`` (``n_positions`` for GPT-2), or the tokenizer's ``model_max_length``
    where that is smaller: a model published with a shorter trained context than its positions allow.
    """
    config = getattr(model, "config", None)
    limits = []
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            limits.append((value, f"the model's {key}"))
            break
    max_length = getattr(tokenizer, "model_max_length", None)
    if isinstance(max_length, int) and 0 < max_length <= SANE_MAX_LENGTH:
        limits.append((max_length, "its tokenizer's model_max_length"))
    return min(limits, key=lambda limit: limit[0]) if limits else None  # a tie names the model's own


def check_context(model: torch.nn.Module, tokenizer, lengths: Sequence[tuple[str, int]], remedy: str,
                  reserve: int = 0) -> None:
    """Refuse, before any forward pass, questions longer than the model's context.

    Past it, a model with learned positions fails with an index error mid-run, and a RoPE model
    (Llama, SmolLM) reads positions it was never trained on: slowly, attention being quadratic in
    the length, and for probabilities that mean nothing. ``lengths``: (how to name the question,
    its tokens); ``reserve``: tokens generated after it; ``remedy``: what the user can do.
    """
    found = context_limit(model, tokenizer)
    if found is None:
        return
    limit, source = found
    over = sorted(((name, n) for name, n in lengths if n + reserve > limit), key=lambda item: -item[1])
    if not over:
        return
    listed = "; ".join(f"{name}: {n:,} tokens" for name, n in over[:MAX_LISTED])
    more = f"; and {len(over) - MAX_LISTED} more" if len(over) > MAX_LISTED else ""
    which = "The question does" if len(lengths) == 1 else f"{len(over)} of {len(lengths)} questions do"
    counting = f" with the {reserve} tokens to generate after it" if reserve else ""
    raise DataError(f"{which} not fit in the model's context of {limit:,} tokens ({source}){counting}: "
                    f"{listed}{more}. {remedy}")


def plan_batches(lengths: Sequence[int], batch_size: int, max_tokens: Optional[int] = None) -> list[list[int]]:
    """Index batches, longest first, of at most ``batch_size`` questions and ``max_tokens`` padded tokens.

    Longest first: each batch pads to similar lengths, the memory peak comes in the first seconds
    rather than at the end, and a question too long for the budget sits alone in its own batch.
    The token budget keeps every forward pass about equally long, so progress can be reported
    every few seconds even for long passages: a batch pads to its first (longest) question, so it
    costs ``len(batch) * lengths[batch[0]]`` tokens. ``max_tokens=None``: no budget.
    """
    if batch_size < 1:
        raise ValueError(f"Expected `batch_size` to be an integer larger than 0, but got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"Expected `max_tokens` to be an integer larger than 0 or None, but got {max_tokens}")
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        current = batches[-1] if batches else None
        if current and len(current) < batch_size and (
                max_tokens is None or (len(current) + 1) * lengths[current[0]] <= max_tokens):
            current.append(i)
        else:
            batches.append([i])
    return batches


def batch_tokens(device: torch.device) -> Optional[int]:
    """The padded-token budget of one forward pass on ``device`` (:data:`BATCH_TOKENS`); None: no budget."""
    return BATCH_TOKENS.get(torch.device(device).type)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's stack of transformer blocks: the ``ModuleList`` as long as its config's
    ``num_hidden_layers`` (Llama's ``model.layers``; a mixture of experts' expert lists can be
    longer), else its longest; an empty one for a model without."""
    lists = sorted((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len, reverse=True)
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    return next((m for m in lists if len(m) == n), lists[0] if lists else torch.nn.ModuleList())


def _after_layer(report: Callable[[float], None], fraction: float, module: torch.nn.Module, args: Any,
                 output: Any) -> None:
    report(fraction)  # returns None: the layer's output passes on unchanged


@contextmanager
def layer_progress(model: torch.nn.Module, report: Callable[[float], None]) -> Iterator[None]:
    """Call ``report(k / n)`` after block k of the n in every forward pass of ``model``.

    One pass over 16 long passages takes a minute on two CPU cores; told how far it is, a progress
    counter has news every second or two without smaller batches (each extra pass costs seconds
    on a busy CPU, bench/progress_latency.py). A hook per block costs microseconds.
    """
    layers = decoder_layers(model)
    handles = [layer.register_forward_hook(functools.partial(_after_layer, report, (k + 1) / len(layers)))
               for k, layer in enumerate(layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def left_padded(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) ids, mask and position ids, padded on the left so every row ends at column T-1."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, width - len(s) :] = torch.tensor(s)
        mask[row, width - len(s) :] = 1
    # Explicit positions: real tokens count from 0 whatever the padding (absolute-position models need it).
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


def right_padded(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and attention mask, padded on the right: every row starts at position 0, so the
    model's default positions are the natural ones (training, extraction)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[row, : len(s)] = 1
    return ids, mask


def pad_id(tokenizer) -> int:
    """The id a batch is padded with: the tokenizer's pad token, else its end of sequence (SmolLM2, Llama)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def index_device(model: torch.nn.Module) -> torch.device:
    """Where an index into ``model``'s outputs or KV cache goes: beside its inputs; for a dispatched model, whose
    hidden states, logits and cache lie on several devices, the CPU, from where an index serves any of them."""
    return torch.device("cpu") if dispatched(model) else input_device(model)
