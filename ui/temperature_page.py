"""The temperature lab: move a temperature and see the reliability, ECE and NLL it would give.

Everything is recomputed from the stored probabilities (:mod:`lab.results.analysis`), so a move redraws with
no model call (a median 0.6–0.8 s from key press to redrawn diagram in a browser on two shared
cores, about 0.1 s of it here: README); the ECE/NLL sweep does not depend on the temperature and is cached
per run on the server's context. The sweep widens its grid past an edge that holds an optimum (up to
:data:`lab.calibration.temperature.LAB_SWEEP_BOUNDS`), so its range may span five decades: the slider therefore moves
log10 T (gradio's slider is linear), a box beside it shows and takes T itself, and a button per
optimum dials it exactly. Bins are closed as the run was evaluated unless the user picks the other
convention. A chosen temperature can be saved beside the run, with the binning the page shows.

The two forms name their parameter differently on purpose (:func:`lab.results.analysis.recalibrate`): the
logit form's T = 1 is the run unscaled, while the paper form's c = 1 is a real rescaling (FIRST's
softmax(p / c) nearly flattens every row there), so the paper form's baseline is "unscaled", never
"c = 1". What is drawn (run, T, form, binning) lives in one ``gr.State``: a refused entry puts the
boxes back to it and Save records exactly it, whatever the controls say while a redraw is on its way.

A token run (task clm or facts) is rescaled over the whole vocabulary from the log-partition each
target kept at the temperatures of its grid (:func:`lab.results.analysis.temperature_summary`), so
T is drawn within that grid only: a T outside it is taken to the nearest end, and said so. Its T is
the unscaled model's, as the logit form's is, whatever temperature the run was evaluated at.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import gradio as gr
import plotly.graph_objects as go

from lab.calibration.temperature import FORMS, LAB_SWEEP_BOUNDS, TemperatureFit
from lab.calibration.temperature_files import save_temperature
from lab.results import analysis, predictions, run_configs, runs
from lab.results.runs import EvalRun
from ui.components import AS_EVALUATED, bin_edges, binning, binning_radio, edges_radio, run_picker
from ui.context import LabContext
from ui.messages import error, note, ok
from ui.plots.curves import sweep_figure
from ui.plots.reliability import reliability_figure
from ui.temperature_slider import (BOX_DIGITS, FIELD, SHOWN_DIGITS, SYMBOL, box_text, parse_position,
                                   parse_temperature, positive, slider_settings, slider_span, slider_update, thumb)
from ui.temperature_text import FORMULA, metrics_text

INTRO = ("Move the temperature: the reliability diagram, ECE, NLL and accuracy are recomputed from the "
         "stored probabilities, no model call. `logit`: softmax(log p / T), where T = 1 is the run unscaled; "
         "`paper`: FIRST's softmax(p / c), where c = 1 already rescales (it nearly flattens every row). "
         "A token run (clm, facts) is rescaled over the whole vocabulary, softmax(z / T), from the log-partition "
         "each target kept at the temperatures of its grid; the paper form needs every probability, which it "
         "does not keep.")
FORM_INFO = "logit: softmax(log p / T); paper: FIRST's softmax(p / c)"
# A token run keeps its top tokens and the log-partition, not every probability of the vocabulary
# that FIRST's softmax(p / c) divides: the radio offers it the logit form only, and says why.
PAPER_NOT_FOR_TOKENS = ("The paper form, FIRST's softmax(p / c), does not apply to a token run (clm, facts): it "
                        "divides every probability of the vocabulary, and a token run keeps only its top tokens. "
                        "Drawn in the logit form, softmax(z / T) over the whole vocabulary.")
START = (0.1, 10.0)  # the slider's range before a run is drawn: the logit sweep's default grid
GO_TO = {"ece": "Go to lowest ECE", "nll": "Go to lowest NLL"}
# Where each form starts on a run it has not drawn: the logit form at the run's saved temperature, else
# T = 1 (the run unscaled); the paper form, which has no unscaled value, at c = 1, the top of its grid.
PAPER_START = 1.0
# The drawn ECE's interval resamples as the run's evaluation did (its config.yaml's bootstrap and seed), so
# at T = 1 it is the interval the run reported; these, the evaluation's defaults, where the run has none.
# 1000 replicates take ≈ 30 ms for 500 questions, per move.
BOOT, BOOT_SEED = 1000, 0
# The diagram has half the row (≈ 650 px at 1440 px): at 15 px a title line of more than ≈ 60
# characters runs past its edge, so the title leads with T and wraps the run's label narrower.
TITLE_CHARS = 52


class PageView(NamedTuple):
    """What a handler returns, in the order of the wiring's outputs: each field is a value, a
    ``gr.update`` or ``gr.skip()`` (left as it is)."""

    drawn: Any  # the state: {"name", "temperature", "form", "bins", "edges"} of what is drawn, or None
    slider: Any  # the log10-T slider
    box: Any  # the box showing and taking T (or c)
    message: Any  # a refused entry or a failure, "" once drawn
    reliability: Any
    text: Any  # the metrics, the optima and the sweep's widening note
    sweep: Any
    go_ece: Any  # the two go-to-optimum buttons, labelled with the optimum
    go_nll: Any
    form: Any = gr.skip()  # the form radio: a token run offers the logit form only


# ---------------------------------------------------------------- what one view shows
def _sweep_plot(sweep: analysis.Sweep, t: float, form: str) -> go.Figure:
    """The sweep figure with the current T marked, its parameter named as the form names it."""
    fig = sweep_figure(sweep.table, sweep.best_ece, sweep.best_nll, current_T=t)
    symbol = SYMBOL[form]
    if symbol != "T":  # ui.plots.curves.sweep_figure writes T into its legend and its marker
        fig.for_each_trace(lambda trace: trace.update(name=(trace.name or "").replace("T=", f"{symbol}=")))
        fig.for_each_annotation(lambda note: note.update(text=(note.text or "").replace("T = ", f"{symbol} = ")))
    fig.update_xaxes(title_text=f"{symbol} ({FORMULA[form]}), log scale")
    return fig


def _sweep(ctx: LabContext, run: EvalRun, form: str, bins: Optional[str], edges: Optional[str]) -> analysis.Sweep:
    """The run's cached sweep for a form and binning; raises ValueError or OSError as loading does."""
    n_bins, _ = binning(bins)
    return ctx.results.sweep(run, form, n_bins, bin_edges(edges, ctx.results.predictions(run).bin_edges))


