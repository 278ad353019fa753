"""The controlled task's jobs that several benches train: bench.controlled's experiments, and
bench.determinism, bench.rcft_lambda and bench.lifecycle, which start from the same models or reuse
its folder. Kept apart from any one experiment so that each bench module is only its own.

A task from :mod:`lab.data.synthetic` and a small Llama created from scratch (:mod:`lab.models.scratch`);
every job is a config built from the shipped presets ``examples/*-controlled.yaml`` and run by the lab's
own worker, so a finished job is not redone when a bench is run again.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional

from bench._harness import Only, Timer, parser, preset
from lab.calibration.spread import mean_interval
from lab.core.events import read_events
from lab.core.layout import EVENTS_FILE, MODEL_DIR, RESULT_FILE
from lab.core.yamlio import dump_yaml
from lab.data.synthetic import Task, write_splits
from lab.jobkit.worker import run
from lab.results.reports import pct

TASK = Task()  # the shipped task: 8 objects, seed 0
# Scoring is cheap next to training here, but every question scored is scored once per seed: 500 test and
# shifted questions keep a bootstrap interval of about ±3 points, below the spread over seeds.
SIZES = {"pretrain": 600, "train": 100, "validation": 200, "test": 500, "shifted": 500, "pool": 1200}
EPOCHS = 16  # experiments 1 and 2: enough for a hard-label fine-tune to memorise its 100 noisy labels
JOBS_HELP = "where the bench's jobs run (a rerun skips finished ones)"


def jobs_parser(doc: str, out: Path, out_help: str = JOBS_HELP, threads: int = 2,
                seeds: Optional[int] = None, only: Optional[Only] = None) -> argparse.ArgumentParser:
    """The parser of a bench of jobs on the controlled task: ``--out`` is its jobs' folder, ``--threads``
    torch's CPU threads; ``--seeds`` and ``--only`` (seeds) where it runs several."""
    made = parser(doc, out=out, out_help=out_help, seeds=seeds, only=only)
    made.add_argument("--threads", type=int, default=threads, help="torch CPU threads")
    return made


def prepare(args: argparse.Namespace) -> tuple[Path, dict[str, str]]:
    """torch's threads set, and the bench's folder (resolved) with its data files in it."""
    import torch

    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    return out, data_files(out)


def common(seed: int) -> dict[str, Any]:
    """The fields every job of experiments 1 and 2 shares (a cft job names its data per source)."""
    return {"dataset": "synthetic", "device": "cpu", "seed": seed}


def job(out: Path, name: str, config: dict[str, Any]) -> Path:
    """Run ``config`` in ``out/name``. A finished run of the same config is kept; any other run
    (killed, or its config changed: a CFT job given one more λ) resumes there, where the worker's
    stages skip what is done. A changed setting of a stage that is done needs another ``name``."""
    target = out / name
    result = target / RESULT_FILE
    path = out / "configs" / f"{name}.yaml"
    text = dump_yaml(config)
    if (result.is_file() and json.loads(result.read_text()).get("status") == "succeeded" and path.is_file()
            and path.read_text() == text):
        return target
    target.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    timer = Timer()
    code = run(path, target)
    if code != 0:
        raise SystemExit(f"{name} failed (exit code {code}); see {target}/log.txt or {target}/{EVENTS_FILE}")
    print(f"{out.name}/{name}: {timer.seconds / 60:.1f} min", flush=True)
    return target


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The per-epoch validation records of a finetune run."""
    events, _ = read_events(run_dir / EVENTS_FILE)
    return [e for e in events if e["stage"] == "train_eval" and "ece" in e and float(e["epoch"]).is_integer()]


def data_files(out: Path) -> dict[str, str]:
    """The bench's splits (written under ``out/data`` on first use) as loader arguments ``split=path``."""
    data = out / "data"
    if not (data / "pool.jsonl").is_file():
        write_splits(data, TASK, SIZES)
    # The synthetic dataset's splits are train / validation / test / shifted: the bench's other parts are read as train.
    return {part: f"{part if part in ('validation', 'test', 'shifted') else 'train'}={data / f'{part}.jsonl'}"
            for part in SIZES}


def base_model(out: Path, files: dict[str, str], seed: int = 0) -> Path:
    """The run of the *base*: the scratch model (initialised with ``seed``) trained 3 epochs on its
    own pretrain questions, in ``out``."""
    from lab.models.scratch import ScratchConfig, create
    from lab.data import load

    scratch = out / "scratch"
    if not (scratch / "config.json").is_file():
        create(scratch, load("synthetic", "train", [files["pretrain"]]).records, ScratchConfig(seed=seed))
    return job(out, "base", {**preset("finetune-controlled"), **common(seed), "model": str(scratch),
                             "data_files": [files["pretrain"]], "split": "train", "limit": None,
                             "val_data_files": [files["validation"]], "val_limit": None, "epochs": 3})


def finetune_job(out: Path, files: dict[str, str], base: Path, name: str, seed: int, **overrides: Any) -> Path:
    """The base fine-tuned ``EPOCHS`` epochs on the 100 train questions (experiment 1)."""
    return job(out, name, {**preset("finetune-controlled"), **common(seed), "model": str(base / MODEL_DIR),
                           "data_files": [files["train"]], "limit": None, "val_data_files": [files["validation"]],
                           "val_limit": None, "epochs": EPOCHS, **overrides})


def full_finetune(out: Path, files: dict[str, str], base: Path, seed: int = 0) -> Path:
    """Experiment 1's full fine-tune: the over-confident model that experiments 2 and 3 start from."""
    return finetune_job(out, files, base, "e1-full", seed)


def cft_job(out: Path, files: dict[str, str], start: Path, name: str, **overrides: Any) -> Path:
    """A CFT job from ``start`` (a finetune run: the over-confident model of experiment 1), on the
    bench's pool and shifted split; ``overrides`` are top-level fields of the cft-controlled preset."""
    return job(out, name, {
        **preset("cft-controlled"), "device": "cpu", "seed": 0, "model": str(start / MODEL_DIR),
        "in_domain": [{"dataset": "synthetic", "data_files": [files["pool"]], "split": "train"}],
        "ood": [{"dataset": "synthetic", "data_files": [files["shifted"]], "split": "shifted"}], **overrides})


def ece_cell(m: dict[str, Any]) -> str:
    """One run's ECE with its bootstrap interval over questions, in percent."""
    return f"{pct(m['ece'])} [{pct(m['ece_ci_low'])}, {pct(m['ece_ci_high'])}]"


def mean_cell(values: list[float]) -> str:
    """The mean over seeds with its t interval, in percent (the mean alone from one seed)."""
    mean, low, high = mean_interval(values)
    return pct(mean) if low is None else f"{pct(mean)} [{pct(low)}, {pct(high)}]"
