"""Training curves: loss per step and validation ECE and accuracy per epoch, from a job's events
(:class:`lab.training.callbacks.LabCallback`)."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ui.plots.common import NO_DATA, message_figure, never_raises, plain


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


@never_raises
def training_figure(events: Sequence[dict], stage_prefix: str) -> go.Figure:
    """Training loss per step, validation ECE per epoch and validation accuracy per epoch, side by side.

    Every stage starting with ``stage_prefix`` is drawn ("teacher", or "student:" for all four
    FIRST students) in one colour across the three panels, its traces one legend group (a click
    on one hides the stage); validation comes from its ``<stage>_eval`` events. ECE (circles) and
    accuracy (squares, dotted) get panels of their own: on one axis they differ by dash only.
    """
    losses, evals = _stage_events(events, stage_prefix)
    if not losses and not evals:
        return message_figure(NO_DATA)
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
