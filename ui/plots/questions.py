"""What a model gives the options of a question: several models on one question, and the rank-k
tokens at the answer position over a run."""
from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from lab.data.templates import option_letters
from ui.plots.common import NO_DATA, message_figure, never_raises, plain, wrap_label


@never_raises
def option_bars(results: Sequence[dict]) -> go.Figure:
    """Several models on one question: a group per option, a bar per model.

    Each result: ``model`` (its name), ``probs`` (option probabilities) and optionally ``labels``
    (option names; default A, B, C, ...).
    """
    if not results:
        return message_figure(NO_DATA)
    fig = go.Figure()
    for result in results:
        probs = list(result["probs"])
        labels = list(result.get("labels") or option_letters(len(probs)))
        fig.add_trace(go.Bar(x=[plain(label) for label in labels], y=probs, name=plain(result.get("model", "")),
                             text=[f"{p:.0%}" for p in probs], textposition="outside"))
    fig.update_layout(barmode="group", xaxis_title="option", yaxis_title="probability", yaxis_range=[0, 1.1])
    return fig


@never_raises
def positionwise_figure(tables: Sequence[tuple[str, pd.DataFrame]]) -> go.Figure:
    """:func:`lab.results.tables.positionwise_topk` of one or more runs, each ``(label, table)``.

    Per run, in its own colour: bars (grouped by rank) of the mean probability of the rank-k token
    at the answer position, and a dotted line of how often the answer letter is within the top k.
    The legend groups each run's two traces under its label. Runs with an empty table (cloze runs
    keep no top tokens) are left out: the page names them.
    """
    drawn = [(label, df) for label, df in tables or [] if df is not None and not df.empty]
    if not drawn:
        return message_figure(NO_DATA)
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
