"""Records → token sequences for training: prompt + target, labels masked where not supervised.

The prompt and target are split into tokens exactly as the scorer splits them
(``lab.models.batching.split_pairs``), so a model is trained on the same token boundary it is evaluated
at. ``completion_only`` supervises only the target (CFT, and FIRST's answer); otherwise the
whole sequence (RCFT's prompt + answer).

Every example also records where its answer is decided: ``answer_pos`` (the position whose
logits predict the answer letter), ``option_ids`` (each option letter's token there) and
``answer``, so RCFT and option-level label smoothing read the option probabilities from the same
forward pass that gives the language-modelling loss.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from lab.data.record import MCQRecord
from lab.data.templates import Prompt, get_template
from lab.models.batching import right_padded, split_pairs

IGNORE = -100  # transformers' label for "no loss here"


def build_examples(records: Sequence[MCQRecord], template: str, tokenizer, completion_only: bool = True,
                   max_length: int = 512) -> list[dict[str, Any]]:
    """One ``{"input_ids", "labels", "record"}`` dict per record that fits in ``max_length``.

    Over-long examples are dropped rather than truncated: cutting the prompt's start changes the
    question, and cutting the end removes the answer.
    """
    render = get_template(template).render
    examples = []
    for index, record in enumerate(records):
        prompt = render(record, tokenizer)
        context, (target,) = split_pairs(tokenizer, Prompt(prompt.text, (prompt.target(record.answer),), prompt.chat))
        ids = context + target + [tokenizer.eos_token_id]
        if len(ids) > max_length:
            continue
        labels = ([IGNORE] * len(context) if completion_only else list(context)) + target + [tokenizer.eos_token_id]
        option_context, options = split_pairs(tokenizer, prompt)
        option_ids = [o[0] for o in options] if option_context == context else []  # [] : not a letter-at-one-position format
        examples.append({"input_ids": ids, "labels": labels, "record": index, "answer_pos": len(context) - 1,
                         "option_ids": option_ids, "answer": record.answer})
    return examples


def pad_batch(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``input_ids`` / ``labels`` into (B, T) tensors with an attention mask."""
    ids, mask = right_padded([e["input_ids"] for e in examples], pad_id)
    labels, _ = right_padded([e["labels"] for e in examples], IGNORE)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pad_option_batch(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """``pad_batch`` plus the answer position, the option tokens (B, K; -1 pads) and the answer."""
    if any(not e["option_ids"] for e in examples):
        raise ValueError("This loss needs each option's letter at one answer position; use a letter template "
                         "whose options are single tokens (e.g. cft_chat)")
    option_ids, option_mask = right_padded([e["option_ids"] for e in examples], -1)
    return {**pad_batch(examples, pad_id), "answer_pos": torch.tensor([e["answer_pos"] for e in examples]),
            "option_ids": option_ids, "option_mask": option_mask.bool(),
            "answer": torch.tensor([e["answer"] for e in examples])}
