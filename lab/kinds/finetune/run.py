"""Run a ``finetune`` job: the training loop of :mod:`lab.training.trainer`, its last validation as the summary."""
from __future__ import annotations

from typing import Any

from lab.jobkit.worker import JobContext
from lab.training.config import TrainConfig
from lab.training.trainer import finetune


def run_job(cfg: TrainConfig, ctx: JobContext) -> dict[str, Any]:
    result = finetune(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    return {"final_" + k: v for k, v in (result["history"] or [{}])[-1].items()} | {"n_train": result["n_train"]}
