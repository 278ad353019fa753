"""The ``extract`` job: a teacher's top-k over a dataset's training sequences, on its own.

The FIRST pipeline runs the same extraction as one of its stages; as a job of its own it answers
"how concentrated is this model's knowledge?" — the manifest's top-K coverage curve, which the
browser's Knowledge page draws — and leaves a store a later distillation can reuse.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

from lab.config import ConfigMixin, doc
from lab.data import DATASETS, MCQRecord, load_records
from lab.errors import Stopped
from lab.events import EventWriter
from lab.limits import DEVICE, MAX_ROWS, MAX_TOKENS, MAX_TOP_K, SEED, SPLIT, Dtype
from lab.templates import TEMPLATES, default_template, get_template


@dataclass
class ExtractConfig(ConfigMixin):
    model: str = field(default="bundled", metadata=doc("the teacher: 'bundled', a directory or a hub id", role="model"))
    adapter: Optional[str] = field(default=None, metadata=doc("its LoRA adapter, if any", role="dir"))
    dataset: str = field(default="csqa", metadata=doc("registered dataset name", role="name", registry=DATASETS))
    data_files: list[str] = field(default_factory=list, metadata=doc("local files: PATH or SPLIT=PATH",
                                                                     role="data_files"))
    split: str = field(default="train", metadata=doc("split (or SOURCE:PART)", **SPLIT))
    limit: Optional[int] = field(default=None, metadata=doc("first N examples", ge=1, le=MAX_ROWS))
    template: Optional[str] = field(default=None, metadata=doc("letter template; default depends on dataset",
                                                               role="name", registry=TEMPLATES))
    k: int = field(default=5, metadata=doc("tokens kept per position", ge=1, le=MAX_TOP_K))
    logprob_dtype: Literal["float16", "float32"] = field(default="float16", metadata=doc(
        "stored log-prob width: float16 or float32"))
    completion_only: bool = field(default=True, metadata=doc("sequences as the student will be trained on them"))
    max_length: int = field(default=512, metadata=doc("longer examples are dropped", ge=1, le=MAX_TOKENS))
    seed: int = field(default=0, metadata=doc("seed for split carving", **SEED))
    device: str = field(default="auto", metadata=doc("auto, cpu, cuda", **DEVICE))
    dtype: Dtype = field(default="auto", metadata=doc("auto (bf16 on GPU, fp32 on CPU)"))

    def __post_init__(self) -> None:
        if self.template is None:
            self.template = default_template(self.dataset, "letter")
        if get_template(self.template).kind != "letter":
            raise ValueError(f"template: extraction needs a letter template, but {self.template!r} is a cloze template")


def extract_records(loaded, records: Sequence[MCQRecord], template: str, out_dir: Path, *, k: int, logprob_dtype: str,
                    completion_only: bool, max_length: int, meta: dict[str, Any], events: EventWriter,
                    should_stop: Callable[[], bool]) -> dict[str, Any]:
    """Top-k of ``loaded`` over the training sequences of ``records``; progress as ``extract`` events."""
    from lab.distill.extract import extract_topk
    from lab.train.data import build_examples

    examples = build_examples(records, template, loaded.tokenizer, completion_only, max_length)
    done = 0

    def progress(n: int) -> None:  # extract_topk reports each batch's count; events carry the running total
        nonlocal done
        done += n
        events.emit("extract", step=done, total=len(examples))

    manifest = extract_topk(loaded.model, [e["input_ids"] for e in examples], out_dir, k=k, logprob_dtype=logprob_dtype,
                            pad_id=loaded.tokenizer.pad_token_id, meta=meta, progress=progress, should_stop=should_stop)
    if not manifest.get("complete", True):
        raise Stopped(f"extraction stopped after {done} of {len(examples)} sequences; rerun to resume")
    return manifest


def run_extract(cfg: ExtractConfig, out: Path, events: EventWriter, should_stop: Callable[[], bool]) -> dict[str, Any]:
    from lab.models import load_model

    records = load_records(cfg.dataset, cfg.split, cfg.data_files or None, seed=cfg.seed, limit=cfg.limit).records
    loaded = load_model(cfg.model, adapter=cfg.adapter, device=cfg.device, dtype=cfg.dtype)
    meta = {"model": {"model": cfg.model, "adapter": cfg.adapter}, "dataset": cfg.dataset, "split": cfg.split,
            "template": cfg.template}
    return extract_records(loaded, records, cfg.template, out / "topk", k=cfg.k, logprob_dtype=cfg.logprob_dtype,
                           completion_only=cfg.completion_only, max_length=cfg.max_length, meta=meta, events=events,
                           should_stop=should_stop)
