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
import html
import math
from typing import Any, NamedTuple, Optional

import gradio as gr
import plotly.graph_objects as go

from lab.calibration.temperature import FORMS, LAB_SWEEP_BOUNDS, TemperatureFit
from lab.calibration.temperature_files import save_temperature
from lab.results import analysis, predictions, runs
from lab.results.runs import EvalRun
from ui.components import AS_EVALUATED, bin_edges, binning, binning_radio, edges_radio, run_picker
from ui.context import LabContext
from ui.messages import error, note, ok
from ui.plots.curves import sweep_figure
from ui.plots.reliability import reliability_figure

INTRO = ("Move the temperature: the reliability diagram, ECE, NLL and accuracy are recomputed from the "
         "stored probabilities, no model call. `logit`: softmax(log p / T), where T = 1 is the run unscaled; "
         "`paper`: FIRST's softmax(p / c), where c = 1 already rescales (it nearly flattens every row). "
         "A token run (clm, facts) is rescaled over the whole vocabulary, softmax(z / T), from the log-partition "
         "each target kept at the temperatures of its grid; the paper form needs every probability, which it "
         "does not keep.")
SYMBOL = {"logit": "T", "paper": "c"}  # what each form calls its parameter
FIELD = {"logit": "Temperature T", "paper": "Scale c"}  # ... and the box that takes it
FORMULA = {"logit": "softmax(log p / T)", "paper": "FIRST's softmax(p / c)"}
TOKEN_FORMULA = "softmax(z / T) over the whole vocabulary"  # a token run's logit form
BASELINE = {"logit": "at T = 1, unscaled", "paper": "unscaled"}  # the run's own probabilities, in each form's words
STEPS_PER_DECADE = 1000  # the slider's step in log10 T: a factor 1.0023, finer than the 4 digits a move shows
SHOWN_DIGITS = 4  # significant digits of a T read off the slider: the step cannot tell finer ones apart
BOX_DIGITS = 6  # ... and of the T the box shows (an optimum is dialled exactly: the state keeps every digit)
FORM_INFO = "logit: softmax(log p / T); paper: FIRST's softmax(p / c)"
# A token run keeps its top tokens and the log-partition, not every probability of the vocabulary
# that FIRST's softmax(p / c) divides: the radio offers it the logit form only, and says why.
PAPER_NOT_FOR_TOKENS = ("The paper form, FIRST's softmax(p / c), does not apply to a token run (clm, facts): it "
                        "divides every probability of the vocabulary, and a token run keeps only its top tokens. "
                        "Drawn in the logit form, softmax(z / T) over the whole vocabulary.")
LIMITS = (1e-6, 1e6)  # a typed T outside is refused: rows are one-hot or uniform long before, and floats overflow
START = (0.1, 10.0)  # the slider's range before a run is drawn: the logit sweep's default grid
GO_TO = {"ece": "Go to lowest ECE", "nll": "Go to lowest NLL"}
# Where each form starts on a run it has not drawn: the logit form at the run's saved temperature, else
# T = 1 (the run unscaled); the paper form, which has no unscaled value, at c = 1, the top of its grid.
PAPER_START = 1.0
# The drawn ECE's interval resamples as the run's evaluation did (its config.yaml's bootstrap and seed), so
# at T = 1 it is the interval the run reported; these, the evaluation's defaults, where the run has none.
# 1000 replicates take ≈ 30 ms for 500 questions, per move.
BOOT, BOOT_SEED = 1000, 0
# A bootstrap percentile interval of ECE may leave out the point: said beside it, never hidden.
OUTSIDE_INTERVAL = ("ECE {side} its interval, a bootstrap percentile interval: ECE is biased upward under resampling, "
                    "so the point may lie below it (each replicate adds resampling noise, which |confidence − "
                    "accuracy| turns into error), the more so at a temperature fitted on these same questions. Read "
                    "the interval as the estimate's sampling noise, not as bounds on the true calibration error.")
# The diagram has half the row (≈ 650 px at 1440 px): at 15 px a title line of more than ≈ 60
# characters runs past its edge, so the title leads with T and wraps the run's label narrower.
TITLE_CHARS = 52
NOTE_STYLE = "background:#fff8e1;border-radius:6px;padding:4px 8px;margin-top:4px"
# The sweep picks its optima on the questions it then scores them on: say so where they are shown.
SAME_QUESTIONS = ("fitted on these same questions — optimistic; for an honest figure, fit on a validation run in "
                  "the Recalibration workbench and apply it to this run")


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


