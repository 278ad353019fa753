"""The temperature lab's handlers without a browser: the log slider and the T box, the range over a
widened sweep, refused entries, each form's words, what Save records, and the go-to-optimum buttons.

The run at the centre is closed-form: 50 two-option rows at confidence 0.99, 27 right, so ECE(T) =
|σ(ln 99 / T) − 0.54| is 0 at T* = ln 99 / ln(27/23) = 28.7, beyond the logit grid's 10 (and c* =
0.98 / ln(27/23) = 6.1 in the paper form, beyond its 1): the sweep must widen to reach it.
"""
import functools
import json
import math

import gradio as gr
import numpy as np
import pytest

from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import apply_temperature, write_evaluation
from lab.results import analysis, predictions
from tests.helpers import two_option_rows
from ui import temperature_page as page
from ui import temperature_slider
from ui.context import LabContext

pytestmark = pytest.mark.unit

NAME, BINS = "00001-evaluate", "10 equal-width bins"
SKIP = gr.skip()


@pytest.fixture
def far(tmp_path):
    """A run whose lowest ECE lies at T = 28.7, past the logit sweep's default grid (0.1…10)."""
    rows = two_option_rows([(0.99, 0 if i < 27 else 1) for i in range(50)])
    write_evaluation(tmp_path / NAME, rows, EvalConfig(dataset="mmlu", bootstrap=0), {"model": "toy"})
    return LabContext(tmp_path)


@pytest.fixture
def spread(tmp_path):
    """A run with confidences spread over many bins, so that each binning gives its own ECE."""
    rng = np.random.default_rng(0)
    p = rng.uniform(0.5, 1.0, 300)
    rows = two_option_rows([(float(x), 0 if rng.uniform() < 0.8 * x else 1) for x in p])
    write_evaluation(tmp_path / NAME, rows, EvalConfig(dataset="mmlu", bootstrap=0), {"model": "toy"})
    return LabContext(tmp_path)


def _sweep(ctx, form="logit", n_bins=10, edges="right"):
    """The sweep computed here, not through the page's cache."""
    return analysis.temperature_sweep(predictions.load_predictions(ctx.runs / NAME), form=form, n_bins=n_bins,
                                      edges=edges)


def _ece_shown(text):
    return float(text.split("id='ece-value'>")[1].split("%")[0])


# ---------------------------------------------------------------- the log slider
@pytest.mark.parametrize("t", [0.001, 0.0123, 0.1, 1.0, 2.5, 28.18, 999.9, 1000.0])
def test_a_temperature_survives_the_trip_through_the_log_slider(t):
    assert temperature_slider.to_slider(t) == pytest.approx(math.log10(t))
    assert temperature_slider.from_slider(temperature_slider.to_slider(t)) == t  # four significant digits, as the slider shows them


def test_every_slider_position_from_t_0_001_to_1000_reads_back_as_itself():
    positions = np.arange(-3000, 3001) / temperature_slider.STEPS_PER_DECADE
    back = np.array([temperature_slider.to_slider(temperature_slider.from_slider(x)) for x in positions])
    assert np.abs(back - positions).max() < 0.5 / temperature_slider.STEPS_PER_DECADE  # rounding T loses no step
    assert temperature_slider.from_slider(0.0) == 1.0 and temperature_slider.from_slider(1.0) == 10.0 and temperature_slider.from_slider(-3.0) == 0.001


def test_the_slider_spans_the_widened_sweep_and_says_it_is_log_scaled(far):
    view = page.pick_run(far, NAME, "logit", BINS)
    sweep = _sweep(far)
    assert sweep.best_ece > 10 and "sweep went on" in sweep.widened  # the case the issue reported
    slider = view.slider
    low, high = 10 ** slider["minimum"], 10 ** slider["maximum"]
    assert low <= sweep.table["temperature"].min() and high >= sweep.table["temperature"].max() >= sweep.best_ece
    assert high / sweep.table["temperature"].max() < 10 ** (1 / temperature_slider.STEPS_PER_DECADE)  # no wider than it needs
    assert slider["step"] == 1 / temperature_slider.STEPS_PER_DECADE and slider["value"] == 0.0  # T = 1: nothing saved
    assert "log scale" in slider["label"] and "T = 1" in slider["label"]
    paper = page.settings_changed(far, NAME, view.drawn, "paper", BINS).slider
    table = _sweep(far, "paper").table["temperature"]
    assert 10 ** paper["minimum"] <= table.min() and 10 ** paper["maximum"] >= table.max() > 10  # c* = 6.1
    assert "c = 1" in paper["label"]


