"""The lab's command line: ``python -m lab KIND --field …`` for every job kind, ``run CONFIG.yaml``, ``kinds``.

Each kind's flags are generated from its config's fields (:mod:`lab.jobkit.kinds`), so defaults, help
and checks live in one place: ``--data-files a.jsonl b.jsonl`` for a list, ``--no-completion-only``
for a switch, YAML text for a nested field (``cft --training '{epochs: 1, method: lora}'``). A flag
not given keeps the config's default. ``evaluate`` runs in the foreground with a progress bar and
prints its metrics; the other kinds run as the job system runs them (:func:`lab.jobkit.worker.run`) in
``--out``, and ``run PIPELINE.yaml`` runs a pipeline's stages one after the other in it
(:mod:`lab.jobkit.pipeline`). Bad input (unknown dataset or model, malformed file, wrong option)
ends with one line on stderr and exit code 2, running out of memory with exit code 3; only a bug
in the lab itself shows a traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

from lab.core.config import ConfigError, unwrap_optional
from lab.core.errors import USER_ERRORS
from lab.core.layout import CONFIG_FILE, JOB_FILE, METRICS_FILE, PREDICTIONS_FILE, RUN_DIR_NAME, STORE_FILE
from lab.core.yamlio import load_yaml
from lab.jobkit import chain, kinds
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import evaluate

SUMMARY_KEYS = ("n", "accuracy", "ece", "cw_ece", "mce", "brier", "nll", "trust")


def _flag_kwargs(hint: Any, help_text: str) -> dict[str, Any]:
    """How argparse reads one field; the config's validator checks the value afterwards."""
    hint, _ = unwrap_optional(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    kwargs: dict[str, Any] = {"help": help_text, "default": argparse.SUPPRESS}
    if origin is list and args and typing.get_origin(args[0]) is not dict and args[0] is not dict:
        inner = args[0]
        kwargs.update(nargs="+", type=inner if inner in (int, float) else str)
    elif origin in (list, dict):
        kwargs.update(type=lambda text: load_yaml(text, "flag"), metavar="YAML")
    elif origin is typing.Literal:
        kwargs.update(choices=args)
    elif hint is bool:
        kwargs.update(action=argparse.BooleanOptionalAction)
    elif hint in (int, float):
        kwargs.update(type=hint)
    return kwargs


def _add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        help_text = f"{f.metadata.get('help', '')} (default: {default!r})".replace("%", "%%")
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **_flag_kwargs(hints[f.name], help_text))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab", description="Calibration Lab command line")
    sub = parser.add_subparsers(dest="command", required=True)
    for kind in kinds.all_kinds():
        sp = sub.add_parser(kind.name, help=kind.description)
        _add_config_flags(sp, kind.config)
        sp.add_argument("--out", type=Path, default=None, help=f"run directory (default: runs/{kind.name}-<time>)")
    rn = sub.add_parser("run", help="run a job config (YAML with `kind` and its fields), as the job system does, "
                                    "or a pipeline file's stages one after the other")
    rn.add_argument("config", type=Path)
    rn.add_argument("--out", "--run-dir", dest="run_dir", type=Path, default=None,
                    help="run directory (default: runs/<config name>-<time>)")
    sub.add_parser("kinds", help="the job kinds as a Markdown table (the README's)")
    return parser


def kinds_table() -> str:
    """One row per registered kind: what it does, its config class, what its run directory holds."""
    rows = ["| kind | what it does | config | run directory |", "|---|---|---|---|"]
    for kind in kinds.all_kinds():
        outputs = ", ".join(f"`{o}`" for o in kind.outputs)
        rows.append(f"| `{kind.name}` | {kind.description} | `{kind.config.__module__}.{kind.config.__name__}` | "
                    f"{outputs} |")
    return "\n".join(rows)


def _progress_bar(total: int):
    from tqdm import tqdm

    bar = tqdm(total=total, file=sys.stderr, unit="q", desc="scoring", dynamic_ncols=True)
    return bar.update


