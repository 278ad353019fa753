"""The compare page's question box: its text as ``questions`` entries, and back."""
from __future__ import annotations

import re
from typing import Any

from lab.data.templates import option_letter


LETTERED = re.compile(r"^\(?([A-Za-z])[.):]\s+(.+)$")  # "A. Oslo", "A) Oslo", "(A) Oslo", "a: Oslo"


def parse_questions(text: str) -> list[dict[str, Any]]:
    """The compare page's question box as ``questions`` entries.

    Questions are separated by blank lines; a question's first line is the question and each
    further line an option. A ``*`` before an option marks it as the right one; letters the user
    pasted with the options (``A.``, ``B)``, ``(C)``, in order) are dropped, as the prompt letters
    them again. Raises ValueError naming the question."""
    questions = []
    for n, block in enumerate(re.split(r"\n[ \t]*\n", (text or "").strip()), 1):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        question, options, answer = lines[0], [], None
        for i, option in enumerate(lines[1:]):
            if option.startswith("*"):
                if answer is not None:
                    raise ValueError(f"question {n}: two options are marked with *; mark only the right one")
                answer, option = i, option[1:].strip()
            options.append(option)
        matches = [LETTERED.match(o) for o in options]
        if options and all(m and m.group(1).upper() == option_letter(i) for i, m in enumerate(matches)):
            options = [m.group(2) for m in matches]
        questions.append({"question": question, "options": options, **({"answer": answer} if answer is not None else {})})
    if not questions:
        raise ValueError("Type a question, and its options one per line below it if it has any.")
    return questions


def format_questions(questions: list[dict[str, Any]]) -> str:
    """The inverse of :func:`parse_questions`: what the question box shows for ``questions``."""
    return "\n\n".join("\n".join([q["question"], *(("* " if i == q.get("answer") else "") + o
                                                   for i, o in enumerate(q.get("options") or []))])
                       for q in questions)
