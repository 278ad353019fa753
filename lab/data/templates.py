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
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

from lab.core.errors import DataError, ModelLoadError
from lab.core.registry import Registry
from lab.data.record import MCQRecord

Kind = Literal["letter", "cloze", "text"]
LETTERS = string.ascii_uppercase

CFT_SYSTEM = (
    "You are an AI assistant that answers multiple choice questions. You must only respond with a "
    "single letter corresponding to your choice without any explanation or additional text."
)
ALPACA_HEADER = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
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
    "The following are … about anatomy."), said once before few-shot examples (:func:`with_shots`).
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


def has_chat_template(tokenizer: Any) -> bool:
    """Whether a tokenizer (or None) has a chat template: an instruction-tuned model's, not a base model's."""
    return bool(tokenizer is not None and getattr(tokenizer, "chat_template", None))


# A model's chat template is Jinja from the model's folder: a user's code, run in transformers' sandbox. Before the
# lab trusts one it renders a probe conversation (:func:`chat_template_problem`), bounded in template lines run and
# in text made, so that a template that raises, never ends, or has no place for the reply is refused by name.
PROBE_USER = "Which option is right? Answer with a single letter."
PROBE_REPLY = "The answer is (B), the probe's reply."
TEMPLATE_STEPS = 1_000_000  # template lines a probe may run (a real template runs a few hundred; 1e6 is ~1 s)
TEMPLATE_TEXT = 1_000_000  # characters a probe may render, and the most a '*' or '**' in it may make


class TemplateBudget(Exception):
    """A chat template that ran past :data:`TEMPLATE_STEPS` lines or :data:`TEMPLATE_TEXT` characters."""


def _sandbox() -> Any:
    """A Jinja environment as transformers compiles chat templates in (the immutable sandbox, trim_blocks,
    lstrip_blocks, loop controls, ``{% generation %}``, ``raise_exception``, ``tojson``, ``strftime_now``),
    whose ``*`` and ``**`` refuse results past :data:`TEMPLATE_TEXT` before making them."""
    import datetime
    import json

    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers marks the assistant's tokens with it; here it renders its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(("*", "**"))

        def call_binop(self, context, operator, left, right):
            sizes = [len(x) for x in (left, right) if isinstance(x, (str, list, tuple))]
            counts = [x for x in (left, right) if isinstance(x, int)]
            if operator == "*" and sizes and counts and sizes[0] * max(counts) > TEMPLATE_TEXT:
                raise TemplateBudget(f"it repeats a text or list {max(counts):,} times")
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise TemplateBudget(f"it raises a number to the power {right}")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    return env


def _bounded_render(template: Any, **context: Any) -> str:
    """``template`` rendered with ``context``, stopped with :class:`TemplateBudget` past :data:`TEMPLATE_STEPS`
    template lines (counted by a trace on the template's own frames: a loop that renders nothing is counted
    too) or :data:`TEMPLATE_TEXT` characters. The trace is this thread's only, and is removed after."""
    import sys

    steps = [0]

    def lines(frame, event, arg):
        steps[0] += 1
        if steps[0] > TEMPLATE_STEPS:
            raise TemplateBudget(f"it ran past {TEMPLATE_STEPS:,} template lines")
        return lines

    def calls(frame, event, arg):
        return lines if frame.f_code.co_filename == "<template>" else None

    chunks, made = [], 0
    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        for chunk in template.generate(**context):
            made += len(chunk)
            if made > TEMPLATE_TEXT:
                raise TemplateBudget(f"it rendered more than {TEMPLATE_TEXT:,} characters")
            chunks.append(chunk)
    finally:
        sys.settrace(previous)
    return "".join(chunks)


