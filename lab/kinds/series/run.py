"""Run a ``series`` job: every model entry, in order, on every task, each cell a resumable stage.

    train/m<i>-seed<s>/        a train entry's finetune run for one seed (config.yaml, snapshots/, model/ or adapter/)
    cells/<point>_t<j>-<task>/ one evaluation per (point, task): config.yaml, metrics.json, predictions.jsonl, done.json
    series.json, series.csv    the table (:mod:`lab.results.series`), rewritten after every cell

A point is an entry's model, or one state of a trained run (``m<i>[-seed<s>][-step<n>]``). Its model
is loaded once, for the tasks it has not done, and let go before the next is loaded; a cell that
finished (``done.json``) is not redone, so an interrupted series resumes at the first missing cell,
and one whose training finished does not train again. Every cell is evaluated with the series' seed
(the same clm positions for every model), whatever seed trained its model.
"""
from __future__ import annotations

import contextlib
import gc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lab.calibration.spread import accuracy_bootstrap
from lab.core.errors import Stopped
from lab.core.layout import CELLS_DIR, DONE_FILE, PREDICTIONS_FILE
from lab.jobkit.kinds import write_config
from lab.jobkit.stages import stage
from lab.jobkit.worker import JobContext
from lab.kinds.evaluate.run import evaluate
from lab.kinds.series.config import SeriesConfig
from lab.results import series
from lab.training.config import TrainConfig
from lab.training.snapshots import final_weights, training_points

TRAIN_DIR = "train"


@dataclass(frozen=True)
class Point:
    """One model state of the series: what to load, and where it sits on each axis."""

    key: str  # m<i>, m<i>-seed<s>, m<i>-seed<s>-step<n>: the cells' folder names start with it
    entry: int
    model: str
    adapter: Optional[str]
    stage: Optional[str]
    seed: Optional[int]  # the seed that trained it (train entries), else None
    step: Optional[int]
    revision: Optional[str] = None  # a hub model's branch or commit


def task_keys(cfg: SeriesConfig) -> list[dict[str, Any]]:
    """Each task's key (``t<j>-<task>``: its cells' folder suffix) and what it evaluates."""
    out = []
    for j in range(len(cfg.tasks)):
        task = cfg.task_config(j, "bundled", None, cfg.seed)
        described = {"task": task.task, "dataset": task.dataset, "split": task.split, "num_fewshot": task.num_fewshot}
        out.append({"key": f"t{j}-{task.task}", **described, "label": series.task_label(described)})
    return out


def trained_points(cfg: SeriesConfig, entry: int, run_dir: Path, seed: Optional[int]) -> list[Point]:
    """A finished training run's points: every snapshot after its base model on the step axis, else
    its final weights."""
    label = cfg.models[entry].get("stage")
    head = f"m{entry}" + ("" if seed is None else f"-seed{seed}")
    if cfg.axis != "step":
        final = final_weights(run_dir)
        return [Point(head, entry, final.model, final.adapter, label, seed, final.step)]
    base, *snapshots = training_points(run_dir)
    # The base model is the same whatever the seed: one point, evaluated once for all of them.
    return [Point(f"m{entry}-step0", entry, base.model, base.adapter, label, None, 0),
            *(Point(f"{head}-step{s.step}", entry, s.model, s.adapter, label, seed, s.step) for s in snapshots)]


def _train(cfg: SeriesConfig, entry: int, seed: int, out: Path, ctx: JobContext) -> dict[str, Any]:
    from lab.training.trainer import finetune  # torch: in the worker, when a series trains

    values = {**cfg.models[entry]["train"], "seed": seed, "device": cfg.device, "dtype": cfg.dtype}
    if cfg.axis == "step":
        values["snapshots"] = True
    train_cfg = TrainConfig.from_checked(values)
    write_config(out, "finetune", train_cfg)
    result = finetune(train_cfg, out, ctx.events, ctx.should_stop, stage=f"m{entry} seed {seed}")
    return {"model": result["model"], "adapter": result["adapter"], "n_train": result["n_train"],
            "history": result["history"]}


def _cell(cfg: SeriesConfig, point: Point, j: int, loaded: Any, params: int, out: Path,
          ctx: JobContext, label: str) -> dict[str, Any]:
    """Evaluate task ``j`` on ``point`` into ``out``; the cell's row of the table (its done.json)."""
    task = cfg.task_config(j, point.model, point.adapter, cfg.seed)
    metrics = evaluate(task, out, progress_factory=ctx.progress(label), log=ctx.log, announce=ctx.announce,
                       loaded=loaded, series_point=point.key, revision=point.revision)
    lines = (out / PREDICTIONS_FILE).read_text(encoding="utf-8").splitlines()
    correct = [json.loads(line)["correct"] for line in lines]
    low, high = accuracy_bootstrap(correct, max(cfg.bootstrap, 1), seed=cfg.seed)
    oracle = metrics.get("oracle") or {}
    return {"n": metrics["n"], "accuracy": metrics["accuracy"], "accuracy_low": low, "accuracy_high": high,
            "ece": metrics["ece"], "ece_low": metrics.get("ece_ci_low"), "ece_high": metrics.get("ece_ci_high"),
            "oracle_ece": oracle.get("ece"), "params": params}


