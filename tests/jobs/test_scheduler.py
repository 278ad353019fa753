"""The job system with real subprocesses: store, scheduler, cancel, failures, restarts, concurrency."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from jobs.scheduler import Scheduler, cancel
from jobs.store import ConfigError, JobStore
from lab.core.events import read_events
from tests.helpers import CONFIG, FAKE, fake_launcher, wait_for


@pytest.fixture
def store(tmp_path) -> JobStore:
    return JobStore(tmp_path / "runs")


@pytest.mark.e2e
def test_submit_runs_to_success_with_events(store):
    job = store.submit(CONFIG)
    assert job.status == "queued" and (Path(job.run_dir) / "config.yaml").read_text().startswith("kind: evaluate")
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: "ok"}))
    scheduler.tick()
    assert store.get(job.id).status == "running" and store.get(job.id).devices == "cpu"
    wait_for(lambda: store.get(job.id).status == "succeeded", tick=scheduler.tick)
    events, offset = read_events(Path(job.run_dir) / "events.jsonl")
    stages = [e["stage"] for e in events]
    assert stages[:2] == ["queued_start", "start"] and stages.count("train") == 3 and stages[-1] == "ended"
    assert [e["loss"] for e in events if e["stage"] == "train"] == [1.0, 0.5, 1 / 3]
    assert read_events(Path(job.run_dir) / "events.jsonl", offset) == ([], offset)


@pytest.mark.e2e
def test_two_cpu_jobs_run_one_after_the_other_in_queue_order(store):
    first, second = store.submit(CONFIG), store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({first.id: "sleep0.5", second.id: "ok"}))
    scheduler.tick()
    assert (store.get(first.id).status, store.get(second.id).status) == ("running", "queued")
    wait_for(lambda: store.get(second.id).status == "running", tick=scheduler.tick)
    assert store.get(first.id).status == "succeeded"
    assert store.get(first.id).finished <= store.get(second.id).started
    wait_for(lambda: store.get(second.id).status == "succeeded", tick=scheduler.tick)


@pytest.mark.unit
def test_reorder_and_clone(store):
    a, b, c = (store.submit(CONFIG) for _ in range(3))
    store.move(c.id, 2)
    assert [j.id for j in store.list(("queued",))] == [c.id, a.id, b.id]
    store.move(c.id, -1)
    assert [j.id for j in store.list(("queued",))] == [a.id, c.id, b.id]
    clone = store.clone(a.id)
    assert clone.id not in (a.id, b.id, c.id) and clone.config == a.config and clone.run_dir != a.run_dir


@pytest.mark.e2e
def test_cooperative_cancel_saves_partial_work(store):
    job = store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: "cooperative"}))
    scheduler.tick()
    wait_for(lambda: (Path(job.run_dir) / "events.jsonl").exists() and "start" in (Path(job.run_dir) / "events.jsonl").read_text())
    done = cancel(store, job.id, grace=5)
    assert done.status == "cancelled" and (Path(job.run_dir) / "partial.txt").read_text() == "saved"


@pytest.mark.e2e
def test_cancel_kills_the_whole_process_tree_within_the_grace_period(store):
    job = store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: "stubborn"}))
    scheduler.tick()
    child_file = Path(job.run_dir) / "child.pid"
    wait_for(child_file.exists)
    worker, child = psutil.Process(store.get(job.id).pid), psutil.Process(int(child_file.read_text()))
    grace = 1.0
    start = time.monotonic()
    done = cancel(store, job.id, grace=grace)
    assert time.monotonic() - start < 3 * grace + 1.0  # flag wait, SIGTERM (ignored), SIGKILL
    assert done.status == "cancelled"
    scheduler.tick()  # reaps our child
    for proc in (worker, child):
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE


@pytest.mark.unit
def test_cancel_a_queued_job_is_immediate(store):
    job = store.submit(CONFIG)
    assert cancel(store, job.id).status == "cancelled"
    Scheduler(store, gpus=[], launcher=fake_launcher({})).tick()  # nothing left to start
    assert store.get(job.id).status == "cancelled" and store.get(job.id).pid is None


@pytest.mark.e2e
@pytest.mark.parametrize("mode, summary", [
    ("crash", "crashed (exit code 1): RuntimeError: boom in step 3"),
    ("oom", "out of memory"),
])
def test_failures_are_summarised_from_the_log(store, mode, summary):
    job = store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: mode}))
    wait_for(lambda: store.get(job.id).status == "failed", tick=scheduler.tick)
    assert store.get(job.id).error.startswith(summary)


@pytest.mark.e2e
def test_kill_9_of_a_worker_is_a_failure_with_the_log_tail(store):
    job = store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: "sleep30"}))
    scheduler.tick()
    wait_for(lambda: "start" in (Path(job.run_dir) / "events.jsonl").read_text())
    os.kill(store.get(job.id).pid, signal.SIGKILL)
    wait_for(lambda: store.get(job.id).status == "failed", tick=scheduler.tick)
    assert store.get(job.id).error.startswith("killed (SIGKILL)")
    shown = subprocess.run([sys.executable, "-m", "jobs", "--root", str(store.root), "show", str(job.id)],
                           capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert "status: failed" in shown.stdout and "log tail:" in shown.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("worker_survives", [True, False])
def test_server_restart_keeps_or_reconciles_running_jobs(store, worker_survives):
    job = store.submit(CONFIG)
    server = subprocess.Popen([sys.executable, FAKE, "--serve", str(store.root), "sleep3"])
    try:
        wait_for(lambda: store.get(job.id).pid is not None)
        worker = psutil.Process(store.get(job.id).pid)
    finally:
        server.kill()  # the server dies abruptly; the job is its own session and lives on
        server.wait()
    assert worker.is_running()
    if not worker_survives:
        worker.kill()
        worker.wait()
    restarted = Scheduler(store, gpus=[], launcher=fake_launcher({}))
    restarted.reconcile()
    if worker_survives:
        assert store.get(job.id).status == "running"
        wait_for(lambda: store.get(job.id).status == "succeeded", tick=restarted.tick)
    else:
        assert store.get(job.id).status == "interrupted"


@pytest.mark.unit
def test_malformed_config_is_refused_with_the_field_and_changes_nothing(store):
    store.submit(CONFIG)
    before = (store.list(), sorted(p.name for p in store.root.iterdir()))
    for bad, field in [({**CONFIG, "bins": 0}, "bins"), ({**CONFIG, "modle": "x"}, "modle"),
                       ({**CONFIG, "dataset": "arc"}, "dataset"), ({"model": "bundled"}, "kind")]:
        with pytest.raises(ConfigError, match=field):
            store.submit(bad)
    with pytest.raises(ConfigError, match="gpus"):
        store.submit(CONFIG, gpus=-1)
    assert (store.list(), sorted(p.name for p in store.root.iterdir())) == before


@pytest.mark.e2e
def test_concurrent_submits_and_schedulers_never_double_book_a_gpu(store):
    errors = []

    def submit_many():
        try:
            for _ in range(15):
                store.submit(CONFIG, gpus=1)
        except Exception as e:  # noqa: BLE001 - any error is the failure we look for
            errors.append(e)

    threads = [threading.Thread(target=submit_many) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs = store.list()
    assert not errors and len({j.id for j in jobs}) == 30 and len({j.run_dir for j in jobs}) == 30
    assert len({j.position for j in jobs}) == 30
    for job in jobs[4:]:
        store.update(job.id, status="cancelled")  # keep four to run
    modes = {j.id: "sleep0.3" for j in jobs}
    schedulers = [Scheduler(store, gpus=[0], launcher=fake_launcher(modes)) for _ in range(2)]
    overlap = []
    stop = threading.Event()

    def drive(s):
        while not stop.is_set():
            s.tick()
            running = store.list(("running",))
            if len(running) > 1:
                overlap.append([j.id for j in running])

    drivers = [threading.Thread(target=drive, args=(s,)) for s in schedulers]
    for d in drivers:
        d.start()
    try:
        wait_for(lambda: all(store.get(j.id).status == "succeeded" for j in jobs[:4]), timeout=30)
    finally:
        stop.set()
        for d in drivers:
            d.join()
    assert overlap == []


@pytest.mark.e2e
def test_a_job_asking_for_more_gpus_than_exist_fails_at_once(store):
    job = store.submit(CONFIG, gpus=2)
    Scheduler(store, gpus=[0], launcher=fake_launcher({})).tick()
    assert store.get(job.id).status == "failed" and "asked for 2 GPU(s); this server has 1" in store.get(job.id).error


@pytest.mark.model
@pytest.mark.e2e
def test_a_real_evaluate_job_end_to_end(store, shared_data):
    config = {**CONFIG, "data_files": [str(shared_data / "arc_challenge" / "test.jsonl")], "limit": 4}
    job = store.submit(config)
    scheduler = Scheduler(store, gpus=[])
    wait_for(lambda: store.get(job.id).status not in ("queued", "running"), timeout=240, step=0.5, tick=scheduler.tick)
    assert store.get(job.id).status == "succeeded", (Path(job.run_dir) / "log.txt").read_text()[-2000:]
    metrics = json.loads((Path(job.run_dir) / "metrics.json").read_text())
    assert metrics["n"] == 4
    events, _ = read_events(Path(job.run_dir) / "events.jsonl")
    assert {"start", "scoring", "done", "ended"} <= {e["stage"] for e in events}


TORCHRUN_TAIL = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
lab FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_17:51:23
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 16136)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 16136
============================================================"""


