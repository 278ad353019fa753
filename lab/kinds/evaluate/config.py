"""The ``evaluate`` kind's description: :class:`EvalConfig` and its registration (the run: :mod:`.run`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

from lab.calibration import calibrators
from lab.calibration.temperature_files import load_temperature
from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.layout import METRICS_FILE, PREDICTIONS_FILE
from lab.core.reads import shown_here
from lab.core.limits import MAX_BATCH, MAX_TOKENS
from lab.core.errors import DataError
from lab.data import DATASETS, harness
from lab.data.files import split_entry
from lab.data.registry import dataset_names, not_for_task
from lab.data.split import parse_split
from lab.data.templates import LM_EVAL, default_template, get_template, template_names
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import (BUNDLED, AdaptedModel, DataSection, EvalSection, HarnessSection, PlacementSection,
                                 PromptSection, RunSection, bundled_split_problem)

Scoring = Literal["letter", "cloze"]
Task = Literal["mcq", "clm", "facts"]
CONFIDENCE = {
    "letter": "softmax over the option tokens' logits at the answer position (renormalised over the options)",
    "cloze": "softmax over the options' summed log-likelihoods",
    "clm": "the highest probability over the whole vocabulary for the token at a sampled position",
    "facts": "the highest probability over the whole vocabulary for an entity's first token",
}
# The multiple-choice defaults (ARC-Easy's validation split); a token task given them reads its own
# instead: these datasets' test splits (the bundled T-REx sample has no other).
MCQ_DATASET, MCQ_SPLIT = "arc_easy", "validation"
TOKEN_DATASETS, TOKEN_SPLIT = {"clm": "text", "facts": "trex"}, "test"
MAX_POSITIONS = 1000  # sampled positions per document


@dataclass
class EvalConfig(ConfigMixin, PlacementSection, RunSection, EvalSection, HarnessSection, PromptSection, DataSection, AdaptedModel):
    """Everything that defines an evaluation: the shared sections (model, data, prompt, ECE,
    device) and what only an evaluation has; unknown keys refused."""

    template: Optional[str] = redeclare(PromptSection, "template", help="prompt template (None: the dataset's "
                                        "default for the scoring)")
    # ARC-Easy's dev file by default (the only ARC-Easy split that ships, lab/data/bundled/SOURCES.md):
    # the bundled model is clearly above chance there, so a newcomer's first diagram has structure;
    # on OpenBookQA (the evaluate-obqa preset) it is at chance. Cloze, because by option text it is
    # right about half the time yet claims ~80 % confidence (ECE ~28 %), the mis-calibration to see
    # first; by letter it is at chance and says so (the README's first five minutes has the figures).
    dataset: str = redeclare(DataSection, "dataset", default=MCQ_DATASET, families=True, help=(
        f"registered dataset name ({MCQ_DATASET} with task clm or facts: that task's own default, "
        f"{' / '.join(TOKEN_DATASETS.values())})"))
    split: str = redeclare(DataSection, "split", default=MCQ_SPLIT, help=(
        f"split name, or SOURCE:PART for a seeded carve ({MCQ_SPLIT} with task clm or facts: {TOKEN_SPLIT})"))
    # The alignment-calibration paper's three tasks (§4): multiple choice, the next token at a random
    # position of a text (causal language modelling), the first token of an entity (facts generation).
    task: Task = field(default="mcq", metadata=doc(
        "mcq (multiple choice), clm (the token at random positions of texts) or facts (each entity's first token)"))
    positions: int = field(default=1, metadata=doc("clm: positions sampled per document (with the seed)", ge=1,
                                                   le=MAX_POSITIONS))
    min_context: int = field(default=8, metadata=doc("clm: tokens before the earliest sampled position", ge=1,
                                                     le=MAX_TOKENS))
    scoring: Scoring = field(default="cloze", metadata=doc("mcq: cloze (option texts) or letter (option tokens)"))
    batch_size: int = field(default=16, metadata=doc("questions per forward pass", ge=1, le=MAX_BATCH))
    on_bad_rows: Literal["skip", "error"] = field(default="skip", metadata=doc("skip or reject malformed rows"))
    temperature: Optional[str] = field(default=None, metadata=doc(
        "scale probabilities by T: a number, a temperature.json or its directory (a run's name in the runs folder "
        "too)", role="temperature"))
    calibrator: Optional[str] = field(default=None, metadata=doc(
        "also report a saved recalibration (fitted on another run): a calibrator.json or its directory "
        "(calibrators/<name>, as the Recalibration page saves it)",
        role="calibrator"))

    def __post_init__(self) -> None:
        self.check_placement([self.model])
        load_temperature(self.temperature)  # a bad number or a missing file fails at submit time
        if self.calibrator is not None:  # ... and so does a damaged calibrator.json, or one of the other kind of run
            fitted = calibrators.load(Path(self.calibrator))
            if fitted.tokens != (self.task != "mcq"):
                kinds = {True: "a token-level run (task clm or facts)", False: "a multiple-choice run"}
                raise ValueError(f"calibrator: {shown_here(self.calibrator)} was fitted on {kinds[fitted.tokens]}, "
                                 f"and this is {kinds[not fitted.tokens]}: fit one on a run like this one in the "
                                 "Recalibration workbench")
        if harness.is_task(self.dataset):
            self._check_lm_eval()
            return
        if self.lm_eval_include is not None:
            raise ValueError(f"lm_eval_include: applies to an lm-eval task (dataset lm-eval:<task>), not to {self.dataset!r}")
        if self.template == LM_EVAL:
            raise ValueError(f"template: {LM_EVAL!r} is an lm-eval task's own prompt; it needs dataset lm-eval:<task>")
        if self.task != "mcq":
            for name in ("num_fewshot", "fewshot_split"):
                if getattr(self, name):
                    raise ValueError(f"{name}: few-shot examples go before multiple-choice questions (task mcq); "
                                     f"task {self.task} scores texts as they are: leave {name} empty")
            self._check_token_task()
        elif self.dataset in DATASETS and "mcq" not in DATASETS.get(self.dataset).tasks:
            raise ValueError(f"dataset: {not_for_task(DATASETS.get(self.dataset), 'mcq')}")
        problem = bundled_split_problem(self.dataset, self.split, self.data_files)
        if problem:
            raise ValueError(problem)
        if self.task == "mcq":
            self._check_template()
            self._check_fewshot()

    def _check_lm_eval(self) -> None:
        """An lm-eval task brings its prompt, its data and its scoring: what would contradict them is refused."""
        if self.task != "mcq":
            raise ValueError(f"task: an lm-eval task is multiple choice (task mcq), not {self.task}")
        if self.scoring != "cloze":
            raise ValueError("scoring: an lm-eval task is scored as lm-eval scores it, by each option's "
                             "log-likelihood after the task's context (cloze); its prompts do not list lettered options")
        if self.template not in (None, LM_EVAL):
            raise ValueError(f"template: an lm-eval task brings its own prompt; leave template empty (or {LM_EVAL!r})")
        if self.fewshot_split is not None:
            raise ValueError("fewshot_split: an lm-eval task draws its examples from its YAML's fewshot_split; leave "
                             "fewshot_split empty, or write fewshot_split in a task YAML of your include folder")
        self.template = LM_EVAL
        if self.data_files == [BUNDLED]:  # the default: the task's YAML names its data
            self.data_files = []
        if self.data_files:
            raise ValueError("data_files: an lm-eval task reads the data its YAML names; write dataset_kwargs."
                             "data_files in a task YAML of your include folder (lm_eval_include) instead")
        if self.subject is not None:
            raise ValueError("subject: an lm-eval task picks its own data; name a subtask instead "
                             "(lm-eval:mmlu_anatomy, lm-eval:bundled_mmlu_anatomy)")
        try:
            harness.check_task(self.dataset, self.lm_eval_include)
        except DataError as e:
            raise ValueError(f"dataset: {e}") from None

    def _check_template(self) -> None:
        if self.template is None:
            self.template = default_template(self.dataset, self.scoring)
        kind = get_template(self.template).kind
        if kind != self.scoring:
            raise ValueError(
                f"template: {self.template!r} is a {kind} template; for {self.scoring} scoring use one of: "
                f"{', '.join(template_names(self.scoring))}"
            )

    def _check_fewshot(self) -> None:
        """A lab dataset's few-shot examples: a split to draw them from (its default filled in, so the stored
        config says it), which the data holds and which never reads the scored questions."""
        if not self.num_fewshot:
            if self.fewshot_split is not None:
                raise ValueError(f"fewshot_split: {self.fewshot_split!r} is where few-shot examples come from, and "
                                 "num_fewshot asks for none; set num_fewshot, or leave fewshot_split empty")
            return
        if get_template(self.template).chat:
            raise ValueError(f"num_fewshot: template {self.template!r} puts each question in the model's chat "
                             "template, where examples before it are not built; pick a template without a chat format "
                             f"({', '.join(n for n in template_names('letter') if not get_template(n).chat)}) or "
                             "num_fewshot 0")
        if self.dataset not in DATASETS:
            return  # the registry check of the dataset field refuses it
        if self.fewshot_split is None:
            self.fewshot_split = default_fewshot_split(self.dataset)
        problem = bundled_split_problem(self.dataset, self.fewshot_split, self.data_files)
        if problem:
            source = self.split.partition(":")[0]
            missing = problem.removeprefix("split: ").split(". Ask for")[0]
            raise ValueError(f"fewshot_split: {missing}. Draw from one of those, or score and draw from two parts of "
                             f"one seeded carve: split '{source}:test' with fewshot_split '{source}:train'")
        try:
            shared = shares_rows(self.split, self.fewshot_split, self.data_files, DATASETS.get(self.dataset).own_splits)
        except DataError as e:
            raise ValueError(f"fewshot_split: {e}") from None
        if shared:
            raise ValueError(shared)

    def _check_token_task(self) -> None:
        if (self.dataset, self.split) == (MCQ_DATASET, MCQ_SPLIT):
            self.dataset, self.split = TOKEN_DATASETS[self.task], TOKEN_SPLIT
        elif self.dataset == MCQ_DATASET:
            self.dataset = TOKEN_DATASETS[self.task]
        if self.task not in DATASETS.get(self.dataset).tasks:
            raise ValueError(f"dataset: {self.dataset!r} cannot feed task {self.task}; use one of: "
                             f"{', '.join(dataset_names(self.task))}")
        if self.template is None:
            self.template = "plain"
        if get_template(self.template).kind != "text":
            raise ValueError(f"template: {self.template!r} is a {get_template(self.template).kind} template; for "
                             f"task {self.task} use one of: {', '.join(template_names('text'))}")


def default_fewshot_split(dataset: str) -> str:
    """Where a lab dataset's examples come from when the config names no split: MMLU's own ``dev`` (five per
    subject, kept for few-shot prompts: MMLU 5-shot's and lm-eval's fewshot_split), else ``train``."""
    return "dev" if "dev" in DATASETS.get(dataset).own_splits else "train"


def shares_rows(split: str, fewshot_split: str, data_files: list[str], own: tuple[str, ...]) -> Optional[str]:
    """Why ``fewshot_split`` would read questions ``split`` scores, or None. Both read the same rows when they
    name the same split, or when a data file names no split (``PATH``, not ``SPLIT=PATH``: every split reads it);
    two different parts of one seeded carve of those rows (``dev:train`` and ``dev:test``) share none."""
    scored, shots = parse_split(split, own), parse_split(fewshot_split, own)
    if scored.part and shots.part and scored.part != shots.part:
        return None
    plain = [e for e in data_files if e != BUNDLED and split_entry(e)[0] is None]
    if scored.source != shots.source and not plain:
        return None
    carve = f"split '{scored.source}:test' with fewshot_split '{scored.source}:train'"
    if scored.source != shots.source:
        return (f"fewshot_split: the data files name no split (PATH, not SPLIT=PATH), so every split reads them "
                f"and {fewshot_split!r} would read the questions split {split!r} scores; few-shot examples never come "
                f"from the scored questions: name each file's split ({scored.source}=PATH, train=PATH), or score and "
                f"draw from two parts of one seeded carve ({carve})")
    return (f"fewshot_split: {fewshot_split!r} reads the questions split {split!r} scores, and few-shot examples "
            f"never come from the scored questions: draw them from another split, or score and draw from two parts "
            f"of one seeded carve ({carve})")


register(JobKind(
    "evaluate", "accuracy and calibration of a model on a dataset", EvalConfig, "lab.kinds.evaluate.run:run_job",
    outputs=(METRICS_FILE, PREDICTIONS_FILE),
    key_fields=("model", "adapter", "task", "dataset", "data_files", "split", "limit", "scoring", "template", "temperature",
                "calibrator", "num_fewshot", "fewshot_split", "lm_eval_include"),
))
