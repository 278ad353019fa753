"""The recalibration workbench: fit a calibrator on one run, apply it to another, see before/after.

Honest by construction (:mod:`lab.calibration.calibrators`): the fit run is meant to be a validation split and
the other the test split of the same model and task. Scoring a calibrator on the questions it was
fitted on is refused (most of them shared) or marked in red (some shared). Before/after come with
bootstrap intervals; a fitted calibrator can be saved under ``runs/calibrators/`` and is then
offered by the Reliability and Compare pages and taken by an evaluation's ``calibrator`` field.
Token runs (task clm or facts) are calibrated target by target, on their own confidence and
correctness, and temperature scaling rescales their whole vocabulary from the log-partition each
target kept; a calibrator fitted on one kind of run is refused on the other.
"""
from __future__ import annotations

import functools
import html
import re
import time
from typing import Any, Optional

import gradio as gr
import pandas as pd

from lab.calibration import calibrators, confidence
from lab.core.layout import CALIBRATORS_DIR
from lab.results import analysis, predictions, runs
from lab.results.reports import pct
from ui.components import run_picker, signal_choices
from ui.context import LabContext
from ui.messages import error, note, ok
from ui.plots.reliability import side_by_side

BOOT = 1000
DEFAULT_METHOD = "temperature"
INTRO = ("Fit a calibrator on a **validation** run, apply it to a **test** run of the same model and task, and "
         "compare the test run's calibration before and after. Fitting and scoring on the same questions "
         "flatters every method (isotonic regression can reach ECE 0 that way), so it is refused. "
         "Brier and NLL here score the confidence as the probability that the answer is right (top label). "
         "A token run (clm, facts) is calibrated target by target; temperature scaling rescales its whole "
         "vocabulary.")
METRICS = (("ECE", "ece"), ("smooth ECE", "smece"), ("Brier (top label)", "brier"), ("NLL (top label)", "nll"),
           ("accuracy", "accuracy"))
RED = "<div class='lab-error' style='font-weight:600'>{}</div>"
# The bracket is a percentile bootstrap (lab.calibration.metrics.ece_bootstrap): the middle 95 % of the ECEs
# of resampled test questions, not an interval that must hold the ECE measured on them all.
ECE_LABEL = "ECE % [95% range of resampled ECE]"


def method_choices() -> list[tuple[str, str]]:
    return [(calibrators.METHODS.get(m).title, m) for m in calibrators.METHODS.in_order()]


def _with_interval(report: dict[str, Any]) -> str:
    low, high = report.get("ece_ci_low"), report.get("ece_ci_high")
    interval = f" [{pct(low)}, {pct(high)}]" if low is not None and high is not None else ""
    return f"{100 * report['ece']:.2f}{interval}"


def range_note(report: dict[str, Any]) -> str:
    """Why an ECE can lie outside its bracket, said where one does (else ""): binned ECE is biased
    upward, a resample's more so (it adds resampling noise, and |·| turns noise into error), so a
    small ECE (a good calibrator's "after") can sit below the range of its resamples."""
    outside = [side for side in ("before", "after") if report[side].get("ece_ci_low") is not None
               and not report[side]["ece_ci_low"] <= report[side]["ece"] <= report[side]["ece_ci_high"]]
    if not outside:
        return ""
    return (f"The ECE {' and '.join(outside)} lies outside its bracket: the bracket is the middle 95% of the ECEs of "
            f"{BOOT} resamples of the test questions, and binned ECE is biased upward, a resample's more so, so a "
            "small ECE can sit below it. Read the bracket as how much the ECE moves with the sample, not as an "
            "interval for the true calibration error.")


def metrics_table(report: dict[str, Any]) -> pd.DataFrame:
    """Before and after, one metric a row; ECE in percent with its 95 % bootstrap range (:data:`ECE_LABEL`)."""
    rows = [{"metric": ECE_LABEL, "before": _with_interval(report["before"]),
             "after": _with_interval(report["after"])}]
    for name, key in METRICS[1:]:
        rows.append({"metric": name, "before": f"{report['before'][key]:.4f}", "after": f"{report['after'][key]:.4f}"})
    return pd.DataFrame(rows, columns=["metric", "before", "after"])


