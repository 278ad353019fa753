"""Plotly figures for the browser lab, built from plain dicts and DataFrames (no gradio, no torch).

Each figure function returns a ``go.Figure`` and never raises: empty input gives an empty figure saying
"no data", and input it cannot draw gives one saying why, so one bad run cannot break a page.
Inputs come from :mod:`lab.results.analysis` (summaries, sweeps, tables), a top-k store's manifest
(:mod:`lab.kinds.extract.store`) and a job's events (:class:`lab.training.trainer.LabCallback`).
"""
from __future__ import annotations

import functools
import html
import math
from typing import Any, Callable, Optional, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from lab.data.templates import option_letters

OVER = "#d62728"  # conf > acc: the model claims more than it achieves
UNDER = "#1f77b4"  # conf < acc
ACCURACY = "#7f7f7f"
CLEAR = "rgba(0,0,0,0)"  # a hatched bar's ground: Plotly's default is opaque, hiding what lies beneath
DIAGONAL = "#333333"
ECE_COLOUR = "#d62728"
NLL_COLOUR = "#1f77b4"
NO_DATA = "no data"
COUNT_ROW = 16  # px above a reliability plot's area: the row of bin counts, written level
COUNT_ROW_TALL = 34  # ... written upright, when bars are too narrow for level numbers side by side
MAX_LEVEL_COUNTS = 30  # bars across the whole figure up to which counts fit level (≈ 40 px a bar)
MODEBAR = 30  # px at the very top kept for plotly's toolbar, which would otherwise cover titles on the right
TITLE_LINE = 16  # px per line of a subplot title (12 px font)
MAX_TITLE_LINES = 3
MIN_BAR = 0.012  # narrowest equal-mass bar, in confidence: ≈ 5 px of a 400 px wide plot
VISIBLE = 0.004  # a bar narrower than this (ties: bins that all hold one confidence) also gets a marker
COUNT_NAME, TITLE_NAME, STATS_NAME = "bin count", "subplot title", "stats"  # annotation names, for tests
COUNT_KEY_NAME = "bin count key"
NARROW_NAME = "narrow bin (marked)"


