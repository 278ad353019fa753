"""Chat templates: a model's own (Jinja from its folder), probed before the lab trusts it, then used to put
the lab's messages in the model's turns; and, for a base model without one, Stanford Alpaca's prompt.

A model's chat template is a user's code, run in transformers' sandbox: :func:`chat_template_problem` renders a
probe conversation, bounded in template lines run and in text made, so that a template that raises, never
ends, or has no place for the reply is refused by name (:func:`check_chat_template`) when the model loads,
rather than failing mid-run. The prompt templates (:mod:`lab.data.templates`) render questions through it.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from lab.core.errors import ModelLoadError

ALPACA_HEADER = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether a tokenizer (or None) has a chat template: an instruction-tuned model's, not a base model's."""
    return bool(tokenizer is not None and getattr(tokenizer, "chat_template", None))


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
    input stays after its instruction, where the instruction readers put it (:mod:`lab.data.instructions`)."""
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
