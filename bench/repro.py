"""Reproduction report of a pipeline job (FIRST or CFT/RCFT), in-domain and out-of-domain.

    python -m bench.repro --config examples/first-cpu.yaml [--out runs/first-cpu]
    python -m bench.repro --config examples/cft-cpu.yaml [--out runs/cft-cpu]

Runs the config (resuming a run directory that has finished stages), then writes
``bench/results/<kind>_repro_<device>.md``: the command, the machine, the job's report (ECE with
its 95 % bootstrap interval, accuracy and the method's own extras: FIRST's sweep, CFT's
temperature, win rate and per-epoch validation), and the wall time of each stage from the
run's events.
"""
from __future__ import annotations

import sys
from pathlib import Path

from bench._harness import REPO, RESULTS, Timer, parser, write_result
from lab.core.events import read_events
from lab.core.layout import EVENTS_FILE
from lab.jobkit.kinds import load_config
from lab.jobkit.worker import run


def stage_times(run_dir: Path) -> list[tuple[str, float]]:
    events, _ = read_events(run_dir / EVENTS_FILE)
    marks = [(e["name"], e["time"]) for e in events if e["stage"] == "stage"] + [("end", events[-1]["time"])]
    return [(name, end - start) for (name, start), (_, end) in zip(marks, marks[1:])]


def main() -> int:
    options = parser(__doc__)
    options.add_argument("--config", type=Path, required=True, help="a first or cft job config")
    options.add_argument("--out", type=Path, help="run directory (default: runs/<config name>)")
    args = options.parse_args()
    kind = load_config(args.config)[0].name
    args.out = args.out or REPO / "runs" / args.config.stem
    timer = Timer()
    code = run(args.config, args.out)
    if code != 0:
        print(f"the run failed (exit code {code}); see {args.out}/log.txt or events.jsonl", file=sys.stderr)
        return code
    import torch

    device = "gpu" if torch.cuda.is_available() else "cpu"
    lines = [
        f"# {kind.upper()} reproduction ({device})", "",
        f"{torch.get_num_threads()} CPU threads; this invocation took {timer.seconds / 60:.1f} min.", "",
        (args.out / "report.md").read_text().split("\n", 2)[2].strip(), "",
        "## Stage times", "", "| stage | minutes |", "|---|---|",
        *[f"| {name} | {seconds / 60:.1f} |" for name, seconds in stage_times(args.out)], "",
        "## Config", "", "```yaml", args.config.read_text().strip(), "```",
    ]
    target = RESULTS / f"{kind}_repro_{device}.md"
    write_result(target, lines)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
