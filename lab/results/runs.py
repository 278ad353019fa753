"""The catalogue of runs: what the runs directory holds, found in one walk with one depth rule.

Every job writes into ``runs/<job>/``; pipelines nest their parts one or two levels deeper
(``eval/<row>-<set>/``, ``models/<row>/``, ``topk/train/``, ``ts/``; see :mod:`lab.core.layout`). The
catalogue names each thing by the directory that holds it, relative to the runs directory
(``"12/eval/cft-in_domain"``), and lists it when that directory is at most
:data:`~lab.results.walk.MAX_DEPTH` levels down; hidden folders and training checkpoints are never
entered, and neither are links to folders (what they lead to is not the runs directory's): one walk,
:mod:`lab.results.walk`. What it finds:

    evaluations   a directory with metrics.json and predictions.jsonl (:class:`EvalRun`)
    stores        a top-k store: manifest.json in topk/ or below it
    models        a directory with model/config.json (full weights) or adapter/adapter_config.json
    temperatures  a directory with temperature.json
    reports       a directory with report.json
    comparisons   a directory with compare.json (a compare job's, or the compare lane's history)
    calibrators   a directory with calibrator.json (the recalibration workbench's, lab.calibration.calibrators)
    series        a directory with series.json (a series job's table, lab.results.series)

What a browser sends back is only a name: :func:`resolve` turns it into a path again, through
``..`` and links, and answers None for anything outside the runs directory or deeper than the
catalogue looks. No gradio here: the pages, the API and :mod:`lab.results.analysis` share this module.
"""
from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from lab.calibration import calibrators
from lab.calibration.metrics import finite_or_none
from lab.calibration.temperature_files import load_temperature
from lab.core import stored
from lab.core.layout import (ADAPTER_DIR, CALIBRATOR_FILE, COMPARE_FILE, EVAL_DIR, FITTED_TEMPERATURE_DIR, LABEL_FILE,
                             MANIFEST_FILE, METRICS_FILE, MODEL_DIR, PREDICTIONS_FILE, REPORT_JSON, SERIES_FILE,
                             TEMPERATURE_FILE, TOPK_DIR)
from lab.core.reads import inside
from lab.core.trained import ADAPTER_CONFIG, HF_CONFIG
from lab.results import series as series_table
from lab.results.run_configs import adapter_base
from lab.results.run_metrics import metrics_problem, read_metrics, shots_of
from lab.results.walk import MAX_DEPTH, entered, walk

MAX_LABEL = 120  # characters of a user-given run name
JOB_NUMBER = re.compile(r"(\d+)-")  # a job's run folder: 00003-evaluate


# ---------------------------------------------------------------- what is found
@dataclass(frozen=True)
class EvalRun:
    """One evaluation directory and the headline numbers of its ``metrics.json`` (None when absent)."""

    path: Path
    name: str  # path relative to the searched root, POSIX, e.g. "12/eval/cft-in_domain"
    model: Optional[str] = None
    dataset: Optional[str] = None
    split: Optional[str] = None
    n: Optional[int] = None
    accuracy: Optional[float] = None
    ece: Optional[float] = None
    cw_ece: Optional[float] = None
    nll: Optional[float] = None
    trust: Optional[float] = None
    temperature: Optional[float] = None
    scoring: Optional[str] = None
    in_domain: Optional[bool] = None  # set by the FIRST and CFT pipelines for their evaluations
    adapter: Optional[str] = None
    template: Optional[str] = None
    ece_ci: Optional[tuple[float, float]] = None  # the bootstrap interval, when the run computed one
    created: float = 0.0  # when metrics.json was written (seconds since the epoch)
    title: Optional[str] = None  # the name the user gave it (label.txt), if any
    aurc: Optional[float] = None  # selective prediction with the top probability (lab.calibration.selective); None in
    auroc: Optional[float] = None  # ... runs evaluated before it was recorded
    oracle_accuracy: Optional[float] = None  # the Bayes predictor's, on data with known true distributions
    oracle_ece: Optional[float] = None  # ... (lab.data.synthetic); None for any other data
    shots: Optional[str] = None  # few-shot examples per question ("5"; an lm-eval group's "0–5"); None: zero-shot

    @property
    def dataset_label(self) -> str:
        """The dataset as the pages name it: ``lm-eval:bundled_mmlu (5-shot)``, ``obqa`` (its split apart)."""
        return series_table.dataset_label(self.dataset, None, self.shots) if self.dataset else ""

    @property
    def label(self) -> str:
        """What the pages call the run: the user's name for it, else what it is — model (+ adapter),
        dataset/split, scoring/template, n, date — so two runs of one job never look alike."""
        if self.title:
            return self.title
        return describe_run(self.model, self.adapter, self.dataset, self.split, self.scoring, self.template,
                            self.n, self.created, self.name, self.shots)


