"""``CftConfig``: the CFT/RCFT protocol as one job (REFERENCE.md §3).

An in-domain pool (MMLU + MedMCQA + OpenBookQA by default, their bundled samples) sampled per
source and carved, seeded, into train / validation / test; out-of-domain sets (ARC-Challenge);
rows for the base model, temperature scaling (T fitted on the validation part by ECE, as the
paper's Appendix searches it, or by NLL), label smoothing, CFT and RCFT at each λ; win rate on
preference pairs before and after (the bundled stand-in by default: right answers over wrong ones).
``training`` holds the fine-tuning settings shared by every trained row — any
:class:`~lab.training.config.TrainConfig` field — so the YAML is the same vocabulary as a ``finetune`` job's.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lab.calibration.temperature import FitObjective
from lab.core.config import ConfigMixin, doc, redeclare, with_defaults
from lab.core.layout import EVAL_DIR, FITTED_TEMPERATURE_DIR, REPORT_JSON, REPORT_MD
from lab.core.limits import MAX_ROWS, MAX_TOKENS
from lab.data import harness
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import (BUNDLED, DataSection, HarnessSection, ModelSection, PipelineEvalSection, PromptSection,
                                 RunSection)
from lab.kinds.evaluate.config import EvalConfig
from lab.training.config import Loss, TrainConfig, training_section

Row = Literal["ts", "ls", "cft", "rcft"]  # the rows of the report besides the base model
ROWS: tuple[str, ...] = typing.get_args(Row)
# The paper's mix and out-of-domain set, from the samples bundled with the lab (MMLU's test split is not
# bundled: its validation split stands in), so that the defaults run on a machine with no network.
DEFAULT_IN_DOMAIN = [{"dataset": "mmlu", "split": "validation", "data_files": [BUNDLED]},
                     {"dataset": "medmcqa", "split": "validation", "data_files": [BUNDLED]},
                     {"dataset": "obqa", "split": "train", "data_files": [BUNDLED]}]
DEFAULT_OOD = [{"dataset": "arc_challenge", "split": "test", "data_files": [BUNDLED], "limit": 100}]
# The defaults' sizes: five rows trained on a CPU at well under one example a second, each model evaluated
# in and out of domain, in about half an hour (examples/cft-paper.yaml has the paper's 3000 / 500 / 2000).
TRAIN_SIZE, VAL_SIZE, TEST_SIZE, PREFERENCE_LIMIT = 32, 64, 100, 50
HARNESS_KEYS = ("num_fewshot", "fewshot_split", "lm_eval_include")  # an out-of-domain lm-eval task's own fields


@dataclass(kw_only=True)
class Source(DataSection):
    """One dataset of the in-domain pool or one out-of-domain evaluation (entries of ``in_domain`` / ``ood``)."""

    MOVED: typing.ClassVar[dict[str, str]] = {"n": "limit"}

    dataset: str = redeclare(DataSection, "dataset", required=True)
    limit: Optional[int] = redeclare(DataSection, "limit", help="questions drawn from it at random, seeded "
                                                                "(None: all)")


@dataclass(kw_only=True)
class OodSource(HarnessSection, Source):
    """One out-of-domain evaluation (an entry of ``ood``): a lab dataset, scored as the rows are trained (by
    letter, the protocol's template, zero-shot), or an lm-eval task (``lm-eval:<task>``) scored as the evaluate
    kind scores one: cloze on lm-eval's own prompts, with the entry's ``num_fewshot`` and ``lm_eval_include``."""

    dataset: str = redeclare(Source, "dataset", required=True, families=True)
    limit: Optional[int] = redeclare(DataSection, "limit", help=(
        "questions drawn from it at random, seeded; an lm-eval task: its first N documents per task, as "
        "lm_eval --limit N, so that its figures compare with lm-eval's (None: all)"))


@dataclass
class CftConfig(ConfigMixin, RunSection, PipelineEvalSection, ModelSection):
    model: str = redeclare(ModelSection, "model", help="the (preference-aligned) model: 'bundled', a directory, "
                                                       "a hub id or run:<id> (a dpo job's result, say)",
                           trained_by="training.method")
    in_domain: list[dict[str, Any]] = field(default_factory=lambda: [dict(e) for e in DEFAULT_IN_DOMAIN], metadata=doc(
        "in-domain sources [{dataset, data_files, subject, split, limit}]: limit questions drawn from each, then "
        "pooled", entries=Source, max_items=32))
    train_size: int = field(default=TRAIN_SIZE, metadata=doc("pooled questions to train on", ge=1, le=MAX_ROWS))
    val_size: int = field(default=VAL_SIZE, metadata=doc(
        "pooled questions to fit the temperature and track ECE per epoch", ge=1, le=MAX_ROWS))
    test_size: int = field(default=TEST_SIZE, metadata=doc("pooled questions for the in-domain evaluation",
                                                           ge=1, le=MAX_ROWS))
    ood: list[dict[str, Any]] = field(default_factory=lambda: [dict(e) for e in DEFAULT_OOD], metadata=doc(
        "out-of-domain evaluations [{dataset, data_files, subject, split, limit}]; dataset lm-eval:<task> (with "
        "num_fewshot, lm_eval_include) is scored on the task's own prompts (cloze)", entries=OodSource, max_items=32))
    template: str = redeclare(PromptSection, "template", default="cft_chat", help=(
        "letter template of every row's training and evaluation (cft_chat: the paper's prompt)"))
    methods: list[Row] = field(default_factory=lambda: list(ROWS), metadata=doc(
        f"rows besides the base model: any of {ROWS}"))
    lambdas: list[float] = field(default_factory=lambda: [0.4, 1.0, 1.8], metadata=doc(
        "RCFT's λ values (one row each). training.lambda_scale paper (default): L_SFT + λ·L_ECE, SFT a mean over "
        "every prompt + answer token, L_ECE over questions at the answer, so λ weighs each question like "
        "λ × its token count of cross-entropy (controlled task, 45 tokens: the regulariser pulls the answer as "
        "hard as SFT at λ ≈ 0.1, 20× at 1.8); released: (1-λ)·L_SFT + λ·1e-3·L_ECE per bin, λ <= 1",
        ge=0, le=1000, max_items=32))
    ts_objective: FitObjective = field(default="ece", metadata=doc(
        "what the temperature-scaling row's T minimises on validation: ece (a log grid, as the paper searches it) "
        "or nll (a bounded Brent search over log T); the report shows both fits"))
    label_smoothing: float = field(default=0.1, metadata=doc("ε of the label-smoothing row", ge=0, lt=1))
    preferences: list[str] = field(default_factory=lambda: [BUNDLED], metadata=doc(
        "preference pair files for the win rate; 'bundled': OpenBookQA dev questions, the right answer chosen over "
        "a wrong one (an offline stand-in); empty: the hub's argilla/ultrafeedback-binarized-preferences",
        role="files"))
    preference_limit: Optional[int] = field(default=PREFERENCE_LIMIT, metadata=doc(
        "pairs scored per model (None: all)", ge=1, le=MAX_ROWS))
    max_response_tokens: Optional[int] = field(default=256, metadata=doc("each response is cut to this many tokens",
                                                                         ge=1, le=MAX_TOKENS))
    training: dict[str, Any] = field(default_factory=dict, metadata=training_section(
        "fine-tuning settings for every trained row (TrainConfig fields: method, epochs, learning_rate, lora_r, ...)",
        ("objective", "completion_only", "ece_lambda", "label_smoothing"),
        "the protocol sets it for each row (use the top-level fields model, seed, device, dtype, bins, "
        "bin_edges, label_smoothing, lambdas)"))

    def __post_init__(self) -> None:
        if not self.in_domain:
            raise ValueError("in_domain: must name at least one source")
        # An entry without data_files reads the bundled sample, as its declaration (and FIRST's ood) says; an
        # lm-eval task reads the data its YAML names, so it is kept as written.
        self.in_domain = [with_defaults(Source, e) for e in self.in_domain]
        self.ood = [e if harness.is_task(e["dataset"]) else with_defaults(Source, e) for e in self.ood]
        for i, entry in enumerate(self.ood):
            self._check_ood(i, entry)
        if "rcft" in self.methods and not self.lambdas:
            raise ValueError("lambdas: `rcft` needs at least one value")
        self.train_config("sft", completion_only=True)  # cross-field checks of the training settings, at submit time

    def _check_ood(self, index: int, entry: dict[str, Any]) -> None:
        """An out-of-domain set as its evaluation will read it, refused at submit rather than after training."""
        if not harness.is_task(entry["dataset"]):
            named = next((key for key in HARNESS_KEYS if entry.get(key)), None)
            if named:
                raise ValueError(f"ood[{index}].{named}: applies to an lm-eval task (dataset lm-eval:<task>); CFT "
                                 f"evaluates {entry['dataset']!r} as it trains, zero-shot with template "
                                 f"{self.template!r}: leave {named} out")
        try:
            self.eval_config(self.model, None, entry)
        except ValueError as e:
            raise ValueError(f"ood[{index}].{e}") from None

    def eval_config(self, model: str, adapter: Optional[str], source: dict[str, Any]) -> EvalConfig:
        """One model's evaluation on one set (``source``: an entry, or the in-domain pool's first). A lab dataset's
        questions are scored by letter with the protocol's template; an lm-eval task's by cloze on its own prompts
        (template ``lm_eval``), with the entry's shots and include folder."""
        if harness.is_task(source["dataset"]):
            # data_files and subject go along so that the evaluation refuses what contradicts the task's YAML
            given = {k: source[k] for k in (*HARNESS_KEYS, "data_files", "subject") if k in source}
            own = {"scoring": "cloze", "template": None, **given}
        else:
            own = {"scoring": "letter", "template": self.template}
        return EvalConfig.from_dict({
            "model": model, "adapter": adapter, "dataset": source["dataset"], **own, "bins": self.bins,
            "bin_edges": self.bin_edges, "batch_size": self.eval_batch_size, "device": self.device, "dtype": self.dtype,
            "bootstrap": self.bootstrap, "seed": self.seed})

    def train_config(self, objective: Loss, completion_only: bool, **overrides: Any) -> TrainConfig:
        """The fine-tuning settings of one trained row (no limit or validation split: the pipeline hands
        each row the carved pool)."""
        return TrainConfig.from_dict({
            **self.training, "model": self.model, "dataset": self.in_domain[0]["dataset"], "template": self.template,
            "limit": None, "val_split": None, "objective": objective, "completion_only": completion_only,
            "label_smoothing": self.label_smoothing, "seed": self.seed, "device": self.device, "dtype": self.dtype,
            "bins": self.bins, "bin_edges": self.bin_edges, **overrides,
        })

    def rows(self) -> list[tuple[str, Optional[TrainConfig]]]:
        """(row name, its training config or None) in report order: base, ts, ls, cft, rcft λ…"""
        rows: list[tuple[str, Optional[TrainConfig]]] = [("base", None)]
        if "ts" in self.methods:
            rows.append(("ts", None))
        if "ls" in self.methods:
            rows.append(("ls", self.train_config("label_smoothing", completion_only=True)))
        if "cft" in self.methods:
            rows.append(("cft", self.train_config("sft", completion_only=True)))
        if "rcft" in self.methods:
            rows += [(f"rcft_{lam:g}", self.train_config("rcft", completion_only=False, ece_lambda=float(lam)))
                     for lam in self.lambdas]
        return rows


register(JobKind(
    "cft", "CFT/RCFT protocol: base, temperature scaling, label smoothing, CFT, RCFT per λ, in/out of domain, "
    "win rate, report", CftConfig, "lab.kinds.cft.run:run_job",
    outputs=(f"{EVAL_DIR}/<row>-<set>/", f"{FITTED_TEMPERATURE_DIR}/", "models/<row>/", "winrate/<row>/", REPORT_JSON, REPORT_MD),
    key_fields=("model", "in_domain", "ood", "train_size", "val_size", "test_size", "methods", "lambdas", "training",
                "preferences"),
    data_parallel=True,
))