# ---------------------------------------------------------------- shared helpers
def _message_figure(text: str, title: str = "") -> go.Figure:
    """An empty figure carrying one centred message, axes hidden."""
    fig = go.Figure()
    fig.add_annotation(text=plain(text), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 16})
    fig.update_layout(title=plain(title) if title else None, xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def _never_raises(draw: Callable[..., go.Figure]) -> Callable[..., go.Figure]:
    """A page shows the reason in place of the figure instead of failing as a whole."""

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> go.Figure:
        try:
            return draw(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure becomes a figure that says so
            return _message_figure(f"cannot draw: {type(e).__name__}: {e}")

    return wrapper


def _pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def plain(text: Any) -> str:
    """User text (a run label, a model name, a question or an option) as Plotly shows it literally.

    Plotly renders a subset of HTML (``<a href>``, ``<b>``, ``<br>``, ``<span style>``) in titles,
    legends, annotations, hover and tick text, and decodes entities: a run renamed to
    ``<a href="https://…">Log in again</a>`` would be a live link on every plot. Escaped, ``&lt;``
    is drawn as ``<``. Quotes are kept: outside a tag they mean nothing to Plotly."""
    return html.escape(str(text), quote=False)


def wrap_label(label: str, width: int, max_lines: int = MAX_TITLE_LINES) -> str:
    """A run label (``00003 · bundled · obqa/test · …``) broken at its `` · `` separators into
    lines of at most ``width`` characters, at most ``max_lines`` of them, the last cut with "…":
    plots side by side have little width, so the full label goes into the hover instead."""
    lines: list[str] = []
    for part in str(label).split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    cut = len(lines) > max_lines
    lines = [line if len(line) <= width else line[:width - 1] + "…" for line in lines[:max_lines]]
    if cut and not lines[-1].endswith("…"):
        lines[-1] = (lines[-1] if len(lines[-1]) < width else lines[-1][:width - 1]) + "…"
    return "<br>".join(plain(line) for line in lines)  # cut first, so no entity is cut in half


def _one_legend_entry_per_name(fig: go.Figure) -> None:
    """Subplots repeat the same kinds of trace: one of each name goes into the legend, the first
    that draws something. Plotly lists no empty trace, so an entry given to an empty one (a
    "before" plot with no under-confident bin) would leave the bars of its name unexplained."""
    names = dict.fromkeys(trace.name for trace in fig.data)
    for name in names:
        same = [trace for trace in fig.data if trace.name == name]
        keeper = next((trace for trace in same if trace.x is not None and len(trace.x)), same[0])
        for trace in same:
            trace.showlegend = trace is keeper


def _bins(summary: dict) -> list[dict]:
    """The non-empty reliability bins (empty ones have no accuracy to draw), by mean confidence."""
    full = [b for b in summary.get("reliability") or [] if b.get("count") and b.get("acc") is not None]
    return sorted(full, key=lambda b: b["conf"]) if summary.get("strategy") == "mass" else full


def _mass_spans(bins: Sequence[dict]) -> list[tuple[float, float]]:
    """Where each equal-mass bin is drawn: over the confidences it holds (``lo``..``hi``, the
    smallest and largest, :func:`lab.calibration.metrics.reliability_table`), widened to :data:`MIN_BAR` where
    narrower but never past halfway to a neighbour's confidences, so no two bars overlap."""
    lo = [b["conf"] if b.get("lo") is None else b["lo"] for b in bins]
    hi = [b["conf"] if b.get("hi") is None else b["hi"] for b in bins]
    spans = []
    for i in range(len(bins)):
        left = 0.0 if i == 0 else (hi[i - 1] + lo[i]) / 2
        right = 1.0 if i == len(bins) - 1 else (hi[i] + lo[i + 1]) / 2
        centre = (lo[i] + hi[i]) / 2
        start = max(min(lo[i], centre - MIN_BAR / 2), left)
        spans.append((start, max(start, min(max(hi[i], centre + MIN_BAR / 2), right))))
    return spans


def _bin_spans(bins: Sequence[dict], strategy: str) -> list[tuple[float, float]]:
    """(left, right) of each drawn bar: equal-width bins fill 95% of their fixed edges."""
    if strategy == "mass":
        return _mass_spans(bins)
    return [(0.975 * b["lo"] + 0.025 * b["hi"], 0.025 * b["lo"] + 0.975 * b["hi"]) for b in bins]


def _count_row(summary: dict, cols: int) -> tuple[int, int]:
    """(height in px, text angle) of the row of bin counts: upright when ``cols`` plots of this
    many bins leave too little width per bar for level numbers."""
    n_bins = summary.get("n_bins") or len(summary.get("reliability") or []) or 10
    return (COUNT_ROW, 0) if cols * n_bins <= MAX_LEVEL_COUNTS else (COUNT_ROW_TALL, -90)


def _stats_text(summary: dict, bins: Sequence[dict], cols: int = 1) -> str:
    """ECE with its bootstrap interval when the summary has one, n and Trust (where the summary has
    it; one a line in narrow plots, to keep the box off the bars); equal-mass bins
    hold (nearly) equal counts, so those are said here once instead of above each bar, where
    narrow bars' counts would run into each other."""
    sep = "<br>" if cols >= 4 else " · "
    low, high = summary.get("ece_ci_low"), summary.get("ece_ci_high")
    interval = f" [{100 * low:.1f}, {100 * high:.1f}]" if low is not None and high is not None else ""
    ece = summary.get("ece")
    # A percentile bootstrap of the upward-biased ECE can leave out the point: say whose interval it is.
    if interval and ece is not None and not low <= ece <= high:
        interval = f", {'below' if ece < low else 'above'} its bootstrap{interval}"
    parts = [f"ECE {_pct(summary.get('ece'))}{interval}", f"n={summary.get('n', '–')}"]
    if summary.get("trust") is not None:
        parts.append(f"Trust {_pct(summary.get('trust'))}")
    text = sep.join(parts)
    if summary.get("strategy") == "mass" and bins:
        low, high = min(b["count"] for b in bins), max(b["count"] for b in bins)
        text += f"<br>{low if low == high else f'{low}–{high}'} questions per bin"
    return text


def _add_counts(fig: go.Figure, bins: Sequence[dict], centres: Sequence[float], angle: int, key: bool,
                where: dict) -> None:
    """Each bin's count in a row just above the plot area: clear of the bars, the diagonal (which
    ends at the top-right corner) and the titles, which sit above this row. ``key``: say "per bin"
    left of the row (once a figure)."""
    for b, x in zip(bins, centres):
        fig.add_annotation(text=str(b["count"]), x=x, y=1, xref="x", yref="y domain", yanchor="bottom", yshift=2,
                           textangle=angle, showarrow=False, font={"size": 10, "color": DIAGONAL}, name=COUNT_NAME,
                           hovertext=f"{b['count']} questions, confidence {b['lo']:.2f}–{b['hi']:.2f}", **where)
    if key:
        fig.add_annotation(text="per bin", hovertext="questions per bin", x=0, y=1, xref="x domain", yref="y domain",
                           xanchor="right", yanchor="bottom", xshift=-4, yshift=2, showarrow=False,
                           font={"size": 10, "color": ACCURACY}, name=COUNT_KEY_NAME, **where)


def _add_narrow_marks(fig: go.Figure, bins: Sequence[dict], spans: Sequence[tuple[float, float]],
                      where: dict) -> None:
    """A marker on each bar too narrow to see (equal-mass bins whose confidences are all alike)."""
    narrow = [(b, (a + z) / 2) for b, (a, z) in zip(bins, spans) if z - a < VISIBLE]
    if narrow:
        fig.add_trace(go.Scatter(
            x=[x for _, x in narrow], y=[b["acc"] for b, _ in narrow], mode="markers", name=NARROW_NAME,
            cliponaxis=False,  # often at confidence 1, the plot's edge
            marker={"symbol": "diamond", "size": 9, "color": ACCURACY, "line": {"color": DIAGONAL, "width": 1}},
            customdata=[[b["count"], b["conf"]] for b, _ in narrow],
            hovertemplate="accuracy %{y:.3f}<br>confidence %{customdata[1]:.3f}<br>%{customdata[0]} questions"
                          "<extra>narrow bin</extra>"), **where)


def _add_gaps(fig: go.Figure, bins: Sequence[dict], centres: Sequence[float], widths: Sequence[float],
              where: dict) -> None:
    """Red/blue bars from each bin's accuracy to its mean confidence; both traces are always added.
    A red gap stands on the grey accuracy bar; a blue one lies over its top (from the confidence
    up to the accuracy), so it is hatched on a clear ground: filled, it hid the grey there, and the
    bar labelled "accuracy" seemed to end at the confidence."""
    for name, colour, keep, pattern in (("over-confident", OVER, lambda g: g > 0, None),
                                        ("under-confident", UNDER, lambda g: g < 0,
                                         {"shape": "/", "solidity": 0.5, "fgcolor": UNDER, "bgcolor": CLEAR})):
        chosen = [(x, w, b) for x, w, b in zip(centres, widths, bins) if keep(b["conf"] - b["acc"])]
        fig.add_trace(go.Bar(
            x=[c[0] for c in chosen], y=[c[2]["conf"] - c[2]["acc"] for c in chosen],
            base=[c[2]["acc"] for c in chosen], width=[c[1] for c in chosen], name=name, marker_color=colour,
            marker_pattern=pattern, marker_line={"color": colour, "width": 1.5} if pattern else None,
            opacity=0.6 if pattern is None else 0.9, legendgroup=name,
            hovertemplate="gap (conf − acc) %{y:+.3f}<extra></extra>",
        ), **where)


def _add_reliability(fig: go.Figure, summary: dict, col: Optional[int] = None, label: str = "", cols: int = 1) -> None:
    """Accuracy bars, red/blue gap bars from accuracy to confidence, the diagonal, the stats box and
    the bin counts (equal-width bins) above the plot area. ``col`` picks a subplot of a one-row
    grid of ``cols``; ``label`` (the run's) goes into the bars' hover."""
    where = {} if col is None else {"row": 1, "col": col}
    strategy = summary.get("strategy", "width")
    bins = _bins(summary)
    spans = _bin_spans(bins, strategy)
    centres, widths = [(a + z) / 2 for a, z in spans], [z - a for a, z in spans]
    fig.add_trace(go.Bar(
        x=centres, y=[b["acc"] for b in bins], width=widths, name="accuracy", marker_color=ACCURACY,
        legendgroup="accuracy", customdata=[[b["count"], b["conf"], b["lo"], b["hi"]] for b in bins],
        hovertemplate="accuracy %{y:.3f}<br>mean confidence %{customdata[1]:.3f}"
                      "<br>confidences %{customdata[2]:.3f}–%{customdata[3]:.3f}<br>%{customdata[0]} questions"
                      f"<extra>{plain(label)}</extra>",
    ), **where)
    _add_gaps(fig, bins, centres, widths, where)
    _add_narrow_marks(fig, bins, spans, where)
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration", legendgroup="diagonal",
                             line={"dash": "dash", "color": DIAGONAL}, hoverinfo="skip"), **where)
    if strategy != "mass":
        _add_counts(fig, bins, centres, _count_row(summary, cols)[1], col in (None, 1), where)
    fig.add_annotation(text=_stats_text(summary, bins, cols), x=0.02, y=0.98, xref="x domain", yref="y domain",
                       xanchor="left", yanchor="top", showarrow=False, bgcolor="rgba(255,255,255,0.85)",
                       bordercolor=DIAGONAL, borderwidth=1, align="left", name=STATS_NAME, **where)
    axis_title = "confidence (equal-mass bins)" if strategy == "mass" else "confidence"
    fig.update_xaxes(range=[0, 1], title_text=axis_title, **where)
    fig.update_yaxes(range=[0, 1], **where)


