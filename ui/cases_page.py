"""Case studies: the questions of one run, over-confident wrong answers first, and one question
followed across runs (:mod:`lab.results.cases`).

The table leads with what a reader scans for (confidence, prediction, answer, correct) and keeps
the long question text in a bounded column after them, so a wide question never pushes them off
screen. Gradio's Dataframe sorts only through a header's menu (two clicks), hence the "Sort by"
dropdown beside it.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import gradio as gr
import pandas as pd

from lab.calibration import confidence
from lab.data.templates import option_letter
from lab.results import cases, predictions, runs
from ui.components import run_picker, signal_choices
from ui.context import LabContext
from ui.messages import error

DEFAULT_KIND = "overconfident_wrong"
KIND_CHOICES = [("over-confident wrong", "overconfident_wrong"), ("wrong", "wrong"), ("right", "correct"),
                ("all", "all")]
KIND_HELP = """**Show** keeps, within the confidence range and dataset picked:
- **over-confident wrong**: wrong answers given with a confidence above the accuracy of these questions
  (the threshold is printed above the table): the model claimed a hit rate it does not reach;
- **wrong**: every wrong answer; **right**: every right answer; **all**: every question."""
# the key columns first; the question and options bounded (wrapped, cut at MAX_CHARS: a click shows all)
COLUMNS = ["confidence", "prediction", "answer", "correct", "question", "options", "dataset", "id"]
COLUMN_WIDTHS = ["120px", "110px", "95px", "95px", "360px", "230px", "100px", "80px"]  # ≈ 1190 px: all fit at 1440
KEY_COLUMNS = 4  # pinned while the table scrolls sideways
SIGNAL_WIDTH = "120px"  # a signal other than the top probability: its column, after the confidence
MAX_CHARS = 180
SAME_COLUMNS = ["run", "answer", "prediction", "confidence", "correct", "probabilities"]


# ---------------------------------------------------------------- handlers
def three_digits(value: float) -> float:
    """``value`` to 3 significant digits (0.87345 → 0.873): what a reader can take in at a glance."""
    return float(f"{value:.3g}")


def shown_cases(table: pd.DataFrame, signal: Optional[str] = None) -> pd.DataFrame:
    """A case table as the page shows it: :data:`COLUMNS` in that order, confidences to 3 digits,
    and last, for the controlled task, the true probability of each prediction (the oracle's).
    ``signal``: a column the table holds for another confidence signal, shown after the confidence."""
    oracle = [cases.ORACLE_COLUMN] if cases.ORACLE_COLUMN in table else []
    extra = [signal] if signal else []
    shown = table.reindex(columns=COLUMNS[:1] + extra + COLUMNS[1:] + oracle)
    for column in ["confidence", *extra, *oracle]:
        shown[column] = shown[column].map(three_digits)
    return shown


def signal_title(signal: Optional[str]) -> Optional[str]:
    """The column a signal other than the top probability adds (its title), else None."""
    if not signal or signal == confidence.DEFAULT or signal not in confidence.SIGNALS:
        return None
    return confidence.SIGNALS.get(signal).title


def cases_view(ctx: LabContext, name: Optional[str], kind: str, lo: float, hi: float, dataset: Optional[str],
               order: str = cases.DEFAULT_SORT, signal: Optional[str] = confidence.DEFAULT):
    """(the filtered questions, the dataset filter's choices, a note) for one run. The note says
    what the filter keeps, with its threshold, and how many of the questions of its kind it covers.
    The confidence range applies to ``signal`` (:mod:`lab.calibration.confidence`), shown in a column of its
    own when it is not the top probability: the selective page's threshold on any signal opens
    exactly the questions it drops."""
    empty = pd.DataFrame(columns=COLUMNS)
    run = runs.evaluation(ctx.runs, name)
    if run is None:
        return empty, gr.update(), "Pick an evaluation run."
    conf_range = (min(lo, hi), max(lo, hi))
    column = signal_title(signal)
    try:
        pred = ctx.results.predictions(run)
        table = cases.case_table(pred)
        if column:
            table[column] = confidence.values(signal, predictions.reported_probs(pred), pred.mask, pred.rows)
        by = column or "confidence"
        filtered = cases.filter_cases(table, kind, conf_range, dataset or None, by)
        unit = "targets" if predictions.is_token_run(pred) else "questions"  # a token run's rows are its target tokens
        note = cases.describe_cases(table, filtered, kind, conf_range, dataset or None, by, unit)
        filtered = cases.sort_cases(filtered, order or cases.DEFAULT_SORT)
    except (ValueError, OSError) as e:
        return empty, gr.update(), error(str(e))
    datasets = sorted(set(table["dataset"]) - {""})
    note = f"**{len(filtered)} of {len(table)} {unit}.** {note}"
    return shown_cases(filtered, column), gr.update(choices=[""] + datasets), note


def page_view(ctx: LabContext, name: Optional[str], kind: str, lo: float, hi: float, dataset: Optional[str],
              order: str = cases.DEFAULT_SORT, signal: Optional[str] = confidence.DEFAULT):
    """:func:`cases_view` for the page: the table's widths and pinned key columns follow the
    signal's column, which sits among the key columns when there is one."""
    table, datasets, note = cases_view(ctx, name, kind, lo, hi, dataset, order, signal)
    extra = 1 if signal_title(signal) in table.columns else 0
    widths = COLUMN_WIDTHS[:1] + [SIGNAL_WIDTH] * extra + COLUMN_WIDTHS[1:]
    return gr.update(value=table, column_widths=widths, pinned_columns=KEY_COLUMNS + extra), datasets, note


def probabilities_text(probs: Any) -> str:
    """``A 0.873 · B 0.127``: each option's probability, lettered, to 3 significant digits (a token
    run's top tokens come as text already, :func:`lab.results.cases.top_tokens_text`)."""
    if isinstance(probs, str):
        return probs
    return " · ".join(f"{option_letter(i)} {three_digits(p)}" for i, p in enumerate(probs))


def shown_answers(answers: pd.DataFrame) -> pd.DataFrame:
    """:func:`lab.results.cases.same_question` as the page shows it: probabilities as lettered text."""
    shown = answers.assign(confidence=answers["confidence"].map(three_digits),
                           probabilities=answers["probs"].map(probabilities_text))
    return shown.reindex(columns=SAME_COLUMNS)


def same_question_view(ctx: LabContext, question_id: Optional[str], names: Optional[list[str]]) -> pd.DataFrame:
    """What each picked run (named by its label) answered to one question (empty until both are
    given); a damaged run's file and line are shown as a notice (:class:`gradio.Error`)."""
    picked = [r for r in (runs.evaluation(ctx.runs, n) for n in names or []) if r]
    if not question_id or not question_id.strip() or not picked:
        return pd.DataFrame(columns=SAME_COLUMNS)
    try:
        answers = cases.same_question([r.path for r in picked], question_id.strip(), [r.label for r in picked])
    except (ValueError, OSError) as e:  # a run damaged since it was listed: say which, in a notice
        raise gr.Error(str(e)) from None
    return shown_answers(answers)


# ---------------------------------------------------------------- layout and wiring
def _table(**kwargs: Any) -> gr.Dataframe:
    return gr.Dataframe(interactive=False, wrap=True, column_widths=COLUMN_WIDTHS, max_chars=MAX_CHARS,
                        max_height=640, pinned_columns=4, **kwargs)


class CasesControls(NamedTuple):
    """What another page's link sets to open questions here (:func:`questions_below`): the run picker, what to show,
    the confidence range, the signal it ranges over, the dataset filter, and the view it draws (the order is read)."""

    picker: gr.Dropdown
    kind: gr.Radio
    lo: gr.Slider
    hi: gr.Slider
    signal: gr.Dropdown
    dataset: gr.Dropdown
    order: gr.Dropdown
    table: gr.Dataframe
    note: gr.Markdown

    def opened(self) -> list[Any]:
        """What :func:`questions_below` returns updates for, in its order."""
        return [self.kind, self.lo, self.hi, self.signal, self.dataset, self.table, self.note]


def questions_below(ctx: LabContext, name: Optional[str], signal: str, below: float, order: Optional[str]):
    """Updates for :meth:`CasesControls.opened`: run ``name``'s every question whose ``signal`` is below ``below``,
    the controls set to say so and the view drawn in the same reply. The view is not left to the change events of
    the controls: the link sets five at once on a page that may not be drawn yet, and a fresh clone's parallel run
    kept the view from before the link (no change it fired, or an older one, came last)."""
    table, datasets, note = page_view(ctx, name, "all", 0, below, "", order or cases.DEFAULT_SORT, signal)
    return (gr.update(value="all"), gr.update(value=0), gr.update(value=below), gr.update(value=signal),
            {**datasets, "value": ""}, table, note)


def build_cases(ctx: LabContext) -> CasesControls:
    """The page; its controls are returned so a job's page or the selective page can open a run here."""
    name, _ = run_picker(ctx, "Evaluation run")
    with gr.Row():
        kind = gr.Radio(KIND_CHOICES, value=DEFAULT_KIND, label="Show")
        # steps of 0.01, as the selective page's threshold, which opens its dropped questions here
        lo = gr.Slider(0, 1, value=0, step=0.01, label="confidence from")
        hi = gr.Slider(0, 1, value=1, step=0.01, label="to")
        signal = gr.Dropdown(signal_choices(), value=confidence.DEFAULT, label="Confidence signal (the range's)",
                             elem_id="cases-signal")
        dataset = gr.Dropdown([""], value="", label="dataset", allow_custom_value=False)
        order = gr.Dropdown(list(cases.SORT_ORDERS), value=cases.DEFAULT_SORT, label="Sort by")
    gr.Markdown(KIND_HELP)
    note = gr.Markdown()
    table = _table(label="Questions (a long cell shows all of itself when clicked)", elem_id="cases-table")
    gr.Markdown("### The same question across runs")
    with gr.Row():
        question_id = gr.Textbox(label="Question id (from the table)", scale=1)
        with gr.Column(scale=3):
            across, _ = run_picker(ctx, "Runs", multiselect=True)
    same = gr.Dataframe(interactive=False, wrap=True, label="What each run answered")

    inputs = [name, kind, lo, hi, dataset, order, signal]
    # One event for every control, run again after the last change: a link that sets five controls at once
    # (the selective page's) fires five changes, and as five events the first one's view could land last.
    gr.on([control.change for control in inputs], functools.partial(page_view, ctx), inputs=inputs,
          outputs=[table, dataset, note], trigger_mode="always_last")
    on_same = functools.partial(same_question_view, ctx)
    question_id.submit(on_same, inputs=[question_id, across], outputs=same)
    across.change(on_same, inputs=[question_id, across], outputs=same)
    return CasesControls(name, kind, lo, hi, signal, dataset, order, table, note)
