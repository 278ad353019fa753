"""Chains of runs read back as series over stages: base → SFT → DPO, from the run folders as the jobs left them.

A chain is jobs linked by their model fields (:mod:`lab.jobkit.chain`): an sft job of ``bundled``, a dpo job
of ``run:2`` (that sft job's weights), an evaluation of ``run:3``; a pipeline file queues one
(:mod:`lab.jobkit.pipeline`). Each chain that evaluated two or more of its stages on the same task becomes a
table of the shape a series over stages writes (:func:`lab.results.series.document`: tasks, cells placed on
the ``stage`` axis, the summary), so the Life cycle page draws, lists and exports it as it does a series,
without a hand-written series job.

A *stage* is one set of weights along the chain: the base model, a training run's weights at one of its
calibration evaluations (``sft step 2``), its final weights (``sft``). What evaluated a stage:

- an evaluate job (``NNNNN-evaluate/``) whose model was ``run:<id>`` (its ``start.json`` says), a training
  run's ``model/`` or ``adapter/``, or a model outside the runs folder (the base);
- a training run's calibration tasks (``calibration/step-<n>/<task>/``, sft and dpo): step 0 is the model it
  started from, the stage before it; a later step its weights then, the last step of a run that succeeded
  its final weights.

A *task* is what was asked, as the evaluation's ``config.yaml`` resolved it (:data:`TASK_FIELDS`): the same
questions, scored and binned the same way. One stage evaluated several times on one task (a dpo run's step 0
is its sft run's final weights, which that run evaluated too) is the same weights measured again, not a
replicate to average: one evaluation is drawn, an evaluate job's before a calibration evaluation, the stage's
own before the next run's step 0, the newest among equals. So each stage has one run: its error bars are its
bootstrap over questions (the accuracy's drawn from n and the accuracy as a series draws it,
:func:`lab.calibration.spread.accuracy_bootstrap`), and there is no interval over seeds.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lab.calibration.spread import accuracy_bootstrap
from lab.core.layout import ADAPTER_DIR, CALIBRATION_DIR, MODEL_DIR, RESULT_FILE, RUN_DIR_NAME, START_DIR, START_FILE
from lab.core.stored import read_object
from lab.results import run_configs, runs, series

CHAIN = "chain:"  # a chain's name (what a picker sends back): its last training run's, so prefixed
TRAINERS = ("finetune", "sft", "dpo")  # the kinds whose weights run:<id> names (lab.jobkit.chain)
EVALUATE = "evaluate"
STEP = re.compile(r"step-(\d{1,9})")
REFERENCE = re.compile(r"run:([1-9][0-9]{0,8})")  # lab.jobkit.chain's
TASK_FIELDS = ("task", "dataset", "data_files", "subject", "split", "limit", "scoring", "template", "bins",
               "bin_edges", "num_fewshot", "fewshot_split", "lm_eval_include")
TOKEN_FIELDS = ("seed", "positions", "min_context")  # ... and, for a token task, what picks its targets
TOKEN_TASKS = ("clm", "facts")
BASE = "base"
MAX_LINKS = 32  # a chain longer than a pipeline may be is a loop in hand-edited files

Node = tuple  # ("model", model, adapter) | ("run", job name) | ("step", job name, step): one set of weights


@dataclass(frozen=True)
class Job:
    """A job's run folder (``NNNNN-kind``) under the runs folder."""

    path: Path  # real path
    name: str  # relative to the runs folder, POSIX: "00002-sft", "pipeline-quick/00002-sft"
    number: int
    kind: str


@dataclass(frozen=True)
class Measured:
    """One evaluation of one stage on one task."""

    node: Node
    task: tuple  # the task's identity (TASK_FIELDS, TOKEN_FIELDS)
    described: dict[str, Any]
    rank: int  # 0: an evaluate job, 1: the stage's own calibration evaluation, 2: a later run's step 0
    run: runs.EvalRun
    bootstrap: int
    seed: int


# ---------------------------------------------------------------- files read
def _config(directory: Path) -> dict[str, Any]:
    """``config.yaml`` of ``directory``; empty when absent or unreadable."""
    return run_configs.read_config(directory) or {}


def _json(path: Path) -> dict[str, Any]:
    try:
        return read_object(path)
    except (OSError, ValueError):  # StoredFileError too: a file no run wrote draws no link
        return {}


def _given(directory: Path) -> Optional[str]:
    """What a job's ``model`` named as written (``run:3``) when it started, from ``start.json``: an
    evaluate job's ``config.yaml`` holds the weights it resolved to."""
    entry = _json(directory / START_FILE).get("model")
    given = entry.get("given") if isinstance(entry, dict) else None
    return given if isinstance(given, str) else None


