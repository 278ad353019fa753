"""Results: every evaluation under the runs directory in one table, FIRST Table 1 style, and as CSV."""
from __future__ import annotations

import functools

import gradio as gr
import pandas as pd

from lab import analysis
from ui.components import export
from ui.context import LabContext

INTRO = ("Every evaluation under the runs directory, FIRST Table 1 style (ECE / accuracy / Trust per run "
         "and dataset; pipeline runs are named `<job>/eval/<model>-<set>`).")


# ---------------------------------------------------------------- handlers
def results_view(ctx: LabContext) -> pd.DataFrame:
    return analysis.results_table(ctx.runs)


def export_csv(ctx: LabContext):
    """The table as ``results.csv``, shown as a download."""
    text = analysis.results_csv(results_view(ctx))
    return export(ctx, "results.csv", lambda target: target.write_text(text, encoding="utf-8"))


# ---------------------------------------------------------------- layout and wiring
def build_results(ctx: LabContext) -> None:
    gr.Markdown(INTRO)
    table = gr.Dataframe(value=functools.partial(results_view, ctx), interactive=False, elem_id="results-table")
    with gr.Row():
        refresh = gr.Button("↻ Refresh")
        export_button = gr.Button("Export CSV")
    csv_file = gr.File(label="CSV", visible=False)
    refresh.click(functools.partial(results_view, ctx), outputs=table)
    export_button.click(functools.partial(export_csv, ctx), outputs=csv_file)