def chat_template_texts(value: Any) -> dict[str, Any]:
    """A tokenizer's ``chat_template`` as transformers takes it, by name: Jinja text (``default``), a
    mapping of names to texts, or a list of ``{"name", "template"}`` entries; anything else under its own
    type's name, for :func:`chat_template_problem` to refuse."""
    if isinstance(value, list) and all(isinstance(e, dict) and "name" in e and "template" in e for e in value):
        return {str(e["name"]): e["template"] for e in value}
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {"default": value}


def chat_template_problem(source: Any) -> Optional[str]:
    """Why the chat template ``source`` (Jinja text) cannot render the lab's conversations, or None: not
    text, not Jinja, raising (its own ``raise_exception`` too), running past its budget, or rendering
    neither the user's message (with the generation prompt) nor the assistant's reply (after it)."""
    import jinja2

    if not isinstance(source, str):
        return f"must be Jinja text, got a JSON {type(source).__name__}"
    user = [{"role": "user", "content": PROBE_USER}]
    try:
        template = _sandbox().from_string(source)
        prompt = _bounded_render(template, messages=user, add_generation_prompt=True, bos_token="", eos_token="")
        full = _bounded_render(template, messages=[*user, {"role": "assistant", "content": PROBE_REPLY}],
                               add_generation_prompt=False, bos_token="", eos_token="")
    except TemplateBudget as e:
        return f"did not finish: {e}"
    except jinja2.TemplateSyntaxError as e:
        return f"is not valid Jinja (line {e.lineno}: {e.message})"
    except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError,
            RecursionError) as e:
        return f"fails on a one-question conversation: {type(e).__name__}: {str(e)[:200]}"
    if PROBE_USER not in prompt:
        return "renders a conversation without the user's message"
    if PROBE_REPLY not in full:
        return "has no place for the assistant's reply: a conversation renders without it"
    return None


def check_chat_template(value: Any, where: str) -> None:
    """Refuse a tokenizer's ``chat_template`` (any form :func:`chat_template_texts` reads) that cannot render
    the lab's conversations, with :class:`ModelLoadError` naming ``where`` (a file, a model) and the template."""
    for name, source in chat_template_texts(value).items():
        problem = chat_template_problem(source)
        if problem:
            label = "its chat template" if name == "default" else f"its chat template {name!r}"
            raise ModelLoadError(f"{where}: {label} {problem}. Mend the template, or pick another model")


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """``messages`` in the model's chat template, ready for the reply; a template that fails on them (one
    refusing a system message, say) is the model's, said as such rather than as a fault of the lab."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # Jinja's TemplateError, or whatever the template's own code raised
        raise ModelLoadError(f"the model's chat template fails on the roles {[m['role'] for m in messages]}: "
                             f"{type(e).__name__}: {str(e)[:200]}; pick a template without a chat format, or "
                             "another model") from e


def alpaca_prompt(messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages ending with a user turn as Stanford Alpaca's prompt, ready for the response: how a
    base model without a chat template is instruction-tuned (the alignment-calibration paper follows
    Stanford Alpaca's setup; TRL's SFTTrainer cannot render chat messages without a template). A system
    message takes the header's place; earlier turns are earlier Instruction / Response blocks. An Alpaca row's
    input stays after its instruction, where the loaders put it (:mod:`lab.data.instructions`)."""
    header, blocks = ALPACA_HEADER, []
    for message in messages:
        if message["role"] == "system":
            header = message["content"].strip() or ALPACA_HEADER
        else:
            title = "Instruction" if message["role"] == "user" else "Response"
            blocks.append(f"### {title}:\n{message['content'].strip()}\n\n")
    return f"{header}\n\n{''.join(blocks)}### Response:\n"


def user_turn(tokenizer, message: str, plain: str) -> tuple[str, bool]:
    """``message`` as the user's turn of the model's chat template, ready for the reply; for a
    model without a chat template, the ``plain`` text. Returns (text, whether it is chat-rendered)."""
    if has_chat_template(tokenizer):
        return render_chat(tokenizer, [{"role": "user", "content": message}]), True
    return plain, False


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
