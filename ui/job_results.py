"""What a job left, shown on its own page: where the user looks first when a job is done.

Each kind shows what it produced, read from its run directory (never from this session):
an evaluation its headline numbers and reliability diagram, a pipeline (FIRST, CFT) its report
table, a comparison its answers, an extraction its coverage curve, a series its life-cycle figure
(the Life cycle page adds its tables), an alignment stage (sft, dpo) each calibration task before → after
training with the evaluations between and, for DPO, the rewards TRL logged. Kinds with nothing to draw draw
nothing: no empty plot frame.
"""
from __future__ import annotations

import html
import math
import os
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pandas as pd

from lab.calibration.metrics import finite_or_none
from lab.core import stored
from lab.core.events import read_events
from lab.core.layout import CALIBRATION_DIR, EVENTS_FILE, MANIFEST_FILE, REPORT_MD, TOPK_DIR
from lab.data.harness import PREFIX as LM_EVAL_PREFIX
from lab.data.templates import option_letter
from lab.kinds.compare.result import COLUMNS as COMPARE_COLUMNS
from lab.kinds.compare.result import read_result
from lab.kinds.compare.result import rows as compare_rows
from lab.kinds.dpo.run import REWARDS_EVENT
from lab.results import run_metrics, runs, series
from lab.results.reports import pct
from lab.training.snapshots import STEP
from ui.plots.common import plain
from ui.plots.curves import coverage_figure
from ui.plots.lifecycle import lifecycle_figure
from ui.plots.questions import option_bars
from ui.plots.reliability import reliability_figure

MAX_REPORT_CHARS = 20_000  # a report longer than this is cut (the file holds it all)
ALIGNMENT_KINDS = ("sft", "dpo")  # training runs that evaluate calibration/step-<n>/t<j>-<task>/ as they go
REWARDS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")  # TRL's DPO logs


class JobResults(NamedTuple):
    text: str  # markdown: headline numbers, a report table, or "" when the job left nothing yet
    figure: Any  # a plotly figure, or None: the page hides the plot
    table: Optional[pd.DataFrame]  # a comparison's answers, or None
    run: Optional[str]  # the evaluation the job wrote (its catalogue name), for the links and the rename box
    figure_label: str = "Reliability"  # what the plot is called above it


NOTHING = JobResults("", None, None, None)


def evaluation_summary(run: runs.EvalRun) -> str:
    """Accuracy, ECE with its bootstrap interval, n and NLL of one evaluation, in one line."""
    low, high = run.ece_ci or (None, None)
    interval = f" (95% interval {pct(low, percent_sign=True)}–{pct(high, percent_sign=True)})" if run.ece_ci else ""
    nll = f" · NLL {run.nll:.3f}" if run.nll is not None else ""
    how = f" · {run.scoring} scoring ({run.template})" if run.scoring else ""
    accuracy, ece = pct(run.accuracy, percent_sign=True), pct(run.ece, percent_sign=True)
    return (f"**Accuracy {accuracy}** · **ECE {ece}**{interval} · n = {run.n}{nll}{how}\n\n"
            f"Run: **{html.escape(run.label)}** (`{run.name}`)")  # a label is shown as typed, never as markup


def _percent(metrics: dict[str, Any], key: str) -> str:
    """A figure of a run's metrics as a percentage; an en dash where it is missing or not a finite number."""
    return pct(finite_or_none(metrics.get(key)) if isinstance(metrics, dict) else None, percent_sign=True)


def lm_eval_summary(metrics: dict[str, Any]) -> str:
    """An lm-eval run's two accuracies as lm-eval names them, each with the ECE of its own confidence
    (``acc``: the softmax over the options' summed log-likelihoods; ``acc_norm``: over the length-normalised
    ones), and what produced the prompts; "" for any other run."""
    about = metrics.get("lm_eval")
    if not isinstance(about, dict):
        return ""
    version = f"lm-eval {_md(about['version'])}, " if isinstance(about.get("version"), str) else ""
    seed = f"few-shot seed {_md(about['fewshot_seed'])}" if about.get("fewshot_seed") is not None else ""
    made = f" ({version}{seed})" if version or seed else ""
    return (f"**lm-eval**{made}: **acc {_percent(metrics, 'accuracy')}** (ECE {_percent(metrics, 'ece')}) · "
            f"**acc_norm {_percent(metrics, 'accuracy_norm')}** (ECE {_percent(metrics, 'ece_norm')}, "
            "its confidence from the length-normalised scores)")


