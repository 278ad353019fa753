"""What an open browser tab costs the server: CPU of the app process with 120 jobs in the store.

    python -m bench.poll_cost [--seconds 30] [--app DIR]

Starts ``app.py`` on a fresh runs directory holding 120 finished jobs (one with an evaluation),
opens it in headless Chromium (Playwright), shows one page, lets it settle, and measures the
server process's CPU time over ``--seconds``: as a share of one core, for the Jobs page, the
Launch page and the Reliability page, against the baseline of the same server with no tab open
(its scheduler still ticking), measured in the same run. ``--app`` runs another checkout's
``app.py`` (e.g. a ``git worktree`` of an older commit) on the same store, for before/after.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import psutil
from playwright.sync_api import sync_playwright

from bench._app import CHROMIUM, served
from bench._harness import REPO, Timer, parser
from jobs.store import JobStore
from lab.core.events import EventWriter

JOBS = 120
SETTLE_S = 8.0
STARTUP_S = 30.0  # the server's own start-up (imports, first requests) is not what is measured


def _store(runs: Path) -> None:
    """120 finished jobs, each with a few events, and one evaluation for the Reliability page."""
    store = JobStore(runs)
    config = {"kind": "evaluate", "model": "bundled", "dataset": "obqa", "data_files": ["bundled"], "limit": 10}
    for i in range(JOBS):
        job = store.submit(config)
        events = EventWriter(Path(job.run_dir) / "events.jsonl")
        events.emit("start", pid=0)
        events.emit("scoring", step=10, total=10)
        events.emit("done", message="ok")
        status = "failed" if i % 10 == 0 else "succeeded"
        store.update(job.id, status=status, started=time.time() - 60, finished=time.time() - 30,
                     error="example failure" if status == "failed" else None)
    run = Path(job.run_dir)
    rows = [{"id": f"q{i}", "question": "?", "choices": ["a", "b"], "answer": i % 2, "probs": [0.7, 0.3], "pred": 0,
             "confidence": 0.7, "correct": i % 2 == 0} for i in range(50)]
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "metrics.json").write_text(json.dumps({"n": 50, "accuracy": 0.5, "ece": 0.2, "model": "bundled",
                                                  "dataset": "obqa", "split": "test", "scoring": "letter"}))


def _core_share(process: psutil.Process, seconds: float) -> float:
    """CPU time the server (and its threads) used per wall-clock second: 1.0 = one core busy."""
    before, timer = sum(process.cpu_times()[:2]), Timer()
    time.sleep(seconds)
    return (sum(process.cpu_times()[:2]) - before) / timer.seconds


def measure(app_dir: Path, seconds: float) -> dict[str, float]:
    """The server's share of a core: idle, then with each page open in one tab."""
    runs = Path(tempfile.mkdtemp(prefix="poll-cost-"))
    _store(runs)
    shares: dict[str, float] = {}
    with served(app_dir, runs) as (url, server):
        process = psutil.Process(server.pid)
        time.sleep(STARTUP_S)
        shares["no tab open"] = _core_share(process, seconds)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url)
            page.wait_for_selector("text=Calibration Lab", timeout=60_000)
            for tab in ("Launch", "Jobs", "Reliability"):
                page.get_by_role("tab", name=tab, exact=True).first.click()
                time.sleep(SETTLE_S)
                shares[f"{tab} page open"] = _core_share(process, seconds)
            browser.close()
    return shares


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--seconds", type=float, default=30.0, help="measuring window per page")
    options.add_argument("--app", type=Path, default=REPO, help="the checkout whose app.py is measured")
    args = options.parse_args()
    shares = measure(args.app.resolve(), args.seconds)
    idle = shares["no tab open"]
    print(f"server CPU with {JOBS} jobs in the store ({args.app.resolve()}), share of one core over {args.seconds:.0f} s:")
    for name, share in shares.items():
        ratio = f"  ({share / idle:.1f}× idle)" if idle > 0 and name != "no tab open" else ""
        print(f"  {name:<24} {100 * share:5.1f}%{ratio}")


if __name__ == "__main__":
    main()
