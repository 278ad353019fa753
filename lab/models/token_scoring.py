"""Score next-token predictions inside texts: the ``clm`` and ``facts`` tasks of the alignment-calibration
paper (../shared/seeds/calibration_of_llms_and_alignment.txt, §4).

``clm``: at a random position p of a document the model predicts token p from tokens [0, p); the
prediction is its argmax over the whole vocabulary, the confidence that argmax's probability, and it
is correct when it is the text's own token. ``facts``: the same, at the first token of each entity.

A document is a :class:`~lab.models.token_targets.TokenDoc`: its tokens as the model sees them and
the positions to read (:mod:`lab.models.token_targets`, which needs no torch). :func:`score_documents` reads every position of
a document in ONE forward pass: a causal model's output at p-1 depends on tokens [0, p) only, so all
of a document's targets come from the same pass, and the pass stops at the last target (the tokens
after it change nothing that is read). The LM head is applied only at the rows read — a boolean
``logits_to_keep`` (B, T), transformers' own slicing, so each model's forward keeps whatever it does
after its head (Gemma's soft-capping) — and the float32 log-softmax runs over those rows only, never
over (batch × length × vocabulary). Documents are batched longest first (:func:`plan_batches`, with
its padded-token budget on a CPU), right-padded, and come back in the input order.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import torch

from lab.core.errors import DataError, ScoringError
from lab.models.scoring import batch_tokens, context_limit, plan_batches, right_padded
from lab.models.token_targets import TokenDoc

Progress = Optional[Callable[[int], None]]
TOP_K = 5


def _check(docs: Sequence[TokenDoc], top_k: int, temperature: float) -> None:
    if top_k < 1:
        raise ValueError(f"Expected `top_k` to be an integer larger than 0, but got {top_k}")
    if not (temperature > 0 and np.isfinite(temperature)):
        raise ValueError(f"Expected `temperature` to be a finite number larger than 0, but got {temperature}")
    for i, doc in enumerate(docs):
        bad = [p for p in doc.positions if not 1 <= p < len(doc.ids)]
        if bad:
            raise ValueError(f"Expected document {i}'s positions in [1, {len(doc.ids)}), but got {bad[:5]}")
        if doc.entities is not None and len(doc.entities) != len(doc.positions):
            raise ValueError(f"Expected document {i} to have one entity per position, but got "
                             f"{len(doc.entities)} entities for {len(doc.positions)} positions")


def _check_context(model: torch.nn.Module, fed: Sequence[int]) -> None:
    """Refuse a document whose last target lies past the model's context (it would be fed that many
    tokens): a RoPE model would read positions it never trained on, a learned-position one fail mid-run."""
    found = context_limit(model, None)
    if found is None:
        return
    limit, source = found
    over = [(i, n) for i, n in enumerate(fed) if n > limit]
    if over:
        listed = "; ".join(f"document {i}: last target at position {n:,}" for i, n in over[:5])
        more = f"; and {len(over) - 5} more" if len(over) > 5 else ""
        raise DataError(f"{len(over)} of {len(fed)} documents have targets past the model's context of "
                        f"{limit:,} tokens ({source}): {listed}{more}. Draw positions below the limit "
                        f"(clm_positions(min(n_tokens, {limit + 1}), …)) or leave out the entities past it")


def _rows(logp: torch.Tensor, logits: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor,
          top_k: int) -> list[tuple]:
    """Per target: (target log-prob, top ids, top log-probs, problem) from the kept rows' log-probs
    ``logp`` (R, V) fp32, their raw ``logits`` (R, V) and each target's row index ``rows`` (N,)."""
    top_lp, top_ids = logp.topk(top_k, dim=-1)  # (R, k)
    target_lp = logp[rows, targets]  # (N,)
    # NaN or +inf anywhere in a row leaves its log-softmax undefined (lab.models.scoring.letter_problem).
    broken = (logits.isnan() | logits.isposinf()).any(dim=-1)  # (R,)
    return list(zip(target_lp.tolist(), top_ids[rows].tolist(), top_lp[rows].tolist(), broken[rows].tolist()))


