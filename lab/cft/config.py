"""``CftConfig``: the CFT/RCFT protocol as one job (REFERENCE.md §3).

An in-domain pool (MMLU + MedMCQA + OpenBookQA by default) sampled per source and carved, seeded,
into train / validation / test; out-of-domain sets (ARC-Challenge); rows for the base model,
temperature scaling (fitted on the validation part), label smoothing, CFT and RCFT at each λ; win
rate on preference pairs before and after. ``training`` holds the fine-tuning settings shared by
every trained row — any :class:`~lab.train.config.TrainConfig` field — so the YAML is the same
vocabulary as a ``finetune`` job's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from lab.config import ConfigMixin, doc
from lab.data import DATASETS
from lab.train.config import Objective, TrainConfig

METHODS = ("ts", "ls", "cft", "rcft")
# Set by the protocol for each row; a user setting them in `training` would silently be overridden.
PROTOCOL_FIELDS = ("model", "dataset", "data_files", "split", "limit", "val_split", "val_data_files", "val_limit",
                   "template", "objective", "completion_only", "ece_lambda", "label_smoothing", "seed", "device",
                   "dtype", "bins")
DEFAULT_IN_DOMAIN = [{"dataset": "mmlu", "split": "test"}, {"dataset": "medmcqa", "split": "validation"},
                     {"dataset": "obqa", "split": "train"}]


def _check_sources(name: str, entries: Any) -> None:
    if not isinstance(entries, list):
        raise ValueError(f"Expected `{name}` to be a list of {{dataset, data_files, split, n}} mappings, but got {entries!r}")
    for entry in entries:
        if not isinstance(entry, dict) or "dataset" not in entry:
            raise ValueError(f"Expected each `{name}` entry to be a mapping with `dataset`, but got {entry!r}")
        unknown = sorted(set(entry) - {"dataset", "data_files", "split", "n", "subject"})
        if unknown:
            raise ValueError(f"Unknown key(s) {unknown} in `{name}` entry {entry!r}; valid: dataset, data_files, split, n, subject")
        DATASETS.get(entry["dataset"])
        n = entry.get("n")
        if n is not None and (not isinstance(n, int) or n < 1):
            raise ValueError(f"Expected `n` in {entry!r} to be a positive integer, but got {n!r}")


@dataclass
class CftConfig(ConfigMixin):
    model: str = field(default="bundled", metadata=doc("the (preference-aligned) model: 'bundled', a directory or a hub id"))
    in_domain: list[dict[str, Any]] = field(default_factory=lambda: [dict(e) for e in DEFAULT_IN_DOMAIN], metadata=doc(
        "in-domain sources [{dataset, data_files, split, n}]: n questions sampled from each, then pooled"))
    train_size: int = field(default=3000, metadata=doc("pooled questions to train on"))
    val_size: int = field(default=500, metadata=doc("pooled questions to fit the temperature and track ECE per epoch"))
    test_size: int = field(default=2000, metadata=doc("pooled questions for the in-domain evaluation"))
    ood: list[dict[str, Any]] = field(default_factory=lambda: [{"dataset": "arc_challenge", "split": "test"}],
                                      metadata=doc("out-of-domain evaluations [{dataset, data_files, split, n}]"))
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata=doc(f"rows besides the base model: any of {METHODS}"))
    lambdas: list[float] = field(default_factory=lambda: [0.4, 1.0, 1.8], metadata=doc("RCFT's λ values (one row each)"))
    ts_objective: Literal["nll", "ece"] = field(default="nll", metadata=doc("temperature fit: NLL (L-BFGS) or ECE (grid)"))
    label_smoothing: float = field(default=0.1, metadata=doc("ε of the label-smoothing row"))
    preferences: list[str] = field(default_factory=list, metadata=doc(
        "preference pair files for the win rate (empty: the hub's argilla/ultrafeedback-binarized-preferences)"))
    preference_limit: Optional[int] = field(default=200, metadata=doc("pairs scored per model (None: all)"))
    max_response_tokens: Optional[int] = field(default=256, metadata=doc("each response is cut to this many tokens"))
    training: dict[str, Any] = field(default_factory=dict, metadata=doc(
        "fine-tuning settings for every trained row (TrainConfig fields: method, epochs, learning_rate, lora_r, ...)"))
    eval_batch_size: int = field(default=16, metadata=doc("questions per forward pass when evaluating"))
    bins: int = field(default=10, metadata=doc("ECE bins"))
    bootstrap: int = field(default=1000, metadata=doc("bootstrap replicates for ECE intervals"))
    seed: int = field(default=0, metadata=doc("seed of the sampling, the carve, data order and initialisation"))
    device: str = field(default="auto", metadata=doc("auto, cpu, cuda"))
    dtype: str = field(default="auto", metadata=doc("auto (bf16 on GPU, fp32 on CPU)"))

    def __post_init__(self) -> None:
        _check_sources("in_domain", self.in_domain)
        _check_sources("ood", self.ood)
        if not self.in_domain:
            raise ValueError("Expected at least one `in_domain` source")
        unknown = sorted(set(self.methods) - set(METHODS))
        if unknown:
            raise ValueError(f"Unknown method(s) {unknown}; expected any of {METHODS} (the base model is always a row)")
        if "rcft" in self.methods and not self.lambdas:
            raise ValueError("`rcft` needs at least one value in `lambdas`")
        if any(not isinstance(x, (int, float)) or isinstance(x, bool) or x < 0 for x in self.lambdas):
            raise ValueError(f"Expected `lambdas` to be numbers ≥ 0, but got {self.lambdas}")
        for name in ("train_size", "val_size", "test_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Expected `{name}` to be a positive integer, but got {value!r}")
        if not isinstance(self.training, dict):
            raise ValueError(f"Expected `training` to be a mapping of TrainConfig fields, but got {self.training!r}")
        clash = sorted(set(self.training) & set(PROTOCOL_FIELDS))
        if clash:
            raise ValueError(f"`training` may not set {clash}: the protocol sets them for each row (use the top-level "
                             "fields model, seed, device, dtype, bins, label_smoothing, lambdas)")
        self.train_config("sft", completion_only=True)  # unknown or invalid training fields fail at submit time

    def train_config(self, objective: Objective, completion_only: bool, **overrides: Any) -> TrainConfig:
        """The fine-tuning settings of one trained row."""
        return TrainConfig.from_dict({
            **self.training, "model": self.model, "dataset": self.in_domain[0]["dataset"], "template": "cft_chat",
            "val_split": None, "objective": objective, "completion_only": completion_only,
            "label_smoothing": self.label_smoothing, "seed": self.seed, "device": self.device, "dtype": self.dtype,
            "bins": self.bins, **overrides,
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
