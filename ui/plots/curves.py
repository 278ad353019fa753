"""A metric against what it depends on: ECE and NLL against temperature, the top-K's probability
mass against K, selective accuracy and risk against coverage, ECE against the number of bins.

Inputs come from :mod:`lab.results.analysis` (sweeps, tables), :mod:`lab.calibration.selective` and a
top-k store's manifest (:mod:`lab.kinds.extract.store`).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from lab.results.reports import pct
from ui.plots.common import (DIAGONAL, ECE_COLOUR, NO_DATA, OVER, UNDER, message_figure, never_raises, plain,
                             wrap_label)

NLL_COLOUR = "#1f77b4"


@never_raises
def sweep_figure(df: pd.DataFrame, best_ece_T: float, best_nll_T: float,
                 current_T: Optional[float] = None) -> go.Figure:
    """ECE (left axis) and NLL (right axis) against temperature on a log axis, optima starred."""
    if df is None or df.empty:
        return message_figure(NO_DATA)
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


@never_raises
def coverage_figure(coverage: dict) -> go.Figure:
    """FIRST Figure 2: how much probability the teacher's top-K holds, and what storing it costs.

    ``coverage``: a top-k store's ``manifest.json`` (its ``coverage`` and ``storage``, plus the
    stored ``k`` marked) or only its ``coverage`` part. Mean coverage per K with the min–max band
    over positions; bytes per position on the right axis.
    """
    section = (coverage or {}).get("coverage", coverage) or {}
    ks = section.get("k") or []
    if not ks:
        return message_figure(NO_DATA)
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


@never_raises
def selective_figure(curves: Sequence[dict[str, Any]], threshold: Optional[float] = None) -> go.Figure:
    """Accuracy–coverage (left) and risk–coverage (right) of one or more runs.

    Each curve: ``label``, ``coverage`` and ``risk`` (:func:`lab.calibration.selective.risk_coverage`), and
    ``at_threshold`` (coverage, selective accuracy) where the page's threshold cuts it, marked on
    the left plot. The shaded area under a risk curve is its AURC (in the legend).
    """
    if not curves:
        return message_figure(NO_DATA)
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


@never_raises
def robustness_figure(runs: Sequence[tuple[str, pd.DataFrame, float]]) -> go.Figure:
    """ECE against the number of bins, per run (``label``, :func:`lab.results.analysis.ece_robustness`'s
    table, smECE): equal-width as a line in its bootstrap band, equal-mass dashed, smooth ECE dotted
    (it has no bins, so it is flat). Where the lines part, the binning, not the model, sets the ECE."""
    drawn = [(label, df, smooth) for label, df, smooth in runs or [] if df is not None and not df.empty]
    if not drawn:
        return message_figure(NO_DATA)
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
        smooth_ece = pct(smooth, percent_sign=True)
        fig.add_trace(go.Scatter(x=[bins[0], bins[-1]], y=[smooth, smooth], mode="lines",
                                 line={"color": colour, "dash": "dot"}, name=f"smooth ECE {smooth_ece}",
                                 hovertemplate=f"smooth ECE (no bins) {smooth_ece}<extra>{plain(label)}</extra>",
                                 **group))
    fig.update_layout(xaxis_title="number of bins", yaxis_title="ECE", yaxis_tickformat=".0%", yaxis_rangemode="tozero",
                      height=470, legend_tracegroupgap=14)
    return fig