# ---------------------------------------------------------------- numbers in, numbers shown
def to_slider(t: float) -> float:
    """The slider's position for T: log10 T, so that every decade gets the same length of track."""
    return math.log10(t)


def from_slider(position: float) -> float:
    """T at a slider position, to :data:`SHOWN_DIGITS` significant digits ("2.512", not 2.51188643)."""
    return float(f"{10 ** position:.{SHOWN_DIGITS}g}")


def _on_grid(position: float, rounding: Any = round) -> float:
    """A slider position on the slider's step grid (``math.floor``/``ceil`` to take a bound outward)."""
    return rounding(round(position * STEPS_PER_DECADE, 6)) / STEPS_PER_DECADE


def _show(t: float) -> str:
    return f"{t:.{BOX_DIGITS}g}"


def _number(value: Any) -> Optional[float]:
    """A finite float from a number or its text, else None (True is no temperature)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _positive(value: Any) -> Optional[float]:
    number = _number(value)
    return number if number is not None and number > 0 else None


def parse_temperature(value: Any, form: str) -> float:
    """A typed T (or c): a finite number inside :data:`LIMITS`; a ValueError naming the box otherwise."""
    t = _positive(value)
    if t is None:
        raise ValueError(f"{FIELD[form]}: expected a positive number such as 1.5, but got {value!r}")
    if not LIMITS[0] <= t <= LIMITS[1]:
        raise ValueError(f"{FIELD[form]}: expected a value from {LIMITS[0]:g} to {LIMITS[1]:g}, but got {value!r}")
    return t


def parse_position(value: Any, form: str) -> float:
    """T at a slider position the browser sent (it may be typed, out of the slider's range: that is
    taken, the range follows); a ValueError naming the slider for a position past :data:`LIMITS`."""
    position, low, high = _number(value), to_slider(LIMITS[0]), to_slider(LIMITS[1])
    if position is None or not low <= position <= high:
        raise ValueError(f"{FIELD[form]} slider: expected log₁₀ {SYMBOL[form]} from {low:g} to {high:g}, "
                         f"but got {value!r}")
    return from_slider(position)


# ---------------------------------------------------------------- what one view shows
def slider_span(sweep: analysis.Sweep, t: float) -> tuple[float, float]:
    """The temperatures the slider spans: the sweep's after any widening, so that every optimum it
    reports can be dialled, stretched to hold ``t``."""
    temperatures = sweep.table["temperature"]
    return min(float(temperatures.min()), t), max(float(temperatures.max()), t)


def slider_settings(low: float, high: float, t: float, form: str) -> dict[str, Any]:
    """The log slider over at least [low, high] (bounds taken outward onto its step grid), the thumb
    at T, the label saying it is log-scaled and showing T: keyword arguments of ``gr.Slider``."""
    symbol = SYMBOL[form]
    bottom, top = _on_grid(to_slider(low), math.floor), _on_grid(to_slider(high), math.ceil)
    label = (f"{FIELD[form]} on a log scale (the track is log₁₀ {symbol}): {symbol} = {t:.{SHOWN_DIGITS}g}, "
             f"from {10 ** bottom:.3g} to {10 ** top:.3g}")
    return {"minimum": bottom, "maximum": top, "step": 1 / STEPS_PER_DECADE, "label": label,
            "value": _on_grid(to_slider(t))}


def slider_update(low: float, high: float, t: float, form: str, move: bool = True) -> dict[str, Any]:
    """:func:`slider_settings` as an update; ``move=False`` leaves the thumb alone: while the user
    drags it, an answer to an earlier position would pull it back."""
    settings = slider_settings(low, high, t, form)
    if not move:
        del settings["value"]
    return gr.update(**settings)


def _baseline(run: EvalRun, form: str) -> str:
    """What the unscaled numbers are called: the run "as evaluated" only where it applied no temperature."""
    if run.temperature in (None, 1.0):
        return f"{BASELINE[form]} (as evaluated)"
    return f"{BASELINE[form]}; the run itself was evaluated at T = {run.temperature:.3g}"


def _optima_text(sweep: analysis.Sweep, form: str) -> str:
    """The sweep's optima, labelled as fitted on the questions they are scored on (their ECE and NLL
    flatter the temperature), and right below them, the note that the sweep widened to find them."""
    symbol = SYMBOL[form]
    # lab.results.analysis words its note with T for both forms: the paper form's parameter is c
    note = sweep.widened.replace("T = ", f"{symbol} = ")
    widened = f"<div id='sweep-widened' style='{NOTE_STYLE}'>↔ {html.escape(note)}</div>" if note else ""
    return (f"<div id='temperature-optima'>lowest ECE at {symbol} = {sweep.best_ece:.3g}, "
            f"lowest NLL at {symbol} = {sweep.best_nll:.3g}"
            f"<div id='optima-same-questions' style='{NOTE_STYLE}'>⚠ {SAME_QUESTIONS}</div>{widened}</div>")


def _interval(summary: dict) -> str:
    """`` [95% CI 4.1–9.8%]`` after an ECE that has its bootstrap interval (equal-width bins), else ""."""
    low, high = summary.get("ece_ci_low"), summary.get("ece_ci_high")
    if low is None or high is None:
        return ""
    return f" <span id='ece-interval'>[95% CI {100 * low:.1f}–{100 * high:.1f}%]</span>"


def _outside_interval(summary: dict) -> str:
    """The note under the metrics when the ECE lies outside its own interval (:data:`OUTSIDE_INTERVAL`), else ""."""
    low, high, ece = summary.get("ece_ci_low"), summary.get("ece_ci_high"), summary["ece"]
    if low is None or high is None or low <= ece <= high:
        return ""
    said = OUTSIDE_INTERVAL.format(side="below" if ece < low else "above")
    return f"<div id='ece-outside-interval' style='{NOTE_STYLE}'>⚠ {html.escape(said)}</div>"


def _metrics_text(run: EvalRun, t: float, form: str, summary: dict, base: dict, sweep: analysis.Sweep,
                  token: bool = False) -> str:
    baseline = _baseline(run, form)
    binned = f"{summary['n_bins']} equal-{'mass' if summary['strategy'] == 'mass' else 'width'} bins"
    return (f"<div id='temperature-metrics'>{SYMBOL[form]} = <b>{t:.{SHOWN_DIGITS}g}</b> "
            f"({form} form, {TOKEN_FORMULA if token else FORMULA[form]}) · "
            f"ECE <b id='ece-value'>{100 * summary['ece']:.2f}%</b>{_interval(summary)} "
            f"({baseline}: {100 * base['ece']:.2f}%) · "
            f"NLL {summary['nll']:.4f} ({BASELINE[form]}: {base['nll']:.4f}) · "
            f"accuracy {100 * summary['accuracy']:.1f}% · n = {summary['n']} · {binned}, "
            f"bins {summary['bin_edges']}-closed</div>{_outside_interval(summary)}{_small_sample(summary['n'], token)}"
            f"{_optima_text(sweep, form)}")


def _small_sample(n: int, token: bool) -> str:
    """The note the Reliability page and the workbench give a run under :data:`lab.results.analysis.SMALL_N`
    questions (a token run's: targets)."""
    said = analysis.small_sample_warning(n, token)
    return f"<div id='temperature-small-sample' style='{NOTE_STYLE}'>⚠ {html.escape(said)}</div>" if said else ""


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
    config = runs.read_config(run.path) or {}
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
    slider = gr.skip() if t is None else gr.update(value=_on_grid(to_slider(t)))
    return PageView(gr.skip(), slider, "" if t is None else _show(t), message, *[gr.skip()] * 5)


def draw(ctx: LabContext, name: Optional[str], temperature: Any, form: str, bins: Optional[str],
         edges: Optional[str] = AS_EVALUATED, move: bool = True) -> PageView:
    """Everything the page shows at one temperature: reliability, metrics against the unscaled run,
    the sweep with its optima and the current T, the slider ranging over the sweep and T, the box at T.
    ``move=False`` leaves the slider's thumb where the user holds it, unless T lies outside the sweep."""
    run = runs.evaluation(ctx.runs, name)
    if run is None:
        return _blank("Pick an evaluation run.")
    t = _positive(temperature)
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
        box=gr.update(value=_show(t), label=f"{FIELD[form]} (type a value, then Enter)"),
        message=(note(PAPER_NOT_FOR_TOKENS) if form != asked else "") + clamped,
        reliability=reliability_figure(summary, f"{symbol} = {t:.{SHOWN_DIGITS}g} · {run.label}", TITLE_CHARS),
        text=_metrics_text(run, t, form, summary, base, sweep, predictions.is_token_run(pred)),
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
    it; anything but a number inside :data:`LIMITS` is refused and the box shows the drawn T again."""
    if drawn and str(value).strip() == _show(drawn["temperature"]):
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
    t = _positive(temperature)
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
        box = gr.Textbox(_show(1.0), label=f"{FIELD['logit']} (type a value, then Enter)", max_lines=1,
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
