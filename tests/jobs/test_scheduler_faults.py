"""The scheduler under faults: unwritable run directories, a failing tick, a dying thread, zombies,
and the Jobs page's warning when no scheduler runs. Real worker processes (``fake_worker.py``), no model.

Tests may run as root, where ``chmod`` stops no write: the read-only cases then simulate the
refusal by monkeypatching, and the other cases use faults that stop root too (a file where the
run directory was, a directory where ``events.jsonl`` goes).
"""
import errno
import os
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

from jobs import scheduler as scheduler_module
from jobs.scheduler import Scheduler, cancel, start_in_background
from jobs.store import JobStore
from lab.core.events import EventWriter, read_events
from tests.helpers import CONFIG, fake_launcher, wait_for

ROOT = os.geteuid() == 0


def worker_started(run_dir: Path) -> bool:
    """The worker's own ``start`` event is in (the scheduler's ``queued_start`` comes before it)."""
    return any(e["stage"] == "start" for e in read_events(Path(run_dir) / "events.jsonl")[0])


def defunct(pids) -> list[int]:
    """Which of ``pids`` are ``<defunct>`` children of this process (only these: earlier tests' leftovers are not ours)."""
    return [c.pid for c in psutil.Process().children(recursive=True)
            if c.pid in set(pids) and c.status() == psutil.STATUS_ZOMBIE]


def refuse_writes(monkeypatch, run_dir: Path) -> None:
    """Make ``run_dir`` read-only: by mode where that binds, else (root) by failing the scheduler's writes there."""
    if not ROOT:
        run_dir.chmod(0o555)
        return
    emit, mkstemp = EventWriter.emit, tempfile.mkstemp

    def denied(path):
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def emit_or_deny(self, stage, **fields):
        if self.path.parent == run_dir:
            raise denied(self.path)
        emit(self, stage, **fields)

    def mkstemp_or_deny(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == run_dir:
            raise denied(Path(dir, ".write-check-x"))
        return mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(EventWriter, "emit", emit_or_deny)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_or_deny)


@pytest.fixture
def store(tmp_path):
    store = JobStore(tmp_path / "runs")
    yield store
    for run_dir in store.root.iterdir():  # undo chmod, so pytest can clean up
        if run_dir.is_dir():
            run_dir.chmod(0o755)


@pytest.mark.e2e
@pytest.mark.parametrize("fault", ["replaced by a file", "read-only"])
def test_a_run_directory_that_breaks_mid_job_fails_that_job_and_the_queue_goes_on(store, monkeypatch, fault):
    broken, after = store.submit(CONFIG), store.submit(CONFIG)
    run_dir = Path(broken.run_dir)
    # Root writes through a read-only mode, so there the worker just crashes and only the scheduler is refused.
    mode = "crash" if fault == "read-only" and ROOT else "sleep1"
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({broken.id: mode, after.id: "ok"}))
    scheduler.tick()
    wait_for(lambda: worker_started(run_dir))
    if fault == "replaced by a file":  # stops root too: every path inside it is now "not a directory"
        run_dir.rename(run_dir.with_name(run_dir.name + ".moved"))
        run_dir.write_text("not a directory any more")
        expected = f"cannot write to the run directory {run_dir}: not a directory (events.jsonl)"
    else:
        refuse_writes(monkeypatch, run_dir)
        expected = f"cannot write to the run directory {run_dir}: permission denied"
    wait_for(lambda: store.get(broken.id).status != "running", tick=scheduler.tick)
    assert (store.get(broken.id).status, store.get(broken.id).error) == ("failed", expected)
    wait_for(lambda: store.get(after.id).status == "succeeded", tick=scheduler.tick)
    assert store.scheduler_alive(max_age_s=5)


@pytest.mark.e2e
@pytest.mark.parametrize("fault", ["events.jsonl is a directory", "read-only"])
def test_a_run_directory_unwritable_before_the_start_fails_the_job_and_the_next_one_runs(store, monkeypatch, fault):
    broken, after = store.submit(CONFIG), store.submit(CONFIG)
    run_dir = Path(broken.run_dir)
    if fault == "events.jsonl is a directory":  # opening it for append fails for root too
        (run_dir / "events.jsonl").mkdir()
        what = "is a directory"
    else:
        refuse_writes(monkeypatch, run_dir)
        what = "permission denied"
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({broken.id: "ok", after.id: "ok"}))
    scheduler.tick()  # claims the broken job (marks it running), fails it, then starts the next
    failed = store.get(broken.id)
    assert (failed.status, failed.pid, failed.error) == \
        ("failed", None, f"cannot write to the run directory {run_dir}: {what} (events.jsonl)")
    assert failed.finished is not None and broken.id not in scheduler.children
    wait_for(lambda: store.get(after.id).status == "succeeded", tick=scheduler.tick)


