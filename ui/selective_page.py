"""Selective prediction: when to trust an answer. For runs side by side, the accuracy–coverage and
risk–coverage curves, AURC, E-AURC and AUROC with bootstrap intervals, accuracy at 50 % and 80 %
coverage, and a confidence threshold that shows the coverage and selective accuracy it buys and
exactly which questions it drops (with a link to open them in Case studies).

Everything is recomputed from the stored predictions (:mod:`lab.calibration.selective`) with the confidence
signal the user picks (:mod:`lab.calibration.confidence`): the top probability, the margin, 1 − entropy, or
the full-vocabulary probability of letter-scored runs.
"""
from __future__ import annotations

import functools
import html
from typing import Any, NamedTuple, Optional

import gradio as gr
import numpy as np
import pandas as pd

from lab.calibration import confidence, selective
from lab.results import cases, predictions, runs
from ui.cases_page import COLUMN_WIDTHS
from ui.cases_page import COLUMNS as CASE_COLUMNS
from ui.cases_page import MAX_CHARS, shown_cases
from ui.components import run_picker, signal_choices
from ui.context import LabContext
from ui.messages import error, note
from ui.plots.curves import selective_figure

MAX_RUNS = 6
BOOT = 200  # bootstrap replicates of the AURC / AUROC intervals (each re-sorts the questions)
DEFAULT_THRESHOLD = 0.5
NO_CASES = pd.DataFrame(columns=CASE_COLUMNS)
INTRO = ("A model that may abstain answers only where its confidence clears a threshold. **Coverage**: the share "
         "of questions it then answers; **risk**: its error rate on them. **AURC** (↓) is the area under the "
         "risk–coverage curve, **E-AURC** (↓) what remains of it after the best possible ranking of these "
         "answers, **AUROC** (↑) the chance that a right answer is more confident than a wrong one (0.5: the "
         "confidence says nothing); **acc @ 50%** / **80%**: the accuracy of the most confident half / 80 % of the "
         "answers. Tied confidences count as the mean over their orders.")
# The run, then the numbers a reader came for (at 1440 px they were behind a scroll), then the details;
# each with its width, so that no header breaks mid-word.
TABLE_WIDTHS = {"run": "260px", "AUROC": "84px", "AURC": "84px", "acc @ 50%": "96px", "acc @ 80%": "96px",
                "accuracy": "96px", "n": "64px", "AUROC 95% CI": "110px", "AURC 95% CI": "110px", "E-AURC": "84px",
                "signal": "130px", "coverage at threshold": "110px", "accuracy at threshold": "110px",
                "dropped right": "96px", "dropped wrong": "96px"}
TABLE_COLUMNS = list(TABLE_WIDTHS)


class SelectiveLink(NamedTuple):
    """What the app wires to Case studies: the button, and the inputs that say what to open."""

    button: gr.Button
    names: gr.Dropdown
    signal: gr.Dropdown
    threshold: gr.Slider


def _interval(pair: Optional[list[float]]) -> str:
    return "–" if not pair else f"{pair[0]:.3f}–{pair[1]:.3f}"


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)


def run_row(label: str, signal: str, correct: np.ndarray, s: dict[str, Any], cut: dict[str, Any]) -> dict[str, Any]:
    """One row of the table: the run's selective metrics (``s``, :func:`lab.calibration.selective.summary`) and
    what the threshold does to it (``cut``, :func:`lab.calibration.selective.select`)."""
    return {"run": label, "signal": confidence.SIGNALS.get(signal).title, "n": int(correct.size),
            "accuracy": _round(float(np.mean(correct))), "AURC": _round(s["aurc"]),
            "AURC 95% CI": _interval(s.get("aurc_ci")), "E-AURC": _round(s["e_aurc"]), "AUROC": _round(s["auroc"]),
            "AUROC 95% CI": _interval(s.get("auroc_ci")), "acc @ 50%": _round(s["acc_at_50"]),
            "acc @ 80%": _round(s["acc_at_80"]), "coverage at threshold": _round(cut["coverage"]),
            "accuracy at threshold": _round(cut["accuracy"]), "dropped right": cut["dropped_right"],
            "dropped wrong": cut["dropped_wrong"]}


