"""Reliability: one run's diagram, or several side by side, and the position-wise top-k view.

Recomputed from each run's ``predictions.jsonl`` (:mod:`lab.analysis`) as the run reported it,
so the bins can be changed (equal-width, equal-mass, which end closed) without a model call.
Runs are named by their labels (:attr:`lab.runs.EvalRun.label`), never by folder.
"""
from __future__ import annotations

import functools
import html
import json
import re
from typing import Any, Optional

import gradio as gr
import plotly.graph_objects as go
from gradio.components.plot import PlotData

from lab import analysis, runs
from ui.components import AS_EVALUATED, bin_edges, binning, binning_radio, edges_radio, export, run_picker
from ui.context import LabContext
from ui.messages import error
from ui.plots import positionwise_figure, reliability_figure, side_by_side

MAX_SIDE_BY_SIDE = 6
VIEWS = ("reliability diagram", "position-wise top-k")
PNG_SCALE = 3  # the camera button saves the plot as shown at 3× its pixels: sharp in print and slides
NO_TOP_TOKENS = "No top-token data (only letter scoring keeps the top tokens; cloze runs do not) for: "


# ---------------------------------------------------------------- handlers
def reported_summary(ctx: LabContext, run: runs.EvalRun, n_bins: int, strategy: str,
                     edges: Optional[str] = AS_EVALUATED) -> dict[str, Any]:
    """The run's calibration as it reported it (after the temperature it applied, if any), its bins
    closed as it was evaluated unless ``edges`` (an edges radio's choice) names a convention."""
    pred = ctx.results.predictions(run)
    return analysis.calibration_summary(analysis.reported_probs(pred), pred.mask, pred.labels, n_bins, strategy,
                                        bin_edges(edges, pred.bin_edges))


def positionwise_view(ctx: LabContext, picked: list[runs.EvalRun]) -> tuple[go.Figure, str]:
    """Every picked run's position-wise top-k, and a note naming the runs that have none to draw."""
    tables = [(r.label, analysis.positionwise_topk(ctx.results.predictions(r))) for r in picked]
    missing = [label for label, table in tables if table.empty]
    return positionwise_figure(tables), (NO_TOP_TOKENS + html.escape("; ".join(missing)) + "." if missing else "")


def reliability_view(ctx: LabContext, names: Optional[list[str]], bins: Optional[str], view: str,
                     edges: Optional[str] = AS_EVALUATED):
    """(figure or None, message) for the picked runs (at most :data:`MAX_SIDE_BY_SIDE`)."""
    n_bins, strategy = binning(bins)
    picked = [r for r in (runs.evaluation(ctx.runs, n) for n in (names or [])[:MAX_SIDE_BY_SIDE]) if r]
    if not picked:
        return None, "Pick one or more evaluation runs."
    try:
        if view == VIEWS[1]:
            return positionwise_view(ctx, picked)
        summaries = [(r.label, reported_summary(ctx, r, n_bins, strategy, edges)) for r in picked]
    except (ValueError, OSError) as e:
        return None, error(str(e))
    figure = reliability_figure(summaries[0][1], summaries[0][0]) if len(summaries) == 1 else side_by_side(summaries)
    return figure, ""


def download_name(ctx: LabContext, names: Optional[list[str]], view: str) -> str:
    """A file name (no extension) for the figure: its view and the first run's label, as letters,
    digits and dashes (``reliability-00003-bundled-obqa-test-…``)."""
    first = runs.evaluation(ctx.runs, names[0]) if names else None
    stem = "position-wise-top-k" if view == VIEWS[1] else "reliability"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", first.label if first else "").strip("-").lower()[:80].rstrip("-")
    return f"{stem}-{slug}" if slug else stem


def camera_config(filename: str) -> dict[str, Any]:
    """Plotly's config: the modebar's camera button saves a PNG of the plot as shown, at
    :data:`PNG_SCALE` times its pixels, named ``filename`` (no server-side renderer needed)."""
    return {"toImageButtonOptions": {"format": "png", "filename": filename, "scale": PNG_SCALE},
            "displaylogo": False}


def for_browser(figure: Optional[go.Figure], filename: str) -> Optional[PlotData]:
    """``figure`` as gr.Plot sends it, plus a plotly config: its front end passes a ``config`` it
    finds in the figure's JSON on to plotly, which gr.Plot offers no other way to set."""
    if figure is None:
        return None
    data = json.loads(figure.to_json())
    return PlotData(type="plotly", plot=json.dumps({**data, "config": camera_config(filename)}))


def shown_view(ctx: LabContext, names: Optional[list[str]], bins: Optional[str], view: str,
               edges: Optional[str] = AS_EVALUATED):
    """:func:`reliability_view` for the page: the camera button saves a named full-resolution PNG."""
    figure, message = reliability_view(ctx, names, bins, view, edges)
    return for_browser(figure, download_name(ctx, names, view)), message


def export_view(ctx: LabContext, names: Optional[list[str]], bins: Optional[str], view: str,
                edges: Optional[str] = AS_EVALUATED):
    """The current figure as a self-contained HTML file to download (hidden when there is none):
    plotly.js is embedded (≈ 5 MB), so it opens offline, and its camera button saves a PNG too."""
    figure = reliability_view(ctx, names, bins, view, edges)[0]
    if figure is None:
        return gr.update(visible=False)
    filename = download_name(ctx, names, view)
    return export(ctx, f"{filename}.html", lambda target: figure.write_html(
        target, include_plotlyjs=True, full_html=True, config=camera_config(filename)))


# ---------------------------------------------------------------- layout and wiring
def build_reliability(ctx: LabContext) -> None:
    names, _ = run_picker(ctx, "Evaluation runs (several: side by side)", multiselect=True,
                          elem_id="reliability-runs")
    with gr.Row():
        bins = binning_radio()
        edges = edges_radio()
        view = gr.Radio(list(VIEWS), value=VIEWS[0], label="View")
    message = gr.HTML()
    plot = gr.Plot(label="Reliability: bars = accuracy per bin, red = over-confident gap, blue = under-confident "
                         "· the camera icon (top right, on hover) saves a full-resolution PNG")
    export_button = gr.Button("Export the plot as HTML (self-contained, opens offline)")
    exported = gr.File(label="Plot (HTML with plotly.js inside; for a PNG use the plot's camera icon)", visible=False)

    inputs = [names, bins, view, edges]
    for control in inputs:
        control.change(functools.partial(shown_view, ctx), inputs=inputs, outputs=[plot, message])
    export_button.click(functools.partial(export_view, ctx), inputs=inputs, outputs=exported)
