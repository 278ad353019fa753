"""The worker protocol: ``python -m lab run CONFIG.yaml`` runs one job config, as the job system does.

A config is YAML with ``kind`` (a registered job kind, :mod:`lab.jobkit.kinds`) and that kind's fields.
The same file runs by hand, from ``python -m jobs submit`` or from the browser, and the run
directory keeps it.

The worker reports through ``events.jsonl`` and ends by writing ``result.json``
(``{"status": "succeeded" | "failed" | "cancelled", "error": …}``), so whoever watches the job —
the scheduler that started it, or one started after a server restart — learns how it ended from
files rather than from being its parent. It stops cooperatively when ``STOP`` appears in its run
directory. A job a server's scheduler starts reads files only inside the folders that server
allows (:func:`allowed_folders`; one queued from the command line and run elsewhere, inside those
its ``job.json`` names): its config is checked against them again here, and each data file again as
it is opened (:mod:`lab.core.reads`), since a file can be swapped for a link while the job waits.
For the same reason a ``run:<id>`` (another job's weights, :mod:`lab.jobkit.chain`) is resolved
here, as the job starts, in the store whose folder holds the run directory: that job must have
succeeded by now, whatever it was when this one was queued.
Exit codes: 0 done, 2 the user's input was refused, 3 out of memory, 130 stopped;
anything else is a bug in the lab and keeps its traceback in the log.
"""
from __future__ import annotations

import bisect
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from lab.core.config import ConfigError
from lab.core.errors import USER_ERRORS, DiskFull, Stopped
from lab.core.events import START, EventWriter
from lab.core.layout import EVENTS_FILE, JOB_FILE, STOP_FILE
from lab.core.reads import restricted
from lab.jobkit.chain import resolve_start, write_result
from lab.jobkit.kinds import JobKind, load_config, runs_in, write_config
from lab.jobkit.paths import Policy, checked_config

PROGRESS_EVERY_S = 1.0  # at most one progress event a second: the UI polls, it need not see every batch


class Counter:
    """``counter(n)`` after n more of a stage's ``total`` items: throttled ``step``/``total`` events.

    It says ``step`` 0 as soon as it exists (the stage began), always says the first count and the
    last, and between them at most one event every :data:`PROGRESS_EVERY_S`. Told the work ahead
    (:meth:`weigh`), its events carry ``tokens``/``tokens_total`` too, and :meth:`within` moves
    ``tokens`` inside a batch: the UI then has news every second or two although one forward pass
    of long passages takes a minute, and an ETA that holds although the longest come first. It
    raises :class:`Stopped` when the job was asked to stop.
    """

    def __init__(self, ctx: "JobContext", stage: str, total: int) -> None:
        self.ctx, self.stage, self.total = ctx, stage, total
        self.done, self.said, self.last = 0, 0, 0.0
        self.items_at: list[int] = []  # items done when each batch ends (from weigh), from 0
        self.tokens_at: list[int] = []  # tokens done then
        self.partial = 0.0  # how far the batch in flight is, 0 to 1
        self._emit()

    def weigh(self, batches: Sequence[tuple[int, int]]) -> None:
        """The work ahead, in order: each batch's number of items and its cost in tokens."""
        if sum(n for n, _ in batches) != self.total:
            raise ValueError(f"Expected batches of {self.total} items in all, but got "
                             f"{sum(n for n, _ in batches)}")
        self.items_at = [0, *itertools.accumulate(n for n, _ in batches)]
        self.tokens_at = [0, *itertools.accumulate(t for _, t in batches)]
        self._emit()  # restates step 0 with tokens_total: the ETA's starting point

    def within(self, fraction: float) -> None:
        """The batch in flight is ``fraction`` done (a forward pass, layer by layer)."""
        if not self.tokens_at:
            return  # not weighed: a batch's share means nothing
        self.partial = max(self.partial, min(fraction, 1.0))  # a pass after the first starts again at 0
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            if self.ctx.should_stop():  # a stop need not wait for the end of a minute-long pass
                raise Stopped(f"stopped at {self.done}/{self.total}")
            self._emit()

    def __call__(self, n: int) -> None:
        self.done += n
        self.partial = 0.0
        if self.ctx.should_stop():
            raise Stopped(f"stopped at {self.done}/{self.total}")
        if self.said == 0 or self.done == self.total or time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self._emit()

    def _tokens(self) -> tuple[int, int]:
        """Tokens done: the finished batches', and with the batch in flight's share."""
        k = bisect.bisect_right(self.items_at, self.done) - 1
        inflight = self.tokens_at[k + 1] - self.tokens_at[k] if k + 1 < len(self.tokens_at) else 0
        return self.tokens_at[k], self.tokens_at[k] + round(self.partial * inflight)

    def _emit(self) -> None:
        fields = {"step": self.done, "total": self.total}
        if self.tokens_at:
            # ``tokens_settled`` leaves the batch in flight out: its share is a pass's, and cloze runs
            # more passes after the first (its options), so ``tokens`` reaches a batch's end while
            # half of its time is still to come. The share is for the page; the ETA's rate is timed
            # on finished batches (ui.progress.eta_seconds).
            settled, tokens = self._tokens()
            fields.update(tokens=tokens, tokens_total=self.tokens_at[-1], tokens_settled=settled)
        self.ctx.events.emit(self.stage, **fields)
        self.said, self.last = self.done, time.monotonic()


