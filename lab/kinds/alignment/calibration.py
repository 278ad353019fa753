"""The calibration tasks of an alignment run (sft, dpo), evaluated on the model in training.

After every epoch (and every ``eval_steps``) each calibration task is evaluated on the model in
training by the evaluate kind's own code, with the model as it is in memory (no save and reload), and
its accuracy, ECE with its interval and NLL go into the ``train_eval`` event under ``tasks``; under a
multi-process launch each rank evaluates its share of the tasks. The event's top-level figures are the
first task's, so that trackers (``report_to``) plot it beside the loss.
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Callable

from lab.core.layout import CALIBRATION_DIR
from lab.jobkit.worker import JobContext
from lab.kinds.alignment.section import AlignmentSection
from lab.kinds.evaluate.run import evaluate
from lab.models import distributed


def calibration_check(cfg: AlignmentSection, tokenizer: Any, ctx: JobContext,
                      device: Any) -> Callable[[Any, int], dict[str, Any]]:
    """``validate(model, step)`` for the training loop: every calibration task on the model in training.

    Scoring the tasks before training takes minutes on a CPU, so each task counts its questions as
    a stage of its own (``scoring calibration task 2/3 (clm · text/test) before training``: the Jobs
    page's progress line, with an ETA) and says its figures in the log; once the tasks before training
    are done, ``training`` is announced until the first step's count. An evaluation after step 0 is
    of the weights in training, and its config and ``metrics.json`` name them (``00012-sft step 40``),
    not the base model they started from (kept as ``base_model``)."""
    from lab.models.loading import LoadedModel

    n_tasks = len(cfg.calibration)

    def one(index: int, model: Any, step: int) -> dict[str, Any]:
        evaluated = cfg.model if step == 0 else trained_name(ctx.run_dir, step)
        task = cfg.task_config(index, evaluated, None)
        key = f"t{index}-{task.task}"
        label = f"{task.task} · {task.dataset}/{task.split}"
        when = "before training" if step == 0 else f"at step {step}"
        name = f"calibration task {index + 1}/{n_tasks} ({label}) {when}"
        dtype = next(model.parameters()).dtype
        loaded = LoadedModel(model, tokenizer, cfg.model, cfg.model, None, device, dtype)
        with contextlib.ExitStack() as scratch:
            out = ctx.run_dir / CALIBRATION_DIR / f"step-{step}" / key
            if distributed.in_lockstep(model) and not distributed.is_main():  # rank 0 writes; the others score
                out = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="calibration-"))) / key
            m = evaluate(task, out, progress_factory=ctx.progress(f"scoring {name}"),
                         log=lambda message: ctx.log(f"{name}: {message}"), loaded=loaded, step=step,
                         base_model=cfg.model)
        ctx.log(f"{name}: {calibration_line(m)}")
        return {"key": key, "label": label, "n": m["n"], "accuracy": m["accuracy"], "ece": m["ece"],
                "ece_low": m.get("ece_ci_low"), "ece_high": m.get("ece_ci_high"), "nll": m["nll"]}

    def validate(model: Any, step: int) -> dict[str, Any]:
        was_training = model.training
        model.eval()
        try:
            results = distributed.map_sharded(lambda share: [one(j, model, step) for j in share],
                                              list(range(n_tasks)), lockstep=distributed.in_lockstep(model))
        finally:
            model.train(was_training)
        if step == 0:
            ctx.announce("training")  # until the first step's count: the tasks' counts are done
        if not results:
            return {}
        first = results[0]
        return {"accuracy": first["accuracy"], "ece": first["ece"], "nll": first["nll"],
                "tasks": {r["key"]: r for r in results}}

    return validate


def trained_name(run_dir: Path, step: int) -> str:
    """What a calibration evaluation after step 0 evaluated: this run's weights at ``step``
    (``00012-sft step 40``), as the pages label the run."""
    return f"{Path(run_dir).name} step {step}"


def calibration_line(metrics: dict[str, Any]) -> str:
    """One evaluation's figures for the log: accuracy, ECE with its interval where computed, n."""
    low, high = metrics.get("ece_ci_low"), metrics.get("ece_ci_high")
    interval = f" [{100 * low:.1f}–{100 * high:.1f}%]" if low is not None and high is not None else ""
    return f"accuracy {100 * metrics['accuracy']:.1f}%, ECE {100 * metrics['ece']:.1f}%{interval}, n = {metrics['n']}"