def _succeeded(job: Job) -> bool:
    return _json(job.path / RESULT_FILE).get("status") == "succeeded"


# ---------------------------------------------------------------- what started from what
class Links:
    """The runs folder's jobs and what each started from, read once per look at the folder."""

    def __init__(self, root: Path) -> None:
        self.base = Path(os.path.realpath(root))
        self._parents: dict[str, Optional[Node]] = {}

    def job(self, directory: Path) -> Optional[Job]:
        """The job whose run folder ``directory`` is (a real path under the runs folder), or None."""
        match = RUN_DIR_NAME.fullmatch(directory.name)
        if match is None or directory == self.base or self.base not in directory.parents:
            return None
        return Job(directory, directory.relative_to(self.base).as_posix(), int(match[1]), match[2])

    def numbered(self, store: Path, number: int) -> Optional[Job]:
        """Job ``number`` of the store whose folder is ``store``: the one folder ``NNNNN-kind`` there."""
        found = [p for p in store.glob(f"{number:05d}-*")
                 if RUN_DIR_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
        return self.job(found[0]) if len(found) == 1 else None

    def node(self, store: Path, model: Any, adapter: Any, links: int = 0) -> Optional[Node]:
        """The stage a model reference names: ``run:<id>`` of ``store``, the weights of a training run under
        the runs folder (its ``model/`` or ``adapter/``; its ``start/``: what it started from), or a model
        outside it (a base: ``bundled``, a hub id, a folder). None for anything else under the runs folder."""
        if not isinstance(model, str) or not model:
            return None
        if model.startswith("run:"):
            match = REFERENCE.fullmatch(model)
            job = self.numbered(store, int(match[1])) if match else None
            return ("run", job.name) if job is not None and job.kind in TRAINERS else None
        for path in (adapter, model):  # a folder as given: absolute, or relative to where the lab runs
            if isinstance(path, str) and path and (os.path.isabs(path) or os.path.isdir(path)):
                real = Path(os.path.realpath(path))
                if real == self.base or self.base in real.parents:
                    return self._weights(real, links)
        adapter = adapter if isinstance(adapter, str) and adapter else None
        return ("model", _external(model), _external(adapter) if adapter else None)

    def _weights(self, real: Path, links: int) -> Optional[Node]:
        """The stage of a folder under the runs folder: a training run's final weights, or its start."""
        for folder in (real, *real.parents):
            job = self.job(folder)
            if job is not None:
                if job.kind not in TRAINERS:
                    return None
                inside = real.relative_to(folder).parts[:1]
                if inside in ((MODEL_DIR,), (ADAPTER_DIR,)):
                    return ("run", job.name)
                return self.parent(job, links + 1) if inside == (START_DIR,) else None
        return None

    def parent(self, job: Job, links: int = 0) -> Optional[Node]:
        """The stage a training run started from, or None when it cannot be told."""
        if job.name not in self._parents:
            self._parents[job.name] = None  # a loop in hand-edited files ends here
            if links <= MAX_LINKS:
                given = _given(job.path) or _config(job.path).get("model")
                self._parents[job.name] = self.node(job.path.parent, given, None, links)
        return self._parents[job.name]


def _external(model: str) -> str:
    """A model outside the runs folder as one name: a folder by its real path, anything else as given."""
    return os.path.realpath(model) if os.path.isabs(model) or os.path.isdir(model) else model


# ---------------------------------------------------------------- evaluations found
def _task(config: dict[str, Any]) -> Optional[tuple[tuple, dict[str, Any]]]:
    """An evaluation's task: its identity and how a panel names it; None for a config that says no task."""
    task = config.get("task") or "mcq"
    if not isinstance(task, str) or not isinstance(config.get("dataset"), str):
        return None
    fields = TASK_FIELDS + (TOKEN_FIELDS if task in TOKEN_TASKS else ())
    identity = tuple((key, json.dumps(config.get(key), sort_keys=True, default=str)) for key in fields)
    described = {"task": task, "dataset": config["dataset"], "split": config.get("split"),
                 "num_fewshot": config.get("num_fewshot")}
    extra = [config["scoring"] if task == "mcq" and config.get("scoring") else None,
             f"first {config['limit']}" if config.get("limit") else None]
    label = " · ".join([series.task_label(described), *(str(e) for e in extra if e)])
    return identity, {**described, "label": label}


def _measured(links: Links, run: runs.EvalRun) -> Optional[Measured]:
    """What ``run`` measured, when it is an evaluate job or a training run's calibration evaluation."""
    directory = links.base / run.name
    parts = run.name.split("/")
    job = links.job(directory)
    if job is not None and job.kind == EVALUATE:
        config, rank = _config(directory), 0
        node = links.node(directory.parent, _given(directory) or config.get("model"), config.get("adapter"))
    elif len(parts) >= 4 and parts[-3] == CALIBRATION_DIR and STEP.fullmatch(parts[-2]):
        trained = links.job(directory.parents[2])
        if trained is None or trained.kind not in TRAINERS:
            return None
        step, config = int(STEP.fullmatch(parts[-2])[1]), _config(directory)
        node, rank = (links.parent(trained), 2) if step == 0 else (("step", trained.name, step), 1)
    else:
        return None
    task = _task(config)
    if node is None or task is None:
        return None
    bootstrap, seed = config.get("bootstrap"), config.get("seed")
    return Measured(node, task[0], task[1], rank, run, bootstrap if isinstance(bootstrap, int) else 0,
                    seed if isinstance(seed, int) else 0)


def _finals(links: Links, found: list[Measured]) -> list[Measured]:
    """The last calibration step of a run that succeeded is its final weights: the run's own stage."""
    last: dict[str, int] = {}
    for m in found:
        if m.node[0] == "step":
            last[m.node[1]] = max(last.get(m.node[1], 0), m.node[2])
    finished = {name for name in last if _succeeded(links.job(links.base / name))}
    return [replace(m, node=("run", m.node[1])) if m.node[0] == "step" and m.node[1] in finished
            and last[m.node[1]] == m.node[2] else m for m in found]


# ---------------------------------------------------------------- chains
@dataclass(frozen=True)
class Chain:
    """One chain drawn as a series over stages."""

    name: str  # CHAIN + its last training run's name
    doc: dict[str, Any]  # as lab.results.series.document shapes it, with "folders": the chain's runs
    stages: tuple[str, ...]  # the stages drawn, in order
    newest: float  # when its newest evaluation drawn was written


def _ancestry(links: Links, leaf: str) -> list[Node]:
    """The stages from the first that can be told down to ``leaf``'s final weights, runs only."""
    path: list[Node] = [("run", leaf)]
    while len(path) <= MAX_LINKS:
        job = links.job(links.base / path[-1][1])
        parent = links.parent(job) if job is not None else None
        if parent is None or parent in path:
            break
        path.append(parent)
        if parent[0] != "run":
            break
    return path[::-1]


def _stages(links: Links, path: list[Node], steps: dict[str, list[int]]) -> list[tuple[Node, str]]:
    """Each stage of a chain with its label: ``base``, then per run its steps measured and its final
    weights (``sft step 2``, ``sft``); a kind that comes twice is told apart by its job's number."""
    kinds = [links.job(links.base / node[1]).kind for node in path if node[0] == "run"]
    out: list[tuple[Node, str]] = []
    for node in path:
        if node[0] != "run":
            out.append((node, BASE))
            continue
        job = links.job(links.base / node[1])
        label = job.kind if kinds.count(job.kind) == 1 else f"{job.kind} {job.number}"
        out += [(("step", node[1], step), f"{label} step {step}") for step in sorted(steps.get(node[1], []))]
        out.append((node, label))
    return out


def _point(node: Node) -> str:
    """What a stage is, as the cells table and the hover name it: never a server's absolute path."""
    if node[0] == "model":
        return runs.short_model(node[1]) + (f" + {runs.short_model(node[2])}" if node[2] else "")
    return node[1] if node[0] == "run" else f"{node[1]} step {node[2]}"


def _accuracy_interval(m: Measured) -> tuple[Optional[float], Optional[float]]:
    """The accuracy's bootstrap interval as a series computes it, from n and the accuracy (a resample's
    number right is Binomial(n, accuracy)); none where the run computed no bootstrap."""
    n, accuracy = m.run.n, m.run.accuracy
    if m.bootstrap < 1 or not n or accuracy is None:
        return None, None
    try:
        return accuracy_bootstrap(np.arange(n) < round(accuracy * n), m.bootstrap, seed=m.seed)
    except ValueError:  # a bootstrap count past its bound in a hand-edited config
        return None, None


def _cell(m: Measured, key: str, entry: int, label: str) -> dict[str, Any]:
    low, high = _accuracy_interval(m)
    ece_low, ece_high = m.run.ece_ci or (None, None)
    return {"task": key, "entry": entry, "point": _point(m.node), "stage": label, "seed": None,
            "step": m.node[2] if m.node[0] == "step" else None, "params": None, "model": _point(m.node),
            "adapter": None, "revision": None, "n": m.run.n, "accuracy": m.run.accuracy, "accuracy_low": low,
            "accuracy_high": high, "ece": m.run.ece, "ece_low": ece_low, "ece_high": ece_high,
            "oracle_ece": m.run.oracle_ece, "run": m.run.name}


def _chain(links: Links, leaf: str, best: dict[Node, dict[tuple, Measured]],
           steps: dict[str, list[int]]) -> Optional[Chain]:
    """The chain ending at ``leaf``'s weights as a series over stages (``best``: each stage's evaluation
    drawn per task); None unless some task was evaluated at two or more of its stages."""
    placed = _stages(links, _ancestry(links, leaf), steps)
    chosen: dict[tuple, dict[Node, Measured]] = {}
    described: dict[tuple, dict[str, Any]] = {}
    for node, _ in placed:
        for task, m in best.get(node, {}).items():
            chosen.setdefault(task, {})[node] = m
            described.setdefault(task, m.described)
    shown = [task for task, measured in chosen.items() if len(measured) > 1]
    if not shown:
        return None
    tasks = [{"key": f"t{j}-{described[task]['task']}", **described[task]} for j, task in enumerate(shown)]
    cells = [_cell(chosen[task][node], info["key"], i, label) for i, (node, label) in enumerate(placed)
             for task, info in zip(shown, tasks) if node in chosen[task]]
    folders = list(dict.fromkeys(node[1] for node, _ in placed if node[0] != "model"))
    doc = {**series.document("stage", tasks, cells), "folders": folders, "problems": []}
    drawn = [label for node, label in placed if any(c["stage"] == label for c in cells)]
    newest = max(chosen[task][node].run.created for task in shown for node in chosen[task])
    return Chain(CHAIN + leaf, doc, tuple(drawn), newest)


def find_chains(root: Path) -> list[Chain]:
    """Every chain of ``root`` with a task evaluated at two or more of its stages, newest first: one per run
    no other run of the folder started from (a run trained twice from one base makes two chains)."""
    links = Links(root)
    measured = _finals(links, [m for run in runs.scan(root).evaluations if (m := _measured(links, run))])
    best: dict[Node, dict[tuple, Measured]] = {}  # per stage and task, the one drawn
    for m in sorted(measured, key=lambda m: (m.rank, -m.run.created, m.run.name)):
        best.setdefault(m.node, {}).setdefault(m.task, m)
    steps: dict[str, list[int]] = {}
    for node in best:
        if node[0] == "step":
            steps.setdefault(node[1], []).append(node[2])
    known = {node[1] for node in best if node[0] != "model"}
    inner = {node[1] for leaf in known for node in _ancestry(links, leaf)[:-1] if node[0] == "run"}
    chains = [c for leaf in sorted(known - inner) if (c := _chain(links, leaf, best, steps))]
    return sorted(chains, key=lambda c: (-c.newest, c.name))


def chain_choices(root: Path) -> list[tuple[str, str]]:
    """(label, name) of every chain, newest first: ``chain to 00003-dpo: base → sft → dpo · 1 task · 11-23 10:58``
    (the user's name for its last run first, when it has one)."""
    choices = []
    for c in find_chains(root):
        leaf = c.name[len(CHAIN):]
        title = runs.read_label(Path(os.path.realpath(root)) / leaf)
        tasks = len(c.doc["tasks"])
        stamp = time.strftime("%m-%d %H:%M", time.localtime(c.newest))
        choices.append((f"{title + ' · ' if title else ''}chain to {leaf}: {' → '.join(c.stages)} · {tasks} "
                        f"task{'s' if tasks > 1 else ''} · {stamp}", c.name))
    return choices


def is_chain(name: Any) -> bool:
    """Whether a picked name names a chain (else, a series)."""
    return isinstance(name, str) and name.startswith(CHAIN)


def chain(root: Path, name: Any) -> Optional[Chain]:
    """The chain called ``name`` (a :attr:`Chain.name`) under ``root``, else the one it grew into (a run
    started from its last run has evaluated since, and the chain is now named for that run), else None.
    The name is only compared with those found, never used as a path."""
    if not is_chain(name):
        return None
    found = find_chains(root)
    last = name[len(CHAIN):]
    return next((c for c in found if c.name == name), None) or next((c for c in found if last in c.doc["folders"]),
                                                                     None)
