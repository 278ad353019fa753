"""The ``compare`` kind's description: :class:`CompareConfig`, its entries, and its registration (the run:
:mod:`.run`; the same comparison served live: :mod:`.lane`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from lab.calibration.temperature_files import load_temperature
from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.layout import COMPARE_FILE
from lab.data.templates import get_template
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import AdaptedModel, DeviceSection, PlacementSection, PromptSection

MAX_MODELS = 4
MAX_QUESTIONS = 100  # a list compared at once; each question costs a generation per model
MAX_QUESTION = 20_000  # characters; a longer prompt is over most models' context anyway
# The default asks FIRST's case-study question (a capital a model may confuse), so that the form runs as it
# opens; examples/compare-quick.yaml adds its options.
EXAMPLE_QUESTION = "What is the capital of Norway?"


@dataclass(kw_only=True)
class CompareModel(AdaptedModel):
    """One model of a comparison (an entry of ``CompareConfig.models``)."""

    model: str = redeclare(AdaptedModel, "model", required=True)

    temperature: Optional[str] = field(default=None, metadata=doc(
        "scale its option probabilities by T: a number, a temperature.json or its directory", role="temperature"))
    label: Optional[str] = field(default=None, metadata=doc("the name shown for it", role="text", max_len=200))


@dataclass(kw_only=True)
class CompareQuestion:
    """One question of a list (an entry of ``CompareConfig.questions``)."""

    question: str = field(metadata=doc("the question", role="text", max_len=MAX_QUESTION))
    options: list[str] = field(default_factory=list, metadata=doc("answer options (none: free text only)",
                                                                  role="text", max_len=MAX_QUESTION, max_items=26))
    answer: Optional[int] = field(default=None, metadata=doc("the right option's index, if known (0 = A)", ge=0, le=25))


@dataclass
class CompareConfig(ConfigMixin, PlacementSection, DeviceSection):
    question: str = field(default=EXAMPLE_QUESTION, metadata=doc("the question", role="text", max_len=MAX_QUESTION))
    options: list[str] = field(default_factory=list, metadata=doc("answer options (none: free text only)",
                                                                  role="text", max_len=MAX_QUESTION, max_items=26))
    questions: list[dict[str, Any]] = field(default_factory=list, metadata=doc(
        f"several questions at once, instead of question/options: [{{question, options}}] (up to {MAX_QUESTIONS})",
        entries=CompareQuestion, max_items=MAX_QUESTIONS))
    models: list[dict[str, Any]] = field(default_factory=lambda: [{"model": "bundled"}], metadata=doc(
        f"up to {MAX_MODELS} models: [{{model, adapter, temperature, label}}]", entries=CompareModel,
        max_items=MAX_MODELS))
    template: str = redeclare(PromptSection, "template", default="cft_chat", help="letter template for the options")
    max_new_tokens: int = field(default=48, metadata=doc("length of each generated answer", ge=1, le=512))

    def __post_init__(self) -> None:
        self.check_placement([entry["model"] for entry in self.models])
        if self.questions and (self.options or self.question != EXAMPLE_QUESTION):
            raise ValueError("questions: give either question (with options) or questions, not both")
        for path, (question, options), answer in zip(self._paths(), self.items(), self.answers()):
            if not question.strip():
                raise ValueError(f"{path}question: must not be empty")
            if any(not o.strip() for o in options):
                raise ValueError(f"{path}options: every option must be non-empty text, got {options!r}")
            if len(options) == 1:
                raise ValueError(f"{path}options: give 2 to 26 options, or none for a free-text answer")
            if answer is not None and answer >= len(options):
                raise ValueError(f"{path}answer: is {answer}, but there are {len(options)} options (0 = the first)")
        if not self.models:
            raise ValueError(f"models: name 1 to {MAX_MODELS} models")
        for entry in self.models:
            load_temperature(entry.get("temperature"))
        if get_template(self.template).kind != "letter":
            raise ValueError(f"template: {self.template!r} is not a letter template")

    def _paths(self) -> list[str]:
        return [f"questions[{i}]." for i in range(len(self.questions))] if self.questions else [""]

    def items(self) -> list[tuple[str, list[str]]]:
        """(question, options) for each question asked."""
        if self.questions:
            return [(q["question"], list(q.get("options") or [])) for q in self.questions]
        return [(self.question, list(self.options))]

    def answers(self) -> list[Optional[int]]:
        """The right option of each question, where the user said which it is."""
        return [q.get("answer") for q in self.questions] if self.questions else [None]


register(JobKind(
    "compare", "1–4 models on your questions: option probabilities and generated answers", CompareConfig, "lab.kinds.compare.run:run_job",
    outputs=(COMPARE_FILE,), key_fields=("question", "options", "questions", "models"),
))
