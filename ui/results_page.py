"""Results: every evaluation under the runs directory in one table, FIRST Table 1 style, and as CSV."""
from __future__ import annotations

import functools
import hashlib
from typing import Any, Optional

import gradio as gr
import pandas as pd

from lab.results import analysis
from ui.components import PICKER_POLL_S as POLL_S
from ui.components import export
from ui.context import LabContext

# The label wraps in its column and the numbers keep theirs, so at 1440 px every headline number is in view.
WIDE = {"run": "300px", "oracle accuracy": "110px", "oracle ECE": "100px", "model": "160px", "scoring": "160px",
        "folder": "160px"}
COLUMN_WIDTHS = [WIDE.get(column, "84px") for column in analysis.RESULTS_COLUMNS]
INTRO = ("Every evaluation under the runs directory, FIRST Table 1 style (ECE / accuracy / Trust per run "
         "and dataset; pipeline runs are named `<job>/eval/<model>-<set>`).")


# ---------------------------------------------------------------- handlers
def results_view(ctx: LabContext) -> pd.DataFrame:
    return analysis.results_table(ctx.runs)


def follow_results(ctx: LabContext, seen: Optional[str]) -> tuple[Any, Optional[str]]:
    """The table while the page is in view: resent only when a run was added, renamed or rewritten."""
    table = results_view(ctx)
    digest = hashlib.blake2b(table.to_json().encode(), digest_size=8).hexdigest()
    return (gr.skip(), seen) if digest == seen else (table, digest)


def export_csv(ctx: LabContext):
    """The table as ``results.csv``, shown as a download."""
    text = analysis.results_csv(results_view(ctx))
    return export(ctx, "results.csv", lambda target: target.write_text(text, encoding="utf-8"))


# ---------------------------------------------------------------- layout and wiring
def build_results(ctx: LabContext) -> None:
    gr.Markdown(INTRO)
    table = gr.Dataframe(interactive=False, wrap=True, column_widths=COLUMN_WIDTHS, pinned_columns=1,
                         elem_id="results-table")
    export_button = gr.Button("Export CSV")
    csv_file = gr.File(label="CSV", visible=False)
    seen = gr.State(None)
    follow = functools.partial(follow_results, ctx)
    gr.on(None, follow, inputs=seen, outputs=[table, seen], show_progress="hidden")
    gr.Timer(POLL_S, active=False).tick(follow, inputs=seen, outputs=[table, seen], show_progress="hidden")
    export_button.click(functools.partial(export_csv, ctx), outputs=csv_file)
