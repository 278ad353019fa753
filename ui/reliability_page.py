"""Reliability: one run's diagram, or several side by side; the position-wise top-k view; and how
much the ECE owes to its binning (ECE against 5–30 bins, equal-width and equal-mass, and smECE).

Recomputed from each run's ``predictions.jsonl`` (:mod:`lab.results.analysis`) as the run reported it,
so the bins can be changed (equal-width, equal-mass, which end closed) without a model call, and a
saved calibrator (:mod:`lab.calibration.calibrators`) can be applied to every run drawn: marked when it was
fitted on some of the same questions. A run of the controlled task (:mod:`lab.data.synthetic`) is
drawn beside the Bayes predictor on its questions. Every equal-width ECE carries its bootstrap interval, and a
run under :data:`lab.results.analysis.SMALL_N` questions is flagged. Runs are named by their labels
(:attr:`lab.results.runs.EvalRun.label`), never by folder.
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

from lab.calibration import calibrators
from lab.results import analysis, predictions, runs
from lab.results.tables import positionwise_topk
from ui.components import (AS_EVALUATED, bin_edges, binning, binning_radio, calibrator_picker, edges_radio, export,
                           picked_calibrator, run_picker)
from ui.context import LabContext
from ui.messages import error, note
from ui.plots.curves import robustness_figure
from ui.plots.questions import positionwise_figure
from ui.plots.reliability import reliability_figure, side_by_side

MAX_SIDE_BY_SIDE = 6
VIEWS = ("reliability diagram", "position-wise top-k", "ECE vs number of bins")
BOOT = 1000  # bootstrap replicates of each drawn ECE's interval (≈ 30 ms for 500 questions)
PNG_SCALE = 3  # the camera button saves the plot as shown at 3× its pixels: sharp in print and slides
NO_TOP_TOKENS = ("No top-token data (only letter scoring keeps the top tokens at the answer letter; cloze and "
                 "token-level runs do not) for: ")


# ---------------------------------------------------------------- handlers
def drawn_confidence(ctx: LabContext, run: runs.EvalRun,
                     calibrator: Optional[calibrators.Calibrator]) -> tuple[Any, Any, list[str]]:
    """(confidence, correct) of the run as it reported it, or after ``calibrator``; and the cautions
    to show: a calibrator fitted on some of these questions, a run too small for a steady ECE."""
    pred = ctx.results.predictions(run)
    if calibrator is None:  # as reported: a token-level run's own confidence and correctness per target
        return predictions.reported_confidence(pred), predictions.reported_correct(pred), cautions_of(run, pred, None)
    if predictions.is_token_run(pred):  # the prediction stays the top token: only its confidence is recalibrated
        _, conf = calibrators.apply(calibrator, pred.probs, pred.mask, pred.rows, logits=predictions.token_logits(pred))
        return conf, predictions.reported_correct(pred), cautions_of(run, pred, calibrator)
    choice, conf = calibrators.apply(calibrator, predictions.reported_probs(pred), pred.mask, pred.rows)
    return conf, choice == pred.labels, cautions_of(run, pred, calibrator)


def cautions_of(run: runs.EvalRun, pred: predictions.Predictions,
                calibrator: Optional[calibrators.Calibrator]) -> list[str]:
    """What to say beside a drawn run: a calibrator fitted on some of its questions, too few questions."""
    said = [calibrators.fitted_on_same(calibrator, pred.rows), analysis.small_sample_warning(len(pred.labels), predictions.is_token_run(pred))]
    return [f"{run.label}: {c}" for c in said if c]


def reported_summary(ctx: LabContext, run: runs.EvalRun, n_bins: int, strategy: str,
                     edges: Optional[str] = AS_EVALUATED,
                     calibrator: Optional[calibrators.Calibrator] = None) -> tuple[dict[str, Any], list[str]]:
    """The run's calibration as it reported it (after the temperature it applied, if any), or after
    a saved calibrator, its bins closed as it was evaluated unless ``edges`` (an edges radio's
    choice) names a convention; with the cautions of :func:`drawn_confidence`."""
    pred = ctx.results.predictions(run)
    closed = bin_edges(edges, pred.bin_edges)
    if calibrator is None:  # the whole summary (NLL, Brier, Trust) of the probabilities as reported
        return analysis.reported_summary(pred, n_bins, strategy, closed, BOOT), cautions_of(run, pred, None)
    conf, correct, cautions = drawn_confidence(ctx, run, calibrator)
    return analysis.confidence_summary(conf, correct, n_bins, strategy, closed, BOOT), cautions


def oracle_summary(ctx: LabContext, run: runs.EvalRun, n_bins: int, strategy: str,
                   edges: Optional[str] = AS_EVALUATED) -> Optional[dict[str, Any]]:
    """The Bayes predictor's calibration on the run's questions when they carry their true answer
    distribution (the controlled task), binned as the run is drawn; None for any other data."""
    pred = ctx.results.predictions(run)
    truth = predictions.oracle_probs(pred)
    if truth is None:
        return None
    return analysis.calibration_summary(truth, pred.mask, pred.labels, n_bins, strategy,
                                        bin_edges(edges, pred.bin_edges), BOOT)


def positionwise_view(ctx: LabContext, picked: list[runs.EvalRun]) -> tuple[go.Figure, str]:
    """Every picked run's position-wise top-k, and a note naming the runs that have none to draw."""
    tables = [(r.label, positionwise_topk(ctx.results.predictions(r))) for r in picked]
    missing = [label for label, table in tables if table.empty]
    return positionwise_figure(tables), (NO_TOP_TOKENS + html.escape("; ".join(missing)) + "." if missing else "")


