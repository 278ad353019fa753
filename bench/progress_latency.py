"""How soon and how often an evaluate job shows progress, read from its ``events.jsonl``.

    python -m bench.progress_latency [--limit 100] [--out /tmp/progress-bench] [--reference DIR] [--repo DIR]

Runs ``python -m lab run CONFIG`` on the bundled model on the CPU (as the job system starts a
worker; letter scoring, batches of 16, fixed so that code of before and after a change runs the
same job) for BoolQ (long passages) and OpenBookQA (short questions), and prints per dataset, in
seconds from process start: the first event, the first thing the Jobs page can show (a stage or a
count), the first progress (a count of questions, or of tokens inside a batch), the first count of
questions; then the largest gap between the scoring stage's events (from its first, so a slow
first batch shows), the longest the Jobs page went without news until scoring ended, the ETA the
page showed a quarter of the way through scoring against the time scoring then really took, and
the scoring time and questions/s (``metrics.json``). ``--reference`` (an earlier ``--out``) adds the
largest difference between the two runs' probabilities and how many predictions differ: the
results must not change. ``--repo`` runs another checkout's ``lab`` (the code before a change).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from bench._harness import REPO, parser
from ui.progress import progress  # no gradio: the reader the Jobs page uses

DATA = REPO.parent / "shared" / "data"
DATASETS = {"boolq": DATA / "boolq" / "dev.jsonl", "obqa": DATA / "openbookqa" / "test.jsonl"}


def run_job(dataset: str, data_file: Path, limit: int, run_dir: Path, repo: Path = REPO) -> float:
    """Run one evaluate job in a fresh worker process; returns its start time (Unix seconds, the clock its
    events are stamped with, hence ``time.time``)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    config = run_dir.parent / f"{dataset}.yaml"
    config.write_text(f"kind: evaluate\nmodel: bundled\ndataset: {dataset}\ndata_files: ['{data_file}']\n"
                      f"split: test\nlimit: {limit}\nscoring: letter\nbatch_size: 16\ndevice: cpu\n",
                      encoding="utf-8")
    start = time.time()
    subprocess.run([sys.executable, "-m", "lab", "run", str(config), "--run-dir", str(run_dir)], cwd=repo,
                   check=True, stdout=subprocess.DEVNULL)
    return start


def latency(events: list[dict[str, Any]], start: float) -> dict[str, Optional[float]]:
    """The figures of one run from its events (seconds since ``start``)."""
    scoring = [e for e in events if e["stage"] == "scoring"]
    counted = [e for e in scoring if e.get("step", 0) > 0]
    moved = [e for e in scoring if e.get("step", 0) > 0 or e.get("tokens", 0) > 0]
    visible = [e for e in events if e["stage"] not in ("start", "log")]
    end = scoring[-1]["time"] if scoring else start
    news = [start] + [e["time"] for e in visible if e["time"] <= end]
    return {
        "first event": events[0]["time"] - start if events else None,
        "first shown": visible[0]["time"] - start if visible else None,
        "first progress": moved[0]["time"] - start if moved else None,
        "first count": counted[0]["time"] - start if counted else None,
        "largest gap": max((b["time"] - a["time"] for a, b in zip(scoring, scoring[1:])), default=None),
        "longest silence": max(b - a for a, b in zip(news, news[1:])) if len(news) > 1 else None,
        "scoring events": len(scoring),
        "ETA at 25%": _eta_at(events, 0.25),
    }


def _eta_at(events: list[dict[str, Any]], share: float) -> str:
    """The ETA shown when ``share`` of the scoring was done, and the seconds it really took then."""
    end = max(e["time"] for e in events if e["stage"] == "scoring")
    for i, event in enumerate(events):
        if event["stage"] != "scoring":
            continue
        shown = progress(events[: i + 1], now=event["time"])
        done = shown.fraction if shown.fraction is not None else shown.step / shown.total
        if done >= share and shown.eta_s is not None:
            return f"{shown.eta_s:.0f}s (took {end - event['time']:.0f}s)"
    return "none"


def compare(run_dir: Path, reference: Path) -> str:
    """Largest probability difference and differing predictions against an earlier run."""
    def rows(d: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (d / "predictions.jsonl").read_text().splitlines()]

    new, old = rows(run_dir), rows(reference)
    if [r["id"] for r in new] != [r["id"] for r in old]:
        return "different questions or order"
    diff = max(abs(a - b) for n, o in zip(new, old) for a, b in zip(n["probs"], o["probs"]))
    preds = sum(n["pred"] != o["pred"] for n, o in zip(new, old))
    return f"max |Δprob| {diff:.2e}, {preds} predictions differ"


def main() -> None:
    options = parser(__doc__, out=Path("/tmp/progress-bench"), out_help="the runs' folder")
    options.add_argument("--limit", type=int, default=100)
    options.add_argument("--reference", type=Path, default=None, help="an earlier --out to compare results with")
    options.add_argument("--repo", type=Path, default=REPO, help="the checkout whose lab runs (default: this one)")
    args = options.parse_args()
    for dataset, data_file in DATASETS.items():
        run_dir = args.out / dataset
        start = run_job(dataset, data_file, args.limit, run_dir, args.repo)
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        metrics = json.loads((run_dir / "metrics.json").read_text())
        figures = latency(events, start)
        shown = ", ".join(f"{k} {v:.1f}s" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
        print(f"{dataset} ({metrics['n']} questions): {shown}; scoring {metrics['seconds']:.1f}s "
              f"({metrics['questions_per_second']:.2f} q/s)")
        if args.reference:
            print(f"  vs {args.reference / dataset}: {compare(run_dir, args.reference / dataset)}")


if __name__ == "__main__":
    main()
