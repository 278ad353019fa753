"""Results: every evaluation under the runs directory in one table, FIRST Table 1 style, and as CSV."""
from __future__ import annotations

import functools
import hashlib
from typing import Any, Optional

import gradio as gr
import pandas as pd

from lab.core import stored
from lab.results import analysis, runs
from ui.components import PICKER_POLL_S as POLL_S
from ui.components import export
from ui.context import LabContext
from ui.messages import error

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


def left_out(ctx: LabContext) -> str:
    """The evaluations the table leaves out because their ``metrics.json`` cannot be read, each named
    with why (a run's name under the runs folder, never a server path); empty when there are none."""
    problems = list(runs.scan(ctx.runs).unreadable.values())
    return error(f"Left out of the table: {stored.summary(problems)}") if problems else ""


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
    skipped = gr.HTML(elem_id="results-skipped")
    seen = gr.State(None)
    follow = functools.partial(follow_results, ctx)
    gr.on(None, follow, inputs=seen, outputs=[table, seen], show_progress="hidden")
    gr.on(None, functools.partial(left_out, ctx), outputs=skipped, show_progress="hidden")
    timer = gr.Timer(POLL_S, active=False)
    timer.tick(follow, inputs=seen, outputs=[table, seen], show_progress="hidden")
    timer.tick(functools.partial(left_out, ctx), outputs=skipped, show_progress="hidden")
    export_button.click(functools.partial(export_csv, ctx), outputs=csv_file)