def robustness_view(ctx: LabContext, picked: list[runs.EvalRun], edges: Optional[str],
                    calibrator: Optional[calibrators.Calibrator]) -> tuple[go.Figure, list[str]]:
    """ECE against the number of bins for every picked run, and the cautions."""
    drawn, cautions = [], []
    for run in picked:
        conf, correct, said = drawn_confidence(ctx, run, calibrator)
        table, smooth = analysis.ece_robustness(conf, correct, edges=bin_edges(edges, ctx.results.predictions(run).bin_edges))
        drawn.append((run.label, table, smooth))
        cautions += said
    return robustness_figure(drawn), cautions


def _notes(cautions: list[str]) -> str:
    return "".join(note(c) for c in cautions)


def reliability_view(ctx: LabContext, names: Optional[list[str]], bins: Optional[str], view: str,
                     edges: Optional[str] = AS_EVALUATED, calibrator: Optional[str] = None):
    """(figure or None, message) for the picked runs (at most :data:`MAX_SIDE_BY_SIDE`), after the
    saved calibrator named ``calibrator`` when one is picked."""
    n_bins, strategy = binning(bins)
    picked = [r for r in (runs.evaluation(ctx.runs, n) for n in (names or [])[:MAX_SIDE_BY_SIDE]) if r]
    if not picked:
        return None, "Pick one or more evaluation runs."
    unread = _unreadable(ctx, picked)
    picked = [r for r in picked if r.name not in unread]
    if not picked:
        return None, "".join(error(said) for said in unread.values())
    try:
        cal = picked_calibrator(ctx, calibrator)
        if view == VIEWS[1]:
            return positionwise_view(ctx, picked)
        if view == VIEWS[2]:
            figure, cautions = robustness_view(ctx, picked, edges, cal)
            return figure, _notes(cautions)
        drawn = [(r, reported_summary(ctx, r, n_bins, strategy, edges, cal)) for r in picked]
    except (ValueError, OSError) as e:
        return None, error(str(e))
    suffix = " · calibrated" if cal else ""
    summaries = []
    for run, (summary, _) in drawn:  # a run of the controlled task is followed by the oracle on its questions
        summaries.append((run.label + suffix, summary))
        oracle = oracle_summary(ctx, run, n_bins, strategy, edges)
        if oracle is not None:
            summaries.append((f"oracle (true distribution) · {run.label}", oracle))
    summaries = summaries[:MAX_SIDE_BY_SIDE]
    cautions = [c for _, (_, said) in drawn for c in said]
    figure = reliability_figure(summaries[0][1], summaries[0][0]) if len(summaries) == 1 else side_by_side(summaries)
    return figure, "".join(error(said) for said in unread.values()) + _notes(cautions)


def _unreadable(ctx: LabContext, picked: list[runs.EvalRun]) -> dict[str, str]:
    """The picked runs whose predictions cannot be read, each with why (naming its file and line): the
    others are drawn without them."""
    unread = {}
    for run in picked:
        try:
            ctx.results.predictions(run)
        except (ValueError, OSError) as e:
            unread[run.name] = str(e)
    return unread


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
               edges: Optional[str] = AS_EVALUATED, calibrator: Optional[str] = None):
    """:func:`reliability_view` for the page: the camera button saves a named full-resolution PNG."""
    figure, message = reliability_view(ctx, names, bins, view, edges, calibrator)
    return for_browser(figure, download_name(ctx, names, view)), message


def export_view(ctx: LabContext, names: Optional[list[str]], bins: Optional[str], view: str,
                edges: Optional[str] = AS_EVALUATED, calibrator: Optional[str] = None):
    """The current figure as a self-contained HTML file to download (hidden when there is none):
    plotly.js is embedded (≈ 5 MB), so it opens offline, and its camera button saves a PNG too."""
    figure = reliability_view(ctx, names, bins, view, edges, calibrator)[0]
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
    calibrator = calibrator_picker(ctx)
    message = gr.HTML()
    plot = gr.Plot(label="Reliability: grey = accuracy per bin, red = over-confident gap, hatched blue = "
                         "under-confident "
                         "· ECE vs bins: where the lines part, the binning sets the ECE "
                         "· the camera icon (top right, on hover) saves a full-resolution PNG")
    export_button = gr.Button("Export the plot as HTML (self-contained, opens offline)")
    exported = gr.File(label="Plot (HTML with plotly.js inside; for a PNG use the plot's camera icon)", visible=False)

    inputs = [names, bins, view, edges, calibrator]
    for control in inputs:
        control.change(functools.partial(shown_view, ctx), inputs=inputs, outputs=[plot, message])
    export_button.click(functools.partial(export_view, ctx), inputs=inputs, outputs=exported)
