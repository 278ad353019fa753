"""Score multiple-choice prompts with a causal LM: ``letter`` and ``cloze`` modes.

``letter`` (REFERENCE.md §1): one forward pass per question; at the answer position take the
logits of the option tokens (tokenised in context) and softmax over them. We also keep the
full-vocabulary probability of each option token and the model's top-5 tokens there, since a
renormalised confidence means little when the options hold 2 % of the mass.

``cloze`` (lm-evaluation-harness's ``acc`` / ``acc_norm``): the sum of log-probabilities of each
option's text after the context, and that sum divided by the option's length in characters. The
context is run once per question; its KV cache is then shared by all of that question's options,
so a question with K options costs one context pass plus K short continuation passes instead of K
full passes.

In both modes the language-model head (vocabulary × hidden, the largest matmul for small models)
is applied only at the positions whose predictions we read (``logits_to_keep``), questions are
batched longest-first to waste little padding, and results come back in the input order. A batch
holds at most ``batch_size`` questions and, on a CPU, :data:`BATCH_TOKENS` padded tokens
(:func:`plan_batches`); :func:`layer_progress` says how far a forward pass is, so a job with long
passages can report progress every second or two.

A caller that wants the questions' lengths checked against the model's context before the first
forward pass tokenises with :func:`encode_prompts`, calls :func:`check_context` and hands the same
encoding to the scorer (``encoded=``), so nothing is tokenised twice.

A question whose option scores are not finite (a float16 overflow, NaN weights) comes back with its
``problem`` named (:func:`nonfinite_cause`, :func:`letter_problem`) and NaN probabilities, rather
than stopping the batch: the caller decides (an evaluation skips and counts it).
"""
from __future__ import annotations

import copy
import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from lab.core.errors import DataError, ScoringError
from lab.data.templates import Prompt, option_letter
from lab.models.loading import dispatched, input_device

Progress = Optional[Callable[[int], None]]
Encoded = tuple[list[int], list[list[int]]]  # (context ids, each option's continuation ids)
TOP_K = 5
MIN_OPTION_CHUNK = 8  # option rows per continuation pass at least (fewer calls when batches are small)
# Tokenizers that set no limit report transformers' VERY_LARGE_INTEGER (1e30): that is no limit.
SANE_MAX_LENGTH = 10_000_000
MAX_LISTED = 5  # questions named in a too-long error
MIN_SHARED = 64  # tokens of context a group of questions must share for it to run once (plan_shared)
# Padded tokens per forward pass at most, by device type; a type not listed: batch_size alone.
# On a CPU it cuts the batches of the longest passages (16 BoolQ passages pad to 13,200 tokens, a
# minute on two cores), so questions are counted at least every few seconds and less is padded
# (BoolQ: 22,357 tokens run instead of 28,620, one pass more in 100 questions). Not smaller: on a
# busy CPU each pass costs seconds of its own (512 tokens made BoolQ 3 times slower, measured).
# A GPU is left to batch_size: users raise it there for throughput.
BATCH_TOKENS = {"cpu": 4096}


@dataclass
class LetterScore:
    probs: np.ndarray  # (K,) softmax over the option tokens' logits
    vocab_probs: np.ndarray  # (K,) full-vocabulary probability of each option token
    top_tokens: list[tuple[str, float]]  # model's TOP_K tokens at the answer position
    option_token_ids: list[int]
    problem: Optional[str] = None  # why the probabilities are undefined (they are NaN then): letter_problem


@dataclass
class ClozeScore:
    probs: np.ndarray  # (K,) softmax over the summed log-likelihoods (confidence for ``acc``)
    logliks: np.ndarray  # (K,) Σ log p(option tokens | context)
    norm_logliks: np.ndarray  # (K,) logliks / option length in characters (``acc_norm``)
    n_tokens: np.ndarray  # (K,) option length in tokens
    problem: Optional[str] = None  # why the probabilities are undefined (they are NaN then): nonfinite_cause


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