def _free_memory(device: Any) -> None:
    """Return a released model's memory before the next one loads: one model in memory at a time."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Series:
    """The run in progress: its cells so far, written out as each one finishes."""

    def __init__(self, cfg: SeriesConfig, ctx: JobContext) -> None:
        self.cfg, self.ctx, self.out = cfg, ctx, ctx.run_dir
        self.tasks = task_keys(cfg)
        self.cells: list[dict[str, Any]] = []
        self.evaluated: set[str] = set()  # point keys: a train entry's base model comes once per seed

    def evaluate_point(self, point: Point) -> None:
        """Every task on ``point``: its model loaded only for the cells not done yet."""
        if point.key in self.evaluated:
            return
        self.evaluated.add(point.key)
        dirs = [self.out / CELLS_DIR / f"{point.key}_{task['key']}" for task in self.tasks]
        loaded, params = None, None
        with contextlib.ExitStack() as placed_for:  # device_map auto: the offload folder, until the cells are done
            if not all((d / DONE_FILE).is_file() for d in dirs):
                if self.ctx.should_stop():
                    raise Stopped(f"series stopped before {point.key}; finished cells are kept")
                from lab.models.loading import load_model  # torch: after the training and the checks
                from lab.models.placement import placed

                adapter = f" + {point.adapter}" if point.adapter else ""
                self.ctx.announce(f"loading model {point.key}: {point.model}{adapter}")
                loaded = load_model(point.model, adapter=point.adapter, device=self.cfg.device, dtype=self.cfg.dtype,
                                    announce=self.ctx.announce, revision=point.revision,
                                    **placed_for.enter_context(placed(self.out, self.cfg)))
                params = sum(p.numel() for p in loaded.model.parameters())
            for j, (task, directory) in enumerate(zip(self.tasks, dirs)):
                label = f"{point.key} × {task['label']}"
                row = stage(directory, self.ctx.events, label,
                            lambda: _cell(self.cfg, point, j, loaded, params, directory, self.ctx, label))
                self.add(point, task, directory, row)
            if loaded is not None:
                device, loaded = loaded.device, None  # the lambdas above share this name: none holds the model now
                _free_memory(device)

    def add(self, point: Point, task: dict[str, Any], directory: Path, row: dict[str, Any]) -> None:
        cell = {"task": task["key"], "entry": point.entry, "point": point.key, "stage": point.stage, "seed": point.seed,
                "step": point.step, "model": point.model, "adapter": point.adapter, "revision": point.revision, **row,
                "run": directory.relative_to(self.out.parent).as_posix()}
        self.cells.append(cell)
        self.ctx.events.emit("series_cell", **{k: cell[k] for k in ("task", "point", "accuracy", "ece")},
                             message=f"{cell['point']} × {task['label']}: accuracy {row['accuracy']:.1%}, "
                                     f"ECE {row['ece']:.1%}")
        series.write(self.out, series.document(self.cfg.axis, self.tasks, self.cells))

    def run(self) -> dict[str, Any]:
        for i, entry in enumerate(self.cfg.models):
            if entry.get("model") is not None:
                self.evaluate_point(Point(f"m{i}", i, entry["model"], entry.get("adapter"), entry.get("stage"), None,
                                          entry.get("step"), entry.get("revision")))
            elif entry.get("run") is not None:
                for point in trained_points(self.cfg, i, Path(entry["run"]), None):
                    self.evaluate_point(point)
            else:
                for seed in self.cfg.run_seeds():
                    directory = self.out / TRAIN_DIR / f"m{i}-seed{seed}"
                    stage(directory, self.ctx.events, f"train m{i} seed {seed}",
                          lambda: _train(self.cfg, i, seed, directory, self.ctx))
                    for point in trained_points(self.cfg, i, directory, seed):
                        self.evaluate_point(point)
        doc = series.document(self.cfg.axis, self.tasks, self.cells)
        series.write(self.out, doc)
        return {"cells": len(self.cells), "points": len({c["point"] for c in self.cells}), "tasks": len(self.tasks)}


def run_job(cfg: SeriesConfig, ctx: JobContext) -> dict[str, Any]:
    return Series(cfg, ctx).run()
