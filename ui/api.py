"""The app's scripting API (``gradio_client``): submit a job, follow it, read its results.

The pages' own events are private; these three are the public, documented endpoints, with the
same checks as the forms (paths, config validation) and plain JSON answers. Each is a function of
the server's :class:`LabContext` and plain values, registered by :func:`register_api`.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import gradio as gr

from jobs.failures import log_tail
from lab.core.config import ConfigError
from lab.core.yamlio import load_yaml
from lab.results import analysis, runs
from ui.context import LabContext
from ui.messages import STORE_FAULTS, server_free, store_fault
from ui.progress import progress

API_NAMES = ("submit_job", "job_status", "run_metrics")  # what the README documents, and nothing else
LOG_LINES = 20


def submit_job(ctx: LabContext, config_yaml: str, gpus: int = 0, processes: int = 1, executor: str = "local",
               slurm: str = "") -> dict[str, Any]:
    """Queue a job from its YAML config (``kind`` and its fields) on ``gpus`` GPUs, or on the CPU in
    ``processes`` data-parallel processes; ``executor: slurm`` submits it to this server's Slurm with
    ``slurm``'s options (JSON: partition, nodes, gpus_per_node, minutes, account, extra). Returns its
    id or the error."""
    try:
        if not isinstance(config_yaml, str):
            raise ConfigError(f"config: must be YAML text, got {type(config_yaml).__name__}")
        job = ctx.submit(load_yaml(config_yaml), gpus=gpus, processes=processes, executor=executor, slurm=slurm or None)
    except ConfigError as e:
        return {"ok": False, "error": server_free(str(e), ctx.roots)}
    except STORE_FAULTS as e:
        return {"ok": False, "error": store_fault(ctx.runs, e)}
    return {"ok": True, "id": job.id, "status": job.status}


def job_status(ctx: LabContext, job_id: int) -> dict[str, Any]:
    """A job's status, progress, error and log tail; ``evaluations`` lists its result directories."""
    try:
        job = ctx.store.get(int(job_id))
    except (KeyError, ValueError, TypeError):
        return {"ok": False, "error": f"No job {job_id!r}"}
    except STORE_FAULTS as e:
        return {"ok": False, "error": store_fault(ctx.runs, e)}
    p = progress(ctx.events.events(job.run_dir)) if job.status == "running" else None
    evaluations = [run.name for run in runs.job_evaluations(ctx.runs, job.run_dir)]
    return {"ok": True, "id": job.id, "kind": job.kind, "status": job.status,
            "error": server_free(job.error, ctx.roots) if job.error else job.error,
            "progress": p.text if p else None, "evaluations": evaluations,
            "log_tail": log_tail(job.run_dir, LOG_LINES)}


def run_metrics(ctx: LabContext, name: str) -> dict[str, Any]:
    """Headline metrics and reliability table of one evaluation (a name from ``job_status``), its
    bins closed as the run was evaluated."""
    run = runs.evaluation(ctx.runs, name)
    if run is None:
        return {"ok": False, "error": f"No evaluation {name!r}"}
    try:
        pred = ctx.results.predictions(run)
    except (ValueError, OSError) as e:
        return {"ok": False, "error": server_free(f"Cannot read evaluation {name!r}: {e}", ctx.roots)}
    return {"ok": True, "name": run.name, "model": run.model, "dataset": run.dataset,
            **analysis.reported_summary(pred)}


def _bound(fn: Callable[..., dict[str, Any]], ctx: LabContext) -> Callable[..., dict[str, Any]]:
    """``fn`` with ``ctx`` given: a function whose signature lacks ``ctx``, since gr.api describes the
    endpoint from the signature and type hints (a ``functools.partial`` has no hints to read)."""
    @functools.wraps(fn)
    def endpoint(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return fn(ctx, *args, **kwargs)

    signature = inspect.signature(fn)
    endpoint.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    return endpoint


def register_api(ctx: LabContext) -> None:
    """The three endpoints, bound to this server's context; named and documented as the functions are."""
    for fn in (submit_job, job_status, run_metrics):
        gr.api(_bound(fn, ctx), api_name=fn.__name__)