def _within(pred: predictions.Predictions, t: float) -> tuple[float, str]:
    """T, taken to the nearest end of the temperatures a token run can be rescaled to when outside them,
    and a note saying so ("" when T is drawn as asked)."""
    limits = analysis.temperature_limits(pred)
    if limits is None or limits[0] <= t <= limits[1]:
        return t, ""
    nearest = min(max(t, limits[0]), limits[1])
    return nearest, note(f"T = {t:.{SHOWN_DIGITS}g} lies outside the temperatures this token run kept its "
                         f"log-partition at ({limits[0]:g} to {limits[1]:g}): drawn at T = {nearest:g}.")


def _form_choices(pred: predictions.Predictions, form: str) -> tuple[str, Any]:
    """The form a run is drawn in and the radio's update: a token run is drawn in the logit form, the
    only one it offers (the paper form said not to apply to it), a multiple-choice run in either."""
    if predictions.is_token_run(pred):
        return "logit", gr.update(choices=["logit"], value="logit", info=PAPER_NOT_FOR_TOKENS)
    return form, gr.update(choices=list(FORMS), info=FORM_INFO)


def _drawn_form(ctx: LabContext, name: Optional[str], form: str) -> str:
    """The form ``name`` is drawn in when ``form`` is asked (:func:`_form_choices`); ``form`` itself
    where its predictions cannot be read (:func:`draw` then says why)."""
    run = runs.evaluation(ctx.runs, name)
    try:
        return _form_choices(ctx.results.predictions(run), form)[0] if run is not None else form
    except (ValueError, OSError):
        return form


def bootstrap_settings(run: EvalRun) -> tuple[int, int]:
    """The replicates and seed the run's evaluation drew its ECE interval with (its config.yaml's
    ``bootstrap`` and ``seed``), so that the page's interval at T = 1 is the one the run reported and at
    any other T the same resampling; :data:`BOOT` and :data:`BOOT_SEED` where the run has none (no
    config.yaml, or ``bootstrap: 0``: the page still shows an interval)."""
    config = run_configs.read_config(run.path) or {}
    n_boot, seed = config.get("bootstrap"), config.get("seed")
    n_boot = n_boot if isinstance(n_boot, int) and not isinstance(n_boot, bool) and n_boot > 0 else BOOT
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else BOOT_SEED
    return n_boot, seed