@pytest.mark.e2e
def test_an_error_handling_one_job_fails_that_job_with_the_reason(store, monkeypatch):
    broken, after = store.submit(CONFIG), store.submit(CONFIG)
    check = scheduler_module.preflight.check

    def check_or_raise(kind, config, gpus):
        if not calls:
            calls.append(1)
            raise ValueError("a bug in preflight")
        return check(kind, config, gpus)

    calls: list[int] = []
    monkeypatch.setattr(scheduler_module.preflight, "check", check_or_raise)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({broken.id: "ok", after.id: "ok"}))
    scheduler.tick()
    assert store.get(broken.id).status == "failed"
    assert store.get(broken.id).error == "the scheduler failed on this job: ValueError: a bug in preflight"
    wait_for(lambda: store.get(after.id).status == "succeeded", tick=scheduler.tick)


@pytest.mark.e2e
def test_a_tick_that_raises_does_not_stop_run_forever(store, monkeypatch, capsys):
    job = store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: "ok"}))
    watch, failures = scheduler._watch, []

    def watch_once_broken():
        if not failures:
            failures.append(1)
            raise RuntimeError("the store hiccuped")
        watch()

    monkeypatch.setattr(scheduler, "_watch", watch_once_broken)
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run_forever, args=(stop, 0.02), daemon=True)
    thread.start()
    try:
        wait_for(lambda: store.get(job.id).status == "succeeded")
        assert thread.is_alive() and store.scheduler_alive(max_age_s=5)
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()
    err = capsys.readouterr().err
    assert "scheduler: a tick failed" in err and "Traceback" in err and "RuntimeError: the store hiccuped" in err


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # that thread's death is the test
def test_the_watchdog_restarts_a_scheduler_thread_that_died(store, monkeypatch):
    job = store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: "ok"}))
    tick, threads = scheduler.tick, []

    def tick_that_kills_its_thread_once():
        threads.append(threading.current_thread())
        if len(threads) == 1:
            raise SystemExit("not an Exception: run_forever lets it through, and its thread ends")
        tick()

    monkeypatch.setattr(scheduler, "tick", tick_that_kills_its_thread_once)
    stop = threading.Event()
    supervisor = start_in_background(scheduler, stop, interval=0.02, restart_after=0.05)
    try:
        wait_for(lambda: store.get(job.id).status == "succeeded")
        assert not threads[0].is_alive() and threads[-1].is_alive() and threads[-1] is not threads[0]
        assert store.scheduler_alive(max_age_s=5)
    finally:
        stop.set()
        supervisor.join(5)
    assert not supervisor.is_alive() and not threads[-1].is_alive()


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["cooperative", "sleep30"])
def test_cancel_leaves_no_zombie(store, mode):
    job = store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: mode}))
    scheduler.tick()
    wait_for(lambda: worker_started(job.run_dir))
    pid = store.get(job.id).pid
    assert cancel(store, job.id, grace=0.5).status == "cancelled"
    assert defunct([pid]) == [] and not psutil.pid_exists(pid)  # reaped by cancel, with no tick
    scheduler.tick()
    assert scheduler.children == {}


@pytest.mark.e2e
def test_a_child_whose_end_another_scheduler_recorded_is_reaped(store):
    job = store.submit(CONFIG)
    starter = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: "sleep0.2"}))
    other = Scheduler(store, gpus=[], launcher=fake_launcher({}))
    starter.tick()
    pid = store.get(job.id).pid
    wait_for(lambda: store.get(job.id).status == "succeeded", tick=other.tick)
    assert defunct([pid]) == [pid]  # the job is over in the store, but only its parent can reap it
    starter.tick()
    assert defunct([pid]) == [] and starter.children == {}


@pytest.mark.unit
def test_the_jobs_page_warns_while_no_scheduler_beats(store):
    from ui.jobs_page import scheduler_banner

    missing = scheduler_banner(store)
    assert "No scheduler is running: queued jobs will not start" in missing and "python -m jobs serve" in missing
    assert "lab-error" in missing
    store.beat()
    assert scheduler_banner(store) == ""
    with store.transaction() as db:
        db.execute("UPDATE heartbeats SET time = time - 90")
    stale = scheduler_banner(store)
    assert "No scheduler is running (last seen 1m30s ago" in stale and f"pid {os.getpid()}" in stale