def dropped_questions(pred: predictions.Predictions, conf: np.ndarray, threshold: float) -> pd.DataFrame:
    """The questions ``threshold`` drops (signal below it), least confident first, as Case studies
    shows questions; ``confidence`` is the signal's value."""
    table = cases.case_table(pred).assign(confidence=conf)
    dropped = table[conf < threshold].sort_values("confidence", kind="stable")
    return shown_cases(dropped)


def selective_view(ctx: LabContext, names: Optional[list[str]], signal: Optional[str], threshold: Any):
    """(figure, table, dropped questions of the first run, its heading, message) for the picked runs."""
    empty = pd.DataFrame(columns=TABLE_COLUMNS)
    picked = [r for r in (runs.evaluation(ctx.runs, n) for n in (names or [])[:MAX_RUNS]) if r]
    threshold = float(threshold if isinstance(threshold, (int, float)) else DEFAULT_THRESHOLD)
    signal = signal if signal in confidence.SIGNALS else confidence.DEFAULT
    if not picked:
        return None, empty, NO_CASES, "", "Pick one or more evaluation runs."
    curves, rows, cautions, first = [], [], [], None
    try:
        for run in picked:
            pred = ctx.results.predictions(run)
            try:
                conf = confidence.values(signal, predictions.reported_probs(pred), pred.mask, pred.rows)
            except ValueError as e:
                cautions.append(f"{run.label}: {e}")
                continue
            correct = predictions.reported_correct(pred)
            coverage, risk = selective.risk_coverage(conf, correct)
            s = ctx.results.selective_summary(run, signal, lambda: selective.summary(conf, correct, n_boot=BOOT))
            cut = selective.select(conf, correct, threshold)
            curves.append({"label": run.label, "coverage": coverage, "risk": risk, "aurc": s["aurc"],
                           "at_threshold": (cut["coverage"], cut["accuracy"])})
            rows.append(run_row(run.label, signal, correct, s, cut))
            first = first or (run, pred, conf)
    except (ValueError, OSError) as e:
        return None, empty, NO_CASES, "", error(str(e))
    if first is None:
        return None, empty, NO_CASES, "", "".join(note(c) for c in cautions)
    run, pred, conf = first
    dropped = dropped_questions(pred, conf, threshold)
    heading = (f"**{len(dropped)} questions of {html.escape(run.label)} fall below the threshold {threshold:.2f}** "
               f"({confidence.SIGNALS.get(signal).title}); least confident first.")
    return (selective_figure(curves, threshold), pd.DataFrame(rows, columns=TABLE_COLUMNS), dropped, heading,
            "".join(note(c) for c in cautions))


def build_selective(ctx: LabContext) -> SelectiveLink:
    gr.Markdown(INTRO)
    names, _ = run_picker(ctx, "Evaluation runs (several: side by side)", multiselect=True, elem_id="selective-runs")
    with gr.Row():
        signal = gr.Dropdown(signal_choices(), value=confidence.DEFAULT, label="Confidence signal",
                             elem_id="selective-signal")
        threshold = gr.Slider(0, 1, value=DEFAULT_THRESHOLD, step=0.01, label="Answer only where confidence ≥",
                              elem_id="selective-threshold")
    message = gr.HTML()
    plot = gr.Plot(label="Accuracy and risk against coverage (the ring: where the threshold cuts)")
    table = gr.Dataframe(interactive=False, wrap=True, label="Selective prediction per run", elem_id="selective-table",
                         column_widths=list(TABLE_WIDTHS.values()), pinned_columns=1)
    heading = gr.Markdown()
    dropped = gr.Dataframe(interactive=False, wrap=True, max_height=420, label="Dropped questions (first run picked)",
                           elem_id="selective-dropped", column_widths=COLUMN_WIDTHS, max_chars=MAX_CHARS,
                           pinned_columns=4)
    open_cases = gr.Button("Open the first run's questions below the threshold in Case studies", size="sm")
    inputs = [names, signal, threshold]
    # One event for every control, run again after the last change (a dragged threshold redraws once it rests): as
    # one event a control each, a signal picked and a threshold typed at once could land in either order, and the
    # older view, drawn at the threshold before, stayed.
    gr.on([control.change for control in inputs], functools.partial(selective_view, ctx), inputs=inputs,
          outputs=[plot, table, dropped, heading, message], trigger_mode="always_last")
    return SelectiveLink(open_cases, names, signal, threshold)
