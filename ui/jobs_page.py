"""Jobs: the live queue and one job's page (progress, curves, log, cancel, clone, what went wrong).

Everything shown is read from the job store and the run directory, never from this session's
memory, so another tab or a restarted server shows the same state. The two-second poll reads
only events appended since the last poll (:class:`ui.progress.EventCache`) and redraws the
curves only when there are new ones.
"""
from __future__ import annotations

import functools
import hashlib
import time
from typing import Any, NamedTuple, Optional

import gradio as gr
import pandas as pd

from jobs.failures import log_tail
from jobs.scheduler import cancel
from jobs.store import HEARTBEAT_STALE_S, RESUMABLE, Job, JobStore
from lab.core.config import ConfigError
from lab.core.layout import LOG_FILE
from lab.results import predictions, run_metrics, runs
from lab.training.estimates import MEMORY_EVENT
from ui.context import LabContext
from ui.job_results import NOTHING, job_results
from ui.messages import error, note, ok, server_free
from ui.plots.curves import sweep_figure
from ui.plots.training import training_figure
from ui.progress import format_seconds, progress

POLL_S = 2.0
JOB_COLUMNS = ["id", "kind", "status", "progress", "elapsed", "ETA", "runs on", "error"]
ACTIVITY_STAGES = ("start", "stage", "resumed", "log", "warning", "stopped", "done")  # events the activity log lists
ACTIVITY_LINES = 40
LOG_LINES = 20
CANCELLABLE = ("queued", "running")  # what Cancel can stop; any other job has ended
WENT_WRONG = ("failed", "interrupted")  # ended by a fault, not by the user: its error is one
UNREAD: Any = object()  # a handler's job row not read yet (None: read, and there is no such job)


# ---------------------------------------------------------------- handlers
def jobs_table(ctx: LabContext, jobs: Optional[list[Job]] = None) -> pd.DataFrame:
    """The queue: queued jobs in order, then the rest newest first, with progress for running ones."""
    rows = []
    for job in ctx.store.list() if jobs is None else jobs:
        p = progress(ctx.events.events(job.run_dir)) if job.status == "running" else None
        waits = job.waits_for if job.status == "queued" else []
        waiting = f"waits for job {', '.join(map(str, waits))}" if waits else ""
        rows.append([job.id, job.kind, job.status,
                     p.text if p else ("done" if job.status == "succeeded" else waiting),
                     format_seconds(job.elapsed()), format_seconds(p.eta_s) if p else "", job.devices or "",
                     server_free(job.error, ctx.roots) if job.status in WENT_WRONG else ""])
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


def job_view(ctx: LabContext, job_id: Optional[int], job: Any = UNREAD) -> JobView:
    """One job as its page shows it, from the store and its run directory. ``job``: its store row as
    the caller read it, once for the whole poll (None: there is no such job); left out, read here."""
    if job_id is None:
        return JobView("Pick a job.", [], "", "")
    if job is UNREAD:
        job = _job(ctx, job_id)
    if job is None:
        return JobView(f"No job {job_id}.", [], "", "")
    events = ctx.events.events(job.run_dir)
    p = progress(events) if job.status == "running" else None
    lines = [f"### Job {job.id} · {job.kind} · **{job.status}**",
             f"Elapsed {format_seconds(job.elapsed()) or '–'}" + (f" · {p.text}" if p else "")
             + (f" · runs on {job.devices}" if job.devices else "") + f" · run directory `{server_free(job.run_dir, ctx.roots)}`"]
    if job.status == "queued" and job.waits_for:
        lines.append(note(waiting_for(ctx, job.waits_for)))
    memory = [e["message"] for e in events if e.get("stage") == MEMORY_EVENT and e.get("message")]
    if memory:  # the training stage's own estimate, at its longest example (docs/jobs.md, "Memory and disk")
        lines.append(f"Memory (estimate): {memory[-1]}")
    if job.status in WENT_WRONG and job.error:
        lines.append(error(f"What went wrong: {server_free(job.error, ctx.roots)}"))
    elif job.error:  # a cancellation's reason ("stopped by request"): said, not as an error
        lines.append(note(f"{job.status.capitalize()}: {server_free(job.error, ctx.roots)}"))
    return JobView("\n\n".join(lines), events, activity(events, job.run_dir), job.config)


