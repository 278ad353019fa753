"""What an open browser tab costs: CPU of the app process and of the browser, with 120 jobs in the store.

    python -m bench.poll_cost [--seconds 30] [--app DIR ...]

Starts ``app.py`` on a fresh runs directory holding 120 finished jobs (one with an evaluation),
opens it in headless Chromium (Playwright), shows one page, lets it settle, and measures over
``--seconds`` the CPU time of the server process and of Chromium's processes, each as a share of
one core: for the Launch, Jobs, Reliability and Case studies pages, against the baseline of the
same server with no tab open (its scheduler still ticking), measured in the same run. A page that
polls costs the browser more than the server: each poll's status updates look up every component
that any event so far has touched in the app's component tree (gradio's frontend). ``--app`` runs
each checkout's ``app.py`` (e.g. a ``git worktree`` of an older commit beside this one) on its
own copy of the same store, one after the other, for before/after in one run.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import psutil
from playwright.sync_api import sync_playwright

from bench._app import CHROMIUM, served
from bench._harness import REPO, RESULTS, Timer, Transcript, parser, write_result
from jobs.store import JobStore
from lab.core.events import EventWriter

JOBS = 120
SETTLE_S = 8.0
STARTUP_S = 30.0  # the server's own start-up (imports, first requests) is not what is measured
PAGES = ("Launch", "Jobs", "Reliability", "Case studies")


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


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    """User and system seconds of ``processes`` (one that has exited counts nothing)."""
    total = 0.0
    for process in processes:
        try:
            total += sum(process.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def _chromium() -> list[psutil.Process]:
    """Chromium's processes (browser, renderers, GPU and utility), below this process and Playwright's driver."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "chrom" in child.name() or "headless" in child.name():
                found.append(child)
        except psutil.Error:
            continue
    return found


def _core_shares(server: psutil.Process, seconds: float) -> tuple[float, float]:
    """CPU time the server (and its threads) and Chromium used per wall-clock second: 1.0 = one core busy."""
    browser = _chromium()
    before, before_browser, timer = _cpu_seconds([server]), _cpu_seconds(browser), Timer()
    time.sleep(seconds)
    return ((_cpu_seconds([server]) - before) / timer.seconds,
            (_cpu_seconds(browser) - before_browser) / timer.seconds)


def measure(app_dir: Path, seconds: float) -> dict[str, tuple[float, float]]:
    """The server's and Chromium's shares of a core: idle (no browser), then with each page open in one tab."""
    runs = Path(tempfile.mkdtemp(prefix="poll-cost-"))
    _store(runs)
    shares: dict[str, tuple[float, float]] = {}
    with served(app_dir, runs) as (url, server):
        process = psutil.Process(server.pid)
        time.sleep(STARTUP_S)
        shares["no tab open"] = _core_shares(process, seconds)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url)
            page.wait_for_selector("text=Calibration Lab", timeout=60_000)
            for tab in PAGES:
                page.get_by_role("tab", name=tab, exact=True).first.click()
                time.sleep(SETTLE_S)
                shares[f"{tab} page open"] = _core_shares(process, seconds)
            browser.close()
    return shares


def main() -> None:
    options = parser(__doc__, out=RESULTS / "poll_cost_cpu.txt")
    options.add_argument("--seconds", type=float, default=30.0, help="measuring window per page")
    options.add_argument("--app", type=Path, nargs="+", default=[REPO], help="the checkouts whose app.py is measured")
    args = options.parse_args()
    report = Transcript()
    report.print(f"{JOBS} jobs in the store; CPU as a share of one core over {args.seconds:.0f} s, server | Chromium:")
    first: dict[str, float] = {}
    for app in args.app:
        shares = measure(app.resolve(), args.seconds)
        idle = shares["no tab open"][0]
        report.print(f"  {app.resolve()}:")
        for name, (server, browser) in shares.items():
            ratio = f" ({server / idle:.1f}× idle)" if idle > 0 and name != "no tab open" else ""
            versus = f" ({browser / first[name]:.2f}× the first checkout)" if first.get(name) else ""
            first.setdefault(name, browser)
            shown = f"Chromium {100 * browser:5.1f}%{versus}" if name != "no tab open" else "no browser"
            report.print(f"    {name:<26} server {100 * server:5.1f}%{ratio:<14} | {shown}")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
