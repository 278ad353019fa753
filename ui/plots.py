"""Plotly figures for the browser lab, built from plain dicts and DataFrames (no gradio, no torch).

Each function returns a ``go.Figure`` and never raises: empty input gives an empty figure saying
"no data", and input it cannot draw gives one saying why, so one bad run cannot break a page.
Inputs come from :mod:`lab.analysis` (summaries, sweeps, tables), a top-k store's manifest
(:mod:`lab.distill.extract`) and a job's events (:class:`lab.train.trainer.LabCallback`).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from lab.templates import option_letters

OVER = "#d62728"  # conf > acc: the model claims more than it achieves
UNDER = "#1f77b4"  # conf < acc
ACCURACY = "#7f7f7f"
DIAGONAL = "#333333"
ECE_COLOUR = "#d62728"
NLL_COLOUR = "#1f77b4"
NO_DATA = "no data"


# ---------------------------------------------------------------- shared helpers
def _message_figure(text: str, title: str = "") -> go.Figure:
    """An empty figure carrying one centred message, axes hidden."""
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 16})
    fig.update_layout(title=title or None, xaxis={"visible": False}, yaxis={"visible": False})
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


def _bins(summary: dict) -> list[dict]:
    """The non-empty reliability bins (empty ones have no accuracy to draw)."""
    return [b for b in summary.get("reliability") or [] if b.get("count") and b.get("acc") is not None]


def _bin_x(bin_: dict, strategy: str) -> float:
    """Equal-width bins sit at their centre; equal-mass bins have no fixed edges, so at their mean confidence."""
    return bin_["conf"] if strategy == "mass" else (bin_["lo"] + bin_["hi"]) / 2


def _stats_text(summary: dict) -> str:
    return f"ECE {_pct(summary.get('ece'))} · n={summary.get('n', '–')} · Trust {_pct(summary.get('trust'))}"


def _add_reliability(fig: go.Figure, summary: dict, col: Optional[int] = None, legend: bool = True) -> None:
    """Accuracy bars, red/blue gap bars from accuracy to confidence, the diagonal and the stats box.

    ``col`` picks a subplot of a one-row grid; every call adds the same four traces, so a run with
    no over-confident bin still has its (empty) over-confident trace and the legend stays put.
    """
    where = {} if col is None else {"row": 1, "col": col}
    strategy = summary.get("strategy", "width")
    bins = _bins(summary)
    n_bins = summary.get("n_bins") or len(summary.get("reliability") or []) or 10
    width = [0.9 / n_bins if strategy == "mass" else 0.95 * (b["hi"] - b["lo"]) for b in bins]
    x = [_bin_x(b, strategy) for b in bins]
    fig.add_trace(go.Bar(
        x=x, y=[b["acc"] for b in bins], width=width, name="accuracy", marker_color=ACCURACY,
        text=[str(b["count"]) for b in bins], textposition="outside", cliponaxis=False,  # visible at acc = 0 too
        legendgroup="accuracy", showlegend=legend,
        customdata=[[b["count"], b["conf"]] for b in bins],
        hovertemplate="accuracy %{y:.3f}<br>confidence %{customdata[1]:.3f}<br>%{customdata[0]} questions"
                      "<extra></extra>",
    ), **where)
    for name, colour, keep in (("over-confident", OVER, lambda g: g > 0), ("under-confident", UNDER, lambda g: g < 0)):
        chosen = [(xi, wi, b) for xi, wi, b in zip(x, width, bins) if keep(b["conf"] - b["acc"])]
        fig.add_trace(go.Bar(
            x=[c[0] for c in chosen], y=[c[2]["conf"] - c[2]["acc"] for c in chosen],
            base=[c[2]["acc"] for c in chosen], width=[c[1] for c in chosen], name=name, marker_color=colour,
            opacity=0.6, legendgroup=name, showlegend=legend,
            hovertemplate="gap (conf − acc) %{y:+.3f}<extra></extra>",
        ), **where)
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration", legendgroup="diagonal",
                             line={"dash": "dash", "color": DIAGONAL}, showlegend=legend), **where)
    fig.add_annotation(text=_stats_text(summary), x=0.02, y=0.98, xref="x domain", yref="y domain", xanchor="left",
                       yanchor="top", showarrow=False, bgcolor="rgba(255,255,255,0.85)", bordercolor=DIAGONAL,
                       borderwidth=1, **where)
    axis_title = "mean confidence (equal-mass bins)" if strategy == "mass" else "confidence"
    fig.update_xaxes(range=[0, 1], title_text=axis_title, **where)
    fig.update_yaxes(range=[0, 1], **where)


# ---------------------------------------------------------------- reliability
@_never_raises
def reliability_figure(summary: dict, title: str = "") -> go.Figure:
    """Reliability diagram of one summary (:func:`lab.analysis.calibration_summary` or ``metrics.json``).

    Grey bars: accuracy per bin, labelled with the bin's count. On top, the gap to the bin's mean
    confidence: red where over-confident (conf > acc), blue where under-confident.
    """
    if not _bins(summary or {}):
        return _message_figure(NO_DATA, title)
    fig = go.Figure()
    _add_reliability(fig, summary)
    fig.update_layout(title=title or None, barmode="overlay", yaxis_title="accuracy")
    return fig


@_never_raises
def side_by_side(summaries: Sequence[tuple[str, dict]]) -> go.Figure:
    """One reliability diagram per run, in a row with a shared accuracy axis, to compare runs."""
    if not summaries:
        return _message_figure(NO_DATA)
    fig = make_subplots(rows=1, cols=len(summaries), shared_yaxes=True,
                        subplot_titles=[name for name, _ in summaries])
    for col, (_, summary) in enumerate(summaries, start=1):
        _add_reliability(fig, summary, col=col, legend=col == 1)
    fig.update_layout(barmode="overlay")
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


@_never_raises
def training_figure(events: Sequence[dict], stage_prefix: str) -> go.Figure:
    """Training loss per step (left) and validation ECE and accuracy per epoch (right).

    Every stage starting with ``stage_prefix`` is drawn ("teacher", or "student:" for all four
    FIRST students), one colour per stage; validation comes from its ``<stage>_eval`` events.
    """
    losses, evals = _stage_events(events, stage_prefix)
    if not losses and not evals:
        return _message_figure(NO_DATA)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["training loss", "validation"])
    palette = qualitative.Plotly
    for i, stage in enumerate(sorted(set(losses) | set(evals))):
        colour = palette[i % len(palette)]
        if stage in losses:
            fig.add_trace(go.Scatter(x=[e["step"] for e in losses[stage]], y=[e["loss"] for e in losses[stage]],
                                     mode="lines", name=f"{stage} loss", line={"color": colour}), row=1, col=1)
        for metric, dash in (("ece", "solid"), ("accuracy", "dash")):
            points = [e for e in evals.get(stage, []) if e.get(metric) is not None]
            if points:
                fig.add_trace(go.Scatter(x=[e["epoch"] for e in points], y=[e[metric] for e in points],
                                         mode="lines+markers", name=f"{stage} val {metric}",
                                         line={"color": colour, "dash": dash}), row=1, col=2)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="epoch", row=1, col=2)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="ECE (solid) / accuracy (dashed)", range=[0, 1], row=1, col=2)
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
        fig.add_trace(go.Bar(x=labels, y=probs, name=str(result.get("model", "")),
                             text=[f"{p:.0%}" for p in probs], textposition="outside"))
    fig.update_layout(barmode="group", xaxis_title="option", yaxis_title="probability", yaxis_range=[0, 1.1])
    return fig


@_never_raises
def positionwise_figure(df: pd.DataFrame) -> go.Figure:
    """:func:`lab.analysis.positionwise_topk`: mean probability of the rank-k token (bars) and how
    often the answer letter is within the top k (line)."""
    if df is None or df.empty:
        return _message_figure(NO_DATA)
    ranks = [f"top-{int(k)}" for k in df["rank"]]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=ranks, y=df["mean_prob"], name="mean probability of the rank-k token",
                         marker_color=ACCURACY))
    fig.add_trace(go.Scatter(x=ranks, y=df["answer_in_topk"], mode="lines+markers", name="answer within top k",
                             line={"color": OVER}))
    fig.update_layout(xaxis_title="rank at the answer position", yaxis_title="probability / fraction",
                      yaxis_range=[0, 1.05])
    return fig
