"""Start queued jobs when their devices are free, watch them, and record how they ended.

Jobs run as their own sessions with output going to ``log.txt`` in their run directory, so they
outlive the browser tab and the server. Any scheduler — the app's, ``python -m jobs serve``, or a
new one after a restart — can watch any job: the pid and its create time in the store say whether
the process is still ours, and ``result.json`` says how it ended. Claiming devices happens in one
``BEGIN IMMEDIATE`` transaction, so two schedulers (or threads) never book the same GPU twice.

Queue policy: queue order, first fit — a queued job that cannot start yet (its GPUs are busy)
does not hold back a later one that can. With no GPU, ``cpu_slots`` CPU jobs run at once (1).
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import psutil

from lab.events import EVENTS_FILE, EventWriter
from lab.run import CONFIG_FILE, RESULT_FILE, STOP_FILE
from jobs import failures, preflight
from jobs.launch import Launch, build_command, job_env, visible_gpus
from jobs.process import job_process, terminate_tree
from jobs.store import Job, JobStore

Launcher = Callable[[Job, Launch], list[str]]
STARTUP_TIMEOUT_S = 60.0  # a claimed job with no pid after this long lost its scheduler mid-start


def default_launcher(job: Job, launch: Launch) -> list[str]:
    run_dir = Path(job.run_dir)
    return build_command(run_dir / CONFIG_FILE, run_dir, launch)


def finish(store: JobStore, job: Job, returncode: Optional[int] = None) -> Optional[Job]:
    """Record how a job whose process is gone ended; None if someone else recorded it first."""
    run_dir = Path(job.run_dir)
    try:
        result = json.loads((run_dir / RESULT_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        result = None
    if result is not None:
        status, error = result["status"], result.get("error")
    elif job.cancel_requested:
        status, error = "cancelled", "stopped by request"
    else:
        status, error = "failed", failures.classify(returncode, failures.log_tail(run_dir))
    if not store.update(job.id, only_if_status=("running",), status=status, error=error, finished=time.time()):
        return None
    EventWriter(run_dir / EVENTS_FILE).emit("ended", status=status, error=error)
    return store.get(job.id)


def cancel(store: JobStore, job_id: int, grace: float = 10.0) -> Job:
    """Stop a job: a queued one at once; a running one cooperatively (``STOP`` file), then with
    SIGTERM to its whole process tree, then SIGKILL — each step waiting up to ``grace`` seconds.
    Blocks until the job has ended (at most about ``3 × grace``)."""
    job = store.get(job_id)
    if job.status == "queued" and store.update(job_id, only_if_status=("queued",), status="cancelled",
                                               error="cancelled before it started", finished=time.time()):
        return store.get(job_id)
    job = store.get(job_id)
    if job.status != "running":
        return job
    store.update(job_id, cancel_requested=1)
    Path(job.run_dir, STOP_FILE).touch()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (job.pid is None or job_process(job.pid, job.pid_started)):
        time.sleep(0.1)
        job = store.get(job_id)
    proc = job_process(job.pid, job.pid_started)
    if proc is not None:
        terminate_tree(proc, grace)
    return finish(store, store.get(job_id)) or store.get(job_id)


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
            if job_process(job.pid, job.pid_started) is None and job.id not in self.children:
                if (Path(job.run_dir) / RESULT_FILE).exists():
                    finish(self.store, job)
                else:
                    self.store.update(job.id, only_if_status=("running",), status="interrupted",
                                      error="the worker was gone when the server restarted", finished=time.time())

    def tick(self) -> None:
        self._watch()
        while self._start_next():
            pass

    def run_forever(self, stop: threading.Event, interval: float = 1.0) -> None:
        self.reconcile()
        while not stop.is_set():
            self.tick()
            stop.wait(interval)

    def _watch(self) -> None:
        for job in self.store.list(("running",)):
            popen = self.children.get(job.id)
            if popen is not None:
                returncode = popen.poll()
                if returncode is None:
                    continue
                del self.children[job.id]
                finish(self.store, job, returncode)
            elif job.pid is None:
                if job.started and time.time() - job.started > STARTUP_TIMEOUT_S:
                    self.store.update(job.id, only_if_status=("running",), status="interrupted",
                                      error="its scheduler stopped while starting it", finished=time.time())
            elif job_process(job.pid, job.pid_started) is None:
                finish(self.store, job)

    def _claim(self) -> Optional[tuple[Job, tuple[int, ...]]]:
        """Atomically pick the first queued job that fits and mark it running on its devices."""
        with self.store.transaction() as db:
            busy: set[int] = set()
            cpu_jobs = 0
            for row in db.execute("SELECT gpus, devices FROM jobs WHERE status = 'running'"):
                if row["gpus"] == 0:
                    cpu_jobs += 1
                elif row["devices"]:
                    busy.update(int(d) for d in row["devices"].split(","))
            free = [g for g in self.gpus if g not in busy]
            for row in db.execute("SELECT * FROM jobs WHERE status = 'queued' ORDER BY position").fetchall():
                job = Job(**dict(row))
                if job.gpus > len(self.gpus):
                    db.execute("UPDATE jobs SET status = 'failed', finished = ?, error = ? WHERE id = ?",
                               (time.time(), f"asked for {job.gpus} GPU(s); this server has {len(self.gpus)}", job.id))
                    continue
                if job.gpus == 0 and cpu_jobs >= self.cpu_slots or job.gpus > len(free):
                    continue
                gpus = tuple(free[: job.gpus])
                db.execute("UPDATE jobs SET status = 'running', devices = ?, started = ? WHERE id = ?",
                           (",".join(map(str, gpus)) or "cpu", time.time(), job.id))
                return job, gpus
        return None

    def _start_next(self) -> bool:
        claimed = self._claim()
        if claimed is None:
            return False
        job, gpus = claimed
        run_dir = Path(job.run_dir)
        events = EventWriter(run_dir / EVENTS_FILE)
        for warning in preflight.check(job.kind, job.config_dict, gpus):
            events.emit("warning", message=warning)
        events.emit("queued_start", devices=list(gpus) or "cpu")
        try:
            with open(run_dir / failures.LOG_FILE, "ab") as log:
                popen = subprocess.Popen(self.launcher(job, Launch(gpus=gpus)), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=job_env(gpus), start_new_session=True)
        except OSError as e:
            self.store.update(job.id, status="failed", error=f"could not start the worker: {e}", finished=time.time())
            return True
        self.children[job.id] = popen
        try:
            created = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            created = None  # already gone: _watch records how it ended
        self.store.update(job.id, pid=popen.pid, pid_started=created)
        return True