def _reliability_layout(fig: go.Figure, count_px: int, title_lines: int, line_px: int) -> None:
    """Room above the plot for the toolbar, the counts row (``count_px`` high) and ``title_lines``
    of title; the legend in a row below, so that the plots keep the full width."""
    fig.update_layout(barmode="overlay", height=480 + count_px + title_lines * line_px,
                      margin={"t": MODEBAR + count_px + 12 + title_lines * line_px, "b": 110},
                      legend={"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "x": 0.0})
    _one_legend_entry_per_name(fig)


# ---------------------------------------------------------------- reliability
@_never_raises
def reliability_figure(summary: dict, title: str = "", title_chars: int = 100) -> go.Figure:
    """Reliability diagram of one summary (:func:`lab.results.analysis.calibration_summary` or ``metrics.json``).

    Grey bars: accuracy per bin (its count above the plot). On top, the gap to the bin's mean
    confidence: red where over-confident (conf > acc), blue where under-confident. ``title``: a
    run's label, wrapped into lines of at most ``title_chars`` characters (fewer where the figure
    gets less than the page's width).
    """
    if not _bins(summary or {}):
        return _message_figure(NO_DATA, title)
    fig = go.Figure()
    _add_reliability(fig, summary, label=title)
    text = wrap_label(title, title_chars) if title else ""
    lines = text.count("<br>") + 1 if text else 0
    count_px = _count_row(summary, 1)[0]
    _reliability_layout(fig, count_px, lines, 20)
    # Anchored at its bottom, Plotly sets a title's first line there and the others below it: each
    # further line lifts the anchor by one, or the title runs onto the bin counts.
    fig.update_layout(yaxis_title="accuracy", title={
        "text": text or None, "y": 1, "yref": "paper", "yanchor": "bottom", "x": 0, "xref": "paper", "xanchor": "left",
        "pad": {"b": count_px + 8 + max(lines - 1, 0) * 20}, "font": {"size": 15}})
    return fig


@_never_raises
def side_by_side(summaries: Sequence[tuple[str, dict]]) -> go.Figure:
    """One reliability diagram per run, in a row with a shared accuracy axis, to compare runs.

    Each ``(label, summary)``: the label is wrapped above its plot (narrower for more plots, at
    most :data:`MAX_TITLE_LINES` lines) and shown whole when the pointer rests on it.
    """
    if not summaries:
        return _message_figure(NO_DATA)
    fig = make_subplots(rows=1, cols=len(summaries), shared_yaxes=True, horizontal_spacing=0.12 / len(summaries))
    width = max(16, 110 // len(summaries))
    titles = [wrap_label(label, width) for label, _ in summaries]
    count_px = max(_count_row(summary, len(summaries))[0] for _, summary in summaries)
    for col, ((label, summary), title) in enumerate(zip(summaries, titles), start=1):
        _add_reliability(fig, summary, col=col, label=label, cols=len(summaries))
        fig.add_annotation(text=title, hovertext=plain(label), x=0.5, y=1, xref="x domain", yref="y domain",
                           yanchor="bottom", yshift=count_px + 4, showarrow=False, font={"size": 12},
                           name=TITLE_NAME, row=1, col=col)
    _reliability_layout(fig, count_px, max(t.count("<br>") + 1 for t in titles), TITLE_LINE)
    fig.update_yaxes(title_text="accuracy", row=1, col=1)
    return fig


# ---------------------------------------------------------------- temperature
@_never_raises
def sweep_figure(df: pd.DataFrame, best_ece_T: float, best_nll_T: float,
                 current_T: Optional[float] = None) -> go.Figure:
    """ECE (left axis) and NLL (right axis) against temperature on a log axis, optima starred."""
    if df is None or df.empty:
        return _message_figure(NO_DATA)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=df["temperature"], y=df["ece"], mode="lines", name="ECE",
                             line={"color": ECE_COLOUR}), secondary_y=False)
    fig.add_trace(go.Scatter(x=df["temperature"], y=df["nll"], mode="lines", name="NLL",
                             line={"color": NLL_COLOUR}), secondary_y=True)
    for column, best, colour, secondary in (("ece", best_ece_T, ECE_COLOUR, False),
                                            ("nll", best_nll_T, NLL_COLOUR, True)):
        y = df.loc[(df["temperature"] - best).abs().idxmin(), column]
        fig.add_trace(go.Scatter(x=[best], y=[y], mode="markers", name=f"best {column.upper()} T={best:.3g}",
                                 marker={"symbol": "star", "size": 14, "color": colour}), secondary_y=secondary)
    if current_T is not None:
        # shapes take data values on a log axis, annotations take log10 values (plotly.py #4012)
        fig.add_vline(x=current_T, line_dash="dot", line_color=DIAGONAL)
        fig.add_annotation(x=math.log10(current_T), y=1, xref="x", yref="paper", text=f"T = {current_T:.3g}",
                           showarrow=False, yanchor="bottom")
    fig.update_xaxes(type="log", title_text="temperature")
    fig.update_yaxes(title_text="ECE", secondary_y=False)
    fig.update_yaxes(title_text="NLL", secondary_y=True)
    return fig


# ---------------------------------------------------------------- FIRST top-k store
@_never_raises
def coverage_figure(coverage: dict) -> go.Figure:
    """FIRST Figure 2: how much probability the teacher's top-K holds, and what storing it costs.

    ``coverage``: a top-k store's ``manifest.json`` (its ``coverage`` and ``storage``, plus the
    stored ``k`` marked) or only its ``coverage`` part. Mean coverage per K with the min–max band
    over positions; bytes per position on the right axis.
    """
    section = (coverage or {}).get("coverage", coverage) or {}
    ks = section.get("k") or []
    if not ks:
        return _message_figure(NO_DATA)
    storage = (coverage or {}).get("storage") or {}
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=ks, y=section["max"], mode="lines", line={"width": 0}, name="max",
                             showlegend=False, hoverinfo="skip"), secondary_y=False)
    fig.add_trace(go.Scatter(x=ks, y=section["min"], mode="lines", line={"width": 0}, fill="tonexty",
                             fillcolor="rgba(31,119,180,0.2)", name="min–max over positions"), secondary_y=False)
    fig.add_trace(go.Scatter(x=ks, y=section["mean"], mode="lines+markers", name="mean coverage",
                             line={"color": UNDER}), secondary_y=False)
    if storage.get("bytes_per_position"):
        fig.add_trace(go.Scatter(x=storage["k"], y=storage["bytes_per_position"], mode="lines", name="bytes / position",
                                 line={"color": DIAGONAL, "dash": "dot"}), secondary_y=True)
    if isinstance(coverage.get("k"), int):
        fig.add_vline(x=coverage["k"], line_dash="dash", line_color=OVER, annotation_text=f"stored k = {coverage['k']}")
    fig.update_xaxes(title_text="K (top-K tokens kept)")
    fig.update_yaxes(title_text="probability mass in top-K", range=[0, 1.02], secondary_y=False)
    fig.update_yaxes(title_text="bytes per position", secondary_y=True)
    return fig


