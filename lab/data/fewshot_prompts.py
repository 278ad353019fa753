"""Few-shot prompts: a question's prompt after solved examples, as lm-eval builds a few-shot context.

Which examples a lab dataset's question gets is drawn elsewhere (:mod:`lab.kinds.evaluate.fewshot`: once,
seeded, never the scored rows); this is how the prompts of those examples and of the question are joined.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from lab.core.errors import DataError
from lab.data.templates import Prompt

FEWSHOT_DELIMITER = "\n\n"  # between solved examples, and before the question: lm-eval's fewshot_delimiter


def with_shots(prompt: Prompt, shots: Sequence[tuple[Prompt, int]], name: str = "") -> Prompt:
    """``prompt`` after solved examples, as lm-eval builds a few-shot context: the description once, then each
    example's text and its correct option (:meth:`Prompt.target`, which holds lm-eval's target_delimiter, the
    space of " A" or " Paris"), each followed by :data:`FEWSHOT_DELIMITER`, then the question's text::

        description + shot_1.text + shot_1.target(a_1) + "\\n\\n" + … + shot_K.target(a_K) + "\\n\\n" + text

    ``shots``: (an example's prompt, its answer). A chat prompt is refused: its text already holds the chat
    template's turns, and examples as earlier turns (lm-eval's --fewshot_as_multiturn) are not built here;
    ``name`` (the template) is for that message."""
    if not shots:
        return prompt
    if prompt.chat or any(shot.chat for shot, _ in shots):
        raise DataError(f"template {name!r} puts each question in the model's chat template, so few-shot examples "
                        "cannot go before it; use a template without a chat format (mmlu, first, cloze_qa …) or "
                        "num_fewshot 0")
    examples = "".join(shot.text.removeprefix(shot.description) + shot.target(answer) + FEWSHOT_DELIMITER
                       for shot, answer in shots)
    return replace(prompt, text=prompt.description + examples + prompt.text.removeprefix(prompt.description))