def test_a_run_under_300_questions_is_flagged_as_the_other_pages_flag_it(far):
    small = page.pick_run(far, NAME, "logit", BINS).text  # 50 questions
    assert "id='temperature-small-sample'" in small and "Only 50 questions: below 300" in small


def test_a_run_of_300_questions_is_not_flagged(spread):
    assert "temperature-small-sample" not in page.pick_run(spread, NAME, "logit", BINS).text


def test_the_widening_is_said_next_to_the_optimum(far):
    text = page.pick_run(far, NAME, "logit", BINS).text
    optima = text.split("id='temperature-optima'>")[1]
    assert optima.startswith("lowest ECE at T = 28.2") and "id='sweep-widened'" in optima
    assert "so the sweep went on to T = 0.1…40" in optima


def test_a_drag_leaves_the_thumb_alone_unless_the_range_had_to_grow(far):
    drawn = page.pick_run(far, NAME, "logit", BINS).drawn
    dragged = page.slider_moved(far, NAME, 0.398, drawn, "logit", BINS)
    assert dragged.drawn["temperature"] == 2.5 and "value" not in dragged.slider
    assert "T = 2.5" in dragged.slider["label"]
    assert dragged.box["value"] == "2.5" and dragged.text.startswith("<div id='temperature-metrics'>T = <b>2.5</b>")
    typed = page.slider_moved(far, NAME, 3, drawn, "logit", BINS)  # typed into the slider's own box, past its end
    assert typed.drawn["temperature"] == 1000.0 and typed.slider["maximum"] == 3.0 and typed.slider["value"] == 3.0


# ---------------------------------------------------------------- the T box
@pytest.mark.parametrize("typed, t", [("250", 250.0), (" 0.002 ", 0.002), (40.5, 40.5)])
def test_a_typed_t_outside_the_range_stretches_it_and_is_drawn(far, typed, t):
    drawn = page.pick_run(far, NAME, "logit", BINS).drawn
    view = page.typed_temperature(far, NAME, typed, drawn, "logit", BINS)
    assert view.drawn["temperature"] == t and view.message == "" and view.box["value"] == temperature_slider.box_text(t)
    assert view.slider["minimum"] <= math.log10(t) <= view.slider["maximum"]
    assert view.slider["value"] == pytest.approx(math.log10(t), abs=1e-3)
    probs = analysis.recalibrate(predictions.load_predictions(far.runs / NAME), t)
    assert view.text.startswith(f"<div id='temperature-metrics'>T = <b>{t:.4g}</b>")
    assert _ece_shown(view.text) == pytest.approx(100 * abs(probs.max(1).mean() - 0.54), abs=0.006)


@pytest.mark.parametrize("typed", ["abc", "", "-1", "0", "inf", "nan", "1e400", None, True, "1e9"])
def test_typed_garbage_is_refused_by_name_and_the_box_shows_the_drawn_t_again(far, typed):
    drawn = page.typed_temperature(far, NAME, "2.5", page.pick_run(far, NAME, "logit", BINS).drawn, "logit", BINS).drawn
    view = page.typed_temperature(far, NAME, typed, drawn, "logit", BINS)
    assert "Temperature T: expected" in view.message and "lab-error" in view.message
    assert view.box == "2.5" and view.slider == gr.update(value=0.398)  # back to what is drawn
    assert (view.drawn, view.reliability, view.text, view.sweep) == (SKIP,) * 4  # the drawing stays at T = 2.5
    paper = page.typed_temperature(far, NAME, typed, {**drawn, "form": "paper"}, "paper", BINS)
    assert "Scale c: expected" in paper.message


def test_a_refused_slider_position_names_the_slider_and_nothing_drawn_resets_to_empty(far):
    drawn = page.pick_run(far, NAME, "logit", BINS).drawn
    view = page.slider_moved(far, NAME, "abc", drawn, "logit", BINS)
    assert "Temperature T slider: expected log₁₀ T" in view.message and view.slider == gr.update(value=0.0)
    assert page.slider_moved(far, NAME, 9, drawn, "logit", BINS).drawn == SKIP  # T = 1e9: past LIMITS
    nothing = page.typed_temperature(far, NAME, "abc", None, "logit", BINS)
    assert nothing.box == "" and nothing.slider == SKIP and "expected" in nothing.message


def test_pressing_enter_on_the_shown_t_keeps_every_digit_of_the_drawn_one(far):
    drawn = page.go_to_optimum(far, NAME, "logit", BINS, which="ece").drawn
    assert temperature_slider.box_text(drawn["temperature"]) != repr(drawn["temperature"])  # the box rounds it
    assert page.typed_temperature(far, NAME, temperature_slider.box_text(drawn["temperature"]), drawn, "logit", BINS) == \
        (SKIP,) * len(page.PageView._fields)