@torch.inference_mode()
def score_documents(model: torch.nn.Module, docs: Sequence[TokenDoc], pad_id: int, batch_size: int = 8,
                    top_k: int = TOP_K, progress: Progress = None, temperature: float = 1.0) -> list[list[dict]]:
    """Per document, per target position (in ``doc.positions``' order), the model's prediction there:

    ``{"position", "entity", "target_id", "pred_id", "confidence", "target_prob", "top_ids",
    "top_probs", "rest", "problem"}`` with ``confidence = max_v P(v | ids[:p])`` over the whole
    vocabulary (= ``top_probs[0]``), ``pred_id = top_ids[0]`` (correct: ``pred_id == target_id``),
    ``target_prob = P(ids[p] | ids[:p])``, ``rest = 1 - sum(top_probs)`` (clamped at 0: float error)
    and ``problem`` None, or why the row's probabilities are undefined (NaN there then; the caller
    skips and counts it). ``entity`` is the doc's entity index for that position, None for clm.
    ``temperature`` T scales the logits before the softmax over the whole vocabulary, ``softmax(z / T)``
    (the logit form of :func:`lab.calibration.temperature.scale`, which top-k rows alone could not give).

    One forward pass per batch of at most ``batch_size`` documents (and, on a CPU, the padded-token
    budget of :data:`lab.models.scoring.BATCH_TOKENS`), each document fed up to its last target only.
    A document whose last target lies past the model's context is refused (:class:`DataError`, naming
    it) before any pass; a document with no positions gets [] without one. ``progress(n)`` after each
    batch, n the targets it scored (a document's positions; one per document for clm's default).
    """
    _check(docs, top_k, temperature)
    fed = [max(doc.positions) if doc.positions else 0 for doc in docs]  # tokens fed: ids[:last target]
    _check_context(model, fed)
    results: list[list[dict]] = [[] for _ in docs]
    todo = [i for i, n in enumerate(fed) if n]
    device = next(model.parameters()).device
    for batch in plan_batches([fed[i] for i in todo], batch_size, batch_tokens(device)):
        chosen = [todo[j] for j in batch]
        ids, mask = right_padded([docs[i].ids[: fed[i]] for i in chosen], pad_id)  # (B, T)
        keep = torch.zeros(ids.shape, dtype=torch.bool)  # (B, T): True at p-1 for every target p
        cells = [(b, p - 1) for b, i in enumerate(chosen) for p in docs[i].positions]
        b_idx, t_idx = torch.tensor(cells, dtype=torch.long).T  # (N,), (N,)
        keep[b_idx, t_idx] = True
        # The kept rows come back flattened row-major over `keep`: a cell's row is its rank among them.
        row_of = keep.flatten().cumsum(0) - 1  # (B*T,)
        rows = row_of[b_idx * ids.shape[1] + t_idx].to(device)  # (N,)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), logits_to_keep=keep.to(device),
                       use_cache=False).logits  # (R, V), R distinct kept cells
        if logits.ndim != 2 or logits.shape[0] != int(keep.sum()):
            raise ScoringError(f"Expected the model to return logits of shape ({int(keep.sum())}, vocabulary) for a "
                               f"boolean logits_to_keep, but got {tuple(logits.shape)}; this model's forward does "
                               "not slice with transformers' slice_logits_to_keep")
        if top_k > logits.shape[-1]:
            raise ValueError(f"Expected `top_k` at most the vocabulary ({logits.shape[-1]}), but got {top_k}")
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (R, V) fp32: the kept rows only
        targets = torch.tensor([docs[i].ids[p] for i in chosen for p in docs[i].positions], device=device)  # (N,)
        scored = iter(_rows(logp, logits, rows, targets, top_k))
        for i in chosen:
            doc = docs[i]
            for n, p in enumerate(doc.positions):
                target_lp, top_ids, top_lp, broken = next(scored)
                top_probs = [float(np.exp(v)) for v in top_lp]
                results[i].append({
                    "position": p, "entity": doc.entities[n] if doc.entities is not None else None,
                    "target_id": doc.ids[p], "pred_id": top_ids[0], "confidence": top_probs[0],
                    "target_prob": float(np.exp(target_lp)), "top_ids": top_ids, "top_probs": top_probs,
                    "rest": max(0.0, 1.0 - sum(top_probs)),
                    "problem": "NaN or +inf logit (probabilities undefined)" if broken else None,
                })
        if progress:
            progress(len(cells))
    return results