_order = plan_batches  # the name lab.kinds.extract.store and bench/topk_store.py import


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def shared_prefixes(contexts: Sequence[Sequence[int]], min_shared: int = MIN_SHARED) -> dict[int, int]:
    """For each question whose context opens with the same ``min_shared`` or more tokens as another's, the
    length of the opening its group shares (question index → tokens); the others are absent.

    A few-shot prompt repeats its examples and the task's description before every question (MMLU 5-shot:
    85 % of its context tokens), so a group's opening runs once and each question runs only its own part
    after it (:func:`score_cloze`). Sorted contexts make each group one run: the common opening of a run's
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
    """:func:`plan_batches` for :func:`score_cloze` or :func:`score_letter` (``scoring``) with shared openings
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


def _left_padded(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _device(model: torch.nn.Module) -> torch.device:
    return input_device(model)  # a dispatched model's first parameter may be on the meta device (offloaded)


def index_device(model: torch.nn.Module) -> torch.device:
    """Where an index into ``model``'s outputs or KV cache goes: beside its inputs; for a dispatched model, whose
    hidden states, logits and cache lie on several devices, the CPU, from where an index serves any of them."""
    return torch.device("cpu") if dispatched(model) else input_device(model)


@functools.lru_cache(maxsize=None)
def _cache_keyword(forward_of: type) -> str:
    """What a model class's ``forward`` calls its KV cache: transformers 5 renamed
    ``past_key_values`` to ``cache``, and the old name, still taken, puts a FutureWarning and a
    notice into every cloze job's log. The requirements allow releases on both sides of the rename."""
    return "cache" if "cache" in inspect.signature(forward_of.forward).parameters else "past_key_values"


def _base_class(model: torch.nn.Module) -> type:
    """The class whose ``forward`` reads the cache: a LoRA wrapper (peft) hands it on by keyword."""
    return type(model.get_base_model() if hasattr(model, "get_base_model") else model)


def _output_cache(out: Any) -> Any:
    """The KV cache of a forward pass's output, by the name it has there (see :func:`_cache_keyword`)."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def letter_option_ids(prompts: Sequence[Prompt], encoded: Sequence[Encoded]) -> list[list[int]]:
    """Each prompt's option tokens (the first token of each continuation); they must differ."""
    option_ids = []
    for prompt, (_, conts) in zip(prompts, encoded):
        first = [c[0] for c in conts]
        if len(set(first)) != len(first):
            raise ScoringError(
                f"options {prompt.options} share a first token after the prompt; letter scoring needs "
                "distinct option tokens (use cloze scoring for option texts)"
            )
        option_ids.append(first)
    return option_ids


def nonfinite_cause(scores: np.ndarray) -> Optional[str]:
    """Why softmax over one question's option scores (K,) is undefined, or None when it is defined.

    A NaN score leaves every probability NaN, and so does +inf (softmax subtracts the maximum:
    inf − inf), even on one option: the limit would put all the mass there, but the model's other
    numbers are just as broken, so such a question is not scored rather than guessed. −inf on some
    options is defined (probability 0 there), on every option it is 0/0. NaN is named first, as it
    is undefined whatever the rest. In float16 a logit past 65,504 overflows to ±inf, and a
    ``log_softmax`` over a vocabulary holding +inf turns it into NaN: that is how a cloze score
    (a sum of log-probabilities) shows an overflow.
    """
    scores = np.asarray(scores, dtype=np.float64)
    for bad, what in ((np.isnan(scores), "NaN score"), (np.isposinf(scores), "+inf score")):
        if bad.any():
            which = ", ".join(option_letter(int(k)) for k in np.flatnonzero(bad))
            return f"{what} on option{'s' if bad.sum() > 1 else ''} {which}"
    return "-inf on every option" if np.isneginf(scores).all() else None


def letter_problem(logits: torch.Tensor, option_ids: list[int]) -> Optional[str]:
    """:func:`nonfinite_cause` of the option logits, or else a NaN or +inf logit elsewhere in the
    vocabulary (V,), which leaves the full-vocabulary probabilities (and the log_softmax the option
    probabilities are taken from) undefined; None when the question's score is defined."""
    cause = nonfinite_cause(logits[option_ids].double().cpu().numpy())
    if cause is None and bool((logits.isnan() | logits.isposinf()).any()):
        return "NaN or +inf logit on a token that is not an option (full-vocabulary probabilities undefined)"
    return cause


def letter_score(logits: torch.Tensor, option_ids: list[int], tokenizer) -> LetterScore:
    """A question's letter score from the logits (V,) of the token after its prompt, or from their
    log-probabilities (the same score: log_softmax is idempotent). Raw logits let a non-finite
    question be told apart (:func:`letter_problem`): after a log_softmax, +inf is NaN everywhere."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (V,)
    top_lp, top_ids = logp.topk(TOP_K)
    opt_lp = logp[torch.tensor(option_ids, device=logp.device)]  # (K,)
    return LetterScore(
        probs=torch.softmax(opt_lp, dim=-1).cpu().numpy(),
        vocab_probs=opt_lp.exp().cpu().numpy(),
        top_tokens=[(tokenizer.decode([t]), float(p)) for t, p in zip(top_ids.tolist(), top_lp.exp().tolist())],
        option_token_ids=option_ids,
        problem=letter_problem(logits, option_ids),
    )


@torch.inference_mode()
def score_letter(
    model: torch.nn.Module, tokenizer, prompts: Sequence[Prompt], batch_size: int = 16, progress: Progress = None,
    encoded: Optional[Sequence[Encoded]] = None, batches: Optional[Sequence[Sequence[int]]] = None,
    shared: Optional[dict[int, int]] = None,
) -> list[LetterScore]:
    """Score each prompt's options as the next token; one forward pass per question.

    ``encoded``: ``encode_prompts(tokenizer, prompts, "letter")``, where the caller already has it;
    ``batches``: the caller's :func:`plan_batches` over ``scored_length(…, "letter")`` (it weighs
    progress by that plan), else batches of ``batch_size`` questions; or, with ``shared``,
    :func:`plan_shared`'s plan (an opening several questions share runs once). ``progress(n)`` after each batch.
    """
    if encoded is None:
        encoded = encode_prompts(tokenizer, prompts, "letter")
    option_ids = letter_option_ids(prompts, encoded)
    results: list[Optional[LetterScore]] = [None] * len(prompts)
    device = _device(model)
    if batches is None:
        batches = plan_batches([scored_length(e, "letter") for e in encoded], batch_size)
    opening = _Opening(model, device)
    for batch in batches:
        length = (shared or {}).get(batch[0], 0)
        logits = _context_pass(model, [encoded[i][0] for i in batch], length, opening, _pad_id(tokenizer),
                               keep_cache=False)[0].logits
        for row, i in enumerate(batch):
            results[i] = letter_score(logits[row, -1, :], option_ids[i], tokenizer)  # (V,)
        if progress:
            progress(len(batch))
    return results  # type: ignore[return-value]


@torch.inference_mode()
def score_cloze(
    model: torch.nn.Module, tokenizer, prompts: Sequence[Prompt], batch_size: int = 16, progress: Progress = None,
    encoded: Optional[Sequence[Encoded]] = None, batches: Optional[Sequence[Sequence[int]]] = None,
    shared: Optional[dict[int, int]] = None,
) -> list[ClozeScore]:
    """Log-likelihood of each option's text after the context; ``batch_size`` counts questions.

    ``encoded``: ``encode_prompts(tokenizer, prompts, "cloze")``, where the caller already has it;
    ``batches``: the caller's :func:`plan_batches` over ``scored_length(…, "cloze")``, else batches
    of ``batch_size`` questions; or, with ``shared``, :func:`plan_shared`'s plan: a batch of questions
    sharing an opening runs it once and then only their own parts on its KV cache (the same
    log-likelihoods, to float rounding). ``progress(n)`` after each batch.
    """
    if encoded is None:
        encoded = encode_prompts(tokenizer, prompts, "cloze")
    results: list[Optional[ClozeScore]] = [None] * len(prompts)
    device = _device(model)
    pad = _pad_id(tokenizer)
    if batches is None:
        batches = plan_batches([scored_length(e, "cloze") for e in encoded], batch_size)
    opening = _Opening(model, device)
    for batch in batches:
        out, mask = _context_pass(model, [encoded[i][0] for i in batch], (shared or {}).get(batch[0], 0), opening,
                                  pad, keep_cache=True)
        first_lp = torch.log_softmax(out.logits[:, -1, :].float(), dim=-1)  # (B, V): predicts each option's 1st token
        # One row per (question, option): the option's tokens after the first, fed on the shared cache.
        rows = [(b, cont) for b, i in enumerate(batch) for cont in encoded[i][1]]
        lls = [float(first_lp[b, cont[0]]) for b, cont in rows]
        # Option rows in chunks of similar length: padding every option to the batch's longest
        # would triple the tokens run on ARC (measured: 3,968 real tokens padded to 11,922).
        longer = sorted((r for r, (_, cont) in enumerate(rows) if len(cont) > 1), key=lambda r: -len(rows[r][1]))
        chunk = max(len(batch), MIN_OPTION_CHUNK)
        for s in range(0, len(longer), chunk):
            part = longer[s : s + chunk]
            for r, lp in zip(part, _continuation_logprobs(model, _output_cache(out), mask, [rows[r] for r in part], pad)):
                lls[r] += lp
        r = 0
        for i in batch:
            k = len(prompts[i].options)
            ll = np.array(lls[r : r + k])
            r += k
            chars = np.array([max(len(o.removeprefix(" ")), 1) for o in prompts[i].options], dtype=float)
            results[i] = ClozeScore(
                probs=_softmax(ll), logliks=ll, norm_logliks=ll / chars,
                n_tokens=np.array([len(c) for c in encoded[i][1]]), problem=nonfinite_cause(ll),
            )
        if progress:
            progress(len(batch))
    return results  # type: ignore[return-value]


def regroup_cloze(scores: Sequence[ClozeScore], owners: Sequence[Sequence[tuple[int, int]]],
                  choices: Sequence[Sequence[str]]) -> list[ClozeScore]:
    """Per question, the option scores its prompts got (``owners[q][j] = (prompt, option)``: an lm-eval
    task's requests, :func:`lab.data.harness.prompts_of`), normalised as lm-eval's ``acc_norm`` is: by
    each choice's length in characters (``doc_to_choice``'s text, without the target delimiter)."""
    out = []
    for spots, options in zip(owners, choices):
        ll = np.array([scores[p].logliks[o] for p, o in spots])
        chars = np.array([max(len(c), 1) for c in options], dtype=float)
        out.append(ClozeScore(probs=_softmax(ll), logliks=ll, norm_logliks=ll / chars,
                              n_tokens=np.array([scores[p].n_tokens[o] for p, o in spots]),
                              problem=nonfinite_cause(ll)))
    return out


def _context_pass(model: torch.nn.Module, contexts: list[list[int]], length: int, opening: "_Opening", pad: int,
                  keep_cache: bool) -> tuple[Any, torch.Tensor]:
    """One forward pass over a batch's contexts, logits at their last token: the whole contexts, or (``length``
    > 0) only their own parts after the opening they share, on its cache (:class:`_Opening`). Returns the
    output (its cache, where kept, for the options' pass) and the attention mask over the whole contexts."""
    device = opening.device
    ids, mask, pos = _left_padded([c[length:] for c in contexts], pad, device)
    extra = {}
    if length:  # padding then sits between the opening and each own part, masked out
        pos = pos + length
        mask = torch.cat([torch.ones((len(contexts), length), dtype=mask.dtype, device=device), mask], dim=1)
        extra = {_cache_keyword(_base_class(model)): opening.cache(contexts[0][:length], len(contexts))}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1,
                use_cache=keep_cache or bool(length), **extra)
    return out, mask


class _Opening:
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
            self.tokens, self.kv = tokens, _output_cache(out)
        cache = copy.deepcopy(self.kv)
        cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=index_device(self.model)))
        return cache


def _continuation_logprobs(model: torch.nn.Module, context_cache, context_mask: torch.Tensor,
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


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()
