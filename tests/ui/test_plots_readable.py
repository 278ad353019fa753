"""Issue #15, the plots: what a reader saw in a browser, checked on the figures' structure — bars
that never overlap, counts and titles that cannot collide, every picked run drawn, an HTML export
that opens offline, a PNG button, training metrics that differ by more than dash, a readable caption."""
import json
import re
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import write_evaluation
from lab.results import runs
from lab.results.analysis import calibration_summary
from ui import knowledge_page, reliability_page
from ui.plots import common, reliability, training
from ui.context import LabContext

pytestmark = pytest.mark.unit

LONG = "00003 · bundled + 00005-cft/adapter · obqa/test · cloze (cloze_plain) · n=300 · 11-23 10:54"


def skewed_summary(n_bins, strategy, n=600, seed=0, ties=0):
    """A realistic over-confident 4-option model: confidences piled up near 1 (Beta(6, 1) on
    [0.25, 1]), right with probability 0.85 × confidence; ``ties`` of them exactly 1.0."""
    rng = np.random.default_rng(seed)
    conf = np.concatenate([0.25 + 0.75 * rng.beta(6, 1, n - ties), np.ones(ties)])
    probs = np.column_stack([conf] + [(1 - conf) / 3] * 3)
    labels = np.where(rng.random(n) < 0.85 * conf, 0, 1)
    return calibration_summary(probs, np.ones_like(probs, dtype=bool), labels, n_bins, strategy)


def _bars(fig):
    return [t for t in fig.data if t.type == "bar"]


def _intervals(trace):
    return [(x - w / 2, x + w / 2) for x, w in zip(trace.x, trace.width)]


def assert_no_two_bars_overlap(fig):
    """Bars of one bin share their span (a gap bar sits on its accuracy bar); spans of different
    bins may touch but not overlap, in every subplot."""
    for axis in {t.xaxis for t in _bars(fig)}:
        spans = sorted({(round(a, 12), round(b, 12)) for t in _bars(fig) if t.xaxis == axis for a, b in _intervals(t)})
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-9, f"bars overlap on {axis}: {spans}"


def _annotations(fig, name):
    return [a for a in fig.layout.annotations if a.name == name]


# ---------------------------------------------------------------- 1. bars never overlap
@pytest.mark.parametrize("n_bins, strategy", [(10, "width"), (14, "width"), (10, "mass"), (15, "mass"), (30, "mass")])
def test_no_two_bars_overlap_on_a_skewed_sample(n_bins, strategy):
    summary = skewed_summary(n_bins, strategy)
    assert_no_two_bars_overlap(reliability.reliability_figure(summary, "run"))
    assert_no_two_bars_overlap(reliability.side_by_side([("a", summary), ("b", skewed_summary(n_bins, strategy, seed=1))]))


def test_equal_mass_bars_span_their_own_confidences_and_stay_visible():
    summary = skewed_summary(10, "mass")
    accuracy = next(t for t in reliability.reliability_figure(summary).data if t.name == "accuracy")
    for (left, right), b in zip(_intervals(accuracy), summary["reliability"]):
        assert left <= b["lo"] + 1e-9 and right >= b["hi"] - 1e-9  # covers every confidence in the bin
    assert min(accuracy.width) >= reliability.MIN_BAR - 1e-9  # narrow bins near 1 widened to stay visible


def test_equal_mass_bins_of_one_tied_confidence_are_marked():
    # 240 ties at 1.0 fill the top three bins' share exactly: tied confidences share one bin (never
    # split by row order), so one bin holds only 1.0 and the two it would have reached stay empty.
    summary = skewed_summary(10, "mass", ties=240)
    fig = reliability.reliability_figure(summary)
    assert_no_two_bars_overlap(fig)
    (marks,) = [t for t in fig.data if t.name == reliability.NARROW_NAME]
    assert list(marks.x) == pytest.approx([1.0], abs=1e-3) and marks.mode == "markers"
    assert not [t for t in reliability.reliability_figure(skewed_summary(10, "mass")).data if t.name == reliability.NARROW_NAME]


# ---------------------------------------------------------------- 2. counts and titles cannot collide
def test_counts_sit_in_a_row_above_the_plot_area_under_the_titles():
    summaries = [(LONG, skewed_summary(10, "width")), (LONG.replace("00003", "00004"), skewed_summary(10, "width"))]
    fig = reliability.side_by_side(summaries)
    counts, titles = _annotations(fig, reliability.COUNT_NAME), _annotations(fig, common.TITLE_NAME)
    assert len(counts) == sum(b["count"] > 0 for _, s in summaries for b in s["reliability"])
    assert {(c.xref, c.yref) for c in counts} == {("x", "y domain"), ("x2", "y2 domain")}
    assert all(c.y == 1 and c.yanchor == "bottom" and c.yshift >= 0 for c in counts)  # above the plot area
    assert fig.layout.yaxis.range == (0, 1)  # nothing inside the plot reaches into that row
    assert all(t.yanchor == "bottom" and t.yshift >= reliability.COUNT_ROW for t in titles)  # above the counts
    lines = max(t.text.count("<br>") + 1 for t in titles)
    assert fig.layout.margin.t >= reliability.COUNT_ROW + lines * common.TITLE_LINE
    assert fig.layout.legend.orientation == "h" and fig.layout.margin.b >= 100  # the legend below, not beside