# ---------------------------------------------------------------- training
def _stage_events(events: Sequence[dict], stage_prefix: str) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """Loss events and validation events per training stage whose name starts with ``stage_prefix``."""
    losses: dict[str, list[dict]] = {}
    evals: dict[str, list[dict]] = {}
    for event in events or []:
        stage = str(event.get("stage", ""))
        if not stage.startswith(stage_prefix):
            continue
        if stage.endswith("_eval") and event.get("epoch") is not None:
            evals.setdefault(stage.removesuffix("_eval"), []).append(event)
        elif not stage.endswith("_eval") and event.get("loss") is not None and event.get("step") is not None:
            losses.setdefault(stage, []).append(event)
    return losses, evals


# one panel per validation metric, each with its own marker, so ECE and accuracy never share an axis
VALIDATION_PANELS = (("ece", "val ECE", 2, "circle", "solid"), ("accuracy", "val accuracy", 3, "square", "dot"))


def _validation_series(evals: Sequence[dict], stage: str) -> list[tuple[str, list[dict]]]:
    """A stage's validation points as (label, points): one series, or, when its events measure several
    calibration tasks (an sft stage's ``tasks``), one per task, in the order they first come."""
    if not any(isinstance(e.get("tasks"), dict) for e in evals):
        return [(stage, list(evals))]
    tasks: dict[str, list[dict]] = {}
    for event in evals:
        for key, task in (event.get("tasks") or {}).items():
            if isinstance(task, dict):
                tasks.setdefault(key, []).append({**task, "epoch": event["epoch"]})
    return [(f"{stage} · {points[0].get('label') or key}", points) for key, points in tasks.items()]


