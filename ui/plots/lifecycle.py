"""The life-cycle figure: a series' ECE and accuracy along its axis, one column per task (the
alignment-calibration paper's Figures 3–5), and the words its hover and the Life cycle page's tables
share (a parameter count, a figure with its interval)."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.results.reports import pct
from ui.plots.common import (DIAGONAL, ECE_COLOUR, MODEBAR, NO_DATA, TITLE_LINE, TITLE_NAME, UNDER, message_figure,
                             never_raises, one_legend_entry_per_name, plain, wrap_label)

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


def with_interval(value: Optional[float], low: Optional[float], high: Optional[float]) -> str:
    """A figure with its interval: "12.3% [9.8%, 15.0%]", the figure alone where it has none."""
    shown = pct(value, percent_sign=True)
    if low is None or high is None:
        return shown
    return f"{shown} [{pct(low, percent_sign=True)}, {pct(high, percent_sign=True)}]"


def _x_text(axis: str, x: Any) -> str:
    return params_label(x) if axis == "params" and isinstance(x, (int, float)) else plain(x)


def _cell_hover(axis: str, axis_title: str, cell: dict[str, Any]) -> str:
    """What a run's marker says: which model it is, where it sits, n, and both metrics with their intervals."""
    model = plain(cell.get("model") or "?") + (f" + {plain(cell['adapter'])}" if cell.get("adapter") else "")
    model += f" @ {plain(cell['revision'])}" if cell.get("revision") else ""
    stage = f" · {plain(cell['stage'])}" if cell.get("stage") else ""
    lines = [f"<b>{plain(cell.get('point') or '?')}</b>{stage}", f"model {model}",
             f"{plain(axis_title)} {_x_text(axis, cell['x'])} · n = {cell.get('n', '–')}",
             "ECE " + with_interval(cell.get("ece"), cell.get("ece_low"), cell.get("ece_high")),
             "accuracy " + with_interval(cell.get("accuracy"), cell.get("accuracy_low"), cell.get("accuracy_high"))]
    if cell.get("oracle_ece") is not None:
        lines.append(f"oracle ECE {pct(cell['oracle_ece'], percent_sign=True)}")
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
    hover = [f"{entry}mean over {row['runs']} seeds {with_interval(m, lo, hi)}"
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


@never_raises
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
        return message_figure(NO_DATA)
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
    one_legend_entry_per_name(fig)
    fig.update_traces(showlegend=False, selector={"fill": "toself"})  # a band is its mean's, which the legend names
    return fig
