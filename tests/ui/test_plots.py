"""Plotly figures: structure (traces, colours, annotations), never pixels; empty input never raises."""
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from lab.results.analysis import calibration_summary
from ui.plots import common, curves, questions, reliability, training
from ui.plots.common import OVER, UNDER

pytestmark = pytest.mark.unit


def _summary():
    """Conf .95 .85 .75 .65 with correct 1 0 1 0: bins 9 and 7 under-confident, 8 and 6 over-confident."""
    probs = np.array([[0.95, 0.05], [0.85, 0.15], [0.25, 0.75], [0.35, 0.65]])
    return calibration_summary(probs, np.ones_like(probs, dtype=bool), np.array([0, 1, 1, 0]))


def _trace(fig, name):
    (trace,) = [t for t in fig.data if t.name == name]
    return trace


def _texts(fig, name=None):
    """Annotation texts, of those called ``name`` (reliability.COUNT_NAME, STATS_NAME, TITLE_NAME) when given."""
    return [a.text for a in fig.layout.annotations if name is None or a.name == name]


def test_reliability_figure_draws_accuracy_gaps_diagonal_and_stats():
    fig = reliability.reliability_figure(_summary(), "teacher")
    assert [t.name for t in fig.data] == ["accuracy", "over-confident", "under-confident", "perfect calibration"]
    accuracy, over, under = _trace(fig, "accuracy"), _trace(fig, "over-confident"), _trace(fig, "under-confident")
    assert accuracy.x == pytest.approx((0.65, 0.75, 0.85, 0.95))  # bin centres, empty bins skipped
    assert accuracy.y == (0.0, 1.0, 0.0, 1.0) and _texts(fig, reliability.COUNT_NAME) == ["1", "1", "1", "1"]
    assert accuracy.width == pytest.approx((0.095,) * 4)
    assert over.marker.color == OVER and under.marker.color == UNDER
    assert over.x == pytest.approx((0.65, 0.85)) and over.y == pytest.approx((0.65, 0.85)) and over.base == (0.0, 0.0)
    assert under.x == pytest.approx((0.75, 0.95)) and under.y == pytest.approx((-0.25, -0.05))
    assert under.base == (1.0, 1.0)  # the gap runs down from accuracy to confidence
    assert _texts(fig, reliability.STATS_NAME) == ["ECE 45.0% · n=4 · Trust 5.0%"]
    assert fig.layout.title.text == "teacher" and fig.layout.barmode == "overlay"


def test_reliability_figure_of_equal_mass_bins_spans_their_confidences():
    probs = np.array([[0.95, 0.05], [0.85, 0.15], [0.25, 0.75], [0.35, 0.65]])
    summary = calibration_summary(probs, np.ones_like(probs, dtype=bool), np.array([0, 1, 1, 0]), 2, "mass")
    fig = reliability.reliability_figure(summary, "")
    assert _trace(fig, "accuracy").x == pytest.approx((0.7, 0.9))  # bins {.65, .75} and {.85, .95}
    assert _trace(fig, "accuracy").width == pytest.approx((0.1, 0.1))  # lo..hi of each
    assert _trace(fig, "over-confident").y == pytest.approx((0.2, 0.4))
    assert _texts(fig, reliability.STATS_NAME) == ["ECE 30.0% · n=4 · Trust 20.0%<br>2 questions per bin"]
    assert _texts(fig, reliability.COUNT_NAME) == []  # equal counts: said once, not above each (narrow) bar


def test_reliability_figure_draws_a_stored_metrics_json_summary():
    stored = {"n": 2, "ece": 0.1, "trust": 0.4, "n_bins": 2, "reliability": [
        {"lo": 0.0, "hi": 0.5, "count": 0, "conf": None, "acc": None, "gap": None},
        {"lo": 0.5, "hi": 1.0, "count": 2, "conf": 0.6, "acc": 0.5, "gap": 0.1}]}
    fig = reliability.reliability_figure(stored, "run")
    assert _trace(fig, "accuracy").x == (0.75,) and _trace(fig, "under-confident").x == ()
    assert _texts(fig, reliability.STATS_NAME) == ["ECE 10.0% · n=2 · Trust 40.0%"]