@_never_raises
def training_figure(events: Sequence[dict], stage_prefix: str) -> go.Figure:
    """Training loss per step, validation ECE per epoch and validation accuracy per epoch, side by side.

    Every stage starting with ``stage_prefix`` is drawn ("teacher", or "student:" for all four
    FIRST students) in one colour across the three panels, its traces one legend group (a click
    on one hides the stage); validation comes from its ``<stage>_eval`` events. ECE (circles) and
    accuracy (squares, dotted) get panels of their own: on one axis they differ by dash only.
    """
    losses, evals = _stage_events(events, stage_prefix)
    if not losses and not evals:
        return _message_figure(NO_DATA)
    fig = make_subplots(rows=1, cols=3, subplot_titles=["training loss", "validation ECE (lower is better)",
                                                        "validation accuracy (higher is better)"])
    palette = qualitative.Plotly
    for i, stage in enumerate(sorted(set(losses) | set(evals))):
        colour = palette[i % len(palette)]
        if stage in losses:
            fig.add_trace(go.Scatter(x=[e["step"] for e in losses[stage]], y=[e["loss"] for e in losses[stage]],
                                     mode="lines", name=f"{plain(stage)} loss", legendgroup=stage,
                                     line={"color": colour}), row=1, col=1)
        for (label, series), colour in zip(_validation_series(evals.get(stage, []), stage),
                                           palette[i % len(palette):] + palette):
            for metric, name, col, symbol, dash in VALIDATION_PANELS:
                points = [e for e in series if e.get(metric) is not None]
                if points:
                    fig.add_trace(go.Scatter(x=[e["epoch"] for e in points], y=[e[metric] for e in points],
                                             mode="lines+markers", name=f"{plain(label)} {name}", legendgroup=stage,
                                             line={"color": colour, "dash": dash},
                                             marker={"symbol": symbol, "size": 8}), row=1, col=col)
    fig.update_xaxes(title_text="step", row=1, col=1)
    for col in (2, 3):
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="ECE", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="accuracy", range=[0, 1], row=1, col=3)
    fig.update_layout(legend={"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "x": 0.0},
                      margin={"b": 110}, legend_tracegroupgap=12)
    return fig


# ---------------------------------------------------------------- questions
@_never_raises
def option_bars(results: Sequence[dict]) -> go.Figure:
    """Several models on one question: a group per option, a bar per model.

    Each result: ``model`` (its name), ``probs`` (option probabilities) and optionally ``labels``
    (option names; default A, B, C, ...).
    """
    if not results:
        return _message_figure(NO_DATA)
    fig = go.Figure()
    for result in results:
        probs = list(result["probs"])
        labels = list(result.get("labels") or option_letters(len(probs)))
        fig.add_trace(go.Bar(x=[plain(label) for label in labels], y=probs, name=plain(result.get("model", "")),
                             text=[f"{p:.0%}" for p in probs], textposition="outside"))
    fig.update_layout(barmode="group", xaxis_title="option", yaxis_title="probability", yaxis_range=[0, 1.1])
    return fig


@_never_raises
def positionwise_figure(tables: Sequence[tuple[str, pd.DataFrame]]) -> go.Figure:
    """:func:`lab.results.analysis.positionwise_topk` of one or more runs, each ``(label, table)``.

    Per run, in its own colour: bars (grouped by rank) of the mean probability of the rank-k token
    at the answer position, and a dotted line of how often the answer letter is within the top k.
    The legend groups each run's two traces under its label. Runs with an empty table (cloze runs
    keep no top tokens) are left out: the page names them.
    """
    drawn = [(label, df) for label, df in tables or [] if df is not None and not df.empty]
    if not drawn:
        return _message_figure(NO_DATA)
    fig = go.Figure()
    palette = qualitative.Plotly
    for i, (label, df) in enumerate(drawn):
        colour, ranks = palette[i % len(palette)], [f"top-{int(k)}" for k in df["rank"]]
        group = {"legendgroup": f"run {i}", "legendgrouptitle_text": wrap_label(label, 60, 2)}
        fig.add_trace(go.Bar(x=ranks, y=df["mean_prob"], name="mean probability of the rank-k token",
                             marker_color=colour, opacity=0.6, offsetgroup=str(i), alignmentgroup="runs",
                             hovertemplate=f"%{{x}}: mean probability %{{y:.3f}}<extra>{plain(label)}</extra>",
                             **group))
        fig.add_trace(go.Scatter(x=ranks, y=df["answer_in_topk"], mode="lines+markers", name="answer within top k",
                                 line={"color": colour, "dash": "dot"}, marker={"symbol": "diamond", "size": 9},
                                 offsetgroup=str(i), alignmentgroup="runs",  # above the run's own bars
                                 hovertemplate=f"answer within %{{x}}: %{{y:.1%}}<extra>{plain(label)}</extra>",
                                 **group))
    fig.update_layout(barmode="group", scattermode="group", xaxis_title="rank at the answer position",
                      yaxis_title="probability / fraction",
                      yaxis_range=[0, 1.05], legend_tracegroupgap=14)
    return fig


# ---------------------------------------------------------------- selective prediction
@_never_raises
def selective_figure(curves: Sequence[dict[str, Any]], threshold: Optional[float] = None) -> go.Figure:
    """Accuracy–coverage (left) and risk–coverage (right) of one or more runs.

    Each curve: ``label``, ``coverage`` and ``risk`` (:func:`lab.calibration.selective.risk_coverage`), and
    ``at_threshold`` (coverage, selective accuracy) where the page's threshold cuts it, marked on
    the left plot. The shaded area under a risk curve is its AURC (in the legend).
    """
    if not curves:
        return _message_figure(NO_DATA)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("accuracy of the answered questions", "risk (error rate) of the answered"))
    palette = qualitative.Plotly
    for i, curve in enumerate(curves):
        colour, label = palette[i % len(palette)], curve["label"]
        group = {"legendgroup": f"run {i}"}
        coverage, risk = list(curve["coverage"]), list(curve["risk"])
        fig.add_trace(go.Scatter(x=coverage, y=[1 - r for r in risk], mode="lines", line={"color": colour},
                                 name=wrap_label(label, 70, 2), hovertemplate="coverage %{x:.1%}: accuracy %{y:.1%}"
                                 f"<extra>{plain(label)}</extra>", **group), row=1, col=1)
        fig.add_trace(go.Scatter(x=coverage, y=risk, mode="lines", line={"color": colour}, fill="tozeroy",
                                 opacity=0.3, name=f"AURC {curve['aurc']:.3f}", showlegend=True,
                                 hovertemplate=f"coverage %{{x:.1%}}: risk %{{y:.1%}}<extra>{plain(label)}</extra>",
                                 **group), row=1, col=2)
        point = curve.get("at_threshold")
        if point and point[1] is not None:
            fig.add_trace(go.Scatter(x=[point[0]], y=[point[1]], mode="markers", showlegend=False,
                                     marker={"size": 12, "symbol": "circle-open", "line": {"width": 3}, "color": colour},
                                     hovertemplate="threshold: coverage %{x:.1%}, accuracy %{y:.1%}"
                                                   f"<extra>{plain(label)}</extra>", **group), row=1, col=1)
    fig.update_xaxes(range=[0, 1.02], title_text="coverage (share of questions answered)", tickformat=".0%")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    fig.update_layout(height=470, margin={"t": 60, "b": 60},
                      legend={"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom"})
    if threshold is not None:
        fig.add_annotation(text=f"ring: threshold {threshold:.2f}", x=1, y=0, xref="x domain", yref="y domain",
                           xanchor="right", yanchor="bottom", showarrow=False, font={"color": DIAGONAL})
    fig.update_layout(legend_title_text="", margin={"b": 120})
    return fig