def waiting_for(ctx: LabContext, ids: list[int]) -> str:
    """Why a queued job has not started: the earlier stages it waits for (a chain, docs/jobs.md), each
    with its kind and status as the store has them now."""
    found = [(i, _job(ctx, i)) for i in ids]
    named = [f"job {i} ({j.kind}, {j.status})" if j else f"job {i} (gone)" for i, j in found]
    return f"Waits for {', '.join(named)}: it starts once {'it has' if len(ids) == 1 else 'they have all'} succeeded."


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


def default_job(jobs: list[Job]) -> Optional[int]:
    """The job a page opens on: the running one (the newest, if several), else the newest."""
    running = [j.id for j in jobs if j.status == "running"]
    return max(running) if running else (max(j.id for j in jobs) if jobs else None)


def _digest(value: Any) -> str:
    text = value.to_json() if isinstance(value, pd.DataFrame) else repr(value)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _if_changed(value: Any, key: str, sent: dict[str, str]) -> Any:
    """``value``, or gr.skip() when the browser already shows it (``sent`` remembers what it was sent)."""
    digest = _digest(value)
    if sent.get(key) == digest:
        return gr.skip()
    sent[key] = digest
    return value


def refresh_all(ctx: LabContext, current: Optional[int], sent: Optional[dict[str, str]] = None,
                jobs: Optional[list[Job]] = None):
    """The table, the picker (with nothing picked yet, on the running or newest job) and the banner,
    each only when it changed since the last poll; and what was sent. ``jobs``: the store's list as
    this poll read it (else read here)."""
    sent = dict(sent or {})
    jobs = ctx.store.list() if jobs is None else jobs
    choices = _choices(jobs)
    table = _if_changed(jobs_table(ctx, jobs), "table", sent)
    if current is None and jobs:
        picker = gr.update(choices=choices, value=default_job(jobs))
        sent["choices"] = _digest(choices)
    elif sent.get("choices") == _digest(choices):
        picker = gr.skip()
    else:
        picker = gr.update(choices=choices)
        sent["choices"] = _digest(choices)
    return table, picker, _if_changed(scheduler_banner(ctx.store), "banner", sent), sent


def _results_outputs(ctx: LabContext, job: Optional[Job]) -> tuple[Any, ...]:
    """The results panel: text, figure, table (each hidden when empty), the run for the links and
    the rename box, and whether those show."""
    found = job_results(ctx.runs, job.kind, job.run_dir) if job else NOTHING
    return (found.text, gr.update(value=found.figure, visible=found.figure is not None, label=found.figure_label),
            gr.update(value=found.table, visible=found.table is not None), found.run,
            gr.update(visible=found.run is not None))


def _figure_outputs(events: list[dict[str, Any]]) -> tuple[Any, Any]:
    training, sweep = job_figures(events)
    return (gr.update(value=training, visible=training is not None),
            gr.update(value=sweep, visible=sweep is not None))


def temperature_link(ctx: LabContext, name: Any) -> Any:
    """"Open in the Temperature lab" only for a run the lab can rescale: not a token-level run (task
    clm or facts) evaluated before it kept the log-partition over the vocabulary (``temperature_grid``)."""
    run = runs.evaluation(ctx.runs, name)
    metrics = (run_metrics.read_metrics(run.path) or {}) if run else {}
    return gr.update(visible=metrics.get("task") not in predictions.TOKEN_TASKS or "temperature_grid" in metrics)


def job_controls(job: Optional[Job]) -> tuple[Any, Any]:
    """Cancel and Resume as the job's status allows them: Cancel (red) only while it is queued or
    running, Resume only once it ended without finishing (:data:`jobs.store.RESUMABLE`); a button
    that could only be refused is not offered."""
    live = job is not None and job.status in CANCELLABLE
    return (gr.update(interactive=live, variant="stop" if live else "secondary"),
            gr.update(interactive=job is not None and job.status in RESUMABLE))


def show(ctx: LabContext, job_id: Optional[int], sent: Optional[dict[str, str]] = None):
    """Everything the job's panel shows, drawn afresh (a job was picked), and what was sent."""
    job = _job(ctx, job_id)  # the one read of its row
    view = job_view(ctx, job_id, job)
    sent = {**(sent or {}), "job": str(job_id), "events": str(len(view.events)), "status": job.status if job else "",
            "activity": _digest(view.activity)}
    return (view.text, *_results_outputs(ctx, job), *_figure_outputs(view.events), view.activity, view.config,
            *job_controls(job), sent)


