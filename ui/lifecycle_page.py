"""Life cycle: a series' ECE and accuracy along its axis (parameters, training steps, alignment stages
or training seeds), one panel per task, as the alignment-calibration paper's Figures 3–5.

Drawn from the series' ``series.json`` (:mod:`lab.results.series`), which its job rewrites after every
cell: the page re-reads it while the series runs and draws the cells done so far. A chain of runs (a
pipeline's base → SFT → DPO, jobs linked by ``run:<id>``) whose stages were evaluated on one task is
listed beside the series and drawn the same way over its stages, its table built from the run folders
(:mod:`lab.results.stages`): one run per stage, so no interval over seeds. Each run carries
its bootstrap interval over questions; where training seeds repeat a point, their mean carries a
Student-t interval over seeds. A row of the cells table picks that cell's evaluation, which "Open in
Reliability" opens there (the app wires the button to the Reliability tab); the cells download as
series.csv. Every name and row index the browser sends is checked against the series on the server.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, NamedTuple, Optional

import gradio as gr
import pandas as pd

from lab.core import stored
from lab.core.files import files_stamp
from lab.core.layout import SERIES_CSV, SERIES_FILE
from lab.results import runs, series, stages
from lab.results.reports import csv_text, pct
from ui.components import export, run_picker
from ui.context import LabContext
from ui.messages import STORE_FAULTS, error, note, ok
from ui.plots.lifecycle import lifecycle_figure, params_label, with_interval

REDRAW_S = 3.0  # how soon a running series' new cells appear
LIVE = ("queued", "running")
INTRO = ("How calibration changes along a model's life: with its size, its pre-training steps, its alignment "
         "stages, or its training seed. Top row: ECE (how far confidence is from accuracy); bottom row: accuracy. "
         "Each marker is one run with its 95 % bootstrap interval over questions; where seeds repeat a point, the "
         "dark line is their mean with a 95 % t-interval over seeds, shown as computed: over two or three seeds it can "
         "pass 0 % or 100 %, and the axes widen to hold it. Click a marker, or select a row of the cells table, to "
         "open that run in Reliability. A chain of runs (a pipeline's base → SFT → DPO, or jobs linked by `run:<id>`) is "
         "listed too once two of its stages are evaluated on the same task, drawn over its stages.")
NO_SERIES = ("No series yet, and no chain of runs with two stages evaluated on the same task. A series evaluates a "
             "list of models on a list of tasks: run `python -m lab run examples/series-scale-quick.yaml`, or fill in "
             "the Launch page's series tab. A pipeline such as examples/pipeline-quick.yaml (base → SFT → DPO) "
             "appears here by itself: its SFT and DPO stages evaluate their calibration tasks before and after "
             "training.")
ONE_RUN = ("One run per stage (1 seed): each marker's bars are its 95 % bootstrap interval over questions; there is "
           "no interval over seeds.")
CELL_COLUMNS = ["task", "x", "point", "n", "accuracy (95% CI)", "ECE (95% CI)", "oracle ECE", "run"]
SUMMARY_COLUMNS = ["task", "x", "runs", "accuracy mean (95% t-interval)", "ECE mean (95% t-interval)"]
CELL_WIDTHS = ["170px", "110px", "120px", "60px", "190px", "190px", "90px", "280px"]
# gr.Plot has no click event (gradio 6: change only), so the browser listens for plotly's own
# plotly_click on the drawn figure, whose run markers carry their cell's run as customdata
# (ui.plots.lifecycle.lifecycle_figure), and types that run into a hidden box; the box's input event picks the
# cell on the server as a row of the table does, then the Open button (enabled only if it was picked)
# is clicked. The figure is redrawn as a series runs: the listener is bound again to each new plot.
CLICK_JS = """() => {
    const send = (data) => {
        const run = data && data.points && data.points.length ? data.points[0].customdata : null;
        const box = document.querySelector('#lifecycle-clicked textarea, #lifecycle-clicked input');
        if (typeof run !== 'string' || !box) return;
        box.value = run + '\\t' + Date.now();  // the time: a second click on the same marker is an input too
        box.dispatchEvent(new Event('input', {bubbles: true}));
    };
    const bind = () => {
        const plot = document.querySelector('#lifecycle-plot .js-plotly-plot');
        if (plot && plot.on && plot.__labClick !== plot._ev) {
            plot.on('plotly_click', send);
            plot.__labClick = plot._ev;  // plotly replaces its emitter when it purges a plot: bind again then
        }
    };
    new MutationObserver(bind).observe(document.body, {childList: true, subtree: true});
    bind();
}"""
OPEN_JS = "() => { const b = document.querySelector('#lifecycle-open'); if (b && !b.disabled) b.click(); }"


class LifecycleLink(NamedTuple):
    """What the app wires to Reliability: the button, and the evaluation of the row the user selected."""

    button: gr.Button
    run: gr.State


# ---------------------------------------------------------------- handlers
def _x_text(axis: str, x: Any) -> str:
    return params_label(x) if axis == "params" and isinstance(x, (int, float)) else ("–" if x is None else str(x))


def _task_labels(doc: dict[str, Any]) -> dict[str, str]:
    return {str(t.get("key")): str(t.get("label") or t.get("key")) for t in doc["tasks"] if isinstance(t, dict)}


def cells_table(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per cell, in the order of ``doc["cells"]`` (a selected row's index is its cell's); the x
    column is named for the axis."""
    labels = _task_labels(doc)
    rows = [[labels.get(c["task"], c["task"]), _x_text(doc["axis"], c.get("x")),
             " · ".join(str(p) for p in (c.get("point"), c.get("stage")) if p), c.get("n"),
             with_interval(c.get("accuracy"), c.get("accuracy_low"), c.get("accuracy_high")),
             with_interval(c.get("ece"), c.get("ece_low"), c.get("ece_high")),
             pct(c.get("oracle_ece"), percent_sign=True), c.get("run")] for c in doc["cells"]]
    return pd.DataFrame(rows, columns=[doc["axis_title"] if col == "x" else col for col in CELL_COLUMNS])