def test_crowded_counts_stand_upright_in_a_taller_row_and_the_stats_stack():
    level = reliability.side_by_side([(str(i), skewed_summary(10, "width", seed=i)) for i in range(3)])
    crowded = reliability.side_by_side([(str(i), skewed_summary(14, "width", seed=i)) for i in range(6)])
    assert {c.textangle for c in _annotations(level, reliability.COUNT_NAME)} == {0}
    assert {c.textangle for c in _annotations(crowded, reliability.COUNT_NAME)} == {-90}  # 84 bars: ≈ 15 px each
    assert {t.yshift for t in _annotations(crowded, common.TITLE_NAME)} == {reliability.COUNT_ROW_TALL + 4}
    assert crowded.layout.margin.t - level.layout.margin.t == reliability.COUNT_ROW_TALL - reliability.COUNT_ROW
    assert all(a.text.count("<br>") == 2 for a in _annotations(crowded, reliability.STATS_NAME))  # narrow: one a line
    assert len(_annotations(crowded, reliability.COUNT_KEY_NAME)) == 1  # "per bin", once, left of the first plot


def test_a_single_diagram_puts_its_title_above_the_counts():
    """Anchored at its bottom, Plotly sets a title's first line there and the next ones below it:
    a title of several lines (the Temperature lab wraps its own, issue 30) ran onto the counts
    unless each further line lifts the anchor by one line."""
    for width, lines in ((100, 1), (30, 3)):
        fig = reliability.reliability_figure(skewed_summary(10, "width"), LONG, width)
        title = fig.layout.title
        assert title.text.count("<br>") == lines - 1
        assert title.yref == "paper" and title.y == 1 and title.yanchor == "bottom"
        assert title.pad.b >= reliability.COUNT_ROW + (lines - 1) * 20
        assert fig.layout.margin.t >= common.MODEBAR + lines * 20 + reliability.COUNT_ROW
    assert all(c.yanchor == "bottom" and c.y == 1 for c in _annotations(fig, reliability.COUNT_NAME))


def test_long_run_labels_are_wrapped_above_side_by_side_plots_and_whole_in_the_hover():
    labels = [LONG.replace("00003", f"0000{i}") for i in range(6)]
    fig = reliability.side_by_side([(label, skewed_summary(10, "width")) for label in labels])
    titles = _annotations(fig, common.TITLE_NAME)
    assert [t.hovertext for t in titles] == labels
    for title in titles:
        lines = title.text.split("<br>")
        assert 1 < len(lines) <= common.MAX_TITLE_LINES and max(map(len, lines)) <= 110 // 6
    accuracy = [t for t in fig.data if t.name == "accuracy"]
    assert [re.search("<extra>(.*)</extra>", t.hovertemplate)[1] for t in accuracy] == labels


def test_wrap_label():
    assert common.wrap_label("a · b · c", 20) == "a · b · c"
    assert common.wrap_label("aaaa · bbbb · cccc", 11) == "aaaa · bbbb<br>cccc"
    assert common.wrap_label("aaaa · bbbb · cccc · dddd", 4, max_lines=2) == "aaaa<br>bbb…"
    assert common.wrap_label("a-very-long-part", 6) == "a-ver…"


# ---------------------------------------------------------------- 3. position-wise: every run
def _letter_rows(n=12, top=True):
    rows = []
    for i in range(n):
        probs = [0.7, 0.1, 0.1, 0.1] if i % 3 else [0.1, 0.7, 0.1, 0.1]
        row = {"id": f"q{i}", "question": f"Question {i}?", "choices": list("abcd"), "answer": 0, "probs": probs,
               "pred": int(np.argmax(probs)), "confidence": 0.7, "correct": i % 3 != 0}
        if top:
            row["top_tokens"] = [{"token": " A", "prob": 0.6}, {"token": " B", "prob": 0.2}, {"token": " C", "prob": 0.1}]
        rows.append(row)
    return rows


