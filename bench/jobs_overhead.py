"""Job-system overheads: submit → the worker's first event, the cost of one UI poll, and what a job's metrics add
to its start-up.

    python -m bench.jobs_overhead [--out bench/results/jobs_overhead_cpu.txt]

1. Time from ``JobStore.submit`` to the worker's ``start`` event, with a scheduler ticking every
   20 ms, for the real worker (``python -m lab run``), against a baseline measured in the same
   run: starting a bare ``python -c pass``.
2. One UI poll with 100 jobs in the store and a 100,000-line event file to which 10 lines were
   appended since the last poll: list the jobs and read the new events from the saved offset;
   against the baseline of re-parsing the whole event file on every poll.
3. The CPU seconds of a fresh process that computes what every evaluation ends with (``summarize``, smooth ECE
   included, and the selective summary, AUROC included) on 200 questions, against a bare ``import numpy``, and
   against the same computation in a process that first imports what it used to: relplot's package (its plotting:
   matplotlib, seaborn, scikit-learn) and scikit-learn's metrics.
4. The CPU seconds of a fresh process that looks up a task lm-eval installs (``lm-eval:arc_easy``, as a job on it
   does at start), with lm-eval's task index read from the lab's cache, against the same with an empty cache (the
   index built from its ~14,700 YAMLs, as every such process did before the cache).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench._harness import RESULTS, Timer, Transcript, parser, timed, write_result
from jobs.scheduler import Scheduler
from jobs.store import JobStore
from lab.core.events import EventWriter, read_events
from lab.core.layout import EVENTS_FILE

CONFIG = {"kind": "evaluate", "model": "bundled", "dataset": "arc_challenge", "limit": 1}
REPEATS = 5


def first_event_seconds(store: JobStore) -> float:
    """Submit, let a scheduler start it, and time until the worker's own ``start`` event."""
    stop = threading.Event()
    scheduler = Scheduler(store, gpus=[])
    thread = threading.Thread(target=scheduler.run_forever, args=(stop, 0.02))
    timer = Timer()
    job = store.submit(CONFIG)
    thread.start()
    path = Path(job.run_dir) / EVENTS_FILE
    offset, seen = 0, None
    while seen is None:
        events, offset = read_events(path, offset)
        seen = next((timer.seconds for e in events if e["stage"] == "start"), None)
        time.sleep(0.002)
    stop.set()
    thread.join()
    subprocess.run([sys.executable, "-m", "jobs", "--root", str(store.root), "cancel", str(job.id), "--grace", "2"],
                   capture_output=True, check=True)
    return seen


def bare_python_seconds() -> float:
    return timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))


METRICS = ("import numpy as np; from lab.calibration import metrics, selective; rng = np.random.default_rng(0); "
           "p = rng.dirichlet(np.ones(4), 200); y = rng.integers(0, 4, 200); metrics.summarize(p, y); "
           "pred, conf = metrics.predictions(p); selective.summary(conf, pred == y)")
BASELINE = "import numpy"
BEFORE = f"import relplot; from sklearn.metrics import roc_auc_score; {METRICS}"


LOOKUP = "from lab.data import harness; harness.manager('arc_easy', None)"
INDEX_REPEATS = 3  # each cold lookup costs 6 s or more


def cpu_seconds(code: str, cache: Path | None = None) -> float:
    """User + system CPU of a fresh ``python -c code`` run from the checkout (with the lab's cache in ``cache``)."""
    env = {**os.environ, **({"CALIBRATION_LAB_CACHE": str(cache)} if cache else {})}
    before = os.times()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1], env=env)
    after = os.times()
    return after.children_user + after.children_system - before.children_user - before.children_system


def poll_costs(root: Path) -> tuple[float, float]:
    store = JobStore(root / "poll")
    for _ in range(100):
        store.submit(CONFIG)
    path = root / "big" / EVENTS_FILE
    path.parent.mkdir()
    writer = EventWriter(path)
    with open(path, "w") as f:
        for step in range(100_000):
            f.write(f'{{"time": {time.time():.3f}, "stage": "train", "step": {step}, "loss": {1 / (step + 1):.6f}}}\n')
    _, offset = read_events(path)
    incremental, full = [], []
    for _ in range(20):
        for step in range(10):
            writer.emit("train", step=step, loss=0.1)
        timer = Timer()
        store.list()
        _, offset = read_events(path, offset)
        incremental.append(timer.seconds)
        timer = Timer()
        store.list()
        read_events(path, 0)
        full.append(timer.seconds)
    return statistics.median(incremental), statistics.median(full)


def main() -> None:
    args = parser(__doc__, out=RESULTS / "jobs_overhead_cpu.txt").parse_args()
    report = Transcript()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = JobStore(root / "latency")
        first = [first_event_seconds(store) for _ in range(REPEATS)]
        bare = [bare_python_seconds() for _ in range(REPEATS)]
        median_first, median_bare = statistics.median(first), statistics.median(bare)
        report.print(f"submit -> worker's first event: median {median_first * 1000:.0f} ms over {REPEATS} "
                     f"(bare `python -c pass`: {median_bare * 1000:.0f} ms; ratio {median_first / median_bare:.1f}x)")
        incremental, full = poll_costs(root)
        report.print(f"one UI poll, 100 jobs + 100k-line events, 10 new lines: {incremental * 1000:.2f} ms "
                     f"(re-parsing the whole file: {full * 1000:.1f} ms; {full / incremental:.0f}x slower)")
    runs = {name: statistics.median(cpu_seconds(code) for _ in range(REPEATS))
            for name, code in (("metrics", METRICS), ("baseline", BASELINE), ("before", BEFORE))}
    report.print(f"a fresh process computing an evaluation's metrics: {runs['metrics']:.2f} s of CPU, median of "
                 f"{REPEATS} (a bare `import numpy`: {runs['baseline']:.2f} s; the same after importing relplot's "
                 f"package and scikit-learn's metrics, as the metrics did before: {runs['before']:.2f} s)")
    with tempfile.TemporaryDirectory() as tmp:
        cold = [cpu_seconds(LOOKUP, Path(tmp) / f"empty{i}") for i in range(INDEX_REPEATS)]
        warm = [cpu_seconds(LOOKUP, Path(tmp) / "empty0") for _ in range(INDEX_REPEATS)]
    report.print(f"a fresh process looking up lm-eval:arc_easy: {statistics.median(warm):.2f} s of CPU with lm-eval's "
                 f"task index in the lab's cache, {statistics.median(cold):.2f} s with an empty cache (the index "
                 f"built), medians of {INDEX_REPEATS}")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
