"""The reliability diagram: one run's, or several side by side to compare them.

Inputs are :func:`lab.results.analysis.calibration_summary` results or a run's ``metrics.json``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.results.reports import pct
from ui.plots.common import (DIAGONAL, MODEBAR, NO_DATA, OVER, TITLE_LINE, TITLE_NAME, UNDER, message_figure,
                             never_raises, one_legend_entry_per_name, plain, wrap_label)

ACCURACY = "#7f7f7f"
CLEAR = "rgba(0,0,0,0)"  # a hatched bar's ground: Plotly's default is opaque, hiding what lies beneath
COUNT_ROW = 16  # px above a reliability plot's area: the row of bin counts, written level
COUNT_ROW_TALL = 34  # ... written upright, when bars are too narrow for level numbers side by side
MAX_LEVEL_COUNTS = 30  # bars across the whole figure up to which counts fit level (≈ 40 px a bar)
MIN_BAR = 0.012  # narrowest equal-mass bar, in confidence: ≈ 5 px of a 400 px wide plot
VISIBLE = 0.004  # a bar narrower than this (ties: bins that all hold one confidence) also gets a marker
COUNT_NAME, STATS_NAME = "bin count", "stats"  # annotation names, for tests
COUNT_KEY_NAME = "bin count key"
NARROW_NAME = "narrow bin (marked)"


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
    interval = f" [{pct(low)}, {pct(high)}]" if low is not None and high is not None else ""
    ece = summary.get("ece")
    # A percentile bootstrap of the upward-biased ECE can leave out the point: say whose interval it is.
    if interval and ece is not None and not low <= ece <= high:
        interval = f", {'below' if ece < low else 'above'} its bootstrap{interval}"
    parts = [f"ECE {pct(summary.get('ece'), percent_sign=True)}{interval}", f"n={summary.get('n', '–')}"]
    if summary.get("trust") is not None:
        parts.append(f"Trust {pct(summary.get('trust'), percent_sign=True)}")
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
    one_legend_entry_per_name(fig)



@never_raises
def reliability_figure(summary: dict, title: str = "", title_chars: int = 100) -> go.Figure:
    """Reliability diagram of one summary (:func:`lab.results.analysis.calibration_summary` or ``metrics.json``).

    Grey bars: accuracy per bin (its count above the plot). On top, the gap to the bin's mean
    confidence: red where over-confident (conf > acc), blue where under-confident. ``title``: a
    run's label, wrapped into lines of at most ``title_chars`` characters (fewer where the figure
    gets less than the page's width).
    """
    if not _bins(summary or {}):
        return message_figure(NO_DATA, title)
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


@never_raises
def side_by_side(summaries: Sequence[tuple[str, dict]]) -> go.Figure:
    """One reliability diagram per run, in a row with a shared accuracy axis, to compare runs.

    Each ``(label, summary)``: the label is wrapped above its plot (narrower for more plots, at
    most :data:`MAX_TITLE_LINES` lines) and shown whole when the pointer rests on it.
    """
    if not summaries:
        return message_figure(NO_DATA)
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
