"""Start queued jobs when their devices are free, watch them, and record how they ended.

Jobs run as their own sessions with output going to ``log.txt`` in their run directory, so they
outlive the browser tab and the server. Any scheduler — the app's, ``python -m jobs serve``, or a
new one after a restart — can watch any job: the pid and its create time in the store say whether
the process is still ours, and ``result.json`` says how it ended. Claiming devices happens in one
``BEGIN IMMEDIATE`` transaction, so two schedulers (or threads) never book the same GPU twice.

Queue policy: queue order, first fit — a queued job that cannot start yet (its GPUs are busy, or a
job it waits for has not succeeded yet) does not hold back a later one that can. With no GPU,
``cpu_slots`` CPU jobs run at once (1). A job that waits for one that failed, was cancelled or was
interrupted (a later stage of a chain, :meth:`jobs.store.JobStore.dependencies`) never starts: it
fails, naming that stage and saying to resume it, then this one.

Every ending goes into the job's run directory (``result.json``, :meth:`jobs.store.JobStore.end`)
before or with its row, so a store rebuilt from the folders knows it: a job cancelled while queued
is never run again. A server's store names the folders it allows, and each worker is told them
(:data:`lab.jobkit.worker.ROOTS_ENV`), whatever its run directory claims.

Nothing one job does stops the queue: an error while starting, watching or finishing a job (a run
directory that cannot be written, say) fails that job with a reason and the tick goes on; an error
in a whole tick is logged and the next tick runs; ``start_in_background`` starts a new scheduler
thread should one ever end while the server runs. Every tick ends with a heartbeat in the store, so
the Jobs page can say when no scheduler is running.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import psutil

from jobs import failures, preflight, slurm
from jobs.launch import Launch, build_command, job_env, visible_gpus
from jobs.sharding import fsdp_of
from jobs.process import job_process, reap, terminate_tree
from jobs.store import Job, JobStore, end_in
from lab.core.events import EventWriter
from lab.core.layout import CONFIG_FILE, EVENTS_FILE, RESULT_FILE, STOP_FILE
from lab.jobkit.chain import ENDINGS, ended_as
from lab.jobkit.worker import ROOTS_ENV
from lab.training.disk import free_bytes

Launcher = Callable[[Job, Launch], list[str]]
STARTUP_TIMEOUT_S = 60.0  # a claimed job with no pid after this long lost its scheduler mid-start
RESTART_AFTER_S = 1.0  # a scheduler thread that keeps dying must not spin


def default_launcher(job: Job, launch: Launch) -> list[str]:
    run_dir = Path(job.run_dir)
    return build_command(run_dir / CONFIG_FILE, run_dir, launch)


def _run_dir_reason(e: OSError, run_dir: Path) -> str:
    """What went wrong with a run directory, from the error's own fields rather than a traceback:
    ``cannot write to the run directory /x/runs/00003-evaluate: permission denied (events.jsonl)``."""
    what = e.strerror or str(e) or type(e).__name__
    reason = f"cannot write to the run directory {run_dir}: {what[:1].lower() + what[1:]}"
    path = Path(os.fsdecode(e.filename)) if e.filename is not None else run_dir
    if path == run_dir:
        return reason
    return f"{reason} ({path.relative_to(run_dir) if path.is_relative_to(run_dir) else path})"


def _write_problem(run_dir: Path) -> Optional[str]:
    """Why a worker could not write its files in ``run_dir`` (its events, a new file, any byte at all
    on a full disk), or None if it can."""
    try:
        free = free_bytes(run_dir)
    except OSError as e:
        return _run_dir_reason(e, run_dir)
    if free < failures.DISK_FULL_BYTES:
        return failures.disk_full(run_dir, free)
    try:
        with open(run_dir / EVENTS_FILE, "a", encoding="utf-8"):
            pass
    except OSError as e:
        return _run_dir_reason(e, run_dir)
    try:
        fd, probe = tempfile.mkstemp(dir=run_dir, prefix=".write-check-")
    except OSError as e:  # the probe's random name would mean nothing to a user: the directory is the news
        return _run_dir_reason(OSError(e.errno, e.strerror), run_dir)
    os.close(fd)
    os.unlink(probe)
    return None


def _emit_ended(run_dir: Path, status: str, error: Optional[str]) -> None:
    """Best effort: the store row is the record, and the run directory may be what went wrong."""
    try:
        EventWriter(run_dir / EVENTS_FILE).emit("ended", status=status, error=error)
    except OSError:
        pass


def _log_error(what: str) -> None:
    """The current exception, with its traceback, on stderr: for whoever runs the server."""
    print(f"scheduler: {what}; carrying on", file=sys.stderr, flush=True)
    traceback.print_exc(file=sys.stderr)


def finish(store: JobStore, job: Job, returncode: Optional[int] = None) -> Optional[Job]:
    """Record how a job whose process is gone ended; None if someone else recorded it first."""
    run_dir = Path(job.run_dir)
    result = ended_as(run_dir)
    if result is not None and result.get("status") in ENDINGS:
        status, error = result["status"], result.get("error")
    elif result is not None:
        status, error = "failed", f"its result.json says no status the lab records ({result.get('status')!r:.40})"
    elif job.cancel_requested:
        status, error = "cancelled", "stopped by request"
    else:
        status = "failed"
        error = _write_problem(run_dir) or failures.classify(returncode, failures.log_tail(run_dir))
    if not store.end(job.id, status, error if isinstance(error, str) else None, only_if_status=("running",)):
        return None
    _emit_ended(run_dir, status, error)
    return store.get(job.id)


def cancel(store: JobStore, job_id: int, grace: float = 10.0) -> Job:
    """Stop a job: a queued one at once; a running one cooperatively (``STOP`` file), then with
    SIGTERM to its whole process tree, then SIGKILL — each step waiting up to ``grace`` seconds.
    Blocks until the job has ended (at most about ``3 × grace``). A worker that is this process's
    child is reaped here, so it leaves no ``<defunct>`` entry even if no scheduler ticks again."""
    job = store.get(job_id)
    if job.status == "queued" and store.end(job_id, "cancelled", "cancelled before it started",
                                            only_if_status=("queued",)):
        if job.slurm_id:  # pending in Slurm's queue
            slurm.cancel(job.slurm_id)
        return store.get(job_id)
    job = store.get(job_id)
    if job.status != "running":
        return job
    store.update(job_id, cancel_requested=1)
    if job.executor == "slurm":
        return _cancel_slurm(store, job, grace)
    try:
        Path(job.run_dir, STOP_FILE).touch()
        deadline = time.monotonic() + grace
    except OSError:
        deadline = time.monotonic()  # no STOP file, no cooperative stop to wait for: on to SIGTERM
    while time.monotonic() < deadline and (job.pid is None or job_process(job.pid, job.pid_started)):
        time.sleep(0.1)
        job = store.get(job_id)
    proc = job_process(job.pid, job.pid_started)
    if proc is not None:
        terminate_tree(proc, grace)
    reap(job.pid, job.pid_started)
    return finish(store, store.get(job_id)) or store.get(job_id)


def _cancel_slurm(store: JobStore, job: Job, grace: float) -> Job:
    """A running Slurm job: ``STOP`` first (it saves what it has), then ``scancel`` (SIGTERM to every
    process of the job on every node, SIGKILL after Slurm's KillWait)."""

    def ended_within(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not (over := slurm.over(slurm.state(job.slurm_id))) and time.monotonic() < deadline:
            time.sleep(0.2)
        return over

    try:
        Path(job.run_dir, STOP_FILE).touch()
    except OSError:
        grace = 0.0
    if not ended_within(grace):
        slurm.cancel(job.slurm_id)
        ended_within(3 * grace + 30)
    return finish(store, store.get(job.id)) or store.get(job.id)


class Scheduler:
    def __init__(self, store: JobStore, gpus: Optional[list[int]] = None, cpu_slots: int = 1,
                 launcher: Launcher = default_launcher) -> None:
        if cpu_slots < 1:
            raise ValueError(f"Expected `cpu_slots` to be at least 1, but got {cpu_slots}")
        self.store = store
        self.gpus = visible_gpus() if gpus is None else list(gpus)
        self.cpu_slots = cpu_slots
        self.launcher = launcher
        self.children: dict[int, subprocess.Popen] = {}  # jobs this scheduler started: exit codes, reaping

    def reconcile(self) -> None:
        """On start: running jobs whose process is gone ended while nobody watched."""
        for job in self.store.list(("running",)):
            if job.executor == "local" and job_process(job.pid, job.pid_started) is None and job.id not in self.children:
                with self._contained(job):
                    if (Path(job.run_dir) / RESULT_FILE).exists():
                        finish(self.store, job)
                    else:
                        self.store.end(job.id, "interrupted", "the worker was gone when the server restarted",
                                       only_if_status=("running",))

    def tick(self) -> None:
        """Reap our workers, watch the others, start what fits; the heartbeat says a tick got through."""
        self._reap()
        self._watch()
        self._follow_slurm()
        while self._start_next():
            pass
        self.store.beat()

    def run_forever(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set; a tick that fails is logged, not fatal."""
        try:
            self.reconcile()
        except Exception:
            _log_error("reconciling running jobs failed")
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                _log_error("a tick failed")
            stop.wait(interval)

    @contextmanager
    def _contained(self, job: Job) -> Iterator[None]:
        """An error in handling one job fails that job, with a reason, and the tick goes on.

        A store error is no fault of the job (nor could its failure be recorded): it goes up to the tick.
        """
        try:
            yield
        except sqlite3.Error:
            raise
        except Exception as e:
            run_dir = Path(job.run_dir)
            if isinstance(e, OSError):  # the file system's answer: the reason says it all
                reason = _run_dir_reason(e, run_dir)
                print(f"scheduler: job {job.id} failed: {reason}", file=sys.stderr, flush=True)
            else:  # a bug: its traceback is for whoever runs the server
                reason = f"the scheduler failed on this job: {type(e).__name__}: {e}"
                _log_error(f"job {job.id} failed in the scheduler")
            if self.store.end(job.id, "failed", reason, only_if_status=("running",)):
                _emit_ended(run_dir, "failed", reason)

    def _reap(self) -> None:
        """Poll every worker this scheduler started, whatever the store says of its job: one that
        ended is reaped here (else it stays ``<defunct>``, say after ``cancel`` or another scheduler
        recorded it), and its job finished if nobody has yet."""
        for job_id, popen in list(self.children.items()):
            returncode = popen.poll()
            if returncode is None:
                continue
            del self.children[job_id]
            job = self.store.get(job_id)
            if job.status == "running":
                with self._contained(job):
                    finish(self.store, job, returncode)

    def _watch(self) -> None:
        """Running jobs that are not our children: started by another scheduler, or before a restart."""
        for job in self.store.list(("running",)):
            if job.id in self.children or job.executor != "local":
                continue
            with self._contained(job):
                if job.pid is None:
                    if job.started and time.time() - job.started > STARTUP_TIMEOUT_S:
                        self.store.end(job.id, "interrupted", "its scheduler stopped while starting it",
                                       only_if_status=("running",))
                elif job_process(job.pid, job.pid_started) is None:
                    finish(self.store, job)

    def _claim(self) -> Optional[tuple[Job, tuple[int, ...]]]:
        """Atomically pick the first queued job that fits and mark it running on its devices.

        A job that never will start (a job it waits for failed; more GPUs than this server has) fails
        here, saying why, in its run directory too; so does one the scheduler cannot even weigh (a
        rebuilt store's row it cannot read): the next job is weighed all the same."""
        with self.store.transaction() as db:
            busy: set[int] = set()
            cpu_jobs = 0
            for row in db.execute("SELECT gpus, devices FROM jobs WHERE status = 'running' AND executor = 'local'"):
                if row["gpus"] == 0:
                    cpu_jobs += 1
                elif row["devices"]:
                    busy.update(int(d) for d in row["devices"].split(",") if d.isdigit())
            free = [g for g in self.gpus if g not in busy]
            for row in db.execute("SELECT * FROM jobs WHERE status = 'queued' AND executor = 'local' "
                                  "ORDER BY position").fetchall():
                job = Job(**dict(row))
                try:
                    fits = self._fits(db, job, free, cpu_jobs)
                except sqlite3.Error:
                    raise
                except Exception as e:  # a bug or a damaged row: that job fails, the queue goes on
                    _log_error(f"job {job.id} failed in the scheduler")
                    end_in(db, job.id, "failed", f"the scheduler failed on this job: {type(e).__name__}: {e}")
                    continue
                if fits is None:
                    continue
                on = ",".join(map(str, fits)) or ("cpu" if job.processes == 1 else f"cpu x{job.processes}")
                db.execute("UPDATE jobs SET status = 'running', devices = ?, started = ? WHERE id = ?",
                           (on, time.time(), job.id))
                return job, fits
        return None

    def _fits(self, db: sqlite3.Connection, job: Job, free: list[int], cpu_jobs: int) -> Optional[tuple[int, ...]]:
        """The GPUs ``job`` starts on now (empty: a CPU job), or None when it cannot start yet; a job
        that never will is ended here, in ``db``'s transaction."""
        ready, never = self.store.dependencies(job, db)
        if never:
            end_in(db, job.id, "failed", never)
            return None
        if not ready:  # an earlier stage is queued or running: a later job that fits goes first
            return None
        if job.gpus > len(self.gpus):
            end_in(db, job.id, "failed", f"asked for {job.gpus} GPU(s); this server has {len(self.gpus)}")
            return None
        if job.gpus == 0 and cpu_jobs >= self.cpu_slots or job.gpus > len(free):
            return None
        return tuple(free[: job.gpus])

    def _follow_slurm(self) -> None:
        """Slurm jobs: submit the queued ones (Slurm queues them, not us), and map the state Slurm
        reports onto ours — also for jobs submitted before a restart, or by another server."""
        for job in self.store.list(("queued", "running")):
            if job.executor != "slurm":
                continue
            with self._contained(job):
                if job.slurm_id is None and self._may_start(job):
                    self._submit_slurm(job)
                elif job.slurm_id:
                    self._slurm_state(job)

    def _may_start(self, job: Job) -> bool:
        """A queued Slurm job goes to Slurm once the jobs it waits for have succeeded; it fails, saying
        which and what to do, when one of them never will."""
        ready, never = self.store.dependencies(job)
        if never and self.store.end(job.id, "failed", never, only_if_status=("queued",)):
            _emit_ended(Path(job.run_dir), "failed", never)
        return ready

    def _submit_slurm(self, job: Job) -> None:
        with self.store.transaction() as db:  # claimed: of two schedulers on one store, one submits
            if db.execute("UPDATE jobs SET slurm_id = '' WHERE id = ? AND status = 'queued' AND slurm_id IS NULL",
                          (job.id,)).rowcount != 1:
                return
        run_dir = Path(job.run_dir)
        try:
            slurm_id = slurm.submit(run_dir, slurm.parse_options(job.slurm), job.processes,
                                    fsdp_of(job.kind, job.config_dict))
        except RuntimeError as e:
            if self.store.end(job.id, "failed", str(e), only_if_status=("queued",)):
                _emit_ended(run_dir, "failed", str(e))
            return
        self.store.update(job.id, slurm_id=slurm_id, devices=slurm.describe(job.slurm, slurm_id))
        EventWriter(run_dir / EVENTS_FILE).emit("log", message=f"submitted to Slurm as job {slurm_id}")

    def _slurm_state(self, job: Job) -> None:
        now = slurm.state(job.slurm_id)
        if now is not None and now.state in slurm.PENDING:
            return
        if job.status == "queued":  # running, or ended before we saw it run
            self.store.update(job.id, only_if_status=("queued",), status="running", started=time.time())
            job = self.store.get(job.id)
        if not slurm.over(now):
            return
        run_dir = Path(job.run_dir)
        result = ended_as(run_dir)
        if now is None and result is None:
            return  # Slurm cannot be asked just now, and the job has not said how it ended: ask again
        if now is None or result is not None or job.cancel_requested:
            finish(self.store, job)
            return
        status, error = slurm.ENDED.get(now.state, ("failed", f"Slurm ended the job: {now.state} ({now.reason})"))
        if self.store.end(job.id, status, error, only_if_status=("running",)):
            _emit_ended(run_dir, status, error)

    def _start_next(self) -> bool:
        """Claim the next job that fits and start it; False when none could be claimed."""
        claimed = self._claim()
        if claimed is None:
            return False
        job, gpus = claimed
        with self._contained(job):
            self._start(job, gpus)
        return True

    def _env(self, gpus: tuple[int, ...]) -> dict[str, str]:
        """The worker's environment: its GPUs, and the folders it may read when the store is a server's
        (:data:`~lab.jobkit.worker.ROOTS_ENV`) — the server's word, not its run directory's."""
        env = job_env(gpus)
        env.pop(ROOTS_ENV, None)  # this process's own, if it is a worker itself: never passed on
        if self.store.roots is not None:
            env[ROOTS_ENV] = json.dumps(self.store.roots)
        return env

    def _start(self, job: Job, gpus: tuple[int, ...]) -> None:
        run_dir = Path(job.run_dir)
        # Not best effort, unlike ``ended``: where the scheduler cannot write, neither can the worker,
        # so the job fails now, saying why, rather than seconds into its run.
        events = EventWriter(run_dir / EVENTS_FILE)
        for warning in preflight.check(job.kind, job.config_dict, gpus):
            events.emit("warning", message=warning)
        events.emit("queued_start", devices=list(gpus) or "cpu")
        with open(run_dir / failures.LOG_FILE, "ab") as log:
            try:
                fsdp, offload = fsdp_of(job.kind, job.config_dict)
                launch = Launch(gpus=gpus, processes=1 if gpus else job.processes, fsdp=fsdp and bool(gpus),
                                fsdp_offload=offload and bool(gpus))
                popen = subprocess.Popen(self.launcher(job, launch), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self._env(gpus), start_new_session=True)
            except OSError as e:
                self.store.end(job.id, "failed", f"could not start the worker: {e}")
                return
        self.children[job.id] = popen
        try:
            created = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            created = None  # already gone: _reap records how it ended
        self.store.update(job.id, pid=popen.pid, pid_started=created)


def start_in_background(scheduler: Scheduler, stop: threading.Event, interval: float = 1.0,
                        restart_after: float = RESTART_AFTER_S) -> threading.Thread:
    """Run ``scheduler`` in a daemon thread, and start a new one whenever it ends while ``stop`` is
    unset — only something ``run_forever`` does not catch (a ``BaseException``, a bug) ends it, and
    a queue nobody serves would take jobs that never run. Returns the supervising thread, which
    ends soon after ``stop`` is set."""

    def supervise() -> None:
        while not stop.is_set():
            worker = threading.Thread(target=scheduler.run_forever, args=(stop, interval), name="scheduler",
                                      daemon=True)
            worker.start()
            worker.join()
            if not stop.is_set():
                print(f"scheduler: its thread ended; starting a new one in {restart_after:g} s",
                      file=sys.stderr, flush=True)
                stop.wait(restart_after)

    supervisor = threading.Thread(target=supervise, name="scheduler-supervisor", daemon=True)
    supervisor.start()
    return supervisor
