"""Jobs: the live queue and one job's page (progress, curves, log, cancel, clone, what went wrong).

Everything shown is read from the job store and the run directory, never from this session's
memory, so another tab or a restarted server shows the same state. The two-second poll reads
only events appended since the last poll (:class:`ui.progress.EventCache`) and redraws the
curves only when there are new ones.
"""
from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple, Optional

import gradio as gr
import pandas as pd

from jobs.failures import log_tail
from jobs.scheduler import cancel
from jobs.store import HEARTBEAT_STALE_S, Job, JobStore
from lab.layout import LOG_FILE
from ui.context import LabContext
from ui.messages import error, ok
from ui.plots import sweep_figure, training_figure
from ui.progress import format_seconds, progress

POLL_S = 2.0
JOB_COLUMNS = ["id", "kind", "status", "progress", "elapsed", "ETA", "GPUs", "error"]
ACTIVITY_STAGES = ("start", "stage", "log", "warning", "stopped", "done")  # events the activity log lists
ACTIVITY_LINES = 40
LOG_LINES = 20


# ---------------------------------------------------------------- handlers
def jobs_table(ctx: LabContext, jobs: Optional[list[Job]] = None) -> pd.DataFrame:
    """The queue: queued jobs in order, then the rest newest first, with progress for running ones."""
    rows = []
    for job in ctx.store.list() if jobs is None else jobs:
        p = progress(ctx.events.events(job.run_dir)) if job.status == "running" else None
        rows.append([job.id, job.kind, job.status, p.text if p else ("done" if job.status == "succeeded" else ""),
                     format_seconds(job.elapsed()), format_seconds(p.eta_s) if p else "", job.devices or "",
                     job.error or ""])
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def scheduler_banner(store: JobStore) -> str:
    """A warning while no scheduler has ticked within ``HEARTBEAT_STALE_S`` (else ""): without one,
    the Launch page still queues jobs, and they would wait with nothing to say why."""
    if store.scheduler_alive(HEARTBEAT_STALE_S):
        return ""
    beat = store.last_beat()
    since = f" (last seen {format_seconds(time.time() - beat.time)} ago, pid {beat.pid} on {beat.host})" if beat else ""
    return error(f"No scheduler is running{since}: queued jobs will not start. "
                 "Restart the app, or run `python -m jobs serve`.")


def _choices(jobs: list[Job]) -> list[tuple[str, int]]:
    return [(f"{j.id} · {j.kind} · {j.status}", j.id) for j in jobs]


def sweep_events_figure(events: list[dict[str, Any]]):
    """FIRST's temperature sweep as it fills: one ``sweep`` event per temperature tried."""
    df = pd.DataFrame([{"temperature": e["value"], "ece": e["ece"], "nll": e["nll"]} for e in events])
    df = df.sort_values("temperature")
    best_ece = float(df.loc[df["ece"].idxmin(), "temperature"])
    best_nll = float(df.loc[df["nll"].idxmin(), "temperature"])
    return sweep_figure(df, best_ece, best_nll)


class JobView(NamedTuple):
    text: str  # status, progress, what went wrong
    events: list[dict[str, Any]]
    activity: str
    config: str


def job_view(ctx: LabContext, job_id: Optional[int]) -> JobView:
    """One job as its page shows it, from the store and its run directory."""
    if job_id is None:
        return JobView("Pick a job.", [], "", "")
    try:
        job = ctx.store.get(int(job_id))
    except (KeyError, ValueError):
        return JobView(f"No job {job_id}.", [], "", "")
    events = ctx.events.events(job.run_dir)
    p = progress(events) if job.status == "running" else None
    lines = [f"### Job {job.id} · {job.kind} · **{job.status}**",
             f"Elapsed {format_seconds(job.elapsed()) or '–'}" + (f" · {p.text}" if p else "")
             + (f" · GPUs {job.devices}" if job.devices else "") + f" · run directory `{job.run_dir}`"]
    if job.status == "failed" and job.error:
        lines.append(error(f"What went wrong: {job.error}"))
    return JobView("\n\n".join(lines), events, activity(events, job.run_dir), job.config)


def job_figures(events: list[dict[str, Any]]) -> tuple[Any, Any]:
    """The training curves and FIRST's temperature sweep, where the events have them (else None)."""
    training = training_figure(events, "") if any("loss" in e for e in events) else None
    sweeps = [e for e in events if e.get("stage") == "sweep"]
    return training, sweep_events_figure(sweeps) if sweeps else None