def poll(ctx: LabContext, job_id: Optional[int], sent: Optional[dict[str, str]] = None, job: Any = UNREAD):
    """As :func:`show`, but only what changed: the results and plots are redrawn when new events
    came or the status changed, the activity when it grew, Cancel and Resume when the status changed.
    ``job``: the job's store row as this poll read it (None: no such job); left out, read here, once."""
    sent = dict(sent or {})
    if job_id is None or sent.get("job") != str(job_id):
        return (gr.skip(),) * 13
    if job is UNREAD:
        job = _job(ctx, job_id)
    view = job_view(ctx, job_id, job)
    status = job.status if job else ""
    activity = _if_changed(view.activity, "activity", sent)
    if sent.get("events") == str(len(view.events)) and sent.get("status") == status:
        return (view.text,) + (gr.skip(),) * 7 + (activity,) + (gr.skip(),) * 3 + (sent,)
    controls = job_controls(job) if sent.get("status") != status else (gr.skip(), gr.skip())
    sent.update(events=str(len(view.events)), status=status)
    return (view.text, *_results_outputs(ctx, job), *_figure_outputs(view.events), activity, gr.skip(), *controls,
            sent)


def tick(ctx: LabContext, job_id: Optional[int], listed: Optional[dict[str, str]], drawn: Optional[dict[str, str]]):
    """One poll of the whole page (one request, not two): the list, then the picked job. The store
    is read once: the picked job's row is the list's (a job not in it is gone)."""
    jobs = ctx.store.list()
    return (*refresh_all(ctx, job_id, listed, jobs), *poll(ctx, job_id, drawn, _listed(jobs, job_id)))


def _listed(jobs: list[Job], job_id: Optional[int]) -> Optional[Job]:
    """The row of ``job_id`` in the store's list (None: not a job there)."""
    try:
        wanted = int(job_id)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return next((job for job in jobs if job.id == wanted), None)


def _job(ctx: LabContext, job_id: Optional[int]) -> Optional[Job]:
    try:
        return ctx.store.get(int(job_id)) if job_id is not None else None
    except (KeyError, ValueError):
        return None


def cancel_job(ctx: LabContext, job_id: Optional[int]) -> str:
    if job_id is None:
        return error("Pick a job first.")
    job = _job(ctx, job_id)
    if job is not None and job.status not in CANCELLABLE:  # a page that had not caught up yet
        return error(f"Job {job.id} is {job.status}: nothing to cancel.")
    job = cancel(ctx.store, int(job_id), grace=5.0)
    return f"Job {job.id} is now {job.status}."


def clone_job(ctx: LabContext, job_id: Optional[int]) -> str:
    if job_id is None:
        return error("Pick a job first.")
    try:
        job = ctx.store.clone(int(job_id), roots=ctx.roots)  # checked as a fresh submit is
    except (KeyError, ConfigError) as e:
        return error(str(e.args[0] if e.args else e))
    return ok(f"Cloned as job {job.id}.")


def resume_job(ctx: LabContext, job_id: Optional[int]) -> str:
    if job_id is None:
        return error("Pick a job first.")
    try:
        job = ctx.store.resume(int(job_id), roots=ctx.roots)
    except (KeyError, ValueError) as e:
        return error(str(e.args[0] if e.args else e))
    return ok(f"Job {job.id} queued again; it continues from what its run directory holds.")


def rename_run(ctx: LabContext, name: Optional[str], label: Optional[str]) -> str:
    """Give the job's evaluation a name of the user's (empty: back to the generated one)."""
    run = runs.evaluation(ctx.runs, name)
    if run is None:
        return error("This job has no evaluation to name.")
    try:
        given = runs.write_label(run.path, label or "")
    except OSError as e:
        return error(f"Cannot rename: {e}")
    return ok(f"Renamed to: {given}" if given else "The run is named for what it is again.")


