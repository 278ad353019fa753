"""``python -m lab run CONFIG.yaml``: run one job config, the way the job system runs it.

A config is YAML with ``kind`` (a registered job kind) and that kind's fields. The same file runs
by hand, from ``python -m jobs submit`` or from the browser, and the run directory keeps it.

The worker reports through ``events.jsonl`` and ends by writing ``result.json``
(``{"status": "succeeded" | "failed" | "cancelled", "error": …}``), so whoever watches the job —
the scheduler that started it, or one started after a server restart — learns how it ended from
files rather than from being its parent. It stops cooperatively when ``STOP`` appears in its
run directory. Importing this module does not import torch: the server validates configs with it.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from lab.cft.config import CftConfig
from lab.compare import CompareConfig
from lab.config import ConfigError
from lab.distill.job import ExtractConfig
from lab.errors import USER_ERRORS, Stopped
from lab.evaluate import EvalConfig, evaluate
from lab.first.config import FirstConfig
from lab.train.config import TrainConfig
from lab.events import EVENTS_FILE, EventWriter
from lab.files import write_atomic
from lab.paths import checked_config
from lab.registry import Registry, UnknownNameError
from lab.yamlio import dump_yaml, load_yaml

STOP_FILE = "STOP"
RESULT_FILE = "result.json"
CONFIG_FILE = "config.yaml"
PROGRESS_EVERY_S = 1.0  # at most one progress event a second: the UI polls, it need not see every batch


class JobContext:
    """What a running job may use: its directory, its event stream, the stop flag."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.events = EventWriter(self.run_dir / EVENTS_FILE)

    def should_stop(self) -> bool:
        return (self.run_dir / STOP_FILE).exists()

    def progress(self, stage: str) -> Callable[[int], Callable[[int], None]]:
        """A progress factory: ``factory(total)`` → ``advance(n)``, emitting throttled events."""

        def factory(total: int) -> Callable[[int], None]:
            done, last = 0, 0.0

            def advance(n: int) -> None:
                nonlocal done, last
                done += n
                if self.should_stop():
                    raise Stopped(f"stopped at {done}/{total}")
                now = time.monotonic()
                if now - last >= PROGRESS_EVERY_S or done == total:
                    self.events.emit(stage, step=done, total=total)
                    last = now

            return advance

        return factory


@dataclass(frozen=True)
class JobKind:
    name: str
    description: str
    config: type  # a dataclass with from_dict / to_dict
    run: Callable[[Any, JobContext], dict[str, Any]]


JOB_KINDS: Registry[JobKind] = Registry("job kind")


def _run_evaluate(cfg: EvalConfig, ctx: JobContext) -> dict[str, Any]:
    return evaluate(cfg, ctx.run_dir, progress_factory=ctx.progress("scoring"),
                    log=lambda m: ctx.events.emit("log", message=m))