class JobContext:
    """What a running job may use: its directory, its event stream, the stop flag (a
    :class:`lab.jobkit.context.RunContext`, the type the kinds registry names)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.events = EventWriter(self.run_dir / EVENTS_FILE)

    def should_stop(self) -> bool:
        return (self.run_dir / STOP_FILE).exists()

    def log(self, message: str) -> None:
        self.events.emit("log", message=message)

    def announce(self, name: str) -> None:
        """A stage with no count began ("loading model bundled"): the Jobs page shows it at once."""
        self.events.stage(name)

    def progress(self, stage: str) -> Callable[[int], Counter]:
        """A progress factory: ``factory(total)`` → a :class:`Counter` of ``stage``."""
        return lambda total: Counter(self, stage, total)


def _quiet_progress_bars() -> None:
    """transformers' "Loading weights" bars would fill the job's log. The hub library reads its
    switch when imported, so the environment says it before any loading stage imports it (the
    worker no longer imports them first); a process that imported them already (jobs run in a
    test's process) is told directly."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def _out_of_memory(error: BaseException) -> bool:
    """A MemoryError or torch's OutOfMemoryError (torch looked up only if the job imported it)."""
    torch = sys.modules.get("torch")
    return isinstance(error, MemoryError) or (torch is not None and isinstance(error, torch.OutOfMemoryError))


PEER_LOST = ("Connection reset by peer", "Connection closed by peer")  # gloo's words when another rank died


def _peer_lost(error: BaseException) -> bool:
    """In a multi-process run: a collective failed because another rank died. The launcher then
    stops this rank and reports which one died first; a result written here would blame this one."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return False
    torch = sys.modules.get("torch")  # a collective ran, so torch is imported
    return (torch is not None and isinstance(error, torch.distributed.DistError)) or any(
        words in str(error) for words in PEER_LOST)


def _write_result(run_dir: Path, status: str, error: Optional[str] = None) -> None:
    if int(os.environ.get("RANK", "0")) != 0:
        return
    write_result(run_dir, status, error)


ROOTS_ENV = "CALIBRATION_LAB_ROOTS"  # the folders the server allows (JSON list), from the scheduler that starts the worker


def allowed_folders(run_dir: Path) -> Optional[list[Path]]:
    """The folders the job may read. A server's scheduler says which (:data:`ROOTS_ENV`: the folders
    the server was started with), whatever the run directory claims: a folder planted in the runs
    folder, or a rebuilt store's row, is no record of what a browser was allowed. Otherwise the
    folders the job was submitted under (``job.json``), or None: a config run by hand, or queued
    from the command line, reads anywhere."""
    given = os.environ.get(ROOTS_ENV)
    if given is not None:
        try:
            roots = json.loads(given)
        except ValueError:
            roots = None
        if not (isinstance(roots, list) and all(isinstance(r, str) for r in roots)):
            raise ConfigError(f"{ROOTS_ENV} must be a JSON list of folders, got {given!r:.80}")
        return [Path(r) for r in roots]
    try:
        roots = json.loads((run_dir / JOB_FILE).read_text(encoding="utf-8"))["roots"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:  # never read anywhere because the record of where is damaged
        raise ConfigError(f"{run_dir / JOB_FILE} is damaged ({e}); clone the job to run it again") from None
    if roots is not None and not (isinstance(roots, list) and all(isinstance(r, str) for r in roots)):
        raise ConfigError(f"{run_dir / JOB_FILE}: roots must be a list of folders; clone the job to run it again")
    return None if roots is None else [Path(r) for r in roots]


def _started(kind: JobKind, cfg: Any, ctx: JobContext, roots: Optional[list[Path]]) -> Any:
    """``cfg`` with each ``run:<id>`` replaced by the weights that job left, read now (it must have
    succeeded by now, whatever it was at submit), and checked again as any config is."""
    values = cfg.to_dict()
    if not resolve_start(kind.config, values, runs_in(ctx.run_dir.parent), ctx.run_dir, ctx.events):
        return cfg
    return kind.config.from_checked(checked_config(kind.config, values, roots))


def run(config_path: Path, run_dir: Path) -> int:
    """Run a config in ``run_dir``; returns the process exit code (see the module docstring).

    Nothing heavy is imported here: the ``start`` event goes out at once, and torch is imported by
    the job's own loading stage (seconds later), which it announces first, so a watcher knows from
    the first second that the worker is alive and what it is doing.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = JobContext(run_dir)
    ctx.events.emit(START, pid=os.getpid())
    _quiet_progress_bars()
    try:
        roots = allowed_folders(run_dir)
        # run:<id> names a job of the store whose folder holds this run's directory
        kind, cfg = load_config(config_path, roots, runs=run_dir.parent)
        write_config(run_dir, kind, cfg)  # as queued: a resumed run resolves its run:<id> again
        with restricted(Policy(roots).roots):
            result = kind.run(_started(kind, cfg, ctx, roots), ctx)
    except Stopped as e:
        ctx.events.emit("stopped", message=str(e))
        _write_result(run_dir, "cancelled", f"stopped by request ({e})")
        return 130
    except USER_ERRORS as e:  # a full disk is no bad input, and its message says so itself
        _write_result(run_dir, "failed", str(e) if isinstance(e, DiskFull) else f"bad input: {e}")
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # out of memory, or a bug in the lab (not the user's input): keep the traceback
        if _out_of_memory(e):
            _write_result(run_dir, "failed", f"out of memory: {str(e).splitlines()[0] if str(e) else 'MemoryError'}")
            print(f"error: out of memory: {e}", file=sys.stderr)
            return 3
        if _peer_lost(e):
            raise
        _write_result(run_dir, "failed", f"internal error ({type(e).__name__}: {e}); the traceback is in the log")
        raise
    summary = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    ctx.events.emit("done", **summary)
    _write_result(run_dir, "succeeded")
    return 0
