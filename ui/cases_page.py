"""Case studies: the questions of one run, over-confident wrong answers first, and one question
followed across runs (:mod:`lab.cases`)."""
from __future__ import annotations

import functools
from typing import Optional

import gradio as gr
import pandas as pd

from lab import cases, runs
from ui.components import run_picker
from ui.context import LabContext
from ui.messages import error

DEFAULT_KIND = "overconfident_wrong"


# ---------------------------------------------------------------- handlers
def cases_view(ctx: LabContext, name: Optional[str], kind: str, lo: float, hi: float, dataset: Optional[str]):
    """(the filtered questions, the dataset filter's choices, a note) for one run."""
    run = runs.evaluation(ctx.runs, name)
    if run is None:
        return pd.DataFrame(), gr.update(), "Pick an evaluation run."
    try:
        table = cases.case_table(ctx.results.predictions(run))
        filtered = cases.filter_cases(table, kind, (min(lo, hi), max(lo, hi)), dataset or None)
    except (ValueError, OSError) as e:
        return pd.DataFrame(), gr.update(), error(str(e))
    datasets = sorted(set(table["dataset"]) - {""})
    note = f"{len(filtered)} of {len(table)} questions" + (", over-confident wrong answers first" if kind != "correct" else "")
    return filtered.drop(columns=["overconfident_wrong"]).round(4), gr.update(choices=[""] + datasets), note


def same_question_view(ctx: LabContext, question_id: Optional[str], names: Optional[list[str]]) -> pd.DataFrame:
    """What each picked run answered to one question (empty until both are given); a damaged run's
    file and line are shown as a notice (:class:`gradio.Error`)."""
    picked = [r.path for r in (runs.evaluation(ctx.runs, n) for n in names or []) if r]
    if not question_id or not question_id.strip() or not picked:
        return pd.DataFrame()
    try:
        return cases.same_question(picked, question_id.strip())
    except (ValueError, OSError) as e:  # a run damaged since it was listed: say which, in a notice
        raise gr.Error(str(e)) from None


# ---------------------------------------------------------------- layout and wiring
def build_cases(ctx: LabContext) -> None:
    name, _ = run_picker(ctx, "Evaluation run")
    with gr.Row():
        kind = gr.Radio(list(cases.CASE_KINDS), value=DEFAULT_KIND, label="Show")
        lo = gr.Slider(0, 1, value=0, step=0.05, label="confidence from")
        hi = gr.Slider(0, 1, value=1, step=0.05, label="to")
        dataset = gr.Dropdown([""], value="", label="dataset", allow_custom_value=False)
    note = gr.Markdown()
    table = gr.Dataframe(interactive=False, wrap=True, label="Questions (click a column to sort)")
    gr.Markdown("### The same question across runs")
    with gr.Row():
        question_id = gr.Textbox(label="Question id (from the table)", scale=1)
        with gr.Column(scale=3):
            across, _ = run_picker(ctx, "Runs", multiselect=True)
    same = gr.Dataframe(interactive=False, label="What each run answered")

    inputs = [name, kind, lo, hi, dataset]
    for control in inputs:
        control.change(functools.partial(cases_view, ctx), inputs=inputs, outputs=[table, dataset, note])
    on_same = functools.partial(same_question_view, ctx)
    question_id.submit(on_same, inputs=[question_id, across], outputs=same)
    across.change(on_same, inputs=[question_id, across], outputs=same)