def fit_and_apply(ctx: LabContext, fit_name: Optional[str], apply_name: Optional[str], method: Optional[str],
                  signal: Optional[str], bins: Any):
    """(message, before/after figure, metrics table, the fitted calibrator for Save) for the page."""
    nothing = (None, pd.DataFrame(columns=["metric", "before", "after"]), None)
    fit_run, apply_run = runs.evaluation(ctx.runs, fit_name), runs.evaluation(ctx.runs, apply_name)
    if fit_run is None or apply_run is None:
        return ("Pick the run to fit on (a validation split) and the run to apply to (a test split).", *nothing)
    n_bins = int(bins) if isinstance(bins, (int, float)) else calibrators.DEFAULT_BINS
    try:
        fit_pred, test_pred = ctx.results.predictions(fit_run), ctx.results.predictions(apply_run)
        for pred in (fit_pred, test_pred):  # a token run keys its targets, and rescales, only since it kept logits
            if predictions.is_token_run(pred):
                predictions.token_logits(pred)
        cal = calibrators.fit(method or DEFAULT_METHOD, predictions.reported_probs(fit_pred), fit_pred.mask,
                              fit_pred.labels, fit_pred.rows, signal or confidence.DEFAULT, n_bins,
                              logits=fit_pred.logits, run=fit_run.name, label=fit_run.label, dataset=fit_run.dataset,
                              split=fit_run.split)
        report = calibrators.before_after(cal, predictions.reported_probs(test_pred), test_pred.mask, test_pred.labels,
                                          test_pred.rows, n_bins, test_pred.bin_edges, BOOT, logits=test_pred.logits)
    except calibrators.SameQuestions as e:
        return (RED.format("⛔ Refused: " + html.escape(str(e))), *nothing)
    except (ValueError, OSError) as e:
        return (error(str(e)), *nothing)
    figure = side_by_side([(f"before: {apply_run.label}", report["before"]),
                           (f"after: {cal.describe()}", report["after"])])
    message = ok(f"{cal.describe()}; applied to {apply_run.label} (n = {report['after']['n']}).")
    if report["overlap"]:
        message = RED.format(html.escape(f"⚠️ {report['overlap']} of the {report['after']['n']} test questions were "
                                     "used to fit this calibrator: the 'after' figures are optimistic."))
    signal = confidence.SIGNALS.get(report["signal"])
    cautions = [analysis.small_sample_warning(report["after"]["n"]),
                "" if signal.probability else f"The {signal.title} is a score, not a probability: the 'before' column "
                                              "reads it as one, so its ECE says little; 'after' is a probability.",
                range_note(report)]
    return message + "".join(note(c) for c in cautions if c), figure, metrics_table(report), cal


def calibrator_folder(cal: calibrators.Calibrator, now: Optional[float] = None) -> str:
    """``<time>-<method>-<fit run>``: sortable, and says what it is (letters, digits, dashes)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(cal.fitted_on.get("run", ""))).strip("-")[:60]
    return f"{stamp}-{cal.method}-{slug}".rstrip("-")


def save_calibrator(ctx: LabContext, cal: Optional[calibrators.Calibrator]) -> str:
    """Save the last fitted calibrator under ``runs/calibrators/`` and say where and how to use it."""
    if cal is None:
        return error("Fit a calibrator first.")
    directory = ctx.runs / CALIBRATORS_DIR / calibrator_folder(cal)
    calibrators.save(cal, directory)
    name = directory.relative_to(ctx.runs).as_posix()  # what the job store's folder finds it by (lab.jobkit.paths)
    return ok(f"Saved as {name}. The Reliability and Compare pages offer it; an evaluation applies it with "
              f"calibrator: {name}")


def build_recalibration(ctx: LabContext) -> None:
    gr.Markdown(INTRO)
    with gr.Row():
        fit_name, _ = run_picker(ctx, "Fit on (a validation run)", elem_id="recal-fit", pick_newest=False)
        apply_name, _ = run_picker(ctx, "Apply to (a test run of the same model and task)", elem_id="recal-apply",
                                   pick_newest=False)
    with gr.Row():
        method = gr.Radio(method_choices(), value=DEFAULT_METHOD, label="Method", elem_id="recal-method")
        signal = gr.Dropdown(signal_choices(), value=confidence.DEFAULT, label="Confidence signal (temperature "
                             "scaling always rescales the option probabilities)")
        bins = gr.Slider(5, 30, value=calibrators.DEFAULT_BINS, step=1, label="Bins (ECE, and histogram binning)")
    with gr.Row(equal_height=False):
        run_button = gr.Button("Fit and apply", variant="primary", elem_id="recal-run")
        with gr.Column():  # "Saved as …" right under the button, not at the foot of the page out of view
            save_button = gr.Button("Save this calibrator", elem_id="recal-save")
            saved = gr.HTML(elem_id="recal-saved")
    message = gr.HTML(elem_id="recal-message")
    plot = gr.Plot(label="Reliability of the test run, before and after")
    table = gr.Dataframe(interactive=False, label="Before and after (test run)", elem_id="recal-table")
    fitted = gr.State(None)
    run_button.click(functools.partial(fit_and_apply, ctx), inputs=[fit_name, apply_name, method, signal, bins],
                     outputs=[message, plot, table, fitted])
    save_button.click(functools.partial(save_calibrator, ctx), inputs=fitted, outputs=saved)