# ---------------------------------------------------------------- each form's words
def test_the_paper_form_says_c_and_never_calls_the_baseline_t_1(far):
    drawn = page.pick_run(far, NAME, "logit", BINS).drawn
    view = page.settings_changed(far, NAME, drawn, "paper", BINS)
    assert view.text.startswith("<div id='temperature-metrics'>c = <b>1</b> (paper form, FIRST's softmax(p / c))")
    assert "(unscaled (as evaluated): " in view.text and "lowest ECE at c = " in view.text
    assert "T =" not in view.text and "T=" not in view.text and "T = " not in view.slider["label"]
    assert "c = " in view.reliability.layout.title.text and "T =" not in view.reliability.layout.title.text
    assert view.sweep.layout.xaxis.title.text.startswith("c (FIRST's softmax(p / c))")
    sweep = _sweep(far, "paper")
    assert [t.name for t in view.sweep.data if t.name.startswith("best")] == \
        [f"best ECE c={sweep.best_ece:.3g}", f"best NLL c={sweep.best_nll:.3g}"]
    assert all("T" not in a.text for a in view.sweep.layout.annotations)
    assert view.go_ece["value"].startswith("Go to lowest ECE (c = ") and view.box["label"].startswith("Scale c")
    logit = page.settings_changed(far, NAME, view.drawn, "logit", BINS).text
    assert "(at T = 1, unscaled (as evaluated): " in logit


def test_a_run_evaluated_at_a_temperature_is_not_called_as_evaluated_when_unscaled(tmp_path):
    rows = apply_temperature(two_option_rows([(0.9, 0), (0.8, 1), (0.7, 0)]), 2.0)
    info = {"model": "toy", "temperature": 2.0}
    write_evaluation(tmp_path / NAME, rows, EvalConfig(dataset="mmlu", bootstrap=0), info)
    text = page.pick_run(LabContext(tmp_path), NAME, "paper", BINS).text
    assert "(unscaled; the run itself was evaluated at T = 2: " in text and "(as evaluated)" not in text


# ---------------------------------------------------------------- save
@pytest.mark.parametrize("bins, edges, n_bins, strategy, closed", [
    ("14 equal-width bins", "left-closed (torchmetrics)", 14, "width", "left"),
    ("10 equal-mass bins", "right-closed (Guo et al.)", 10, "mass", "right"),
])
def test_save_records_the_binning_the_page_shows(spread, bins, edges, n_bins, strategy, closed):
    drawn = page.pick_run(spread, NAME, "logit", bins, edges).drawn
    view = page.typed_temperature(spread, NAME, "1.7", drawn, "logit", bins, edges)
    assert "Saved T = 1.7" in page.save_drawn(spread, view.drawn)
    saved = json.loads((spread.runs / NAME / "temperature.json").read_text())
    recorded = (saved["temperature"], saved["bins"], saved["bin_edges"], saved["strategy"])
    assert recorded == (1.7, n_bins, closed, strategy)
    pred = predictions.load_predictions(spread.runs / NAME)
    scaled = analysis.recalibrate(pred, 1.7)
    after = analysis.calibration_summary(scaled, pred.mask, pred.labels, n_bins, strategy, closed)
    default = analysis.calibration_summary(scaled, pred.mask, pred.labels)  # what Save used to record
    assert saved["ece_after"] == pytest.approx(after["ece"]) and after["ece"] != pytest.approx(default["ece"])
    assert saved["ece_after"] * 100 == pytest.approx(_ece_shown(view.text), abs=0.005)  # what the page showed


@pytest.fixture
def at_chance(tmp_path):
    """A run at chance claiming 0.99 (25 of 50 right): its ECE falls all the way to T = ∞, so the
    sweep widens and stops at its bound, T = 100."""
    rows = two_option_rows([(0.99, 0 if i < 25 else 1) for i in range(50)])
    write_evaluation(tmp_path / NAME, rows, EvalConfig(dataset="mmlu", bootstrap=0), {"model": "toy"})
    return LabContext(tmp_path)