def activity(events: list[dict[str, Any]], run_dir: Optional[str]) -> str:
    """What the job said: its stage changes, messages and warnings (events), then its log's tail."""
    said = [f"{time.strftime('%H:%M:%S', time.localtime(e['time']))}  {e['stage']}: {e.get('message') or e.get('name', '')}"
            for e in events if e.get("stage") in ACTIVITY_STAGES][-ACTIVITY_LINES:]
    tail = log_tail(run_dir, LOG_LINES)
    return "\n".join(said) + (f"\n\n--- {LOG_FILE} ---\n{tail}" if tail.strip() else "")


def refresh_all(ctx: LabContext, current: Optional[int]):
    """The table, the picker's choices (with nothing picked yet, the running or newest job) and the banner."""
    jobs = ctx.store.list()
    choices = _choices(jobs)
    if current is None and jobs:
        running = [j.id for j in jobs if j.status == "running"]
        picker = gr.update(choices=choices, value=running[0] if running else max(j.id for j in jobs))
    else:
        picker = gr.update(choices=choices)
    return jobs_table(ctx, jobs), picker, scheduler_banner(ctx.store)


def show(ctx: LabContext, job_id: Optional[int]):
    """Everything the job's panel shows: text, curves, activity, config, and how many events were drawn."""
    view = job_view(ctx, job_id)
    return view.text, *job_figures(view.events), view.activity, view.config, len(view.events)


def poll(ctx: LabContext, job_id: Optional[int], n_seen: int):
    """As :func:`show`, but the plots stay as drawn while no new event came (no recomputation, no flicker)."""
    if job_id is None:
        return (gr.skip(),) * 6
    view = job_view(ctx, job_id)
    if len(view.events) == n_seen:
        return view.text, gr.skip(), gr.skip(), view.activity, gr.skip(), n_seen
    return view.text, *job_figures(view.events), view.activity, view.config, len(view.events)


def cancel_job(ctx: LabContext, job_id: Optional[int]) -> str:
    if job_id is None:
        return error("Pick a job first.")
    job = cancel(ctx.store, int(job_id), grace=5.0)
    return f"Job {job.id} is now {job.status}."


def clone_job(ctx: LabContext, job_id: Optional[int]) -> str:
    if job_id is None:
        return error("Pick a job first.")
    job = ctx.store.clone(int(job_id))
    return ok(f"Cloned as job {job.id}.")


# ---------------------------------------------------------------- layout and wiring
def build_jobs(ctx: LabContext) -> None:
    banner = gr.HTML(value=functools.partial(scheduler_banner, ctx.store), elem_id="scheduler-banner")
    table = gr.Dataframe(value=functools.partial(jobs_table, ctx), label="Jobs (live)", elem_id="jobs-table",
                         interactive=False)
    with gr.Row():
        picked = gr.Dropdown(_choices(ctx.store.list()), label="Job", elem_id="job-picker", scale=4)
        cancel_btn = gr.Button("Cancel", variant="stop", scale=1)
        clone_btn = gr.Button("Clone (run again)", scale=1)
    action = gr.HTML()
    status = gr.Markdown(elem_id="job-status")
    with gr.Row():
        training = gr.Plot(label="Training: loss per step, validation ECE / accuracy per epoch")
        sweep = gr.Plot(label="Temperature sweep")
    log = gr.Code(label=f"Activity: stages and messages, then the end of {LOG_FILE}", language=None, interactive=False)
    with gr.Accordion("Config", open=False):
        config = gr.Code(language="yaml", interactive=False)
    seen = gr.State(0)  # number of events already drawn for the picked job

    outputs = [status, training, sweep, log, config, seen]
    picked.change(functools.partial(show, ctx), inputs=picked, outputs=outputs)
    cancel_btn.click(functools.partial(cancel_job, ctx), inputs=picked, outputs=action)
    clone_btn.click(functools.partial(clone_job, ctx), inputs=picked, outputs=action)
    timer = gr.Timer(POLL_S)
    timer.tick(functools.partial(refresh_all, ctx), inputs=picked, outputs=[table, picked, banner])
    timer.tick(functools.partial(poll, ctx), inputs=[picked, seen], outputs=outputs)