@pytest.fixture
def three_runs(tmp_path):
    """Two letter-scored runs (with top tokens) and a cloze run (without), as the evaluate job writes them."""
    write_evaluation(tmp_path / "00001-evaluate", _letter_rows(), EvalConfig(dataset="mmlu", bootstrap=0),
                     {"model": "bundled"})
    write_evaluation(tmp_path / "00002-evaluate", _letter_rows(9), EvalConfig(dataset="mmlu", bootstrap=0),
                     {"model": "bundled"})
    write_evaluation(tmp_path / "00003-evaluate", _letter_rows(top=False),
                     EvalConfig(dataset="obqa", scoring="cloze", bootstrap=0), {"model": "bundled"})
    return LabContext(tmp_path)


def test_positionwise_view_draws_every_picked_run_and_names_those_without_top_tokens(three_runs):
    ctx = three_runs
    names = ["00001-evaluate", "00002-evaluate", "00003-evaluate"]
    labels = [runs.evaluation(ctx.runs, n).label for n in names]
    fig, message = reliability_page.reliability_view(ctx, names, "", "position-wise top-k")
    assert fig.layout.barmode == "group"
    assert [t.type for t in fig.data] == ["bar", "scatter", "bar", "scatter"]
    assert [t.legendgrouptitle.text for t in fig.data[::2]] == [common.wrap_label(label, 60, 2) for label in labels[:2]]
    assert [re.search("<extra>(.*)</extra>", t.hovertemplate)[1] for t in fig.data] == [labels[0]] * 2 + [labels[1]] * 2
    assert fig.data[0].marker.color == fig.data[1].line.color != fig.data[2].marker.color  # one colour per run
    assert "No top-token data" in message and labels[2] in message and labels[0] not in message
    only_cloze, message = reliability_page.reliability_view(ctx, names[2:], "", "position-wise top-k")
    assert not only_cloze.data and labels[2] in message
    assert reliability_page.reliability_view(ctx, names[:1], "", "position-wise top-k")[1] == ""


def test_reliability_figures_are_titled_by_run_label_not_folder(three_runs):
    ctx = three_runs
    fig, _ = reliability_page.reliability_view(ctx, ["00001-evaluate"], "", "reliability diagram")
    label = runs.evaluation(ctx.runs, "00001-evaluate").label
    assert fig.layout.title.text == common.wrap_label(label, 100) and "00001-evaluate" not in fig.layout.title.text
    fig, _ = reliability_page.reliability_view(ctx, ["00001-evaluate", "00003-evaluate"], "", "reliability diagram")
    assert [a.hovertext for a in _annotations(fig, common.TITLE_NAME)] == [
        label, runs.evaluation(ctx.runs, "00003-evaluate").label]


# ---------------------------------------------------------------- 4. exports
def test_exported_html_embeds_plotly_and_loads_nothing_from_the_network(three_runs):
    exported = reliability_page.export_view(three_runs, ["00001-evaluate"], "10 equal-mass bins", "reliability diagram")
    path = Path(exported["value"])
    text = path.read_text(encoding="utf-8")
    assert exported["visible"] and path.suffix == ".html" and path.name.startswith("reliability-00001-")
    assert not re.search(r"<script[^>]*\bsrc=", text)  # no script loaded from anywhere, CDN or not
    assert not re.search(r"""src=["']?https?://""", text) and len(text) > 1_000_000  # plotly.js itself is inside
    assert re.search(r"plotly\.js v\d", text)  # its banner
    assert '"toImageButtonOptions": {"format": "png"' in text


def test_the_plot_s_camera_button_saves_a_named_full_resolution_png(three_runs):
    plot, message = reliability_page.shown_view(three_runs, ["00001-evaluate"], "", "reliability diagram")
    sent = json.loads(plot.plot)
    assert plot.type == "plotly" and sent["data"] and sent["layout"]
    assert "Only 12 questions" in message  # a small run draws, flagged
    options = sent["config"]["toImageButtonOptions"]
    assert options["format"] == "png" and options["scale"] >= 2
    assert re.fullmatch(r"reliability-00001-[a-z0-9-]+", options["filename"])
    assert reliability_page.shown_view(three_runs, [], "", "reliability diagram") == (
        None, "Pick one or more evaluation runs.")