def test_side_by_side_has_one_subplot_per_run_with_a_shared_y_axis():
    fig = reliability.side_by_side([("teacher", _summary()), ("student", _summary()), ("first", _summary())])
    assert len(fig.data) == 12
    assert {t.xaxis for t in fig.data} == {"x", "x2", "x3"}
    assert fig.layout.yaxis2.matches == "y" and fig.layout.yaxis3.matches == "y"
    assert sum(t.showlegend is not False for t in fig.data) == 4  # one legend entry per kind of trace
    assert _texts(fig, common.TITLE_NAME) == ["teacher", "student", "first"]
    assert _texts(fig, reliability.STATS_NAME) == ["ECE 45.0% · n=4 · Trust 5.0%"] * 3


def test_sweep_figure_marks_optima_and_the_current_temperature():
    df = pd.DataFrame({"temperature": [0.5, 1.0, 2.0, 4.0], "ece": [0.3, 0.1, 0.05, 0.2],
                       "nll": [2.0, 1.5, 1.2, 1.3], "accuracy": [0.5] * 4})
    fig = curves.sweep_figure(df, 2.0, 2.0, current_T=1.0)
    assert fig.layout.xaxis.type == "log"
    assert [t.name for t in fig.data] == ["ECE", "NLL", "best ECE T=2", "best NLL T=2"]
    assert _trace(fig, "NLL").yaxis == "y2" and _trace(fig, "ECE").yaxis == "y"
    assert _trace(fig, "best ECE T=2").y == (0.05,) and _trace(fig, "best NLL T=2").y == (1.2,)
    (line,) = fig.layout.shapes
    assert line.x0 == line.x1 == 1.0  # shapes take data values on a log axis
    (label,) = fig.layout.annotations
    assert label.text == "T = 1" and label.x == pytest.approx(math.log10(1.0))
    assert not curves.sweep_figure(df, 2.0, 2.0).layout.shapes


def test_coverage_figure_from_a_manifest():
    manifest = {"k": 2, "coverage": {"k": [1, 2, 3], "mean": [0.5, 0.7, 0.8], "min": [0.1, 0.2, 0.3],
                                     "max": [0.9, 0.95, 0.99], "positions": 10},
                "storage": {"k": [1, 2, 3], "bytes_per_position": [4, 8, 12]}}
    fig = curves.coverage_figure(manifest)
    assert _trace(fig, "mean coverage").y == (0.5, 0.7, 0.8)
    assert _trace(fig, "min–max over positions").fill == "tonexty"
    assert _trace(fig, "bytes / position").yaxis == "y2"
    assert "stored k = 2" in _texts(fig)
    only_coverage = curves.coverage_figure(manifest["coverage"])
    assert [t.name for t in only_coverage.data] == ["max", "min–max over positions", "mean coverage"]


def test_training_figure_loss_per_step_and_validation_per_epoch():
    events = [
        {"stage": "stage", "name": "teacher"},
        {"stage": "teacher", "step": 1, "loss": 2.0}, {"stage": "teacher", "step": 2, "loss": 1.5},
        {"stage": "teacher_eval", "epoch": 1.0, "step": 2, "ece": 0.2, "accuracy": 0.4},
        {"stage": "teacher_eval", "epoch": 2.0, "step": 4, "ece": 0.1, "accuracy": 0.5},
        {"stage": "student:first", "step": 1, "loss": 3.0},
        {"stage": "extract", "step": 8, "total": 64},
    ]
    fig = training.training_figure(events, "teacher")
    assert [t.name for t in fig.data] == ["teacher loss", "teacher val ECE", "teacher val accuracy"]
    assert _trace(fig, "teacher loss").x == (1, 2) and _trace(fig, "teacher loss").y == (2.0, 1.5)
    assert _trace(fig, "teacher val ECE").x == (1.0, 2.0) and _trace(fig, "teacher val ECE").y == (0.2, 0.1)
    assert _trace(fig, "teacher val ECE").xaxis == "x2" and _trace(fig, "teacher val accuracy").xaxis == "x3"
    assert [t.name for t in training.training_figure(events, "student:").data] == ["student:first loss"]


def test_option_bars_groups_models_per_option():
    fig = questions.option_bars([{"model": "teacher", "probs": [0.7, 0.2, 0.1]},
                             {"model": "student", "probs": [0.4, 0.6], "labels": ["yes", "no"]}])
    assert fig.layout.barmode == "group"
    assert [t.name for t in fig.data] == ["teacher", "student"]
    assert fig.data[0].x == ("A", "B", "C") and fig.data[1].x == ("yes", "no")
    assert fig.data[0].y == (0.7, 0.2, 0.1)


