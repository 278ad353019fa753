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
holds at most ``batch_size`` questions and, on a CPU, a budget of padded tokens
(:mod:`lab.models.batching`, which also tokenises the prompts and checks them against the context);
an opening several questions share runs once (:mod:`lab.models.shared_opening`).

A question whose option scores are not finite (a float16 overflow, NaN weights) comes back with its
``problem`` named (:func:`nonfinite_cause`, :func:`letter_problem`) and NaN probabilities, rather
than stopping the batch: the caller decides (an evaluation skips and counts it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from lab.core.errors import ScoringError
from lab.data.templates import Prompt, option_letter
from lab.models.batching import Encoded, Progress, encode_prompts, pad_id, plan_batches, scored_length
from lab.models.loading import input_device
from lab.models.shared_opening import Opening, context_pass, continuation_logprobs, output_cache

TOP_K = 5
MIN_OPTION_CHUNK = 8  # option rows per continuation pass at least (fewer calls when batches are small)


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
    device = input_device(model)
    if batches is None:
        batches = plan_batches([scored_length(e, "letter") for e in encoded], batch_size)
    opening = Opening(model, device)
    for batch in batches:
        length = (shared or {}).get(batch[0], 0)
        logits = context_pass(model, [encoded[i][0] for i in batch], length, opening, pad_id(tokenizer),
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
    device = input_device(model)
    pad = pad_id(tokenizer)
    if batches is None:
        batches = plan_batches([scored_length(e, "cloze") for e in encoded], batch_size)
    opening = Opening(model, device)
    for batch in batches:
        out, mask = context_pass(model, [encoded[i][0] for i in batch], (shared or {}).get(batch[0], 0), opening,
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
            for r, lp in zip(part, continuation_logprobs(model, output_cache(out), mask, [rows[r] for r in part], pad)):
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


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()