# ---------------------------------------------------------------- 5. training: ECE and accuracy apart
def test_training_validation_ece_and_accuracy_differ_by_panel_marker_and_name_for_several_stages():
    events = [{"stage": f"student:{s}", "step": 1, "loss": 2.0} for s in ("ce", "first", "kd", "ls")]
    events += [{"stage": f"student:{s}_eval", "epoch": e, "ece": 0.1 * e, "accuracy": 0.3 + 0.1 * e}
               for s in ("ce", "first", "kd", "ls") for e in (1.0, 2.0)]
    fig = training.training_figure(events, "student:")
    ece = [t for t in fig.data if t.name.endswith("val ECE")]
    accuracy = [t for t in fig.data if t.name.endswith("val accuracy")]
    assert len(ece) == len(accuracy) == 4
    assert {t.xaxis for t in ece} == {"x2"} and {t.xaxis for t in accuracy} == {"x3"}  # panels of their own
    assert {t.marker.symbol for t in ece} == {"circle"} and {t.marker.symbol for t in accuracy} == {"square"}
    assert len({t.line.color for t in ece}) == 4  # one colour per stage, the same in every panel
    for stage_ece, stage_acc in zip(ece, accuracy):
        assert stage_ece.line.color == stage_acc.line.color and stage_ece.legendgroup == stage_acc.legendgroup
    assert len({t.name for t in fig.data}) == len(fig.data)  # every legend name says what it is
    assert fig.layout.yaxis3.range == (0, 1) and fig.layout.yaxis2.rangemode == "tozero"


# ---------------------------------------------------------------- 6. knowledge caption
def test_the_knowledge_caption_is_text_not_a_python_dict(tmp_path):
    store = tmp_path / "00007-first" / "topk" / "train"
    store.mkdir(parents=True)
    meta = {"model": {"model": "/home/ada/runs/00005-finetune/model", "adapter": None, "history": [{"loss": 1}]},
            "dataset": "csqa", "split": "train", "tokenizer": "x"}
    (store / "manifest.json").write_text(json.dumps({"k": 5, "n_sequences": 1200, "complete": False, "meta": meta}))
    ctx = LabContext(tmp_path)
    (name,) = runs.store_names(ctx.runs)
    _, text = knowledge_page.knowledge_view(ctx, name)
    assert "{" not in text and "'" not in text and "None" not in text
    assert "k = 5" in text and "1,200 sequences of csqa/train" in text and "model 00005-finetune/model" in text
    assert "incomplete" in text
    assert knowledge_page.model_text({"model": "bundled", "adapter": "/r/00009-cft/adapter"}) == \
        "bundled + adapter 00009-cft/adapter"
    assert knowledge_page.model_text("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    assert knowledge_page.model_text(None) == "not recorded"


def test_the_pages_build(three_runs):
    with gr.Blocks():
        reliability_page.build_reliability(three_runs)
        knowledge_page.build_knowledge(three_runs)


# ---------------------------------------------------------------- issue 30: each mark is what its legend says
def _one_bin_each(over: bool, under: bool) -> dict:
    """A summary whose bins are over-confident (conf .85, acc .6) and/or under-confident (conf .35, acc .7)."""
    bins = []
    if under:
        bins.append({"lo": 0.3, "hi": 0.4, "conf": 0.35, "acc": 0.7, "count": 10})
    if over:
        bins.append({"lo": 0.8, "hi": 0.9, "conf": 0.85, "acc": 0.6, "count": 10})
    return {"reliability": bins, "n_bins": 10, "strategy": "width", "ece": 0.3, "n": 10 * len(bins)}


def test_the_grey_accuracy_bar_shows_whole_under_an_under_confident_gap():
    """Issue 30: in an under-confident bin the grey bar labelled "accuracy" seemed to end at the
    confidence: the blue gap, filled, covered its top from the confidence up to the accuracy. The
    gap is hatched over a clear ground, so the grey shows to its true height beneath it."""
    fig = reliability.reliability_figure(_one_bin_each(over=True, under=True))
    accuracy = next(t for t in fig.data if t.name == "accuracy")
    under = next(t for t in fig.data if t.name == "under-confident")
    over = next(t for t in fig.data if t.name == "over-confident")
    assert accuracy.y == (0.7, 0.6)  # grey from 0 to the accuracy, in every bin
    assert under.base == (0.7,) and under.y == pytest.approx((-0.35,))  # the gap lies over the grey …
    assert under.marker.pattern.shape and under.marker.pattern.fillmode in (None, "replace")
    assert under.marker.pattern.bgcolor == "rgba(0,0,0,0)"  # … hatched on a clear ground: the grey shows
    assert over.base == (0.6,) and over.y == pytest.approx((0.25,))  # above the grey: nothing hidden


def test_every_kind_of_bar_drawn_has_its_legend_entry():
    """Issue 30: the workbench's "after" plot drew a blue bar with no legend entry: the entry went
    to the "before" plot's blue trace, which was empty, and Plotly lists no empty trace."""
    fig = reliability.side_by_side([("before", _one_bin_each(over=True, under=False)),
                              ("after", _one_bin_each(over=True, under=True))])
    shown = {t.name: t for t in fig.data if t.showlegend is not False}
    assert {"accuracy", "over-confident", "under-confident"} <= set(shown)
    assert all(len(shown[name].x) for name in ("accuracy", "over-confident", "under-confident"))
