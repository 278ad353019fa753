"""Exploring stored results: reliability, the temperature lab, case studies, knowledge, results.

Every page recomputes from ``predictions.jsonl`` / ``manifest.json`` with :mod:`lab.results`
(numpy), so moving the temperature slider redraws in milliseconds with no model call. Runs are
picked from what :func:`lab.results.find_evaluations` found under the runs directory, and a
picked name is resolved again on the server (:func:`lab.results.evaluation`): a request cannot
name a file outside the runs directory.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Optional

import gradio as gr
import pandas as pd

from lab import results
from lab.temperature import TemperatureFit, load_temperature, save_temperature
from ui.context import LabContext
from ui.messages import error, ok
from ui.plots import (coverage_figure, positionwise_figure, reliability_figure, side_by_side, sweep_figure)

BINNINGS = {"10 equal-width bins": (10, "width"), "14 equal-width bins": (14, "width"),
            "10 equal-mass bins": (10, "mass")}
MAX_SIDE_BY_SIDE = 6


def _runs(ctx: LabContext) -> dict[str, results.EvalRun]:
    return {r.name: r for r in results.find_evaluations(ctx.runs)}


def _run(ctx: LabContext, name: Optional[str]) -> Optional[results.EvalRun]:
    """The evaluation called ``name`` under the runs directory, or None (nothing outside it)."""
    return results.evaluation(ctx.runs, name or "")


def _reported_summary(run: results.EvalRun, n_bins: int, strategy: str) -> dict[str, Any]:
    """The run's calibration as it reported it (after the temperature it applied, if any)."""
    pred = results.load_predictions(run.path)
    return results.calibration_summary(results.reported_probs(pred), pred.mask, pred.labels, n_bins, strategy)


def _refresh(ctx: LabContext):
    return gr.update(choices=list(_runs(ctx)))


# ---------------------------------------------------------------- reliability
def reliability_view(ctx: LabContext, names: list[str], binning: str, view: str):
    n_bins, strategy = BINNINGS.get(binning, (10, "width"))
    runs = [r for r in (_run(ctx, n) for n in (names or [])[:MAX_SIDE_BY_SIDE]) if r]
    if not runs:
        return None, "Pick one or more evaluation runs."
    try:
        if view == "position-wise top-k":
            run = runs[0]
            return positionwise_figure(results.positionwise_topk(results.load_predictions(run.path))), ""
        summaries = [(r.name, _reported_summary(r, n_bins, strategy)) for r in runs]
    except (ValueError, OSError) as e:
        return None, error(str(e))
    figure = reliability_figure(summaries[0][1], summaries[0][0]) if len(summaries) == 1 else side_by_side(summaries)
    return figure, ""


def build_reliability(ctx: LabContext) -> None:
    with gr.Row():
        names = gr.Dropdown(list(_runs(ctx)), multiselect=True, label="Evaluation runs (several: side by side)",
                            scale=4, elem_id="reliability-runs")
        refresh = gr.Button("↻ Refresh runs", scale=1)
    with gr.Row():
        binning = gr.Radio(list(BINNINGS), value="10 equal-width bins", label="Bins")
        view = gr.Radio(["reliability diagram", "position-wise top-k"], value="reliability diagram", label="View")
    message = gr.HTML()
    plot = gr.Plot(label="Reliability: bars = accuracy per bin, red = over-confident gap, blue = under-confident")
    export = gr.Button("Export the plot as HTML")
    exported = gr.File(label="Plot (HTML; the plot's camera icon saves a PNG)", visible=False)
    inputs = [names, binning, view]
    for control in inputs:
        control.change(lambda *a: reliability_view(ctx, *a), inputs=inputs, outputs=[plot, message],
                       api_visibility="private")
    refresh.click(lambda: _refresh(ctx), outputs=names, api_visibility="private")
    export.click(lambda *a: _export_html(ctx, reliability_view(ctx, *a)[0], "reliability"), inputs=inputs,
                 outputs=exported, api_visibility="private")


