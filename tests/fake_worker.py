"""A stand-in worker (and server) for the job-system tests: real processes, no model.

    python tests/fake_worker.py RUN_DIR MODE          a worker; MODE below
    python tests/fake_worker.py --serve ROOT MODE     a scheduler whose jobs are MODE workers
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.core.events import EventWriter  # noqa: E402


def result(run_dir: Path, status: str, error=None) -> None:
    (run_dir / "result.json").write_text(json.dumps({"status": status, "error": error}))


def work(run_dir: Path, mode: str) -> int:
    events = EventWriter(run_dir / "events.jsonl")
    events.emit("start", pid=os.getpid())
    if mode == "ok":
        for step in range(1, 4):
            events.emit("train", step=step, total=3, loss=1.0 / step)
            time.sleep(0.1)
        result(run_dir, "succeeded")
        return 0
    if mode == "crash":
        print("Traceback (most recent call last):\nRuntimeError: boom in step 3", file=sys.stderr)
        return 1
    if mode == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", file=sys.stderr)
        return 1
    if mode.startswith("sleep"):
        time.sleep(float(mode[5:]))
        result(run_dir, "succeeded")
        return 0
    if mode == "cooperative":  # stops at the flag and saves what it has
        while not (run_dir / "STOP").exists():
            time.sleep(0.05)
        (run_dir / "partial.txt").write_text("saved")
        result(run_dir, "cancelled", "stopped by request")
        return 130
    if mode == "stubborn":  # ignores the flag and SIGTERM, with a grandchild: needs SIGKILL on the tree
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        (run_dir / "child.pid").write_text(str(child.pid))
        time.sleep(600)
    raise SystemExit(f"unknown mode {mode}")


def serve(root: Path, mode: str) -> None:
    from jobs.scheduler import Scheduler
    from jobs.store import JobStore

    launcher = lambda job, launch: [sys.executable, __file__, job.run_dir, mode]  # noqa: E731
    Scheduler(JobStore(root), gpus=[], launcher=launcher).run_forever(threading.Event(), interval=0.1)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(Path(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(work(Path(sys.argv[1]), sys.argv[2]))