def subtask_table(metrics: dict[str, Any], group: str) -> str:
    """A group run's tasks, one row each below the group's (every document pooled, as lm-eval weights a
    group by size): n, shots, acc, acc_norm and ECE; "" for a run of one task."""
    subtasks = metrics.get("subtasks")
    if not isinstance(subtasks, dict) or not subtasks:
        return ""
    tasks = metrics.get("lm_eval", {}).get("tasks", {}) if isinstance(metrics.get("lm_eval"), dict) else {}
    shots = {t.get("shots") for t in tasks.values() if isinstance(t, dict)} if isinstance(tasks, dict) else set()
    rows = [f"| **{_md(group)}** (group, all documents) | {_md(metrics.get('n'))} | "
            f"{_md(shots.pop()) if len(shots) == 1 else '–'} | {_percent(metrics, 'accuracy')} | "
            f"{_percent(metrics, 'accuracy_norm')} | {_percent(metrics, 'ece')} |"]
    for name, row in sorted(subtasks.items()):
        row = row if isinstance(row, dict) else {}
        rows.append(f"| {_md(name)} | {_md(row.get('n', '–'))} | {_md(row.get('shots', '–'))} | "
                    f"{_percent(row, 'accuracy')} | {_percent(row, 'accuracy_norm')} | "
                    f"{_percent(row, 'ece')} |")
    return "\n".join([f"**Each task of the group** ({len(subtasks)})", "",
                      "| task | n | shots | accuracy | accuracy_norm | ECE |", "|---|---|---|---|---|---|", *rows])


def _evaluation(ctx_runs: Path, run_dir: str) -> JobResults:
    found = runs.job_evaluations(ctx_runs, run_dir)
    if not found:
        return NOTHING
    run = found[0]
    metrics = run_metrics.read_metrics(run.path) or {}
    more = "" if len(found) == 1 else f"\n\n{len(found)} evaluations: the Results page lists them all."
    harness = [lm_eval_summary(metrics), subtask_table(metrics, str(run.dataset or "").removeprefix(LM_EVAL_PREFIX))]
    text = "\n\n".join([evaluation_summary(run), *(part for part in harness if part)]) + more
    return JobResults(text, reliability_figure(metrics, run.label), None, run.name)


def _report(run_dir: str) -> JobResults:
    try:
        with open(Path(run_dir) / REPORT_MD, encoding="utf-8", errors="replace") as f:
            text = f.read(MAX_REPORT_CHARS + 1)  # no more than is shown: the file may be any size
    except OSError:
        return NOTHING
    if len(text) > MAX_REPORT_CHARS:
        text = text[:MAX_REPORT_CHARS] + f"\n\n… (cut; the whole report is `{Path(run_dir).name}/{REPORT_MD}`)"
    return JobResults(text, None, None, None)


def compare_answers(result: dict[str, Any]) -> pd.DataFrame:
    """One row per question and model: the option it picks with its confidence, and its generated
    answer, in :data:`lab.kinds.compare.result.COLUMNS` order (free-text questions first still leave it so)."""
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
        manifest = stored.read_object(path)
    except (OSError, ValueError):
        return NOTHING
    return JobResults(f"Top-k store: `{Path(run_dir).name}/{TOPK_DIR}` (k = {str(manifest.get('k', '?'))[:20]})",
                      coverage_figure(manifest), None, None)


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


class Cell(NamedTuple):
    """One calibration evaluation of an alignment run: task ``key`` (``t0-mcq``) at optimiser ``step``."""

    step: int
    key: str
    run: runs.EvalRun


def calibration_cells(ctx_runs: Path, run_dir: str) -> list[Cell]:
    """The evaluations under ``run_dir/calibration/step-<n>/<key>/``, by step, then task."""
    base, cells = Path(os.path.realpath(run_dir)), []
    for run in runs.job_evaluations(ctx_runs, run_dir):
        path = Path(os.path.realpath(run.path))
        parts = path.relative_to(base).parts if path.is_relative_to(base) else ()
        step = STEP.fullmatch(parts[1]) if len(parts) == 3 and parts[0] == CALIBRATION_DIR else None
        if step:
            cells.append(Cell(int(step[1]), parts[2], run))
    return sorted(cells, key=lambda c: (c.step, c.key))


def _md(text: Any) -> str:
    """Text from a run's files as a markdown table cell: shown as written, never as markup."""
    return html.escape(str(text)).replace("|", "&#124;")


def _ece(run: runs.EvalRun) -> str:
    low, high = run.ece_ci or (None, None)
    interval = f" ({pct(low, percent_sign=True)}–{pct(high, percent_sign=True)})" if run.ece_ci else ""
    return pct(run.ece, percent_sign=True) + interval


def _task(cell: Cell) -> str:
    return _md(" · ".join(p for p in (cell.key, series.dataset_label(cell.run.dataset, cell.run.split, cell.run.shots))
                          if p))