def _export_html(ctx: LabContext, figure, stem: str):
    if figure is None:
        return gr.update(visible=False)
    target = ctx.exports / f"{stem}.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.write_html(target, include_plotlyjs="cdn")
    return gr.update(value=str(target), visible=True)


# ---------------------------------------------------------------- temperature lab
@functools.lru_cache(maxsize=32)
def _loaded(path: Path, mtime: float) -> results.Predictions:
    """A run's predictions, read once per version of the file (``mtime`` in the key) per server."""
    return results.load_predictions(path)


@functools.lru_cache(maxsize=32)
def _sweep(path: Path, mtime: float, form: str, n_bins: int) -> results.Sweep:
    """The ECE/NLL sweep does not depend on the slider: computed once per run, form and binning."""
    return results.temperature_sweep(_loaded(path, mtime), form=form, n_bins=n_bins)


def _mtime(run: results.EvalRun) -> float:
    return (run.path / results.PREDICTIONS_FILE).stat().st_mtime


def temperature_view(ctx: LabContext, name: Optional[str], temperature: Any, form: str, binning: str):
    """Reliability at one temperature, its metrics, and the sweep with the optimum and the current T."""
    run = _run(ctx, name)
    if run is None:
        return None, "Pick an evaluation run.", None
    try:
        t = float(temperature)
        if not t > 0:
            raise ValueError
    except (TypeError, ValueError):
        return gr.skip(), error(f"The temperature must be a positive number, got {temperature!r}"), gr.skip()
    n_bins, strategy = BINNINGS.get(binning, (10, "width"))
    try:
        mtime = _mtime(run)
        pred = _loaded(run.path, mtime)
        summary = results.calibration_summary(results.recalibrate(pred, t, form), pred.mask, pred.labels, n_bins, strategy)
        base = results.calibration_summary(pred.probs, pred.mask, pred.labels, n_bins, strategy)
        sweep = _sweep(run.path, mtime, form, n_bins)
    except (ValueError, OSError) as e:
        return None, error(str(e)), None
    text = (f"<div id='temperature-metrics'>T = <b>{t:.3g}</b> ({form} form) · "
            f"ECE <b id='ece-value'>{100 * summary['ece']:.2f}%</b> (at T=1: {100 * base['ece']:.2f}%) · "
            f"NLL {summary['nll']:.4f} (at T=1: {base['nll']:.4f}) · accuracy {100 * summary['accuracy']:.1f}% · "
            f"n = {summary['n']} · lowest ECE at T = {sweep.best_ece:.3g}, lowest NLL at T = {sweep.best_nll:.3g}</div>")
    return (reliability_figure(summary, f"{run.name} at T = {t:.3g}"), text,
            sweep_figure(sweep.table, sweep.best_ece, sweep.best_nll, current_T=t))


def stored_temperature(ctx: LabContext, name: Optional[str]) -> Optional[float]:
    """A temperature saved for this run: beside its predictions, or its pipeline's fitted ``ts/``."""
    run = _run(ctx, name)
    if run is None:
        return None
    for directory in (run.path, run.path.parent.parent / "ts"):
        try:
            return load_temperature(directory)
        except (FileNotFoundError, ValueError):
            continue
    return None


def save_chosen_temperature(ctx: LabContext, name: Optional[str], temperature: Any, form: str) -> str:
    """Write the chosen T as ``temperature.json`` beside the run's predictions (logit form only)."""
    run = _run(ctx, name)
    if run is None:
        return error("Pick an evaluation run first.")
    if form != "logit":
        return error("A saved temperature is applied as softmax(log p / T) (the logit form): switch to it to save.")
    try:
        t = float(temperature)
        pred = results.load_predictions(run.path)
    except (TypeError, ValueError, OSError) as e:
        return error(f"Cannot save: {e}")
    before = results.calibration_summary(pred.probs, pred.mask, pred.labels)
    after = results.calibration_summary(results.recalibrate(pred, t), pred.mask, pred.labels)
    fit = TemperatureFit(temperature=t, objective="chosen in the temperature lab", n=before["n"], bins=10,
                         nll_before=before["nll"], nll_after=after["nll"], ece_before=before["ece"], ece_after=after["ece"])
    path = save_temperature(run.path / "temperature.json", fit, fitted_on=run.name)
    return ok(f"Saved T = {t:.4g} to {path}: pass it as `temperature` to an evaluate job, or pick it on the Compare page.")