def _run_finetune(cfg: TrainConfig, ctx: JobContext) -> dict[str, Any]:
    from lab.train.trainer import finetune  # torch and transformers: only in the worker

    result = finetune(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    return {"final_" + k: v for k, v in (result["history"] or [{}])[-1].items()} | {"n_train": result["n_train"]}


def _run_first(cfg: FirstConfig, ctx: JobContext) -> dict[str, Any]:
    from lab.first.pipeline import run_first

    report = run_first(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    return {"models": len({r["method"] for r in report["rows"]}), "temperature": report["sweep"]["best"]}


def _run_cft(cfg: CftConfig, ctx: JobContext) -> dict[str, Any]:
    from lab.cft.pipeline import run_cft

    report = run_cft(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    t = report.get("temperature") or {}
    return {"rows": len(report["win_rate"]), "temperature": t.get("temperature")}


def _run_extract(cfg: ExtractConfig, ctx: JobContext) -> dict[str, Any]:
    from lab.distill.job import run_extract

    manifest = run_extract(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    return {"sequences": manifest["n_sequences"]}


def _run_compare(cfg: CompareConfig, ctx: JobContext) -> dict[str, Any]:
    from lab.compare import compare

    report = compare(cfg, ctx.run_dir, log=lambda m: ctx.events.emit("log", message=m))
    return {"models": len(report["results"])}


JOB_KINDS.add("evaluate", JobKind("evaluate", "accuracy and calibration of a model on a dataset", EvalConfig, _run_evaluate))
JOB_KINDS.add("finetune", JobKind("finetune", "hard-label fine-tuning (full or LoRA), ECE per epoch", TrainConfig, _run_finetune))
JOB_KINDS.add("first", JobKind("first", "FIRST: teacher, top-k extraction, temperature sweep, four students, report",
                               FirstConfig, _run_first))
JOB_KINDS.add("extract", JobKind("extract", "a teacher's top-k tokens over a dataset (FIRST's concentrated knowledge), "
                                 "with the coverage curve", ExtractConfig, _run_extract))
JOB_KINDS.add("compare", JobKind("compare", "2–4 models on one question: option probabilities and generated answers",
                                 CompareConfig, _run_compare))
JOB_KINDS.add("cft", JobKind("cft", "CFT/RCFT protocol: base, temperature scaling, label smoothing, CFT, RCFT per λ, "
                             "in/out of domain, win rate, report", CftConfig, _run_cft))


def parse_config(values: Any, roots: Optional[Iterable[Path]] = None) -> tuple[JobKind, Any]:
    """Validate a config mapping and resolve the files it names; refusals name the field.

    ``roots``: the folders those files must lie in (a config from a browser); None: anywhere.
    """
    if not isinstance(values, dict):
        raise ConfigError(f"config: must be a mapping with a `kind` field (one of: {', '.join(JOB_KINDS.names())})")
    values = dict(values)
    name = values.pop("kind", None)
    if not isinstance(name, str) or name not in JOB_KINDS:
        raise ConfigError(f"kind: must be one of {', '.join(JOB_KINDS.names())}, got {name!r}")
    kind = JOB_KINDS.get(name)
    checked = checked_config(kind.config, values, roots)
    try:
        return kind, kind.config(**checked)
    except ConfigError:
        raise
    except (ValueError, UnknownNameError, FileNotFoundError) as e:  # the classes' cross-field checks
        raise ConfigError(str(e)) from None


def load_config(path: Path) -> tuple[JobKind, Any]:
    return parse_config(load_yaml(Path(path).read_bytes(), str(path)))


def _write_result(run_dir: Path, status: str, error: Optional[str] = None, **extra: Any) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    write_atomic(run_dir / RESULT_FILE, json.dumps({"status": status, "error": error, **extra}) + "\n")


def run(config_path: Path, run_dir: Path) -> int:
    """Run a config in ``run_dir``; returns the process exit code (0 ok, 2 bad input, 3 OOM, 130 stopped).

    The ``start`` event goes out before torch is imported (seconds), so a watcher knows at once
    that the worker is alive.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = JobContext(run_dir)
    ctx.events.emit("start", pid=os.getpid())
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    try:
        kind, cfg = load_config(config_path)
        resolved = dump_yaml({"kind": kind.name, **cfg.to_dict()})
        if not (run_dir / CONFIG_FILE).exists() or (run_dir / CONFIG_FILE).read_text() != resolved:
            (run_dir / CONFIG_FILE).write_text(resolved, encoding="utf-8")
        result = kind.run(cfg, ctx)
    except Stopped as e:
        ctx.events.emit("stopped", message=str(e))
        _write_result(run_dir, "cancelled", f"stopped by request ({e})")
        return 130
    except USER_ERRORS as e:
        _write_result(run_dir, "failed", f"bad input: {e}")
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, torch.OutOfMemoryError) as e:
        _write_result(run_dir, "failed", f"out of memory: {str(e).splitlines()[0] if str(e) else 'MemoryError'}")
        print(f"error: out of memory: {e}", file=sys.stderr)
        return 3
    summary = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    ctx.events.emit("done", **summary)
    _write_result(run_dir, "succeeded")
    return 0