@_never_raises
def robustness_figure(runs: Sequence[tuple[str, pd.DataFrame, float]]) -> go.Figure:
    """ECE against the number of bins, per run (``label``, :func:`lab.results.analysis.ece_robustness`'s
    table, smECE): equal-width as a line in its bootstrap band, equal-mass dashed, smooth ECE dotted
    (it has no bins, so it is flat). Where the lines part, the binning, not the model, sets the ECE."""
    drawn = [(label, df, smooth) for label, df, smooth in runs or [] if df is not None and not df.empty]
    if not drawn:
        return _message_figure(NO_DATA)
    fig = go.Figure()
    palette = qualitative.Plotly
    for i, (label, df, smooth) in enumerate(drawn):
        colour, group = palette[i % len(palette)], {"legendgroup": f"run {i}",
                                                    "legendgrouptitle_text": wrap_label(label, 60, 2)}
        bins = df["bins"].tolist()
        fig.add_trace(go.Scatter(x=bins + bins[::-1], y=df["width_high"].tolist() + df["width_low"].tolist()[::-1],
                                 fill="toself", fillcolor=colour, opacity=0.15, line={"width": 0},
                                 name="equal-width 95% interval", hoverinfo="skip", **group))
        fig.add_trace(go.Scatter(x=bins, y=df["width"], mode="lines+markers", line={"color": colour},
                                 name="equal-width bins", hovertemplate="%{x} bins: ECE %{y:.1%}"
                                 f"<extra>{plain(label)}</extra>", **group))
        fig.add_trace(go.Scatter(x=bins, y=df["mass"], mode="lines", line={"color": colour, "dash": "dash"},
                                 name="equal-mass bins", hovertemplate="%{x} equal-mass bins: ECE %{y:.1%}"
                                 f"<extra>{plain(label)}</extra>", **group))
        fig.add_trace(go.Scatter(x=[bins[0], bins[-1]], y=[smooth, smooth], mode="lines",
                                 line={"color": colour, "dash": "dot"}, name=f"smooth ECE {100 * smooth:.1f}%",
                                 hovertemplate=f"smooth ECE (no bins) {100 * smooth:.1f}%<extra>{plain(label)}</extra>",
                                 **group))
    fig.update_layout(xaxis_title="number of bins", yaxis_title="ECE", yaxis_tickformat=".0%", yaxis_rangemode="tozero",
                      height=470, legend_tracegroupgap=14)
    return fig


# ---------------------------------------------------------------- life cycle (a series)
SERIES_ROWS = (("ece", "ECE", ECE_COLOUR), ("accuracy", "accuracy", UNDER))  # (metric, title, each run's colour)
SEEDS_MEAN = "#222222"
SEEDS_BAND = "rgba(34,34,34,0.14)"
ORACLE_NAME = "oracle ECE (the Bayes predictor, same questions)"
PANEL_PX = 960  # about the width the page gives a life-cycle figure's panels together, on a 1440 px screen
TICK_GAP_PX = 24  # least room between two parameter ticks (plotly slants crowded labels, which then need this)


def params_label(n: float) -> str:
    """A parameter count as models are named: 135M, 1.4B, 39.8K."""
    for unit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= 0.9995 * unit:  # 999,600 is "1M", not "1e+03K"
            return f"{n / unit:.3g}{suffix}"
    return f"{n:.3g}"


def _with_interval(value: Optional[float], low: Optional[float], high: Optional[float]) -> str:
    return _pct(value) + (f" [{_pct(low)}, {_pct(high)}]" if low is not None and high is not None else "")


def _x_text(axis: str, x: Any) -> str:
    return params_label(x) if axis == "params" and isinstance(x, (int, float)) else plain(x)


def _cell_hover(axis: str, axis_title: str, cell: dict[str, Any]) -> str:
    """What a run's marker says: which model it is, where it sits, n, and both metrics with their intervals."""
    model = plain(cell.get("model") or "?") + (f" + {plain(cell['adapter'])}" if cell.get("adapter") else "")
    model += f" @ {plain(cell['revision'])}" if cell.get("revision") else ""
    stage = f" · {plain(cell['stage'])}" if cell.get("stage") else ""
    lines = [f"<b>{plain(cell.get('point') or '?')}</b>{stage}", f"model {model}",
             f"{plain(axis_title)} {_x_text(axis, cell['x'])} · n = {cell.get('n', '–')}",
             "ECE " + _with_interval(cell.get("ece"), cell.get("ece_low"), cell.get("ece_high")),
             "accuracy " + _with_interval(cell.get("accuracy"), cell.get("accuracy_low"), cell.get("accuracy_high"))]
    if cell.get("oracle_ece") is not None:
        lines.append(f"oracle ECE {_pct(cell['oracle_ece'])}")
    return "<br>".join(lines)