def build_temperature(ctx: LabContext) -> None:
    gr.Markdown("Move the temperature: the reliability diagram, ECE, NLL and accuracy are recomputed from the "
                "stored probabilities, no model call. `logit`: softmax(log p / T); `paper`: FIRST's softmax(p / c).")
    with gr.Row():
        name = gr.Dropdown(list(_runs(ctx)), label="Evaluation run", scale=4, elem_id="temperature-run")
        refresh = gr.Button("↻ Refresh runs", scale=1)
    with gr.Row():
        slider = gr.Slider(0.05, 5.0, value=1.0, step=0.01, label="Temperature (drag, or type in the box)",
                           elem_id="temperature-slider", scale=4)
        form = gr.Radio(["logit", "paper"], value="logit", label="Form", scale=1)
        binning = gr.Radio(list(BINNINGS), value="10 equal-width bins", label="Bins", scale=2)
    text = gr.HTML(elem_id="temperature-text")
    with gr.Row():
        plot = gr.Plot(label="Reliability at this temperature")
        sweep = gr.Plot(label="ECE and NLL against temperature")
    with gr.Row():
        save = gr.Button("Save this temperature", variant="primary")
        saved = gr.HTML()
    inputs = [name, slider, form, binning]
    outputs = [plot, text, sweep]
    view = lambda *a: temperature_view(ctx, *a)  # noqa: E731
    slider.change(view, inputs=inputs, outputs=outputs, trigger_mode="always_last", api_visibility="private")
    for control in (form, binning):
        control.change(view, inputs=inputs, outputs=outputs, api_visibility="private")
    # Picking a run starts the slider at its saved or fitted temperature, if it has one.
    name.change(lambda n: stored_temperature(ctx, n) or 1.0, inputs=name, outputs=slider, api_visibility="private") \
        .then(view, inputs=inputs, outputs=outputs, api_visibility="private")
    refresh.click(lambda: _refresh(ctx), outputs=name, api_visibility="private")
    save.click(lambda *a: save_chosen_temperature(ctx, *a), inputs=[name, slider, form], outputs=saved,
               api_visibility="private")


# ---------------------------------------------------------------- case studies
def cases_view(ctx: LabContext, name: Optional[str], kind: str, lo: float, hi: float, dataset: Optional[str]):
    run = _run(ctx, name)
    if run is None:
        return pd.DataFrame(), gr.update(), "Pick an evaluation run."
    try:
        table = results.case_table(results.load_predictions(run.path))
        filtered = results.filter_cases(table, kind, (min(lo, hi), max(lo, hi)), dataset or None)
    except (ValueError, OSError) as e:
        return pd.DataFrame(), gr.update(), error(str(e))
    datasets = sorted(set(table["dataset"]) - {""})
    note = f"{len(filtered)} of {len(table)} questions" + (", over-confident wrong answers first" if kind != "correct" else "")
    return filtered.drop(columns=["overconfident_wrong"]).round(4), gr.update(choices=[""] + datasets), note


