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
                                     mode="lines", name=f"{stage} loss", legendgroup=stage,
                                     line={"color": colour}), row=1, col=1)
        for metric, name, col, symbol, dash in VALIDATION_PANELS:
            points = [e for e in evals.get(stage, []) if e.get(metric) is not None]
            if points:
                fig.add_trace(go.Scatter(x=[e["epoch"] for e in points], y=[e[metric] for e in points],
                                         mode="lines+markers", name=f"{stage} {name}", legendgroup=stage,
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