def rename_and_redraw(ctx: LabContext, job_id: Optional[int], name: Optional[str],
                      label: Optional[str]) -> tuple[Any, ...]:
    """Rename, then the results panel again (:func:`_results_outputs`), so that its `Run:` line and
    the diagram's title say the new name at once rather than at the next status change."""
    return (rename_run(ctx, name, label), *_results_outputs(ctx, _job(ctx, job_id)))


# ---------------------------------------------------------------- layout and wiring
class JobLinks(NamedTuple):
    """What the app wires to other pages: the picked job's evaluation and the buttons that open it."""

    run: gr.State
    buttons: dict[str, gr.Button]  # page id → its "open this run" button


class _Panel(NamedTuple):
    outputs: list[Any]  # what show/poll fill, in order: text, figure, table, run, links row
    links: JobLinks
    label: gr.Textbox
    rename: gr.Button
    renamed: gr.HTML  # what the rename did, under its button


def _results_panel(ctx: LabContext) -> _Panel:
    results = gr.Markdown(elem_id="job-results")
    figure = gr.Plot(visible=False, label="Reliability", elem_id="job-figure")
    table = gr.Dataframe(visible=False, interactive=False, label="Answers")
    run = gr.State(None)
    with gr.Row(visible=False) as links:
        temperature = gr.Button("Open in the Temperature lab", elem_id="job-open-temperature", scale=1)
        cases = gr.Button("Open in Case studies", elem_id="job-open-cases", scale=1)
        label = gr.Textbox(label="Name this run (empty: named for what it is)", scale=2, elem_id="job-run-label")
        with gr.Column(scale=1):
            rename = gr.Button("Rename", elem_id="job-rename")
            renamed = gr.HTML(elem_id="job-renamed")
    run.change(functools.partial(temperature_link, ctx), inputs=run, outputs=temperature, show_progress="hidden")
    return _Panel([results, figure, table, run, links], JobLinks(run, {"temperature": temperature, "cases": cases}),
                  label, rename, renamed)


def build_jobs(ctx: LabContext) -> JobLinks:
    # Filled when the tab is opened (the app runs the page's poll then: ui.app.poll_when_shown), not as the app loads.
    banner = gr.HTML(elem_id="scheduler-banner")
    table = gr.Dataframe(value=jobs_table(ctx, []), label="Jobs (live)", elem_id="jobs-table", interactive=False)
    with gr.Row():
        picked = gr.Dropdown([], value=None, label="Job", elem_id="job-picker", scale=4)
        cancel_btn = gr.Button("Cancel", variant="stop", scale=1)
        clone_btn = gr.Button("Clone (run again)", scale=1)
        resume_btn = gr.Button("Resume", scale=1, elem_id="job-resume")
    action = gr.HTML()
    status = gr.Markdown(elem_id="job-status")
    panel = _results_panel(ctx)
    with gr.Row():
        training = gr.Plot(label="Training: loss per step, validation ECE / accuracy per epoch", visible=False,
                           elem_id="job-training")
        sweep = gr.Plot(label="Temperature sweep", visible=False)
    log = gr.Code(label=f"Activity: stages and messages, then the end of {LOG_FILE}", language=None, interactive=False)
    with gr.Accordion("Config", open=False):
        config = gr.Code(language="yaml", interactive=False)
    listed, drawn = gr.State({}), gr.State({})  # what the browser was last sent: the list, the picked job

    outputs = [status, *panel.outputs, training, sweep, log, config, cancel_btn, resume_btn, drawn]
    picked.change(functools.partial(show, ctx), inputs=[picked, drawn], outputs=outputs, show_progress="hidden")
    picked.change(lambda: "", outputs=panel.renamed, queue=False, show_progress="hidden")  # it was another job's
    cancel_btn.click(functools.partial(cancel_job, ctx), inputs=picked, outputs=action)
    clone_btn.click(functools.partial(clone_job, ctx), inputs=picked, outputs=action)
    resume_btn.click(functools.partial(resume_job, ctx), inputs=picked, outputs=action)
    panel.rename.click(functools.partial(rename_and_redraw, ctx), inputs=[picked, panel.links.run, panel.label],
                       outputs=[panel.renamed, *panel.outputs])
    timer = gr.Timer(POLL_S, active=False)
    timer.tick(functools.partial(tick, ctx), inputs=[picked, listed, drawn],
               outputs=[table, picked, banner, listed, *outputs], show_progress="hidden")
    return panel.links