def _error_bars(values: Sequence[Optional[float]], lows: Sequence[Optional[float]],
                highs: Sequence[Optional[float]], colour: str, thickness: float, width: int) -> dict[str, Any]:
    """Error bars spanning exactly each ``[low, high]``: plotly draws from ``y - arrayminus`` to
    ``y + array``, so an ECE below its own bootstrap interval (ECE's resamples run high) still gets
    its interval, not one stretched to reach the point; none where there is no interval."""
    spans = [(v - lo, hi - v) if None not in (v, lo, hi) else (None, None) for v, lo, hi in zip(values, lows, highs)]
    return {"type": "data", "symmetric": False, "arrayminus": [s[0] for s in spans], "array": [s[1] for s in spans],
            "color": colour, "thickness": thickness, "width": width}


def _seeds_name(summary: Sequence[dict[str, Any]]) -> str:
    counts = sorted({row["runs"] for row in summary})
    seeds = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"mean over {seeds} seeds, 95 % t-interval"


def _params_ticks(values: Sequence[float], cols: int) -> list[float]:
    """The parameter counts to label on a log axis of one of ``cols`` panels: each at least
    :data:`TICK_GAP_PX` from the last one kept (1.0B and 1.4B, Pythia's, would print over each other
    in three panels); the hover names every point."""
    logs = [math.log10(v) for v in values]
    decades_per_px = 1.1 * (logs[-1] - logs[0]) / (PANEL_PX / cols)  # plotly pads a log range by about 5 % a side
    kept = [0]
    for i in range(1, len(values)):
        if logs[i] - logs[kept[-1]] >= TICK_GAP_PX * decades_per_px:
            kept.append(i)
    return [values[i] for i in kept]


def _add_seed_mean(fig: go.Figure, rows: Sequence[dict[str, Any]], metric: str, xs: list[Any], name: str,
                   where: dict[str, int], across: bool) -> None:
    """The mean over seeds at each x of ``rows`` (one entry's, :func:`lab.results.series.summarize`,
    ``runs`` > 1), a dark line in its t-interval band (``across``: one mean, a level line across the seeds); at a
    single x, a diamond with the interval as error bars."""
    mean = [row[f"{metric}_mean"] for row in rows]
    low, high = [row[f"{metric}_low"] for row in rows], [row[f"{metric}_high"] for row in rows]
    entry = "" if rows[0].get("entry") is None else f"m{rows[0]['entry']}: "
    hover = [f"{entry}mean over {row['runs']} seeds {_with_interval(m, lo, hi)}"
             for row, m, lo, hi in zip(rows, mean, low, high)]
    if len(xs) > 1:
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=high + low[::-1], mode="lines", fill="toself",
                                 fillcolor=SEEDS_BAND, line={"width": 0}, hoverinfo="skip", name=f"{name} (band)",
                                 legendgroup="seeds mean"), **where)
    fig.add_trace(go.Scatter(
        x=xs, y=mean, mode="lines" if across else "lines+markers", line={"color": SEEDS_MEAN, "width": 2.5},
        name=name, legendgroup="seeds mean",
        marker={"symbol": "diamond-open", "size": 13, "color": SEEDS_MEAN, "line": {"width": 2.5}},  # runs show inside
        error_y=None if len(xs) > 1 else _error_bars(mean, low, high, SEEDS_MEAN, 2.5, 9),
        hovertext=hover, hovertemplate="%{hovertext}<extra></extra>"), **where)


