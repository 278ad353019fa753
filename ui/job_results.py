"""What a job left, shown on its own page: where the user looks first when a job is done.

Each kind shows what it produced, read from its run directory (never from this session):
an evaluation its headline numbers and reliability diagram, a pipeline (FIRST, CFT) its report
table, a comparison its answers, an extraction its coverage curve, a series its life-cycle figure
(the Life cycle page adds its tables). Kinds with nothing to draw draw nothing: no empty plot frame.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pandas as pd

from lab.core.layout import MANIFEST_FILE, REPORT_MD, TOPK_DIR
from lab.data.templates import option_letter
from lab.kinds.compare.run import COLUMNS as COMPARE_COLUMNS
from lab.kinds.compare.run import read_result
from lab.kinds.compare.run import rows as compare_rows
from lab.results import runs, series
from ui.plots import coverage_figure, lifecycle_figure, option_bars, plain, reliability_figure

MAX_REPORT_CHARS = 20_000  # a report longer than this is cut (the file holds it all)


class JobResults(NamedTuple):
    text: str  # markdown: headline numbers, a report table, or "" when the job left nothing yet
    figure: Any  # a plotly figure, or None: the page hides the plot
    table: Optional[pd.DataFrame]  # a comparison's answers, or None
    run: Optional[str]  # the evaluation the job wrote (its catalogue name), for the links and the rename box
    figure_label: str = "Reliability"  # what the plot is called above it


NOTHING = JobResults("", None, None, None)


def _pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def evaluation_summary(run: runs.EvalRun) -> str:
    """Accuracy, ECE with its bootstrap interval, n and NLL of one evaluation, in one line."""
    interval = f" (95% interval {_pct(run.ece_ci[0])}–{_pct(run.ece_ci[1])})" if run.ece_ci else ""
    nll = f" · NLL {run.nll:.3f}" if run.nll is not None else ""
    how = f" · {run.scoring} scoring ({run.template})" if run.scoring else ""
    return (f"**Accuracy {_pct(run.accuracy)}** · **ECE {_pct(run.ece)}**{interval} · n = {run.n}{nll}{how}\n\n"
            f"Run: **{html.escape(run.label)}** (`{run.name}`)")  # a label is shown as typed, never as markup


def _evaluation(ctx_runs: Path, run_dir: str) -> JobResults:
    found = runs.job_evaluations(ctx_runs, run_dir)
    if not found:
        return NOTHING
    run = found[0]
    metrics = runs.read_metrics(run.path) or {}
    more = "" if len(found) == 1 else f"\n\n{len(found)} evaluations: the Results page lists them all."
    return JobResults(evaluation_summary(run) + more, reliability_figure(metrics, run.label), None, run.name)


def _report(run_dir: str) -> JobResults:
    try:
        text = (Path(run_dir) / REPORT_MD).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return NOTHING
    if len(text) > MAX_REPORT_CHARS:
        text = text[:MAX_REPORT_CHARS] + f"\n\n… (cut; the whole report is `{Path(run_dir) / REPORT_MD}`)"
    return JobResults(text, None, None, None)


def compare_answers(result: dict[str, Any]) -> pd.DataFrame:
    """One row per question and model: the option it picks with its confidence, and its generated
    answer, in :data:`lab.kinds.compare.run.COLUMNS` order (free-text questions first still leave it so)."""
    table = pd.DataFrame(compare_rows(result))
    return table[[c for c in COMPARE_COLUMNS if c in table]].round(4)


def compare_figure(result: dict[str, Any], question: int = 0) -> Any:
    """Each model's option probabilities on question ``question``, or None for a free-text question."""
    if not 0 <= question < len(result["questions"]):
        return None
    item = result["questions"][question]
    if not item["options"]:
        return None
    labels = [f"{option_letter(i)}. {o}" for i, o in enumerate(item["options"])]
    figure = option_bars([{"model": r["label"], "probs": r["answers"][question]["probs"], "labels": labels}
                          for r in result["results"]])
    if item.get("answer") is not None:
        figure.update_layout(title=f"right answer: {plain(labels[item['answer']])}")
    return figure


def _compare(run_dir: str) -> JobResults:
    result = read_result(run_dir)
    if not result or not result.get("results"):
        return NOTHING
    questions = result["questions"]
    more = f" (+{len(questions) - 1} more in the table; the Compare page draws each)" if len(questions) > 1 else ""
    return JobResults(f"**Question:** {questions[0]['question']}{more}", compare_figure(result),
                      compare_answers(result), None)


def _extract(run_dir: str) -> JobResults:
    path = Path(run_dir) / TOPK_DIR / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return NOTHING
    if not isinstance(manifest, dict):
        return NOTHING
    return JobResults(f"Top-k store: `{path.parent}` (k = {manifest.get('k', '?')})", coverage_figure(manifest), None,
                      None)


def _series(run_dir: str) -> JobResults:
    try:
        doc = series.read(Path(run_dir))
    except (KeyError, TypeError, ValueError, AttributeError):  # cells the summary cannot average
        doc = None
    if doc is None or not doc["cells"]:
        return NOTHING
    points = len({cell.get("point") for cell in doc["cells"]})
    return JobResults(f"**{points} points × {len(doc['tasks'])} tasks** along {series.AXES[doc['axis']]}, "
                      f"{len(doc['cells'])} evaluations. The **Life cycle** page adds each cell's numbers, the means "
                      "over seeds and series.csv, and opens a cell in Reliability.", lifecycle_figure(doc), None, None,
                      "Life cycle: ECE (top) and accuracy (bottom) along the series, one column per task")


def job_results(ctx_runs: Path, kind: str, run_dir: Optional[str]) -> JobResults:
    """What the job's page shows of its outputs; :data:`NOTHING` before it wrote any."""
    if not run_dir:
        return NOTHING
    if kind == "evaluate":
        return _evaluation(ctx_runs, run_dir)
    if kind == "compare":
        return _compare(run_dir)
    if kind == "extract":
        return _extract(run_dir)
    if kind == "series":
        return _series(run_dir)
    report = _report(run_dir)
    if report.text:
        return report
    return _evaluation(ctx_runs, run_dir)  # a finetune job's evaluations, if it ran any
