"""Win rate on preference pairs: does fine-tuning for calibration keep the model's language ability?

A pair wins when the model gives ``chosen`` a higher sequence log-probability than ``rejected``
after the same prompt (REFERENCE.md §3). The length-normalised variant compares the mean
log-probability per token, which removes the plain sum's preference for the shorter response.

The prompt is the user turn of the model's chat template (a base model without one sees the
prompt text and a newline). Both responses are scored on one shared prompt cache
(:func:`lab.models.scoring.score_cloze`); each is cut to ``max_response_tokens`` first — UltraFeedback
answers run to thousands of tokens, and a fixed budget keeps the check affordable on a CPU (the
same truncation DPO trainers apply). Ties count as losses: "exceeds" means strictly greater.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from lab.data.preferences import PreferencePair
from lab.data.chat_templates import user_turn
from lab.data.templates import Prompt


def win_rate(chosen: Any, rejected: Any) -> dict[str, float]:
    """Fraction of pairs with ``chosen > rejected`` (strictly), plus the tie fraction."""
    chosen, rejected = np.asarray(chosen, dtype=np.float64), np.asarray(rejected, dtype=np.float64)
    if chosen.shape != rejected.shape or chosen.ndim != 1 or chosen.size == 0:
        raise ValueError(f"Expected two equal non-empty 1-D arrays, but got {chosen.shape} and {rejected.shape}")
    return {"win_rate": float(np.mean(chosen > rejected)), "ties": float(np.mean(chosen == rejected)), "n": int(chosen.size)}


def _truncate(tokenizer, text: str, max_tokens: Optional[int]) -> str:
    if max_tokens is None:
        return text
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


def pair_prompt(tokenizer, pair: PreferencePair, max_response_tokens: Optional[int]) -> Prompt:
    """The context (user turn) and the two responses to score after it, chosen first."""
    options = tuple(_truncate(tokenizer, r, max_response_tokens) for r in (pair.chosen, pair.rejected))
    text, chat = user_turn(tokenizer, pair.prompt, pair.prompt.rstrip() + "\n")
    return Prompt(text, options, chat=chat)


def score_pairs(model, tokenizer, pairs: Sequence[PreferencePair], max_response_tokens: Optional[int] = 256,
                batch_size: int = 4, progress=None) -> dict[str, Any]:
    """Win rates (sum and per-token) of ``model`` on ``pairs`` and the per-pair log-probabilities."""
    from lab.models.scoring import score_cloze

    prompts = [pair_prompt(tokenizer, p, max_response_tokens) for p in pairs]
    scores = score_cloze(model, tokenizer, prompts, batch_size=batch_size, progress=progress)
    logliks = np.array([s.logliks for s in scores])  # (n, 2): chosen, rejected
    per_token = logliks / np.array([s.n_tokens for s in scores])
    summed, normed = win_rate(logliks[:, 0], logliks[:, 1]), win_rate(per_token[:, 0], per_token[:, 1])
    return {"win_rate": summed["win_rate"], "win_rate_norm": normed["win_rate"], "ties": summed["ties"], "n": summed["n"],
            "max_response_tokens": max_response_tokens,
            "pairs": [{"id": p.id, "chosen_logprob": float(a), "rejected_logprob": float(b),
                       "chosen_tokens": int(s.n_tokens[0]), "rejected_tokens": int(s.n_tokens[1])}
                      for p, (a, b), s in zip(pairs, logliks, scores)]}