def summary_table(doc: dict[str, Any]) -> Optional[pd.DataFrame]:
    """The means over seeds per task and x, or None when no x has more than one run (nothing to average)."""
    if not any((row.get("runs") or 0) > 1 for row in doc["summary"]):
        return None
    labels = _task_labels(doc)
    rows = [[labels.get(r["task"], r["task"]), _x_text(doc["axis"], r["x"]), r["runs"],
             with_interval(r["accuracy_mean"], r["accuracy_low"], r["accuracy_high"]),
             with_interval(r["ece_mean"], r["ece_low"], r["ece_high"])] for r in doc["summary"]]
    return pd.DataFrame(rows, columns=[doc["axis_title"] if col == "x" else col for col in SUMMARY_COLUMNS])


def read_series(directory: Path, name: Optional[str] = None) -> Optional[dict[str, Any]]:
    """``series.json`` as :func:`lab.results.series.read` gives it (cells it cannot draw left out and
    named in ``problems``), or None when it cannot be drawn: absent, damaged, too large or deep."""
    try:
        doc = series.read(directory, name)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return None if doc is None else {**doc, "axis_title": series.AXES[doc["axis"]]}


def _why(directory: Path, name: str) -> str:
    """Why ``series.json`` did not read as a series table, in a few words naming no server path."""
    try:
        stored.read_object(directory / SERIES_FILE, f"{name}/{SERIES_FILE}")
    except OSError as e:
        return e.strerror or type(e).__name__
    except ValueError as e:
        return str(e).removeprefix(f"{name}/{SERIES_FILE}: ")
    return "not a series table: it needs an axis, tasks and cells"


def live_series_jobs(ctx: LabContext) -> list[Any]:
    """The series jobs queued or running (none when the job store cannot be read right now)."""
    try:
        return [job for job in ctx.store.list(LIVE) if job.kind == "series"]
    except STORE_FAULTS:
        return []


def running(ctx: LabContext, directory: Path) -> bool:
    """Whether a job of the store still writes into ``directory``."""
    here = os.path.realpath(directory)
    return any(job.run_dir and os.path.realpath(job.run_dir) == here for job in live_series_jobs(ctx))


def version(ctx: LabContext, directory: Optional[Path]) -> Optional[str]:
    """What changes when the drawing must: the series' files rewritten, or its job ending."""
    if directory is None:
        return None
    return json.dumps([files_stamp(directory / name for name in (SERIES_FILE, SERIES_CSV)), running(ctx, directory)])


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:80] or "series"


def _download(ctx: LabContext, directory: Path, name: str) -> Any:
    """series.csv, copied where the server may hand it to the browser (``<runs>/exports``)."""
    if not (directory / SERIES_CSV).is_file():
        return gr.update(visible=False)
    try:
        return export(ctx, f"series-{_slug(name)}.csv", lambda target: shutil.copyfile(directory / SERIES_CSV, target))
    except OSError:  # removed meanwhile, or exports/ not writable: the rest of the page still draws
        return gr.update(visible=False)


def choices(root: Path) -> list[tuple[str, str]]:
    """What the picker lists: every series, then every chain of runs drawn over its stages, each newest first."""
    return [*runs.series_choices(root), *stages.chain_choices(root)]


