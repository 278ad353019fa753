"""The ``extract`` job: a teacher's top-k over a dataset's training sequences, on its own.

The FIRST pipeline runs the same extraction as one of its stages; as a job of its own it answers
"how concentrated is this model's knowledge?" — the manifest's top-K coverage curve, which the
browser's Knowledge page draws — and leaves a store a later distillation can reuse.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

from lab.config import ConfigMixin, doc, redeclare
from lab.data import MCQRecord, load_records
from lab.errors import Stopped
from lab.events import EventWriter
from lab.kinds import JobKind, register
from lab.layout import MANIFEST_FILE, TOPK_DIR, TOPK_SHARD_SIZE
from lab.limits import MAX_ROWS, MAX_TOKENS, MAX_TOP_K
from lab.sections import AdaptedModel, DataSection, PromptSection, RunSection
from lab.templates import default_template, get_template


EXTRACT_LIMIT = 200  # the default: the bundled model over a few hundred sequences takes minutes on a CPU


@dataclass
class ExtractConfig(ConfigMixin, RunSection, PromptSection, DataSection, AdaptedModel):
    model: str = redeclare(AdaptedModel, "model", help="the teacher: 'bundled', a directory or a hub id")
    split: str = redeclare(DataSection, "split", default="train")
    limit: Optional[int] = redeclare(DataSection, "limit", default=EXTRACT_LIMIT, help=(
        f"first N questions (default {EXTRACT_LIMIT}: minutes on a CPU; None: all)"))
    template: Optional[str] = redeclare(PromptSection, "template", help="letter template (None: the dataset's default)")
    k: int = field(default=5, metadata=doc("tokens kept per position", ge=1, le=MAX_TOP_K))
    logprob_dtype: Literal["float16", "float32"] = field(default="float16", metadata=doc(
        "stored log-prob width: float16 or float32"))
    completion_only: bool = field(default=True, metadata=doc("sequences as the student will be trained on them"))
    max_length: int = field(default=512, metadata=doc("longer examples are dropped", ge=1, le=MAX_TOKENS))
    shard_size: int = field(default=TOPK_SHARD_SIZE, metadata=doc(
        "sequences per shard file: what a resumed run skips, and what the ranks of a multi-process run split",
        ge=1, le=MAX_ROWS))

    def __post_init__(self) -> None:
        if self.template is None:
            self.template = default_template(self.dataset, "letter")
        if get_template(self.template).kind != "letter":
            raise ValueError(f"template: extraction needs a letter template, but {self.template!r} is a cloze template")


def tokenizer_name(tokenizer) -> str:
    """How a store names the tokenizer its sequences were made with, so that a student whose own
    tokenizer differs can be told which two disagree: its ``name_or_path``, class and size."""
    return f"{tokenizer.name_or_path} ({type(tokenizer).__name__}, {len(tokenizer):,} tokens)"


def extract_records(loaded, records: Sequence[MCQRecord], template: str, out_dir: Path, *, k: int, logprob_dtype: str,
                    completion_only: bool, max_length: int, meta: dict[str, Any], events: EventWriter,
                    should_stop: Callable[[], bool], shard_size: int = TOPK_SHARD_SIZE) -> dict[str, Any]:
    """Top-k of ``loaded`` over the training sequences of ``records``; progress as ``extract`` events.

    ``meta`` gains ``tokenizer`` (:func:`tokenizer_name`): the store's ``sequences_sha256`` says
    *that* a student's sequences differ, this says whose tokenizer made the stored ones."""
    from lab.distill.extract import extract_topk, rank_share
    from lab.train.data import build_examples

    examples = build_examples(records, template, loaded.tokenizer, completion_only, max_length)
    done, share = 0, rank_share(len(examples), shard_size)  # rank 0's share: it alone reports progress

    def progress(n: int) -> None:  # extract_topk reports each batch's count; events carry the running total
        nonlocal done
        done += n
        events.emit("extract", step=done, total=share)

    meta = {**meta, "tokenizer": tokenizer_name(loaded.tokenizer)}
    manifest = extract_topk(loaded.model, [e["input_ids"] for e in examples], out_dir, k=k, logprob_dtype=logprob_dtype,
                            pad_id=loaded.tokenizer.pad_token_id, meta=meta, progress=progress, should_stop=should_stop,
                            shard_size=shard_size)
    if not manifest.get("complete", True):
        raise Stopped(f"extraction stopped after {done} of {len(examples)} sequences; rerun to resume")
    return manifest


def run_extract(cfg: ExtractConfig, out: Path, events: EventWriter, should_stop: Callable[[], bool]) -> dict[str, Any]:
    from lab.models import load_model

    records = load_records(cfg.dataset, cfg.split, cfg.data_files or None, subject=cfg.subject, seed=cfg.seed,
                           limit=cfg.limit).records
    loaded = load_model(cfg.model, adapter=cfg.adapter, device=cfg.device, dtype=cfg.dtype)
    meta = {"model": {"model": cfg.model, "adapter": cfg.adapter}, "dataset": cfg.dataset, "split": cfg.split,
            "template": cfg.template}
    return extract_records(loaded, records, cfg.template, out / TOPK_DIR, k=cfg.k, logprob_dtype=cfg.logprob_dtype,
                           completion_only=cfg.completion_only, max_length=cfg.max_length, meta=meta, events=events,
                           should_stop=should_stop, shard_size=cfg.shard_size)


def _run_job(cfg: ExtractConfig, ctx) -> dict[str, Any]:
    manifest = run_extract(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    return {"sequences": manifest["n_sequences"]}


register(JobKind(
    "extract", "a teacher's top-k tokens over a dataset (FIRST's concentrated knowledge), with the coverage curve",
    ExtractConfig, _run_job, outputs=(f"{TOPK_DIR}/{MANIFEST_FILE}", f"{TOPK_DIR}/<shards>"),
    key_fields=("model", "adapter", "dataset", "data_files", "split", "limit", "k"),
    data_parallel=True,
))