def test_positionwise_figure():
    df = pd.DataFrame({"rank": [1, 2], "mean_prob": [0.6, 0.2], "answer_in_topk": [0.5, 0.9]})
    fig = questions.positionwise_figure([("run", df)])
    assert [t.type for t in fig.data] == ["bar", "scatter"]
    assert list(fig.data[0].x) == ["top-1", "top-2"] and list(fig.data[1].y) == [0.5, 0.9]
    assert list(fig.data[0].y) == [0.6, 0.2]


@pytest.mark.parametrize("draw", [
    lambda: reliability.reliability_figure({}, "empty"),
    lambda: reliability.reliability_figure({"reliability": [{"count": 0, "acc": None}]}, ""),
    lambda: reliability.side_by_side([]),
    lambda: curves.sweep_figure(pd.DataFrame(columns=["temperature", "ece", "nll", "accuracy"]), 1.0, 1.0),
    lambda: curves.coverage_figure({}),
    lambda: training.training_figure([], "teacher"),
    lambda: questions.option_bars([]),
    lambda: questions.positionwise_figure([("cloze", pd.DataFrame(columns=["rank", "mean_prob", "answer_in_topk"]))]),
    lambda: questions.positionwise_figure([]),
])
def test_empty_input_gives_a_no_data_figure(draw):
    fig = draw()
    assert isinstance(fig, go.Figure) and not fig.data
    assert _texts(fig) == ["no data"]
    fig.to_json()  # valid for the browser


def test_input_that_cannot_be_drawn_says_why_instead_of_raising():
    fig = questions.option_bars([{"model": "x", "probs": None}])
    assert not fig.data and _texts(fig)[0].startswith("cannot draw: TypeError")


# ---------------------------------------------------------------- user text is text (issue 30, S7)
EVIL = '<a href="https://evil.example">Log in again</a><b>x</b>'
ESCAPED = '&lt;a href="https://evil.example"&gt;Log in again&lt;/a&gt;&lt;b&gt;x&lt;/b&gt;'


def _strings(value):
    """Every string anywhere in a figure's JSON: titles, names, hover, annotations, ticks."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _user_text_figures():
    from ui.job_results import compare_figure

    summary = _summary()
    table = pd.DataFrame({"rank": [1, 2], "mean_prob": [0.6, 0.2], "answer_in_topk": [0.5, 0.9]})
    robust = pd.DataFrame({"bins": [5, 10], "width": [0.1, 0.2], "width_low": [0.05, 0.1], "width_high": [0.2, 0.3],
                           "mass": [0.1, 0.15]})
    curve = {"label": EVIL, "coverage": [0.5, 1.0], "risk": [0.1, 0.2], "aurc": 0.15, "at_threshold": (0.5, 0.9)}
    comparison = {"questions": [{"question": EVIL, "options": [EVIL, "no"], "answer": 0}],
                  "results": [{"label": EVIL, "answers": [{"probs": [0.6, 0.4]}]}]}
    return {
        "reliability": reliability.reliability_figure(summary, EVIL),
        "reliability, no data": reliability.reliability_figure({}, EVIL),
        "side by side": reliability.side_by_side([(EVIL, summary), ("before: " + EVIL, summary)]),
        "option bars": questions.option_bars([{"model": EVIL, "probs": [0.6, 0.4], "labels": [EVIL, "no"]}]),
        "positionwise": questions.positionwise_figure([(EVIL, table)]),
        "selective": curves.selective_figure([curve], 0.5),
        "robustness": curves.robustness_figure([(EVIL, robust, 0.1)]),
        "compare": compare_figure(comparison),
    }


@pytest.mark.parametrize("name", list(_user_text_figures()))
def test_html_in_user_text_is_shown_as_text_never_rendered(name):
    """Plotly renders <a href>, <b>, <span style> … in titles, legends, hover, annotations and ticks:
    a run renamed to a link would put a live link on every plot. Escaped, Plotly shows the text."""
    fig = _user_text_figures()[name]
    texts = list(_strings(fig.to_plotly_json()))
    assert not [t for t in texts if "<a " in t or "<b>" in t], name
    assert any("&lt;a href" in t for t in texts), name  # the label is still there, as text


def test_plain_escapes_markup_but_not_quotes():
    assert common.plain(EVIL) == ESCAPED  # Plotly decodes &lt; back to <, so the reader sees the label as typed
    assert common.plain("T = 2 & more") == "T = 2 &amp; more"
    assert common.wrap_label("<b>a</b> · <i>b</i>", 8) == "&lt;b&gt;a&lt;/b&gt;<br>&lt;i&gt;b&lt;/i&gt;"