def build_cases(ctx: LabContext) -> None:
    with gr.Row():
        name = gr.Dropdown(list(_runs(ctx)), label="Evaluation run", scale=4)
        refresh = gr.Button("↻ Refresh runs", scale=1)
    with gr.Row():
        kind = gr.Radio(list(results.CASE_KINDS), value="overconfident_wrong", label="Show")
        lo = gr.Slider(0, 1, value=0, step=0.05, label="confidence from")
        hi = gr.Slider(0, 1, value=1, step=0.05, label="to")
        dataset = gr.Dropdown([""], value="", label="dataset", allow_custom_value=False)
    note = gr.Markdown()
    table = gr.Dataframe(interactive=False, wrap=True, label="Questions (click a column to sort)")
    inputs = [name, kind, lo, hi, dataset]
    for control in inputs:
        control.change(lambda *a: cases_view(ctx, *a), inputs=inputs, outputs=[table, dataset, note],
                       api_visibility="private")
    refresh.click(lambda: _refresh(ctx), outputs=name, api_visibility="private")
    gr.Markdown("### The same question across runs")
    with gr.Row():
        question_id = gr.Textbox(label="Question id (from the table)", scale=1)
        across = gr.Dropdown(list(_runs(ctx)), multiselect=True, label="Runs", scale=3)
    same = gr.Dataframe(interactive=False, label="What each run answered")

    def on_same(qid: str, names: list[str]):
        runs = [r.path for r in (_run(ctx, n) for n in names or []) if r]
        if not qid or not runs:
            return pd.DataFrame()
        return results.same_question(runs, qid.strip())

    question_id.submit(on_same, inputs=[question_id, across], outputs=same, api_visibility="private")
    across.change(on_same, inputs=[question_id, across], outputs=same, api_visibility="private")


# ---------------------------------------------------------------- knowledge
def _manifests(ctx: LabContext) -> dict[str, Path]:
    found = {}
    for depth in range(1, 5):
        for path in sorted(ctx.runs.glob("/".join(["*"] * depth) + "/manifest.json")):
            found[path.parent.relative_to(ctx.runs).as_posix()] = path
    return found


def knowledge_view(ctx: LabContext, name: Optional[str]):
    path = _manifests(ctx).get(name or "")
    if path is None:
        return None, "Pick a top-k store (an `extract` job, or a FIRST run's `topk/train`)."
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return None, error(f"Cannot read {path.name}: {e}")
    meta = manifest.get("meta", {})
    text = (f"k = {manifest.get('k')} · {manifest.get('n_sequences')} sequences · model {meta.get('model')} · "
            f"{meta.get('dataset')} {meta.get('split')} · complete: {manifest.get('complete', True)}")
    return coverage_figure(manifest), text


def build_knowledge(ctx: LabContext) -> None:
    gr.Markdown("How much of the teacher's probability its top-K tokens hold (FIRST's concentrated knowledge), "
                "and what storing K tokens per position costs.")
    with gr.Row():
        name = gr.Dropdown(list(_manifests(ctx)), label="Top-k store", scale=4)
        refresh = gr.Button("↻ Refresh", scale=1)
    text = gr.Markdown()
    plot = gr.Plot(label="Top-K coverage")
    name.change(lambda n: knowledge_view(ctx, n), inputs=name, outputs=[plot, text], api_visibility="private")
    refresh.click(lambda: gr.update(choices=list(_manifests(ctx))), outputs=name, api_visibility="private")


# ---------------------------------------------------------------- results
def build_results(ctx: LabContext) -> None:
    gr.Markdown("Every evaluation under the runs directory, FIRST Table 1 style (ECE / accuracy / Trust per run "
                "and dataset; pipeline runs are named `<job>/eval/<model>-<set>`).")
    table = gr.Dataframe(value=lambda: results.results_table(ctx.runs), interactive=False, elem_id="results-table")
    with gr.Row():
        refresh = gr.Button("↻ Refresh")
        export = gr.Button("Export CSV")
    csv_file = gr.File(label="CSV", visible=False)

    def on_export():
        target = ctx.exports / "results.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(results.results_csv(results.results_table(ctx.runs)))
        return gr.update(value=str(target), visible=True)

    refresh.click(lambda: results.results_table(ctx.runs), outputs=table, api_visibility="private")
    export.click(on_export, outputs=csv_file, api_visibility="private")