def _evaluate(cfg: EvalConfig, out: Path) -> int:
    """Foreground evaluation: a progress bar on stderr, the headline metrics on stdout."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # ours is the one progress bar on stderr
    try:
        result = evaluate(cfg, out, progress_factory=_progress_bar, log=lambda m: print(m, file=sys.stderr))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, torch.OutOfMemoryError):
        print(f"error: out of memory at --batch-size {cfg.batch_size}; lower it (or use a smaller "
              "--dtype such as bfloat16 on a GPU)", file=sys.stderr)
        return 3
    print(" ".join(f"{k}={result[k]:.4f}" if isinstance(result[k], float) else f"{k}={result[k]}"
                   for k in SUMMARY_KEYS))
    print(f"wrote {out}/{METRICS_FILE} and {out}/{PREDICTIONS_FILE}", file=sys.stderr)
    return 0


def _store_jobs(folder: Path) -> list[str]:
    """What makes ``folder`` a job store's: its ``jobs.db`` and the run folders of jobs queued in it
    (those with a ``job.json``); empty for any other folder."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return []
    jobs = [e for e in entries if RUN_DIR_NAME.fullmatch(e) and (folder / e / JOB_FILE).is_file()]
    return [STORE_FILE] * (STORE_FILE in entries) + jobs


def _in_store(out: Path, config: Optional[Path]) -> Optional[str]:
    """Why ``out`` must not take a foreground run, or None. A store numbers its jobs' folders itself;
    a run written among them (a pipeline's ``00001-<kind>``, or ``--out runs/00007-evaluate``) would
    take a job's id, and a rebuilt store would find two folders of one job. A job's own folder (it
    holds its ``job.json``) is where the scheduler runs its worker."""
    held = _store_jobs(out)
    where = out
    if not held and RUN_DIR_NAME.fullmatch(out.name) and not (out / JOB_FILE).is_file():
        held, where = _store_jobs(out.parent), out.parent
    if not held:
        return None
    queue = f"python -m jobs --root {where} submit {config or 'CONFIG.yaml'}"
    return (f"--out {out}: {where} is a job store's folder (it holds {', '.join(held[:3])}"
            f"{', …' if len(held) > 3 else ''}), which numbers its run folders itself; queue the job there "
            f"instead ({queue}), or give --out a folder outside it")


def _pipeline(path: Path, out: Path) -> Optional[int]:
    """A pipeline file (:mod:`lab.jobkit.pipeline`) run stage after stage in ``out``; None when ``path``
    is one job's config (or unreadable: the worker says why, as for any config)."""
    from lab.jobkit import pipeline

    try:
        data = load_yaml(path.read_bytes(), str(path))
    except (OSError, ConfigError):
        return None
    if not pipeline.is_pipeline(data):
        return None
    try:
        stages = pipeline.parse_pipeline(data, runs=out)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return pipeline.run_here(stages, out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = vars(build_parser().parse_args(argv))
    command, stamp = args.pop("command"), time.strftime("%Y%m%d-%H%M%S")
    if command == "kinds":
        print(kinds_table())
        return 0
    from lab.jobkit.worker import run

    if command == "run":
        out = args["run_dir"] or Path("runs") / f"{args['config'].stem}-{stamp}"
        problem = _in_store(out, args["config"])
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        stages = _pipeline(args["config"], out)
        return run(args["config"], out) if stages is None else stages
    out = args.pop("out") or Path("runs") / f"{command}-{stamp}"
    problem = _in_store(out, None)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        kind, cfg = kinds.parse_config({"kind": command, **args}, runs=out.parent)  # run:<id>: a job beside it
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if command == "evaluate" and not chain.references(kind.config, cfg.to_dict()):  # else the worker resolves them
        return _evaluate(cfg, out)
    kinds.write_config(out, kind, cfg)
    return run(out / CONFIG_FILE, out)