def _mean_lines(axis: str, rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A task's means over seeds, split into the lines that join them: on the seed axis each entry's
    one mean alone; where an entry has means at several x (a trained run's steps), each entry's own
    line, so two learning rates at one step stay two curves; else (a model per x) one line through all."""
    if axis == "seed":
        return [[row] for row in rows]
    entries: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        entries.setdefault(row.get("entry"), []).append(row)
    if any(len({row["x"] for row in group}) > 1 for group in entries.values()):
        return list(entries.values())
    return [list(rows)] if rows else []


def _seed_rows(axis: str, rows: Sequence[dict[str, Any]], cells: Sequence[dict[str, Any]],
               order: Sequence[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """A task's means over seeds (``runs`` > 1) and their x positions, in the axis' order. On the seed
    axis the one mean (x "all seeds") spans the seeds drawn, from the first to the last."""
    if axis == "seed":
        first, last = min(c["x"] for c in cells), max(c["x"] for c in cells)
        return [row for row in rows for _ in (first, last)], [x for _ in rows for x in (first, last)]
    rows = sorted((row for row in rows if row["x"] in order), key=lambda row: order.index(row["x"]))
    return rows, [row["x"] for row in rows]


def _panel_range(metric: str, cells: Sequence[dict[str, Any]], means: Sequence[dict[str, Any]]) -> list[float]:
    """The y range of one panel: from 0 (ECE) or 0 to 100 % (accuracy), widened to hold every run's
    interval, the oracle and every mean's t-band whole. A t-band over two or three seeds can pass 0 or
    100 %; it is drawn as computed (its hover says the numbers), not cut at the panel's edge."""
    shown = [c.get(key) for c in cells for key in (metric, f"{metric}_low", f"{metric}_high")]
    shown += [r.get(key) for r in means for key in (f"{metric}_mean", f"{metric}_low", f"{metric}_high")]
    if metric == "ece":
        shown += [c.get("oracle_ece") for c in cells]
    values = [v for v in shown if isinstance(v, (int, float)) and math.isfinite(v)]
    low = min([0.0, *values])
    high = max([1.0 if metric == "accuracy" else 0.0, *values])
    if high <= low:
        return [0.0, 1.0]
    pad = 0.06 * (high - low)
    return [low - pad if low < 0 else 0.0, high + pad if metric == "ece" or high > 1 else 1.02]


@_never_raises
def lifecycle_figure(doc: dict[str, Any]) -> go.Figure:
    """ECE (top row) and accuracy (bottom row) along a series' axis, one column per task: the
    alignment-calibration paper's Figures 3–5. ``doc``: a ``series.json`` (:func:`lab.results.series.read`).

    Each run is a marker with its bootstrap 95 % interval as error bars (hover: its point, model, n
    and both metrics), joined by a thin line unless several runs share an x; where training seeds
    repeat a point, their mean is a dark line in its Student-t 95 % band over seeds; the Bayes
    predictor's ECE (the controlled task) is dashed. Parameters are on a log axis labelled as models
    are named (135M), stages in the order of the series' entries, steps and seeds on a linear axis.
    Each axis fits the runs' intervals and the means' t-bands whole (:func:`_panel_range`): a band over
    few seeds that passes 0 or 100 % is drawn as computed, and the axis extends past it.
    """
    axis, axis_title = doc.get("axis"), str(doc.get("axis_title") or doc.get("axis") or "")
    tasks = [task for task in doc.get("tasks") or [] if isinstance(task, dict)]
    cells = [cell for cell in doc.get("cells") or [] if cell.get("x") is not None]
    if not tasks or not cells:
        return _message_figure(NO_DATA)
    order = list(dict.fromkeys(cell["x"] for cell in cells))  # the entries' order (the stage axis keeps it)
    if axis != "stage":
        order.sort()
    summary = [row for row in doc.get("summary") or [] if (row.get("runs") or 0) > 1]
    mean_name = _seeds_name(summary) if summary else ""
    cols = len(tasks)
    fig = make_subplots(rows=2, cols=cols, shared_xaxes=True, vertical_spacing=0.1,
                        horizontal_spacing=min(0.08, 0.3 / cols))
    width = max(16, 110 // cols)
    titles = [wrap_label(str(task.get("label") or task.get("key")), width, 2) for task in tasks]
    for col, (task, title) in enumerate(zip(tasks, titles), start=1):
        mine = sorted((c for c in cells if c.get("task") == task.get("key")), key=lambda c: order.index(c["x"]))
        xs = [c["x"] for c in mine]
        joined = axis != "seed" and len(set(xs)) == len(xs)  # one run per x: a line through them shows the trend
        for row, (metric, name, colour) in enumerate(SERIES_ROWS, start=1):
            where = {"row": row, "col": col}
            values = [c.get(metric) for c in mine]
            fig.add_trace(go.Scatter(
                x=xs, y=values, mode="lines+markers" if joined else "markers", cliponaxis=False,  # at 0 % whole
                name=f"{name} of each run, 95 % bootstrap interval", legendgroup=f"runs {metric}",
                line={"color": colour, "width": 1}, marker={"color": colour, "size": 8},
                error_y=_error_bars(values, [c.get(f"{metric}_low") for c in mine],
                                    [c.get(f"{metric}_high") for c in mine], colour, 1.5, 4),
                hovertext=[_cell_hover(axis, axis_title, c) for c in mine],
                customdata=[c.get("run") for c in mine],  # what a click on the marker opens (ui.lifecycle_page)
                hovertemplate=f"%{{hovertext}}<extra>{plain(task.get('label') or '')}</extra>"), **where)
            for rows in _mean_lines(axis, [r for r in summary if r.get("task") == task.get("key")]):
                means, at = _seed_rows(axis, rows, mine, order)
                if means:
                    _add_seed_mean(fig, means, metric, at, mean_name, where, axis == "seed")
        oracle = {c["x"]: c["oracle_ece"] for c in mine if c.get("oracle_ece") is not None}
        if oracle:
            fig.add_trace(go.Scatter(x=list(oracle), y=list(oracle.values()), mode="lines+markers", name=ORACLE_NAME,
                                     legendgroup="oracle", line={"color": DIAGONAL, "dash": "dash", "width": 1.5},
                                     marker={"symbol": "x", "size": 7, "color": DIAGONAL},
                                     hovertemplate="oracle ECE %{y:.1%}<extra></extra>"), row=1, col=col)
        fig.add_annotation(text=title, hovertext=plain(task.get("label") or ""), x=0.5, y=1, xref="x domain",
                           yref="y domain", yanchor="bottom", yshift=6, showarrow=False, font={"size": 13},
                           name=TITLE_NAME, row=1, col=col)
        means = [r for r in summary if r.get("task") == task.get("key")]
        for row, (metric, _, _) in enumerate(SERIES_ROWS, start=1):
            fig.update_yaxes(range=_panel_range(metric, mine, means), row=row, col=col)
    if axis == "params":
        ticks = _params_ticks(order, cols)
        fig.update_xaxes(type="log", tickvals=ticks, ticktext=[params_label(x) for x in ticks])
    elif axis == "stage":  # a stage is named by the user: its tick shows the name as text, never as markup
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=order, tickmode="array",
                         tickvals=order, ticktext=[plain(x) for x in order])
    elif axis == "seed":
        fig.update_xaxes(type="linear", tickvals=order)
    else:
        fig.update_xaxes(type="linear")
    fig.update_xaxes(title_text=plain(axis_title) + (" (log scale)" if axis == "params" else ""), row=2)
    fig.update_yaxes(tickformat=".2~%", row=1)
    fig.update_yaxes(tickformat=".0%", row=2)
    fig.update_yaxes(title_text="ECE (lower is better)", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", row=2, col=1)
    lines = max(t.count("<br>") + 1 for t in titles)
    fig.update_layout(height=640, margin={"t": MODEBAR + 12 + lines * TITLE_LINE, "b": 120, "r": 30},
                      legend={"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "x": 0.0})
    _one_legend_entry_per_name(fig)
    fig.update_traces(showlegend=False, selector={"fill": "toself"})  # a band is its mean's, which the legend names
    return fig