def chain_jobs_live(ctx: LabContext, chain: stages.Chain) -> list[Any]:
    """The jobs of ``chain`` queued or running (none when the job store cannot be read right now)."""
    try:
        live = {os.path.realpath(job.run_dir): job for job in ctx.store.list(LIVE) if job.run_dir}
    except STORE_FAULTS:
        return []
    base = os.path.realpath(ctx.runs)
    return [live[path] for folder in chain.doc["folders"] if (path := os.path.join(base, folder)) in live]


def chain_version(ctx: LabContext, chain: stages.Chain) -> str:
    """What changes when a chain's drawing must: its cells (a stage evaluated, or evaluated again) or a job
    of it ending."""
    cells = [[c["run"], c["n"], c["accuracy"], c["ece"]] for c in chain.doc["cells"]]
    return json.dumps([cells, [job.id for job in chain_jobs_live(ctx, chain)]])


def chain_view(ctx: LabContext, chain: stages.Chain):
    """:func:`series_view` of a chain of runs: its stages as a series over stages, its cells as CSV."""
    live = chain_jobs_live(ctx, chain)
    said = note(ONE_RUN) + (note(f"Job {live[0].id} ({live[0].kind}) of this chain is {live[0].status}: its "
                                 "evaluations are drawn as they finish.") if live else "")
    try:
        text = csv_text(series.cells_frame(chain.doc)).encode("utf-8")
        download = export(ctx, f"stages-{_slug(chain.name.removeprefix(stages.CHAIN))}.csv",
                          lambda target: target.write_bytes(text))
    except OSError:  # exports/ not writable: the rest of the page still draws
        download = gr.update(visible=False)
    return (lifecycle_figure(chain.doc), cells_table(chain.doc), gr.update(value=None, visible=False), said, download,
            chain_version(ctx, chain))


def series_view(ctx: LabContext, name: Any):
    """(figure, cells table, summary table, message, download, version) of the series picked."""
    empty = pd.DataFrame(columns=CELL_COLUMNS)
    nothing = gr.update(value=None, visible=False)
    if stages.is_chain(name):
        chain = stages.chain(ctx.runs, name)
        if chain is not None:
            return chain_view(ctx, chain)
        return (None, empty, nothing, error(f"No chain of runs called {name[:100]!r} here (any more): pick one from "
                                            "the list."), gr.update(visible=False), None)
    directory = runs.series_dir(ctx.runs, name) if name else None
    if directory is None:
        if name:
            said = error(f"No series called {str(name)[:100]!r} here: pick one from the list.")
        elif choices(ctx.runs):
            said = "Pick a series or a chain of runs."
        else:
            jobs = live_series_jobs(ctx)
            said = note(NO_SERIES) + (note(f"Series job {jobs[0].id} is {jobs[0].status}: it appears here when "
                                           "its first cell is done.") if jobs else "")
        return None, empty, nothing, said, gr.update(visible=False), None
    doc = read_series(directory, name)
    if doc is None:
        return (None, empty, nothing, error(f"{name}/{SERIES_FILE} cannot be read ({_why(directory, name)}): "
                                            "rerun or resume the series job to rewrite it."),
                gr.update(visible=False), version(ctx, directory))
    said = error(stored.summary(doc["problems"])) if doc["problems"] else ""
    if running(ctx, directory):
        said += note(f"This series is still running: {len(doc['cells'])} cells so far, drawn as each one finishes.")
    elif not doc["cells"]:
        said += note("This series has no finished cell yet.")
    summary = summary_table(doc)
    return (lifecycle_figure(doc), cells_table(doc), gr.update(value=summary, visible=summary is not None), said,
            _download(ctx, directory, name), version(ctx, directory))


def redraw(ctx: LabContext, name: Any, drawn: Optional[str]):
    """:func:`series_view` when the series or chain changed since ``drawn`` (its version), else nothing sent."""
    if stages.is_chain(name):
        chain = stages.chain(ctx.runs, name)
        return (gr.skip(),) * 6 if chain is None or chain_version(ctx, chain) == drawn else chain_view(ctx, chain)
    directory = runs.series_dir(ctx.runs, name) if name else None
    if directory is None or version(ctx, directory) == drawn:
        return (gr.skip(),) * 6
    return series_view(ctx, name)


def _row_index(index: Any) -> Optional[int]:
    """The row of a table selection (gradio sends [row, column]); None for anything else."""
    row = index[0] if isinstance(index, (list, tuple)) and index else index
    return row if isinstance(row, int) and not isinstance(row, bool) else None


def picked_table(ctx: LabContext, name: Any) -> Optional[dict[str, Any]]:
    """The table of the series or chain picked, as the page drew it; None when there is none of that name."""
    if stages.is_chain(name):
        chain = stages.chain(ctx.runs, name)
        return chain.doc if chain is not None else None
    directory = runs.series_dir(ctx.runs, name) if name else None
    return read_series(directory, name) if directory is not None else None


