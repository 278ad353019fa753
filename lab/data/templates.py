"""Prompt templates: how a question becomes the text a model is scored on.

A template renders a record into a ``Prompt``: the context up to the answer position plus the
strings to score after it. ``letter`` templates list the options in the prompt and score the
option labels ("A", "Yes") as the next token; ``cloze`` templates do not list them and score
each option's own text, as lm-evaluation-harness's ``acc`` / ``acc_norm`` do.

Option strings carry their own leading space where the format puts one (" A" after "Answer:",
"A" after "("), because the scorer tokenises them in context: "A" and " A" are different tokens
in most tokenizers.

``text`` templates are for the token tasks (``clm``, ``facts``: :mod:`lab.data.texts`): a text is
scored as it is, after the template's prefix (:meth:`Template.text_prefix`) — nothing, or the
alignment-calibration paper's instruction (its Table 1), in the model's chat template where ``chat``.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from lab.core.errors import DataError
from lab.core.registry import Registry
from lab.data.chat_templates import ALPACA_HEADER, has_chat_template, render_chat, user_turn
from lab.data.record import MCQRecord

Kind = Literal["letter", "cloze", "text"]
LETTERS = string.ascii_uppercase

CFT_SYSTEM = (
    "You are an AI assistant that answers multiple choice questions. You must only respond with a "
    "single letter corresponding to your choice without any explanation or additional text."
)


def option_letter(i: int) -> str:
    """The label of option ``i`` (0-based) as prompts letter them: A, B, C, …, Z; past Z, its
    1-based number as text, so that a table of a run with many (cloze) options still reads."""
    return LETTERS[i] if 0 <= i < len(LETTERS) else str(i + 1)


def option_letters(n: int) -> list[str]:
    """The labels of ``n`` options: ``["A", "B", …]`` (see :func:`option_letter`)."""
    return [option_letter(i) for i in range(n)]


@dataclass(frozen=True)
class Prompt:
    """What the scorer needs for one question.

    ``options`` are the strings scored right after ``text`` (one per choice, in choice order);
    ``chat`` means ``text`` came from a chat template and already holds its special tokens;
    ``suffix`` follows the chosen option in a training target (FIRST's "The answer is (a).");
    ``spaces``: the trailing characters of ``text`` that move to the options when tokenising (a space:
    most tokenizers glue it to the next word); None: all trailing whitespace, as lm-eval moves it;
    ``description``: the start of ``text`` that introduces the task rather than this question (MMLU's
    "The following are … about anatomy."), said once before few-shot examples
    (:func:`lab.data.fewshot_prompts.with_shots`).
    """

    text: str
    options: tuple[str, ...]
    chat: bool = False
    suffix: str = ""
    spaces: Optional[str] = " "
    description: str = ""

    def target(self, answer: int) -> str:
        """The completion a model is trained to produce for the correct option."""
        return self.options[answer] + self.suffix


@dataclass(frozen=True)
class Template:
    name: str
    kind: Kind
    description: str
    render: Callable[[MCQRecord, Optional[object]], Prompt]
    prefix: str = ""  # text templates: what precedes the text (the instruction)
    # Text templates: the prefix as the user's turn of the model's chat template, if it has one; question
    # templates: the question as a chat turn, if the model has a chat template (no few-shot examples before it).
    chat: bool = False

    def text_prefix(self, tokenizer=None) -> str:
        """What a text template puts before the text the model reads: ``prefix``, or, for ``chat``
        with a tokenizer that has a chat template, ``prefix`` as the user's turn ready for the reply
        (the text is then the model's answer). "" for ``plain``."""
        if self.kind != "text":
            raise DataError(f"template {self.name!r} is a {self.kind} template: it renders questions, not texts; "
                            f"text templates: {', '.join(template_names('text'))}")
        if not self.prefix or not self.chat:
            return self.prefix
        return user_turn(tokenizer, self.prefix.strip(), self.prefix)[0]


TEMPLATES: Registry[Template] = Registry("template")


def register(name: str, kind: Kind, description: str, chat: bool = False):
    def add(render: Callable[[MCQRecord, Optional[object]], Prompt]):
        TEMPLATES.add(name, Template(name, kind, description, render, chat=chat))
        return render

    return add


def get_template(name: str) -> Template:
    return TEMPLATES.get(name)


def template_names(kind: Optional[Kind] = None) -> list[str]:
    """The templates of ``kind`` a user can pick for a lab dataset (all with None); :data:`LM_EVAL`, which only
    an lm-eval task takes (set by its config), is listed under None alone."""
    return [n for n in TEMPLATES.names() if kind is None or (TEMPLATES.get(n).kind == kind and n != LM_EVAL)]


def _letters(record: MCQRecord, lower: bool = False) -> list[str]:
    if len(record.choices) > len(LETTERS):
        raise DataError(f"record {record.id!r} has {len(record.choices)} options; letter templates allow at most 26")
    letters = LETTERS[: len(record.choices)]
    return list(letters.lower() if lower else letters)


def _asked(question: str) -> str:
    """BoolQ questions are lower-case statements without a question mark; both BoolQ formats add one."""
    q = question.strip()
    return q if q.endswith("?") else q + "?"


def _first(record: MCQRecord, lower: bool) -> Prompt:
    letters = _letters(record, lower)
    listed = " ".join(f"({l}) {c}" for l, c in zip(letters, record.choices))
    passage = f"{record.passage.strip()} " if record.passage else ""
    return Prompt(f"Q: {passage}{record.question.strip()} Answer Choices: {listed} A: The answer is (", tuple(letters),
                  suffix=").")


@register("first", "letter", "FIRST CSQA/OBQA format: 'Q: … Answer Choices: (A) … A: The answer is (' (Shum et al. 2023)")
def first(record: MCQRecord, tokenizer=None) -> Prompt:
    return _first(record, lower=False)


@register("first_lower", "letter", "FIRST format with lower-case letters (a)…(e), as in the paper's CSQA examples")
def first_lower(record: MCQRecord, tokenizer=None) -> Prompt:
    return _first(record, lower=True)


@register("first_boolq", "letter", "FIRST BoolQ format: Alpaca instruction, 'Your answer should be Yes or No.'")
def first_boolq(record: MCQRecord, tokenizer=None) -> Prompt:
    names = "Yes or No" if set(record.choices) == {"Yes", "No"} else " or ".join(record.choices)
    instruction = f"Read the input passage and answer the question: {_asked(record.question)} Your answer should be {names}."
    body = f"{ALPACA_HEADER}\n\n### Instruction:\n{instruction}\n\n"
    if record.passage:
        body += f"### Input:\n{record.passage.strip()}\n\n"
    return Prompt(body + "### Response:\n", tuple(record.choices))


def _cft_user(record: MCQRecord) -> tuple[str, list[str]]:
    letters = _letters(record)
    listed = "\n".join(f"{l}. {c}" for l, c in zip(letters, record.choices))
    passage = f"{record.passage.strip()}\n\n" if record.passage else ""
    return f"{passage}{record.question.strip()}\nOptions:\n{listed}\nAnswer with only a single letter:", letters


@register("cft_chat", "letter", "CFT/RCFT chat format: system prompt + 'Answer with only a single letter:' (model's chat template)",
          chat=True)
def cft_chat(record: MCQRecord, tokenizer=None) -> Prompt:
    user, letters = _cft_user(record)
    if has_chat_template(tokenizer):
        text = render_chat(tokenizer, [{"role": "system", "content": CFT_SYSTEM}, {"role": "user", "content": user}])
        return Prompt(text, tuple(letters), chat=True)
    # A base model without a chat template: the same words as plain text.
    return Prompt(f"{CFT_SYSTEM}\n\n{user}", tuple(f" {l}" for l in letters))


@register("mmlu", "letter", "MMLU / lm-evaluation-harness format: question, 'A. …' lines, 'Answer:' then ' A'")
def mmlu(record: MCQRecord, tokenizer=None) -> Prompt:
    letters = _letters(record)
    subject = record.meta.get("subject")
    head = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n" if subject else ""
    listed = "\n".join(f"{l}. {c}" for l, c in zip(letters, record.choices))
    passage = f"{record.passage.strip()}\n" if record.passage else ""
    return Prompt(f"{head}{passage}{record.question.strip()}\n{listed}\nAnswer:", tuple(f" {l}" for l in letters),
                  description=head)


@register("cloze_qa", "cloze", "lm-evaluation-harness ARC format: 'Question: …\\nAnswer:' then ' <option text>'")
def cloze_qa(record: MCQRecord, tokenizer=None) -> Prompt:
    passage = f"{record.passage.strip()}\n" if record.passage else ""
    return Prompt(f"{passage}Question: {record.question.strip()}\nAnswer:", tuple(f" {c}" for c in record.choices))


@register("cloze_plain", "cloze", "lm-evaluation-harness OpenBookQA format: the bare question then ' <option text>'")
def cloze_plain(record: MCQRecord, tokenizer=None) -> Prompt:
    return Prompt(record.question, tuple(f" {c}" for c in record.choices))


@register("cloze_boolq", "cloze", "lm-evaluation-harness BoolQ format: passage, 'Question: …?\\nAnswer:' then ' no' / ' yes'")
def cloze_boolq(record: MCQRecord, tokenizer=None) -> Prompt:
    passage = f"{record.passage.strip()}\n" if record.passage else ""
    return Prompt(f"{passage}Question: {_asked(record.question)}\nAnswer:", tuple(f" {c.lower()}" for c in record.choices))


LM_EVAL = "lm_eval"


@register(LM_EVAL, "cloze", "an lm-evaluation-harness task's own prompt (dataset lm-eval:<task>): its context, with "
          "its few-shot examples and description, then each option's continuation")
def lm_eval(record: MCQRecord, tokenizer=None) -> Prompt:
    contexts = {context for context, _ in record.requests}
    if not contexts:  # a lab dataset's question: nothing to render (as text templates give code that renders every one)
        return Prompt("", ())
    if len(contexts) > 1:  # a multiple_input task: one prompt per context (lab.data.harness.prompts_of)
        raise DataError(f"template {LM_EVAL!r} renders the questions of an lm-eval task (dataset lm-eval:<task>); "
                        f"{record.id!r} has {len(contexts)} contexts")
    return Prompt(record.requests[0][0], tuple(c for _, c in record.requests), spaces=None)


# ---------------------------------------------------------------- texts (clm, facts)


def _no_question(record: MCQRecord, tokenizer=None) -> Prompt:
    """What a text template makes of a question: nothing (an empty prompt). Text templates prefix texts
    (:meth:`Template.text_prefix`); the configs refuse them for multiple choice, and code that renders
    every template on questions (a scratch model's tokenizer corpus) gets no text from them."""
    return Prompt("", ())


def register_text(name: str, description: str, prefix: str = "", chat: bool = False) -> Template:
    """A text template: ``prefix`` before the text, as the user's turn of the chat template where ``chat``."""
    template = Template(name, "text", description, _no_question, prefix, chat)
    TEMPLATES.add(name, template)
    return template


PAPER_CLM = "Finish this sentence:"  # the alignment-calibration paper's Table 1, causal language modelling
PAPER_FACTS = "Finish this Wikipedia description:"  # ... and facts generation
register_text("plain", "the text alone, no prefix (a base model, as in the paper's pre-training stage)")
register_text("paper_clm", f"'{PAPER_CLM}' then the text; the instruction as the user's turn of the model's chat "
              "template if it has one (the paper's alignment stage, Table 1)", f"{PAPER_CLM}\n", chat=True)
register_text("paper_facts", f"'{PAPER_FACTS}' then the text; the instruction as the user's turn of the model's "
              "chat template if it has one (the paper's alignment stage, Table 1)", f"{PAPER_FACTS}\n", chat=True)

# The template a dataset gets when the user names none, per scoring mode.
DEFAULTS: dict[tuple[str, Kind], str] = {
    ("boolq", "letter"): "first_boolq",
    ("boolq", "cloze"): "cloze_boolq",
    ("obqa", "cloze"): "cloze_plain",
    ("mmlu", "letter"): "mmlu",
    ("csqa", "letter"): "first_lower",
}


def default_template(dataset: str, kind: Kind) -> str:
    return DEFAULTS.get((dataset, kind), {"letter": "first", "text": "plain"}.get(kind, "cloze_qa"))
