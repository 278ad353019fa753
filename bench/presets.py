"""How long each ``examples/*-quick.yaml`` preset takes, run in the foreground one at a time.

    python -m bench.presets [NAME ...] [--limit-s 480] [--out /tmp/presets-bench]
                            [--results bench/results/presets_cpu.txt]

Each preset runs as ``python -m lab run examples/NAME.yaml --out DIR`` (as a newcomer would), never
two at once. Per preset it records the wall time, the child's CPU time (user + system, from
``resource.getrusage(RUSAGE_CHILDREN)``), the 1-minute load average before and after, and the
longest stages by their events. Why both times: on a shared CPU the wall time is an upper bound
of the idle machine's, while the CPU time is what the run itself costs; on two idle cores the wall
time lies between CPU/2 (both cores busy throughout) and the CPU time (one core), so a preset whose
CPU time is under 5 minutes runs in under 5 minutes on two idle cores. A run past ``--limit-s``
(8 minutes) is stopped and marked, to be shrunk. Rows are appended to ``--results`` as they come,
under the command and machine of the session, so a long session keeps what it measured.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._harness import REPO, RESULTS, Timer, Transcript, parser, write_result

EXAMPLES = REPO / "examples"
HEADER = (f"{'preset':<22} {'rc':>4} {'wall':>8} {'cpu':>8} {'cpu/wall':>8} {'load before':>11} "
          f"{'load after':>10}  longest stages (s)")


def quick_presets() -> list[str]:
    """Every ``*-quick`` example, by name, in file order."""
    return [path.stem for path in sorted(EXAMPLES.glob("*-quick.yaml"))]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def longest_stages(run_dir: Path, n: int = 4) -> list[tuple[str, float]]:
    """Seconds between each event and the next, summed by the earlier event's stage (its name for
    an announced stage): where a preset spends its time, to know what to shrink. Reads every
    ``events.jsonl`` under ``run_dir`` (a pipeline keeps one per stage)."""
    spent: dict[str, float] = {}
    for path in run_dir.rglob("events.jsonl"):
        events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for a, b in zip(events, events[1:]):
            name = str(a.get("name") or a.get("stage"))
            spent[name] = spent.get(name, 0.0) + b["time"] - a["time"]
    return sorted(spent.items(), key=lambda item: -item[1])[:n]


def run_preset(name: str, out: Path, limit_s: float) -> dict[str, Any]:
    """Run one preset to its end (or ``limit_s``); its times, load and longest stages."""
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    load_before, cpu_before, timer = os.getloadavg()[0], children_cpu_s(), Timer()
    command = [sys.executable, "-m", "lab", "run", str(EXAMPLES / f"{name}.yaml"), "--out", str(run_dir)]
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{name}.stderr").open("w", encoding="utf-8") as stderr:  # a failure's cause, kept to read
        try:
            rc = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
                                timeout=limit_s).returncode
        except subprocess.TimeoutExpired:  # subprocess.run kills and reaps the child
            rc = "stop"
    return {"preset": name, "rc": rc, "wall_s": timer.seconds, "cpu_s": children_cpu_s() - cpu_before,
            "load_before": load_before, "load_after": os.getloadavg()[0],
            "stages": longest_stages(run_dir) if run_dir.exists() else []}


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def row(r: dict[str, Any]) -> str:
    stages = ", ".join(f"{name} {seconds:.0f}" for name, seconds in r["stages"])
    return (f"{r['preset']:<22} {r['rc']!s:>4} {minutes(r['wall_s']):>8} {minutes(r['cpu_s']):>8} "
            f"{r['cpu_s'] / r['wall_s']:>8.2f} {r['load_before']:>11.2f} {r['load_after']:>10.2f}  {stages}")


def main() -> None:
    options = parser(__doc__, out=Path("/tmp/presets-bench"), out_help="the presets' run folders")
    options.add_argument("names", nargs="*", help="presets to run (default: every examples/*-quick.yaml)")
    options.add_argument("--limit-s", type=float, default=480.0, help="stop a preset after this many seconds")
    options.add_argument("--results", type=Path, default=RESULTS / "presets_cpu.txt",
                         help="the results file, appended to")
    args = options.parse_args()
    names = args.names or quick_presets()
    unknown = sorted(set(names) - set(quick_presets()))
    if unknown:
        options.error(f"no such -quick preset: {', '.join(unknown)}; expected some of {', '.join(quick_presets())}")
    earlier = args.results.read_text(encoding="utf-8") if args.results.is_file() else ""
    report = Transcript()
    report.print(f"# {time.strftime('%Y-%m-%d %H:%M')} · {platform.machine()}, {os.cpu_count()} CPUs "
                 f"(shared: load averages beside each run) · python -m lab run examples/NAME.yaml", HEADER)
    write_result(args.results, report.lines, kept=earlier)
    for name in names:
        report.print(row(run_preset(name, args.out, args.limit_s)))
        write_result(args.results, report.lines, kept=earlier)


if __name__ == "__main__":
    main()