def _blank(message: str) -> PageView:
    """Nothing drawn (no run, or it cannot be read): the figures cleared, the controls left as they are."""
    return PageView(None, gr.skip(), "", message, None, "", None, gr.skip(), gr.skip())


def _refused(drawn: Optional[dict], message: str) -> PageView:
    """An entry turned down: the box and the slider back at the T drawn, the drawing left as it is."""
    t = drawn["temperature"] if drawn else None
    slider = gr.skip() if t is None else gr.update(value=thumb(t))
    return PageView(gr.skip(), slider, "" if t is None else box_text(t), message, *[gr.skip()] * 5)


def draw(ctx: LabContext, name: Optional[str], temperature: Any, form: str, bins: Optional[str],
         edges: Optional[str] = AS_EVALUATED, move: bool = True) -> PageView:
    """Everything the page shows at one temperature: reliability, metrics against the unscaled run,
    the sweep with its optima and the current T, the slider ranging over the sweep and T, the box at T.
    ``move=False`` leaves the slider's thumb where the user holds it, unless T lies outside the sweep."""
    run = runs.evaluation(ctx.runs, name)
    if run is None:
        return _blank("Pick an evaluation run.")
    t = positive(temperature)
    if t is None:
        return PageView(*[gr.skip()] * 3, error(f"The temperature must be a positive number, got {temperature!r}"),
                        *[gr.skip()] * 5)
    n_bins, strategy = binning(bins)
    try:
        pred = ctx.results.predictions(run)
        closed = bin_edges(edges, pred.bin_edges)
        asked, (form, radio) = form, _form_choices(pred, form)
        t, clamped = _within(pred, t)
        summary = analysis.temperature_summary(pred, t, form, n_bins, strategy, closed, *bootstrap_settings(run))
        base = analysis.temperature_summary(pred, None, form, n_bins, strategy, closed)
        sweep = ctx.results.sweep(run, form, n_bins, closed)
    except (ValueError, OSError) as e:
        return _blank(error(str(e)))
    temperatures, symbol = sweep.table["temperature"], SYMBOL[form]
    inside = float(temperatures.min()) <= t <= float(temperatures.max())
    return PageView(
        drawn={"name": name, "temperature": t, "form": form, "bins": bins, "edges": edges},
        slider=slider_update(*slider_span(sweep, t), t, form, move or not inside or bool(clamped)),
        box=gr.update(value=box_text(t), label=f"{FIELD[form]} (type a value, then Enter)"),
        message=(note(PAPER_NOT_FOR_TOKENS) if form != asked else "") + clamped,
        reliability=reliability_figure(summary, f"{symbol} = {t:.{SHOWN_DIGITS}g} · {run.label}", TITLE_CHARS),
        text=metrics_text(run, t, form, summary, base, sweep, predictions.is_token_run(pred)),
        sweep=_sweep_plot(sweep, t, form),
        go_ece=gr.update(value=f"{GO_TO['ece']} ({symbol} = {sweep.best_ece:.3g})"),
        go_nll=gr.update(value=f"{GO_TO['nll']} ({symbol} = {sweep.best_nll:.3g})"),
        form=radio,
    )


# ---------------------------------------------------------------- handlers
def stored_temperature(ctx: LabContext, name: Optional[str]) -> Optional[float]:
    """A temperature saved for this run (beside it, or its pipeline's fitted one), or None."""
    run = runs.evaluation(ctx.runs, name)
    return None if run is None else runs.saved_temperature(ctx.runs, run)


def slider_start(ctx: LabContext, name: Optional[str], form: str = "logit") -> float:
    """Where a form starts on a run: the logit form at the run's saved or fitted temperature, else 1;
    the paper form at :data:`PAPER_START`, inside its grid (a saved T is the logit form's: taken as c, a
    T of 4 would lie past the end of the paper form's sweep)."""
    if form == "paper":
        return PAPER_START
    return stored_temperature(ctx, name) or 1.0


