"""The worker protocol: ``python -m lab run CONFIG.yaml`` runs one job config, as the job system does.

A config is YAML with ``kind`` (a registered job kind, :mod:`lab.kinds`) and that kind's fields.
The same file runs by hand, from ``python -m jobs submit`` or from the browser, and the run
directory keeps it.

The worker reports through ``events.jsonl`` and ends by writing ``result.json``
(``{"status": "succeeded" | "failed" | "cancelled", "error": …}``), so whoever watches the job —
the scheduler that started it, or one started after a server restart — learns how it ended from
files rather than from being its parent. It stops cooperatively when ``STOP`` appears in its run
directory. Exit codes: 0 done, 2 the user's input was refused, 3 out of memory, 130 stopped;
anything else is a bug in the lab and keeps its traceback in the log.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from lab.errors import USER_ERRORS, Stopped
from lab.events import EventWriter
from lab.files import write_atomic
from lab.kinds import config_text, load_config
from lab.layout import CONFIG_FILE, EVENTS_FILE, RESULT_FILE, STOP_FILE

PROGRESS_EVERY_S = 1.0  # at most one progress event a second: the UI polls, it need not see every batch


class JobContext:
    """What a running job may use: its directory, its event stream, the stop flag."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.events = EventWriter(self.run_dir / EVENTS_FILE)

    def should_stop(self) -> bool:
        return (self.run_dir / STOP_FILE).exists()

    def log(self, message: str) -> None:
        self.events.emit("log", message=message)

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


def _write_result(run_dir: Path, status: str, error: Optional[str] = None) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    write_atomic(run_dir / RESULT_FILE, json.dumps({"status": status, "error": error}) + "\n")


def run(config_path: Path, run_dir: Path) -> int:
    """Run a config in ``run_dir``; returns the process exit code (see the module docstring).

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
        resolved = config_text(kind, cfg)
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
    except Exception as e:  # a bug in the lab, not the user's input: say so, keep the traceback in the log
        _write_result(run_dir, "failed", f"internal error ({type(e).__name__}: {e}); the traceback is in the log")
        raise
    summary = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    ctx.events.emit("done", **summary)
    _write_result(run_dir, "succeeded")
    return 0
