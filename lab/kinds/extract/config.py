"""The ``extract`` kind's description: :class:`ExtractConfig` and its registration (the run: :mod:`.run`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from lab.core.config import ConfigMixin, doc, redeclare
from lab.core.layout import MANIFEST_FILE, TOPK_DIR, TOPK_SHARD_SIZE
from lab.core.limits import MAX_ROWS, MAX_TOKENS, MAX_TOP_K
from lab.data.templates import default_template, get_template
from lab.jobkit.kinds import JobKind, register
from lab.jobkit.sections import AdaptedModel, DataSection, PlacementSection, PromptSection, RunSection

EXTRACT_LIMIT = 200  # the default: the bundled model over a few hundred sequences takes minutes on a CPU


@dataclass
class ExtractConfig(ConfigMixin, PlacementSection, RunSection, PromptSection, DataSection, AdaptedModel):
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
        self.check_placement([self.model])
        if self.template is None:
            self.template = default_template(self.dataset, "letter")
        if get_template(self.template).kind != "letter":
            raise ValueError(f"template: extraction needs a letter template, but {self.template!r} is a cloze template")


register(JobKind(
    "extract", "a teacher's top-k tokens over a dataset (FIRST's concentrated knowledge), with the coverage curve",
    ExtractConfig, "lab.kinds.extract.run:run_job", outputs=(f"{TOPK_DIR}/{MANIFEST_FILE}", f"{TOPK_DIR}/<shards>"),
    key_fields=("model", "adapter", "dataset", "data_files", "split", "limit", "k"),
    data_parallel=True,
))
