"""A lost or broken job store: rebuilt from the run directories, never renumbered over them (issue 30, S4)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.store import DB_FILE, JobStore, StoreError
from lab.core.events import START
from lab.core.layout import CONFIG_FILE, EVENTS_FILE, RESULT_FILE

CONFIG = {"kind": "evaluate", "model": "bundled", "limit": 5}


def _lose_the_store(root: Path) -> None:
    for name in (DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm"):
        (root / name).unlink(missing_ok=True)


@pytest.mark.unit
def test_a_lost_store_is_rebuilt_from_the_run_folders_and_new_jobs_take_new_ids(tmp_path):
    root = tmp_path / "runs"
    store = JobStore(root)
    done, queued = store.submit(CONFIG), store.submit(CONFIG, gpus=0, processes=1)
    (Path(done.run_dir) / RESULT_FILE).write_text(json.dumps({"status": "succeeded", "error": None}))
    (Path(done.run_dir) / "metrics.json").write_text('{"accuracy": 0.5}')
    _lose_the_store(root)
    jobs = {job.id: job for job in store.list()}  # the same object: every call opens the file again
    assert sorted(jobs) == [done.id, queued.id]
    assert (jobs[done.id].status, jobs[queued.id].status) == ("succeeded", "queued")
    assert jobs[done.id].config == done.config and jobs[done.id].run_dir == done.run_dir
    new = store.submit(CONFIG)
    assert new.id == queued.id + 1 and new.run_dir not in (done.run_dir, queued.run_dir)
    assert (Path(done.run_dir) / "metrics.json").read_text() == '{"accuracy": 0.5}'


@pytest.mark.unit
def test_a_new_job_never_takes_the_id_or_folder_of_a_run_the_store_does_not_know(tmp_path):
    root = tmp_path / "runs"
    store = JobStore(root)
    store.submit(CONFIG)
    stray = root / "00007-evaluate"  # copied in from elsewhere, or left by a store that was replaced
    stray.mkdir()
    (stray / CONFIG_FILE).write_text("kind: evaluate\n")
    (stray / "metrics.json").write_text("old")
    job = store.submit(CONFIG)
    assert job.id == 8 and (stray / "metrics.json").read_text() == "old"


@pytest.mark.e2e
def test_the_rebuilt_store_keeps_a_running_job_running_and_an_orphan_interrupted(tmp_path):
    root = tmp_path / "runs"
    store = JobStore(root)
    alive, dead = store.submit(CONFIG), store.submit(CONFIG)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", alive.run_dir])
    try:
        time.sleep(0.2)
        for job, pid in ((alive, worker.pid), (dead, 2**22 + 17)):
            (Path(job.run_dir) / EVENTS_FILE).write_text(
                json.dumps({"time": time.time(), "stage": START, "pid": pid}) + "\n")
        _lose_the_store(root)
        rebuilt = {job.id: job for job in store.list()}
        assert (rebuilt[alive.id].status, rebuilt[alive.id].pid) == ("running", worker.pid)
        assert rebuilt[dead.id].status == "interrupted" and "rebuilt" in rebuilt[dead.id].error
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_store_sqlite_cannot_read_stops_with_what_to_do(tmp_path, capsys):
    from jobs.cli import main as jobs_cli

    root = tmp_path / "runs"
    root.mkdir()
    (root / DB_FILE).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"cannot be read .* Move it aside \(mv .*jobs.db .*jobs.db.broken\)"):
        JobStore(root)
    assert jobs_cli(["--root", str(root), "list"]) == 2
    assert "Move it aside" in capsys.readouterr().err
    assert (root / DB_FILE).read_bytes().startswith(b"this is not a database")  # left for the user to look at
    result = subprocess.run([sys.executable, "app.py", "--runs", str(root), "--port", "0"], capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).parents[2],
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    assert result.returncode != 0 and "Move it aside" in result.stderr and "Traceback" not in result.stderr