def pick_run(ctx: LabContext, name: Optional[str], form: str, bins: Optional[str],
             edges: Optional[str] = AS_EVALUATED) -> PageView:
    """A run picked (by hand, or given to the picker as the page opens): drawn at once, at its form's start."""
    return draw(ctx, name, slider_start(ctx, name, form), form, bins, edges)


def slider_moved(ctx: LabContext, name: Optional[str], position: Any, drawn: Optional[dict], form: str,
                 bins: Optional[str], edges: Optional[str] = AS_EVALUATED) -> PageView:
    """The slider dragged, or a log10 T typed into its own number box (the range follows that one)."""
    try:
        t = parse_position(position, form)
    except ValueError as e:
        return _refused(drawn, error(str(e)))
    return draw(ctx, name, t, form, bins, edges, move=False)


def typed_temperature(ctx: LabContext, name: Optional[str], value: Any, drawn: Optional[dict], form: str,
                      bins: Optional[str], edges: Optional[str] = AS_EVALUATED) -> PageView:
    """T typed into the box (Enter, or leaving it): drawn there, the slider's range stretched to hold
    it; anything but a number inside :data:`ui.temperature_slider.LIMITS` is refused and the box shows
    the drawn T again."""
    if drawn and str(value).strip() == box_text(drawn["temperature"]):
        return PageView(*[gr.skip()] * len(PageView._fields))  # the drawn T, every digit of it kept
    try:
        t = parse_temperature(value, form)
    except ValueError as e:
        return _refused(drawn, error(str(e)))
    return draw(ctx, name, t, form, bins, edges)


def settings_changed(ctx: LabContext, name: Optional[str], drawn: Optional[dict], form: str, bins: Optional[str],
                     edges: Optional[str] = AS_EVALUATED) -> PageView:
    """Another binning: the same T redrawn, the slider's range following the new sweep, which may reach
    further. Another form (or run): drawn at that form's start (:func:`slider_start`), since a T of one
    form is no value of the other: softmax(log p / T) and softmax(p / c) have different scales. A form
    the run does not take (the paper form on a token run) leaves it in the form drawn, at the T drawn."""
    same = drawn is not None and drawn["name"] == name and drawn["form"] in (form, _drawn_form(ctx, name, form))
    return draw(ctx, name, drawn["temperature"] if same else slider_start(ctx, name, form), form, bins, edges)


def go_to_optimum(ctx: LabContext, name: Optional[str], form: str, bins: Optional[str],
                  edges: Optional[str] = AS_EVALUATED, which: str = "ece") -> PageView:
    """Drawn at the sweep's lowest-ECE (``which="ece"``) or lowest-NLL temperature, exactly."""
    run = runs.evaluation(ctx.runs, name)
    if run is None:
        return _blank("Pick an evaluation run.")
    if which not in GO_TO:
        raise ValueError(f"Expected `which` to be one of {tuple(GO_TO)}, but got {which!r}")
    try:
        sweep = _sweep(ctx, run, form, bins, edges)
    except (ValueError, OSError) as e:
        return _blank(error(str(e)))
    return draw(ctx, name, sweep.best_ece if which == "ece" else sweep.best_nll, form, bins, edges)


def save_chosen_temperature(ctx: LabContext, name: Optional[str], temperature: Any, form: str,
                            bins: Optional[str] = None, edges: Optional[str] = AS_EVALUATED) -> str:
    """Save T as the run's ``temperature.json``, beside its predictions (logit form only), with the
    before/after ECE binned as the page shows it and that binning recorded (``bins``, ``bin_edges``,
    and ``strategy``, which :class:`lab.calibration.temperature.TemperatureFit` has no field for), and the
    flags of the sweep the page shows with it: how far it ``searched``, whether it ``widened``
    past its grid, and whether an optimum lay ``at_bound``, as the page says."""
    run = runs.evaluation(ctx.runs, name)
    if run is None:
        return error("Pick an evaluation run first.")
    if form != "logit":
        return error("A saved temperature is applied as softmax(log p / T) (the logit form): switch to it to save.")
    t = positive(temperature)
    if t is None:
        return error(f"Cannot save: the temperature must be a positive number, got {temperature!r}")
    n_bins, strategy = binning(bins)
    try:
        pred = ctx.results.predictions(run)
        closed = bin_edges(edges, pred.bin_edges)
        before = analysis.temperature_summary(pred, None, form, n_bins, strategy, closed)
        after = analysis.temperature_summary(pred, t, form, n_bins, strategy, closed)
    except (ValueError, OSError) as e:
        return error(f"Cannot save: {e}")
    sweep = ctx.results.sweep(run, form, n_bins, closed)
    searched = (float(sweep.table["temperature"].min()), float(sweep.table["temperature"].max()))
    bounds = analysis.temperature_limits(pred) or LAB_SWEEP_BOUNDS[form]
    fit = TemperatureFit(temperature=t, objective="chosen in the temperature lab", n=before["n"], bins=n_bins,
                         nll_before=before["nll"], nll_after=after["nll"], ece_before=before["ece"],
                         ece_after=after["ece"], bin_edges=closed, searched=searched, widened=bool(sweep.widened),
                         at_bound=any(best in bounds for best in (sweep.best_ece, sweep.best_nll)))
    path = save_temperature(run.path, fit, fitted_on=run.name, strategy=strategy)
    return ok(f"Saved T = {t:.{BOX_DIGITS}g} to {run.name}/{path.name} (ECE {100 * before['ece']:.2f}% → {100 * after['ece']:.2f}% "
              f"with {n_bins} equal-{strategy} bins, {closed}-closed): pass it as `temperature` to an evaluate "
              "job, or pick it on the Compare page.")


