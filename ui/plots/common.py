"""What every figure of the package shares: the colours, the empty and the failed figure, user text
made literal for Plotly, run labels wrapped for narrow titles, and one legend entry per kind of trace."""
from __future__ import annotations

import functools
import html
from typing import Any, Callable

import plotly.graph_objects as go

OVER = "#d62728"  # conf > acc: the model claims more than it achieves
UNDER = "#1f77b4"  # conf < acc
DIAGONAL = "#333333"
ECE_COLOUR = "#d62728"
NO_DATA = "no data"
MODEBAR = 30  # px at the very top kept for plotly's toolbar, which would otherwise cover titles on the right
TITLE_LINE = 16  # px per line of a subplot title (12 px font)
MAX_TITLE_LINES = 3
TITLE_NAME = "subplot title"  # a subplot title's annotation name, for tests


def message_figure(text: str, title: str = "") -> go.Figure:
    """An empty figure carrying one centred message, axes hidden."""
    fig = go.Figure()
    fig.add_annotation(text=plain(text), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 16})
    fig.update_layout(title=plain(title) if title else None, xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def never_raises(draw: Callable[..., go.Figure]) -> Callable[..., go.Figure]:
    """A page shows the reason in place of the figure instead of failing as a whole."""

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> go.Figure:
        try:
            return draw(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure becomes a figure that says so
            return message_figure(f"cannot draw: {type(e).__name__}: {e}")

    return wrapper


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


def one_legend_entry_per_name(fig: go.Figure) -> None:
    """Subplots repeat the same kinds of trace: one of each name goes into the legend, the first
    that draws something. Plotly lists no empty trace, so an entry given to an empty one (a
    "before" plot with no under-confident bin) would leave the bars of its name unexplained."""
    names = dict.fromkeys(trace.name for trace in fig.data)
    for name in names:
        same = [trace for trace in fig.data if trace.name == name]
        keeper = next((trace for trace in same if trace.x is not None and len(trace.x)), same[0])
        for trace in same:
            trace.showlegend = trace is keeper