@dataclass(frozen=True)
class TrainedModel:
    """Weights a training run saved: ``path`` is its ``model/`` or ``adapter/`` directory."""

    path: Path
    name: str  # the run (or pipeline row) that saved it, e.g. "00005-cft/models/cft"
    base: Optional[str] = None  # an adapter's base model, as the config of its job names it; None: full weights


@dataclass(frozen=True)
class Catalogue:
    """Everything under one runs directory; each mapping goes from a name to the directory holding it."""

    evaluations: list[EvalRun]  # newest metrics.json first
    stores: dict[str, Path]
    models: list[TrainedModel]
    temperatures: dict[str, Path]
    reports: dict[str, Path]
    comparisons: dict[str, Path]  # newest compare.json first
    calibrators: dict[str, Path]  # newest calibrator.json first
    series: dict[str, Path]  # newest series.json first
    unreadable: dict[str, str] = field(default_factory=dict)  # evaluations left out: name → why (names the file)


def _text(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def short_model(path: Optional[str]) -> Optional[str]:
    """A model or adapter as a reader knows it: ``bundled`` or a hub id as given, a folder by its
    last two parts (``00005-cft/adapter`` rather than the whole absolute path)."""
    if not path:
        return None
    if not path.startswith(("/", ".", "~")):
        return path
    parts = Path(path).parts
    return "/".join(parts[-3:-1] if parts[-1] in (ADAPTER_DIR, MODEL_DIR) else parts[-2:])


def describe_run(model: Optional[str], adapter: Optional[str], dataset: Optional[str], split: Optional[str],
                 scoring: Optional[str], template: Optional[str], n: Optional[int], created: float, name: str,
                 shots: Optional[str] = None) -> str:
    """``00003 · bundled · obqa/test · cloze (cloze_plain) · n=500 · 11-23 10:58``: the folder's
    first part (the job), then what was evaluated (an lm-eval task with its shots:
    ``lm-eval:bundled_mmlu (5-shot)``), how, on how many questions, and when."""
    what = short_model(model) or "?"
    if adapter:
        what += f" + {short_model(adapter)}"
    how = f"{scoring} ({template})" if scoring and template else (scoring or template)
    when = time.strftime("%m-%d %H:%M", time.localtime(created)) if created else None
    where = series_table.dataset_label(dataset, split, shots) or None
    first, _, rest = name.partition("/")
    job = JOB_NUMBER.match(first)
    parts = [job[1] if job else (first if first != "." else None), rest or None, what, where, how,
             f"n={n}" if n is not None else None, when]
    return " · ".join(p for p in parts if p)


def read_label(directory: Path) -> Optional[str]:
    """The name the user gave a run (``label.txt``), one line of at most :data:`MAX_LABEL` characters."""
    try:
        text = (Path(directory) / LABEL_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    text = " ".join(text.split())[:MAX_LABEL]
    return text or None


def write_label(directory: Path, label: str) -> Optional[str]:
    """Rename a run: ``label`` (whitespace collapsed, at most :data:`MAX_LABEL` characters) into its
    ``label.txt``; an empty label removes the name. Returns the name now in force."""
    text = " ".join(str(label or "").split())[:MAX_LABEL]
    target = Path(directory) / LABEL_FILE
    if not text:
        target.unlink(missing_ok=True)
        return None
    target.write_text(text + "\n", encoding="utf-8")
    return text


def _eval_run(directory: Path, name: str) -> Optional[tuple[float, EvalRun]]:
    """The run and its metrics file's modification time, or None when the metrics are unreadable."""
    data = read_metrics(directory)
    if data is None:
        return None
    try:
        mtime = (directory / METRICS_FILE).stat().st_mtime
    except OSError:
        return None
    n = finite_or_none(data.get("n"))
    low, high = finite_or_none(data.get("ece_ci_low")), finite_or_none(data.get("ece_ci_high"))
    oracle = data.get("oracle") if isinstance(data.get("oracle"), dict) else {}
    shots, task_split = shots_of(data)
    run = EvalRun(
        path=directory, name=name, model=_text(data.get("model")), dataset=_text(data.get("dataset")),
        split=task_split or _text(data.get("split")), n=None if n is None else int(n), shots=shots,
        accuracy=finite_or_none(data.get("accuracy")), ece=finite_or_none(data.get("ece")),
        cw_ece=finite_or_none(data.get("cw_ece")), nll=finite_or_none(data.get("nll")),
        trust=finite_or_none(data.get("trust")), temperature=finite_or_none(data.get("temperature")),
        scoring=_text(data.get("scoring")),
        in_domain=data["in_domain"] if isinstance(data.get("in_domain"), bool) else None,
        adapter=_text(data.get("adapter")), template=_text(data.get("template")),
        ece_ci=(low, high) if low is not None and high is not None else None, created=mtime,
        title=read_label(directory), aurc=finite_or_none(data.get("aurc")), auroc=finite_or_none(data.get("auroc")),
        oracle_accuracy=finite_or_none(oracle.get("accuracy")), oracle_ece=finite_or_none(oracle.get("ece")),
    )
    return mtime, run


def _is_store(name: str) -> bool:
    return TOPK_DIR in name.split("/")


def _scan(root: Path, start: Path, depth: int) -> Catalogue:
    """The catalogue of ``start`` (``root`` or a folder below it), walked ``depth`` levels down."""
    evaluations, stores, models, temperatures, reports, unreadable = [], {}, [], {}, {}, {}
    comparisons, calibrators, series = [], [], []
    for directory, files, folders in walk(start, depth):
        name = directory.relative_to(root).as_posix()
        if METRICS_FILE in files and PREDICTIONS_FILE in files:
            found = _eval_run(directory, name)
            if found:
                evaluations.append(found)
            elif problem := metrics_problem(directory, name):
                unreadable[name] = problem
        if MANIFEST_FILE in files and _is_store(name):
            stores[name] = directory
        if TEMPERATURE_FILE in files:
            temperatures[name] = directory
        if REPORT_JSON in files:
            reports[name] = directory
        if COMPARE_FILE in files:
            comparisons.append((_mtime(directory / COMPARE_FILE), name, directory))
        if CALIBRATOR_FILE in files:
            calibrators.append((_mtime(directory / CALIBRATOR_FILE), name, directory))
        if SERIES_FILE in files:
            series.append((_mtime(directory / SERIES_FILE), name, directory))
        if ADAPTER_DIR in folders and (directory / ADAPTER_DIR / ADAPTER_CONFIG).is_file():
            models.append(TrainedModel(directory / ADAPTER_DIR, name, adapter_base(root, directory / ADAPTER_DIR)))
        if MODEL_DIR in folders and (directory / MODEL_DIR / HF_CONFIG).is_file():
            models.append(TrainedModel(directory / MODEL_DIR, name))
    evaluations.sort(key=lambda item: (-item[0], item[1].name))
    comparisons.sort(key=lambda item: (-item[0], item[1]))
    calibrators.sort(key=lambda item: (-item[0], item[1]))
    series.sort(key=lambda item: (-item[0], item[1]))
    return Catalogue([run for _, run in evaluations], stores, models, temperatures, reports,
                     {name: directory for _, name, directory in comparisons},
                     {name: directory for _, name, directory in calibrators},
                     {name: directory for _, name, directory in series}, unreadable)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile
        return 0.0


def scan(root: Path) -> Catalogue:
    """Everything under ``root`` (``root`` itself included), in one walk. A damaged or half-written
    ``metrics.json`` (a job still writing, or killed) is skipped: pages poll this and must never
    fail because of one run; a missing ``root`` is an empty catalogue."""
    root = Path(root)
    return _scan(root, root, MAX_DEPTH)


# ---------------------------------------------------------------- what the pages list
def find_evaluations(root: Path) -> list[EvalRun]:
    """Every evaluation under ``root``, newest ``metrics.json`` first."""
    return scan(root).evaluations


def evaluation_choices(root: Path) -> list[tuple[str, str]]:
    """(label, name) for a picker, newest first: the label says what the run is, the name (what
    the browser sends back) is resolved again with :func:`evaluation`."""
    return [(run.label, run.name) for run in find_evaluations(root)]


def comparison_choices(root: Path) -> list[tuple[str, str]]:
    """(label, name) of every comparison, newest first: its name if the user gave one, else its
    first question, how many there were, and when."""
    choices = []
    for name, directory in scan(root).comparisons.items():
        title = read_label(directory)
        if title is None:
            try:
                report = stored.read_object(directory / COMPARE_FILE)
                questions = report.get("questions") or [{"question": report.get("question")}]
                first = " ".join(str(questions[0].get("question") or "?").split())
            except (OSError, ValueError, AttributeError, IndexError, TypeError, KeyError):
                first, questions = "(unreadable)", []
            more = f" (+{len(questions) - 1} more)" if len(questions) > 1 else ""
            stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(_mtime(directory / COMPARE_FILE)))
            title = f"{first[:70]}{more} · {stamp}"
        choices.append((title, name))
    return choices


def store_names(root: Path) -> list[str]:
    """The names a page offers for picking a top-k store (an ``extract`` job's, a FIRST run's)."""
    return sorted(scan(root).stores)


def trained_models(root: Path) -> list[TrainedModel]:
    """Every saved model and adapter under ``root`` (never an epoch checkpoint), by run name."""
    return scan(root).models


# ---------------------------------------------------------------- names back to paths
def resolve(root: Path, name: Any) -> Optional[Path]:
    """The directory called ``name`` under ``root`` as the catalogue could list it, or None.

    ``name`` comes from a browser: it is resolved through ``..`` and links, and must land in
    ``root`` (``"."``: ``root`` itself), at most :data:`MAX_DEPTH` levels down, through no hidden
    or checkpoint folder. An absolute path, ``../x`` or a link leading out answers None.
    """
    if not isinstance(name, str) or not name:
        return None
    try:
        base = Path(os.path.realpath(root))
        target = Path(os.path.realpath(base / name))
    except (OSError, ValueError):  # a NUL byte, a link loop
        return None
    if not inside(target, (base,)):
        return None
    parts = target.relative_to(base).parts
    if len(parts) > MAX_DEPTH or not all(entered(part) for part in parts):
        return None
    return target


def evaluation(root: Path, name: Any) -> Optional[EvalRun]:
    """The evaluation called ``name`` (an :attr:`EvalRun.name`) under ``root``, or None.
    One lookup instead of a scan of the whole tree."""
    directory = resolve(root, name)
    if directory is None or not (directory / PREDICTIONS_FILE).is_file():
        return None
    found = _eval_run(directory, directory.relative_to(os.path.realpath(root)).as_posix())
    return found[1] if found else None


def topk_store(root: Path, name: Any) -> Optional[Path]:
    """The ``manifest.json`` of the top-k store called ``name`` under ``root``, or None."""
    directory = resolve(root, name)
    if directory is None or not _is_store(directory.relative_to(os.path.realpath(root)).as_posix()):
        return None
    manifest = directory / MANIFEST_FILE
    return manifest if manifest.is_file() else None


def job_evaluations(root: Path, run_dir: Any) -> list[EvalRun]:
    """The evaluations one job wrote (its run directory and below), named as :func:`find_evaluations`
    names them; empty for a job without a run directory or one outside ``root``."""
    if not run_dir:
        return []
    root = Path(root)
    base = Path(os.path.realpath(root))
    directory = Path(os.path.realpath(run_dir))
    if not inside(directory, (base,)):
        return []
    depth = len(directory.relative_to(base).parts)
    if depth > MAX_DEPTH:
        return []
    return _scan(base, directory, MAX_DEPTH - depth).evaluations


def saved_temperature(root: Path, run: EvalRun) -> Optional[float]:
    """A temperature saved for this evaluation: beside its predictions (the temperature lab's save),
    else, for a pipeline's ``<job>/eval/<row>-<set>``, the one the pipeline fitted (``<job>/ts/``)."""
    places = [run.path]
    if run.path.parent.name == EVAL_DIR:
        places.append(run.path.parent.parent / FITTED_TEMPERATURE_DIR)
    base = Path(os.path.realpath(root))
    for directory in places:
        if not inside(Path(os.path.realpath(directory)), (base,)):
            continue
        try:
            return load_temperature(directory)
        except (OSError, ValueError):  # none saved here, or not a temperature file
            continue
    return None


def calibrator_dir(root: Path, name: Any) -> Optional[Path]:
    """The folder of the saved calibrator called ``name`` under ``root``, or None."""
    directory = resolve(root, name)
    return directory if directory is not None and (directory / CALIBRATOR_FILE).is_file() else None


def calibrator_choices(root: Path) -> list[tuple[str, str]]:
    """(label, name) of every saved calibrator, newest first: what it is and where it was fitted."""
    choices = []
    for name, directory in scan(root).calibrators.items():
        try:
            label = _calibrator_label(directory, (directory / CALIBRATOR_FILE).stat().st_mtime_ns)
        except (OSError, ValueError):
            label = f"{name} (unreadable)"
        choices.append((label, name))
    return choices


@functools.lru_cache(maxsize=256)
def _calibrator_label(directory: Path, mtime_ns: int) -> str:
    """A calibrator's description, read once per version of its file: the pickers that list them
    follow the runs directory every few seconds."""
    return calibrators.load(directory).describe()


def series_dir(root: Path, name: Any) -> Optional[Path]:
    """The folder of the series called ``name`` under ``root`` (one holding series.json), or None."""
    directory = resolve(root, name)
    return directory if directory is not None and (directory / SERIES_FILE).is_file() else None


def series_choices(root: Path) -> list[tuple[str, str]]:
    """(label, name) of every series, newest first: the user's name for it, else its job, axis, size
    and date (``00007 · params · 8 cells: 4 points × 2 tasks · 11-23 10:58``)."""
    choices = []
    for name, directory in scan(root).series.items():
        try:
            stat = (directory / SERIES_FILE).stat()
        except OSError:  # removed meanwhile
            continue
        choices.append((read_label(directory) or _series_label(name, directory, stat.st_mtime_ns, stat.st_size), name))
    return choices


@functools.lru_cache(maxsize=256)
def _series_label(name: str, directory: Path, mtime_ns: int, size: int) -> str:
    """A series' description, read once per version of its table: it is rewritten after every cell,
    and the pickers that list series follow the runs directory every few seconds. A version is its
    time and its size: a resumed series rewrites its table once per finished cell within the same
    tick of the file system's clock, and a label cached by time alone kept the first count."""
    first, _, rest = name.partition("/")
    job = JOB_NUMBER.match(first)
    head = " · ".join(p for p in (job[1] if job else first, rest) if p)
    stamp = time.strftime("%m-%d %H:%M", time.localtime(mtime_ns / 1e9))
    doc = series_table.read(directory)
    if doc is None:
        return f"{head} · (unreadable) · {stamp}"
    points = len({cell.get("point") for cell in doc["cells"]})
    return (f"{head} · {doc['axis']} · {len(doc['cells'])} cells: {points} points × {len(doc['tasks'])} tasks "
            f"· {stamp}")
