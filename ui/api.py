"""The app's scripting API (``gradio_client``): submit a job, follow it, read its results.

The pages' own events are private; these three are the public, documented endpoints, with the
same checks as the forms (paths, config validation) and plain JSON answers.
"""
from __future__ import annotations

from typing import Any

import gradio as gr

from lab import results
from lab.config import ConfigError
from lab.yamlio import load_yaml
from ui.context import LabContext
from ui.jobs_page import CACHE
from ui.progress import log_tail, progress


API_NAMES = ("submit_job", "job_status", "run_metrics")  # what the README documents, and nothing else


def register_api(ctx: LabContext) -> None:
    def submit_job(config_yaml: str, gpus: int = 0) -> dict[str, Any]:
        """Queue a job from its YAML config (``kind`` and its fields); returns its id or the error."""
        try:
            if not isinstance(config_yaml, str):
                raise ConfigError(f"config: must be YAML text, got {type(config_yaml).__name__}")
            job = ctx.submit(load_yaml(config_yaml), gpus=gpus)
        except ConfigError as e:
            return {"ok": False, "error": str(e)}
        return {"ok": True, "id": job.id, "status": job.status}

    def job_status(job_id: int) -> dict[str, Any]:
        """A job's status, progress, error and log tail; ``evaluations`` lists its result directories."""
        try:
            job = ctx.store.get(int(job_id))
        except (KeyError, ValueError, TypeError):
            return {"ok": False, "error": f"No job {job_id!r}"}
        p = progress(CACHE.events(job.run_dir)) if job.status == "running" else None
        run_name = str(job.run_dir).removeprefix(str(ctx.runs)).strip("/")
        evaluations = [r.name for r in results.find_evaluations(ctx.runs)
                       if r.name == run_name or r.name.startswith(run_name + "/")]
        return {"ok": True, "id": job.id, "kind": job.kind, "status": job.status, "error": job.error,
                "progress": p.text if p else None, "evaluations": evaluations, "log_tail": log_tail(job.run_dir, 20)}

    def run_metrics(name: str) -> dict[str, Any]:
        """Headline metrics and reliability table of one evaluation (a name from ``job_status``)."""
        run = results.evaluation(ctx.runs, name or "")
        if run is None:
            return {"ok": False, "error": f"No evaluation {name!r}"}
        pred = results.load_predictions(run.path)
        return {"ok": True, "name": run.name, "model": run.model, "dataset": run.dataset,
                **results.calibration_summary(results.reported_probs(pred), pred.mask, pred.labels)}

    for fn in (submit_job, job_status, run_metrics):
        gr.api(fn, api_name=fn.__name__)
