"""Results: every evaluation under the runs directory in one table, FIRST Table 1 style, and as CSV.

The table can be narrowed by a text filter (every word must appear in the run's name, model, dataset,
split, scoring or folder) and leaves a series' cells out unless asked: a series of 4 models × 3 seeds ×
2 tasks is 24 rows that the Life cycle page shows better. ECE, accuracy and their kin are shown in %,
as on the other pages; the CSV keeps fractions. The CSV is the rows shown, written when asked: the
link goes away as soon as the table changes, so it never offers an older table than the one in view.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any, Optional

import gradio as gr
import pandas as pd

from lab.core import stored
from lab.core.layout import CELLS_DIR, SERIES_FILE
from lab.results import runs, tables
from ui.components import PICKER_POLL_S as POLL_S
from ui.components import export
from ui.context import LabContext
from ui.messages import error, note

# The label wraps in its column and the numbers keep theirs, so at 1440 px every headline number is in view.
WIDE = {"run": "300px", "oracle accuracy": "110px", "oracle ECE": "100px", "model": "160px", "scoring": "160px",
        "folder": "160px"}
COLUMN_WIDTHS = [WIDE.get(column, "84px") for column in tables.RESULTS_COLUMNS]
PERCENT = ("ECE", "ECE low", "ECE high", "accuracy", "cw-ECE", "oracle accuracy", "oracle ECE")  # fractions, shown ×100
SEARCHED = ("run", "model", "dataset", "split", "scoring", "folder")  # what the filter's words are looked for in
INTRO = ("Every evaluation under the runs directory, FIRST Table 1 style (ECE / accuracy / Trust per run "
         "and dataset; pipeline runs are named `<job>/eval/<model>-<set>`). ECE, its interval, accuracy, cw-ECE "
         "and the oracle's columns are in %; Trust, AURC and AUROC are scores from 0 to 1.")
TABLE_LABEL = "Evaluations (ECE and accuracy columns in %)"


# ---------------------------------------------------------------- handlers
def results_view(ctx: LabContext) -> pd.DataFrame:
    """Every evaluation, its figures as fractions (what the CSV holds)."""
    return tables.results_table(ctx.runs)


def is_series_cell(root: Path, folder: Any) -> bool:
    """Whether the evaluation ``folder`` (a name under ``root``) is one cell of a series:
    ``<series>/cells/<point>_<task>`` beside its ``series.json``."""
    parts = Path(str(folder)).parts
    return len(parts) >= 2 and parts[-2] == CELLS_DIR and (Path(root).joinpath(*parts[:-2]) / SERIES_FILE).is_file()


def filtered(ctx: LabContext, table: pd.DataFrame, text: Any = "", show_cells: Any = False) -> pd.DataFrame:
    """The rows of ``table`` to show: each word of ``text`` (case ignored) found in the row's
    :data:`SEARCHED` columns, and no series cell unless ``show_cells``."""
    keep = pd.Series(True, index=table.index)
    if not show_cells:
        keep &= ~table["folder"].map(lambda folder: is_series_cell(ctx.runs, folder)).astype(bool)
    words = str(text or "").lower().split()
    if words:
        haystack = table[list(SEARCHED)].fillna("").astype(str).agg(" ".join, axis=1).str.lower()
        for word in words:
            keep &= haystack.str.contains(word, regex=False)
    return table[keep]


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The rows as the page shows them: the fractions of :data:`PERCENT` in %, to 2 decimals."""
    out = table.copy()
    for column in PERCENT:
        out[column] = (pd.to_numeric(out[column], errors="coerce") * 100).round(2)
    return out


def counted(ctx: LabContext, table: pd.DataFrame, rows: pd.DataFrame, show_cells: Any) -> str:
    """What the filter leaves out, in a line: "" when every evaluation is shown."""
    if len(rows) == len(table):
        return ""
    cells = 0 if show_cells else int(table["folder"].map(lambda f: is_series_cell(ctx.runs, f)).sum())
    hidden = f"; {cells} series cells hidden (tick “Show series cells”, or open them on the Life cycle page)"
    return note(f"Showing {len(rows)} of {len(table)} evaluations{hidden if cells else ''}.")


def follow_results(ctx: LabContext, seen: Optional[str], text: Any = "", show_cells: Any = False
                   ) -> tuple[Any, Optional[str], Any]:
    """(the table shown, its digest, what the filter leaves out) while the page is in view: the table
    and the line resent only when a run was added, renamed or rewritten, or the filter changed."""
    table = results_view(ctx)
    rows = filtered(ctx, table, text, show_cells)
    digest = hashlib.blake2b((rows.to_json() + repr((text, bool(show_cells)))).encode(), digest_size=8).hexdigest()
    if digest == seen:
        return gr.skip(), seen, gr.skip()
    return shown(rows), digest, counted(ctx, table, rows, show_cells)


def left_out(ctx: LabContext) -> str:
    """The evaluations the table leaves out because their ``metrics.json`` cannot be read, each named
    with why (a run's name under the runs folder, never a server path); empty when there are none."""
    problems = list(runs.scan(ctx.runs).unreadable.values())
    return error(f"Left out of the table: {stored.summary(problems)}") if problems else ""


def export_csv(ctx: LabContext, text: Any = "", show_cells: Any = False):
    """The rows the filter shows as ``results.csv`` (figures as fractions), shown as a download."""
    csv = tables.results_csv(filtered(ctx, results_view(ctx), text, show_cells))
    return export(ctx, "results.csv", lambda target: target.write_text(csv, encoding="utf-8"))


def stale_export() -> Any:
    """The download hidden: the table it was written from has changed."""
    return gr.update(value=None, visible=False)


# ---------------------------------------------------------------- layout and wiring
def build_results(ctx: LabContext) -> None:
    gr.Markdown(INTRO)
    with gr.Row():
        text = gr.Textbox(label="Filter (words in the run's name, model, dataset, split, scoring or folder)",
                          placeholder="e.g. arc_easy cloze", max_lines=1, scale=4, elem_id="results-filter")
        show_cells = gr.Checkbox(False, label="Show series cells", scale=1, elem_id="results-series-cells")
    counts = gr.HTML(elem_id="results-counts")
    table = gr.Dataframe(interactive=False, wrap=True, column_widths=COLUMN_WIDTHS, pinned_columns=1,
                         label=TABLE_LABEL, elem_id="results-table")
    export_button = gr.Button("Export CSV", elem_id="results-export")
    csv_file = gr.File(label="CSV (the rows shown)", visible=False, elem_id="results-csv")
    skipped = gr.HTML(elem_id="results-skipped")
    seen = gr.State(None)
    follow = functools.partial(follow_results, ctx)
    view = dict(fn=follow, inputs=[seen, text, show_cells], outputs=[table, seen, counts], show_progress="hidden")
    # Drawn when the tab is opened (the app runs a page's polls then: ui.app.poll_when_shown), not as the app loads.
    timer = gr.Timer(POLL_S, active=False)
    timer.tick(**view)
    timer.tick(functools.partial(left_out, ctx), outputs=skipped, show_progress="hidden")
    gr.on([text.submit, text.blur, show_cells.change], **view)
    table.change(stale_export, outputs=csv_file, show_progress="hidden")
    export_button.click(functools.partial(export_csv, ctx), inputs=[text, show_cells], outputs=csv_file)
