"""What the temperature lab says beside its diagram: T and its form, ECE (with its bootstrap interval)
and NLL against the unscaled run, accuracy, the binning, the sweep's optima, and the notes that
qualify them (an ECE outside its interval, a small sample, optima fitted on the questions scored)."""
from __future__ import annotations

import html

from lab.results import analysis
from lab.results.reports import pct
from lab.results.runs import EvalRun
from ui.temperature_slider import SHOWN_DIGITS, SYMBOL

FORMULA = {"logit": "softmax(log p / T)", "paper": "FIRST's softmax(p / c)"}
TOKEN_FORMULA = "softmax(z / T) over the whole vocabulary"  # a token run's logit form
BASELINE = {"logit": "at T = 1, unscaled", "paper": "unscaled"}  # the run's own probabilities, in each form's words
# A bootstrap percentile interval of ECE may leave out the point: said beside it, never hidden.
OUTSIDE_INTERVAL = ("ECE {side} its interval, a bootstrap percentile interval: ECE is biased upward under resampling, "
                    "so the point may lie below it (each replicate adds resampling noise, which |confidence − "
                    "accuracy| turns into error), the more so at a temperature fitted on these same questions. Read "
                    "the interval as the estimate's sampling noise, not as bounds on the true calibration error.")
NOTE_STYLE = "background:#fff8e1;border-radius:6px;padding:4px 8px;margin-top:4px"
# The sweep picks its optima on the questions it then scores them on: say so where they are shown.
SAME_QUESTIONS = ("fitted on these same questions — optimistic; for an honest figure, fit on a validation run in "
                  "the Recalibration workbench and apply it to this run")


def _baseline(run: EvalRun, form: str) -> str:
    """What the unscaled numbers are called: the run "as evaluated" only where it applied no temperature."""
    if run.temperature in (None, 1.0):
        return f"{BASELINE[form]} (as evaluated)"
    return f"{BASELINE[form]}; the run itself was evaluated at T = {run.temperature:.3g}"


def _optima_text(sweep: analysis.Sweep, form: str) -> str:
    """The sweep's optima, labelled as fitted on the questions they are scored on (their ECE and NLL
    flatter the temperature), and right below them, the note that the sweep widened to find them."""
    symbol = SYMBOL[form]
    # lab.results.analysis words its note with T for both forms: the paper form's parameter is c
    note = sweep.widened.replace("T = ", f"{symbol} = ")
    widened = f"<div id='sweep-widened' style='{NOTE_STYLE}'>↔ {html.escape(note)}</div>" if note else ""
    return (f"<div id='temperature-optima'>lowest ECE at {symbol} = {sweep.best_ece:.3g}, "
            f"lowest NLL at {symbol} = {sweep.best_nll:.3g}"
            f"<div id='optima-same-questions' style='{NOTE_STYLE}'>⚠ {SAME_QUESTIONS}</div>{widened}</div>")


def _interval(summary: dict) -> str:
    """`` [95% CI 4.1–9.8%]`` after an ECE that has its bootstrap interval (equal-width bins), else ""."""
    low, high = summary.get("ece_ci_low"), summary.get("ece_ci_high")
    if low is None or high is None:
        return ""
    return f" <span id='ece-interval'>[95% CI {pct(low)}–{pct(high, percent_sign=True)}]</span>"


def _outside_interval(summary: dict) -> str:
    """The note under the metrics when the ECE lies outside its own interval (:data:`OUTSIDE_INTERVAL`), else ""."""
    low, high, ece = summary.get("ece_ci_low"), summary.get("ece_ci_high"), summary["ece"]
    if low is None or high is None or low <= ece <= high:
        return ""
    said = OUTSIDE_INTERVAL.format(side="below" if ece < low else "above")
    return f"<div id='ece-outside-interval' style='{NOTE_STYLE}'>⚠ {html.escape(said)}</div>"


def metrics_text(run: EvalRun, t: float, form: str, summary: dict, base: dict, sweep: analysis.Sweep,
                 token: bool = False) -> str:
    """The figures at T against the unscaled run's (``base``), then the notes and the sweep's optima:
    ``summary`` and ``base`` are :func:`lab.results.analysis.temperature_summary`'s."""
    baseline = _baseline(run, form)
    binned = f"{summary['n_bins']} equal-{'mass' if summary['strategy'] == 'mass' else 'width'} bins"
    return (f"<div id='temperature-metrics'>{SYMBOL[form]} = <b>{t:.{SHOWN_DIGITS}g}</b> "
            f"({form} form, {TOKEN_FORMULA if token else FORMULA[form]}) · "
            f"ECE <b id='ece-value'>{100 * summary['ece']:.2f}%</b>{_interval(summary)} "
            f"({baseline}: {100 * base['ece']:.2f}%) · "
            f"NLL {summary['nll']:.4f} ({BASELINE[form]}: {base['nll']:.4f}) · "
            f"accuracy {pct(summary['accuracy'], percent_sign=True)} · n = {summary['n']} · {binned}, "
            f"bins {summary['bin_edges']}-closed</div>{_outside_interval(summary)}{_small_sample(summary['n'], token)}"
            f"{_optima_text(sweep, form)}")


def _small_sample(n: int, token: bool) -> str:
    """The note the Reliability page and the workbench give a run under :data:`lab.results.analysis.SMALL_N`
    questions (a token run's: targets)."""
    said = analysis.small_sample_warning(n, token)
    return f"<div id='temperature-small-sample' style='{NOTE_STYLE}'>⚠ {html.escape(said)}</div>" if said else ""