@pytest.mark.unit
def test_a_dead_rank_is_named_and_a_specific_cause_still_wins():
    from jobs.failures import classify

    assert classify(1, TORCHRUN_TAIL) == ("rank 1 of the multi-process launch died, killed (SIGKILL): by a user, or by "
                                          "the operating system when memory ran out; the launcher stopped the other ranks")
    oom = "[rank1]: torch.OutOfMemoryError: CUDA out of memory.\n" + TORCHRUN_TAIL
    assert classify(1, oom).startswith("rank 1: out of memory")
    assert classify(1, TORCHRUN_TAIL.replace("-9 (pid", "3 (pid")).startswith("rank 1 of the multi-process launch "
                                                                               "died, exit code 3")


@pytest.mark.unit
def test_resume_requeues_an_ended_job_in_its_own_directory_and_refuses_others(store):
    job = store.submit(CONFIG)
    with pytest.raises(ValueError, match="is queued; only a failed, cancelled, interrupted job can be resumed"):
        store.resume(job.id)
    run_dir = Path(job.run_dir)
    (run_dir / "result.json").write_text('{"status": "failed"}')
    (run_dir / "STOP").touch()
    store.update(job.id, status="failed", error="killed", finished=time.time(), pid=123)
    other = store.submit(CONFIG)
    resumed = store.resume(job.id)
    assert (resumed.status, resumed.run_dir, resumed.error, resumed.pid) == ("queued", job.run_dir, None, None)
    assert [j.id for j in store.list(("queued",))] == [other.id, job.id], "back of the queue"
    assert not (run_dir / "result.json").exists() and not (run_dir / "STOP").exists()
    with pytest.raises(KeyError):
        store.resume(999)


@pytest.mark.unit
def test_an_older_store_gains_the_processes_column(tmp_path):
    import sqlite3

    old = tmp_path / "runs"
    old.mkdir()
    db = sqlite3.connect(old / "jobs.db")
    db.executescript(SCHEMA_BEFORE_PROCESSES)
    db.execute("INSERT INTO jobs (kind, config, status, position, created) VALUES ('evaluate', 'kind: evaluate', "
               "'succeeded', 1, 0)")
    db.commit()
    db.close()
    store = JobStore(old)
    assert store.get(1).processes == 1 and store.get(1).status == "succeeded"


SCHEMA_BEFORE_PROCESSES = """CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,
    config TEXT NOT NULL, status TEXT NOT NULL, gpus INTEGER NOT NULL DEFAULT 0, devices TEXT,
    position REAL NOT NULL, pid INTEGER, pid_started REAL, created REAL NOT NULL, started REAL, finished REAL,
    run_dir TEXT, error TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0);"""