def test_save_records_the_widening_and_the_bound_the_page_shows(at_chance):
    """Issue 30: the page said the sweep widened and stopped at the bound; the file said
    ``widened: false, at_bound: false``."""
    view = page.go_to_optimum(at_chance, NAME, "logit", BINS)
    assert view.drawn["temperature"] == 100 and "it stopped at the bound T = 100" in view.text
    page.save_drawn(at_chance, view.drawn)
    saved = json.loads((at_chance.runs / NAME / "temperature.json").read_text())
    sweep = _sweep(at_chance)
    assert saved["widened"] is True and saved["at_bound"] is True
    assert saved["searched"] == [sweep.table["temperature"].min(), 100.0]
    inside = page.typed_temperature(at_chance, NAME, "2", view.drawn, "logit", BINS)
    page.save_drawn(at_chance, inside.drawn)  # T = 2 is no bound, but the sweep it is shown with is the same
    saved = json.loads((at_chance.runs / NAME / "temperature.json").read_text())
    assert (saved["temperature"], saved["widened"], saved["at_bound"]) == (2.0, True, True)


def test_the_diagram_s_title_leads_with_the_t_drawn_and_fits_half_the_page(at_chance):
    """Issue 30: "… at T = 1" while T = 100: the title ran past the plot's half of the row, and
    the end of "100" was cut off."""
    (at_chance.runs / NAME / "label.txt").write_text("a run named at some length · " * 3)
    view = page.go_to_optimum(at_chance, NAME, "logit", BINS)
    title = view.reliability.layout.title.text
    assert title.startswith("T = 100 · ")
    assert max(len(line) for line in title.split("<br>")) <= page.TITLE_CHARS
    paper = page.go_to_optimum(at_chance, NAME, "paper", BINS).reliability.layout.title.text
    assert paper.startswith("c = ")


def test_save_is_refused_before_anything_is_drawn_and_in_the_paper_form(far):
    assert "Nothing is drawn yet" in page.save_drawn(far, None)
    paper = page.pick_run(far, NAME, "paper", BINS).drawn
    assert "logit form" in page.save_drawn(far, paper)
    assert not (far.runs / NAME / "temperature.json").exists()


# ---------------------------------------------------------------- optima, and picking a run
@pytest.mark.parametrize("which", ["ece", "nll"])
def test_go_to_optimum_dials_the_sweep_s_best_exactly(far, which):
    sweep = _sweep(far)
    best = sweep.best_ece if which == "ece" else sweep.best_nll
    view = page.go_to_optimum(far, NAME, "logit", BINS, which=which)
    assert view.drawn["temperature"] == best and best > 10  # past the default grid: only the widening found it
    button = view.go_ece if which == "ece" else view.go_nll
    assert view.box["value"] == temperature_slider.box_text(best) and button["value"].endswith(f"(T = {best:.3g})")
    at_best = sweep.table.loc[sweep.table["temperature"] == best].iloc[0]
    assert _ece_shown(view.text) == pytest.approx(100 * at_best["ece"], abs=0.005)
    assert f"NLL {at_best['nll']:.4f}" in view.text
    with pytest.raises(ValueError, match="which"):
        page.go_to_optimum(far, NAME, "logit", BINS, which="brier")


def test_picking_a_run_draws_everything_at_its_saved_temperature(far):
    assert page.save_chosen_temperature(far, NAME, 3.0, "logit").startswith("<div class='lab-ok'>")
    view = page.pick_run(far, NAME, "logit", BINS)
    assert view.drawn == {"name": NAME, "temperature": 3.0, "form": "logit", "bins": BINS, "edges": page.AS_EVALUATED}
    assert view.slider["value"] == pytest.approx(math.log10(3.0), abs=1e-3) and view.box["value"] == "3"
    assert view.reliability is not None and view.sweep is not None and view.message == ""
    assert view.text.startswith("<div id='temperature-metrics'>T = <b>3</b>")
    blank = page.pick_run(far, None, "logit", BINS)
    assert blank.drawn is None and blank.message == "Pick an evaluation run." and blank.reliability is None


def test_the_wiring_calls_each_handler_from_its_control(far):
    with gr.Blocks() as demo:
        page.build_temperature(far)
    wired = {}
    for fn in demo.fns.values():
        handler = fn.fn.func if isinstance(fn.fn, functools.partial) else fn.fn
        wired.setdefault(getattr(handler, "__name__", ""), []).append(fn)
    events = {name: {event for fn in fns for _, event in fn.targets} for name, fns in wired.items()}
    assert events["pick_run"] == {"change"} and events["slider_moved"] == {"input"}
    assert events["typed_temperature"] == {"submit", "blur"} and events["go_to_optimum"] == {"click"}
    assert events["settings_changed"] == {"change"} and len(wired["settings_changed"]) == 3
    assert wired["slider_moved"][0].preprocess is False  # gradio would refuse an out-of-range position with a toast
    assert len(wired["pick_run"][0].outputs) == len(page.PageView._fields)
