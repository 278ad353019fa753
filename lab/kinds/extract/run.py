"""The ``extract`` job: a teacher's top-k over a dataset's training sequences, on its own.

The FIRST pipeline runs the same extraction as one of its stages; as a job of its own it answers
"how concentrated is this model's knowledge?" — the manifest's top-K coverage curve, which the
browser's Knowledge page draws — and leaves a store a later distillation can reuse.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from lab.core.errors import Stopped
from lab.core.events import EventWriter
from lab.core.layout import TOPK_DIR, TOPK_SHARD_SIZE
from lab.data import MCQRecord, load
from lab.jobkit.worker import JobContext
from lab.kinds.extract.config import ExtractConfig


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
    from lab.kinds.extract.store import extract_topk, rank_share
    from lab.training.data import build_examples

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
    """The teacher's top-k over ``cfg``'s questions into ``out``; with ``device_map: auto`` its offload folder in
    ``out`` is deleted once the store is written, or the run failed."""
    from lab.models.loading import load_model
    from lab.models.placement import placed

    records = load(cfg.dataset, cfg.split, cfg.data_files or None, subject=cfg.subject, seed=cfg.seed,
                   limit=cfg.limit).records
    meta = {"model": {"model": cfg.model, "adapter": cfg.adapter}, "dataset": cfg.dataset, "split": cfg.split,
            "template": cfg.template}
    with placed(out, cfg) as placing:
        loaded = load_model(cfg.model, adapter=cfg.adapter, device=cfg.device, dtype=cfg.dtype, **placing)
        return extract_records(loaded, records, cfg.template, out / TOPK_DIR, k=cfg.k, logprob_dtype=cfg.logprob_dtype,
                               completion_only=cfg.completion_only, max_length=cfg.max_length, meta=meta,
                               events=events, should_stop=should_stop, shard_size=cfg.shard_size)


def run_job(cfg: ExtractConfig, ctx: JobContext) -> dict[str, Any]:
    manifest = run_extract(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    return {"sequences": manifest["n_sequences"]}