def picked_cell(ctx: LabContext, name: Any, index: Any, row: Any = None):
    """(the evaluation's name, what the page says, the Open button) for the selected row of the cells
    table. The row's own run (its last column) wins when it is one of this series' cells, as it
    stays right after the user sorts the table; else the row index, within the series' cells."""
    doc = picked_table(ctx, name)
    cells = doc["cells"] if doc else []
    shown = row[-1] if isinstance(row, (list, tuple)) and row else None
    i = _row_index(index)
    cell = next((c for c in cells if shown is not None and c.get("run") == shown), None)
    if cell is None and i is not None and 0 <= i < len(cells):
        cell = cells[i]
    run = runs.evaluation(ctx.runs, cell.get("run")) if cell else None
    if run is None:
        said = error("That row's evaluation is not there (any more): pick a row of the table.") if cell else ""
        return None, said, gr.update(interactive=False)
    labels = _task_labels(doc)
    return (run.name, ok(f"Picked {cell.get('point')} × {labels.get(cell['task'], cell['task'])} ({run.name})."),
            gr.update(interactive=True))


def clicked_marker(ctx: LabContext, name: Any, sent: Any):
    """:func:`picked_cell` of the marker clicked on the plot: ``sent`` is its run and the time of the
    click, tab-separated; anything else picks nothing."""
    run = sent.split("\t", 1)[0] if isinstance(sent, str) else None
    return picked_cell(ctx, name, None, [run]) if run else (None, "", gr.update(interactive=False))


def empty_state(ctx: LabContext) -> Any:
    """What the page says as it opens with no series to pick: the picker then picks nothing, so its
    change, which draws the page (and says this), never fires. Nothing sent when there are series."""
    return gr.skip() if choices(ctx.runs) else series_view(ctx, None)[3]


def show_series(ctx: LabContext, name: Any):
    """Another series picked: drawn afresh, and the previous one's selected row forgotten."""
    return (*series_view(ctx, name), None, "", gr.update(interactive=False))


# ---------------------------------------------------------------- layout and wiring
def build_lifecycle(ctx: LabContext) -> LifecycleLink:
    gr.Markdown(INTRO)
    picker, _ = run_picker(ctx, "Series, or chain of runs over its stages", catalogue=choices,
                           elem_id="lifecycle-series")
    message = gr.HTML(elem_id="lifecycle-message")
    plot = gr.Plot(label="ECE and accuracy along the series (hover a marker: its model, n, intervals; click it: "
                         "Reliability)",
                   elem_id="lifecycle-plot")
    cells = gr.Dataframe(pd.DataFrame(columns=CELL_COLUMNS), interactive=False, wrap=True, max_height=420,
                         elem_id="lifecycle-cells",
                         label="Cells: one evaluation per model and task (select a row to open it in Reliability)",
                         column_widths=CELL_WIDTHS)
    with gr.Row():
        picked = gr.HTML(elem_id="lifecycle-picked")
        button = gr.Button("Open in Reliability", interactive=False, elem_id="lifecycle-open", scale=0, min_width=200)
        download = gr.DownloadButton("Download the cells (CSV)", visible=False, elem_id="lifecycle-csv", scale=0,
                                     min_width=240)
    summary = gr.Dataframe(interactive=False, wrap=True, visible=False, elem_id="lifecycle-summary",
                           label="Means over training seeds, with their 95 % Student-t interval")
    gr.on(None, functools.partial(empty_state, ctx), outputs=message, show_progress="hidden")
    run, drawn = gr.State(None), gr.State(None)
    view = [plot, cells, summary, message, download, drawn]
    picker.change(functools.partial(show_series, ctx), inputs=picker, outputs=[*view, run, picked, button],
                  show_progress="hidden")
    timer = gr.Timer(REDRAW_S, active=False)
    timer.tick(functools.partial(redraw, ctx), inputs=[picker, drawn], outputs=view, show_progress="hidden")

    def select_cell(name: Any, evt: gr.SelectData):
        """:func:`picked_cell` of the row selected. Not a partial: gradio finds the event's data by the
        annotation of the function it is given, and a partial's has none."""
        return picked_cell(ctx, name, evt.index, evt.row_value)

    cells.select(select_cell, inputs=picker, outputs=[run, picked, button], show_progress="hidden")
    clicked = gr.Textbox(elem_id="lifecycle-clicked", elem_classes=["lab-hidden"], container=False, max_lines=1)
    gr.on(None, None, js=CLICK_JS)
    clicked.change(functools.partial(clicked_marker, ctx), inputs=[picker, clicked], outputs=[run, picked, button],
                  show_progress="hidden").then(None, js=OPEN_JS)
    return LifecycleLink(button, run)