def _before_after(cells: list[Cell]) -> str:
    """Each task's first evaluation (before training) → its last, as one table row each."""
    last = max(c.step for c in cells)
    first = min(c.step for c in cells)
    span = f"step {first}, no evaluation after training yet" if first == last else \
        f"step {first} → step {last}, the last evaluated"
    head = (f"**Calibration before → after training** ({span})\n\n"
            "| task | n | accuracy | ECE (95% interval) |\n|---|---|---|---|")
    rows = []
    for key in sorted({c.key for c in cells}):
        own = [c for c in cells if c.key == key]
        a, b = own[0], own[-1]
        if a is b:
            rows.append(f"| {_task(a)} | {a.run.n} | {pct(a.run.accuracy, percent_sign=True)} → … | "
                        f"{_ece(a.run)} → … |")
            continue
        n = str(a.run.n) if a.run.n == b.run.n else f"{a.run.n} → {b.run.n}"
        before, after = pct(a.run.accuracy, percent_sign=True), pct(b.run.accuracy, percent_sign=True)
        rows.append(f"| {_task(a)} | {n} | {before} → **{after}** | {_ece(a.run)} → **{_ece(b.run)}** |")
    return "\n".join([head, *rows])


def _per_evaluation(cells: list[Cell], epochs: dict[int, float]) -> str:
    """Every evaluation, in step order: the curve of the plots below, with each point's interval."""
    rows = [f"| {c.step} | {epochs.get(c.step, '–') if c.step else 0} | {_task(c)} | "
            f"{pct(c.run.accuracy, percent_sign=True)} | {_ece(c.run)} | "
            f"{'–' if c.run.nll is None else f'{c.run.nll:.3f}'} | {c.run.n} |" for c in cells]
    return "\n".join(["**Each evaluation** (before training, then after every epoch or eval_steps)", "",
                      "| step | epoch | task | accuracy | ECE (95% interval) | NLL | n |",
                      "|---|---|---|---|---|---|---|", *rows])


def reward_table(events: list[dict[str, Any]]) -> str:
    """DPO's reward figures as TRL logged them: the mean of each epoch's logs, then the last log.
    A step logged twice (a run resumed from a checkpoint before it) counts once, as last logged."""
    by_step = {e["step"]: e for e in events if e.get("stage") == REWARDS_EVENT and isinstance(e.get("step"), int)}
    logged = [by_step[s] for s in sorted(by_step)]
    if not logged:
        return ""
    epochs: dict[int, list[dict[str, Any]]] = {}
    for e in logged:
        epoch = finite_or_none(e.get("epoch")) or 0.0
        epochs.setdefault(max(1, math.ceil(epoch - 1e-9)), []).append(e)

    def figures(group: list[dict[str, Any]]) -> str:
        means = []
        for key in REWARDS:
            values = [v for v in (finite_or_none(e.get(key)) for e in group) if v is not None]
            mean = sum(values) / len(values) if values else None
            shown = "–" if mean is None else f"{mean:+.3f}"
            means.append(pct(mean, percent_sign=True) if key.endswith("accuracies") else shown)
        return " | ".join(means)

    rows = [f"| epoch {epoch} | {group[0]['step']}–{group[-1]['step']} | {figures(group)} |"
            for epoch, group in sorted(epochs.items())]
    rows.append(f"| final (last log) | {logged[-1]['step']} | {figures(logged[-1:])} |")
    return "\n".join(["**DPO rewards** (β-scaled log-ratios to the reference, as TRL logs them; each epoch's "
                      "the mean of its logs)", "", f"| | steps | {' | '.join(REWARDS)} |", "|---|---|---|---|---|---|",
                      *rows])


def _alignment(ctx_runs: Path, kind: str, run_dir: str) -> JobResults:
    """An sft or dpo run: each calibration task before → after training, every evaluation with its
    interval, DPO's rewards; the diagram of the first task's last evaluation."""
    events, _ = read_events(Path(run_dir) / EVENTS_FILE)
    epochs = {e["step"]: e["epoch"] for e in events if e.get("stage") == "train_eval"
              and isinstance(e.get("step"), int) and finite_or_none(e.get("epoch")) is not None}
    cells = calibration_cells(ctx_runs, run_dir)
    parts = [_before_after(cells), _per_evaluation(cells, epochs)] if cells else []
    if kind == "dpo":
        parts.append(reward_table(events))
    text = "\n\n".join(p for p in parts if p)
    if not cells:
        return JobResults(text, None, None, None)
    shown = [c for c in cells if c.key == cells[0].key][-1]
    metrics = run_metrics.read_metrics(shown.run.path) or {}
    when = "before training" if shown.step == 0 else f"at step {shown.step}"
    return JobResults(text + f"\n\nRun drawn: **{html.escape(shown.run.label)}** (`{shown.run.name}`)",
                      reliability_figure(metrics, shown.run.label), None, shown.run.name,
                      f"Reliability: {shown.key} {when}, the latest evaluation")


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
    if kind in ALIGNMENT_KINDS:
        return _alignment(ctx_runs, kind, run_dir)
    report = _report(run_dir)
    if report.text:
        return report
    return _evaluation(ctx_runs, run_dir)  # a finetune job's evaluations, if it ran any