def save_drawn(ctx: LabContext, drawn: Optional[dict]) -> str:
    """Save button: what is drawn (run, T, form, binning), refused before anything is."""
    if not drawn:
        return error("Nothing is drawn yet: pick an evaluation run, then save the temperature it shows.")
    return save_chosen_temperature(ctx, **drawn)


# ---------------------------------------------------------------- layout and wiring
def build_temperature(ctx: LabContext) -> gr.Dropdown:
    """The page; its run picker is returned so a job's page can open a run here."""
    gr.Markdown(INTRO)
    name, _ = run_picker(ctx, "Evaluation run", elem_id="temperature-run")
    drawn = gr.State(None)
    with gr.Row():
        # No reset button: it moves the thumb without an input event, so nothing would be redrawn.
        slider = gr.Slider(**slider_settings(*START, 1.0, "logit"), buttons=[], elem_id="temperature-log-slider",
                           scale=4)
        box = gr.Textbox(box_text(1.0), label=f"{FIELD['logit']} (type a value, then Enter)", max_lines=1,
                         elem_id="temperature-value", scale=1)
    with gr.Row():
        form = gr.Radio(list(FORMS), value="logit", label="Form", info=FORM_INFO, scale=1)
        bins = binning_radio(scale=2)
        edges = edges_radio(scale=2)
    message = gr.HTML(elem_id="temperature-message")
    text = gr.HTML(elem_id="temperature-text")
    with gr.Row():
        go_ece = gr.Button(GO_TO["ece"], size="sm", elem_id="temperature-best-ece")
        go_nll = gr.Button(GO_TO["nll"], size="sm", elem_id="temperature-best-nll")
    with gr.Row():
        plot = gr.Plot(label="Reliability at this temperature")
        sweep = gr.Plot(label="ECE and NLL against temperature")
    with gr.Row():
        save = gr.Button("Save this temperature", variant="primary")
        saved = gr.HTML()

    controls, outputs = [form, bins, edges], list(PageView(drawn, slider, box, message, plot, text, sweep, go_ece,
                                                           go_nll, form))
    name.change(functools.partial(pick_run, ctx), inputs=[name, *controls], outputs=outputs)
    # Unprocessed: gradio refuses a typed slider value outside its range with a toast; this handler takes it.
    slider.input(functools.partial(slider_moved, ctx), inputs=[name, slider, drawn, *controls], outputs=outputs,
                 trigger_mode="always_last", show_progress="hidden", preprocess=False)
    for entered in (box.submit, box.blur):
        entered(functools.partial(typed_temperature, ctx), inputs=[name, box, drawn, *controls], outputs=outputs)
    for control in controls:
        control.change(functools.partial(settings_changed, ctx), inputs=[name, drawn, *controls], outputs=outputs)
    for which, button in (("ece", go_ece), ("nll", go_nll)):
        button.click(functools.partial(go_to_optimum, ctx, which=which), inputs=[name, *controls], outputs=outputs)
    save.click(functools.partial(save_drawn, ctx), inputs=drawn, outputs=saved)
    return name
