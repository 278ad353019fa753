"""A training step in one process and in several, on this machine, with the same global batch.

    python -m bench.train_scaling [--model bundled] [--processes 1 2] [--batch 8] [--steps 12]
                                  [--out bench/results/train_scaling_cpu.txt]

Each configuration is a real ``finetune`` job run as the scheduler runs it (``python -m lab run``,
or ``accelerate launch --num_processes N`` on gloo where N > 1; the per-device batch is the
global batch / N), on the bundled OpenBookQA sample, full fine-tuning, no validation. Seconds
per optimizer step are read from the job's own step events (last minus first step time over the
steps between them), so process start-up, model loading and the final save are not counted;
it also prints the wall time of the whole job and the ratio of each configuration to one process.

What the ratio says: on a CPU the ranks share the machine's cores (accelerate gives each
cores / N threads) and gloo all-reduces the gradients through shared memory, so two processes
on one CPU are at best as fast as one; the figure measures the overhead of data-parallel
training (the all-reduce of every gradient, the duplicated model) on this machine. On GPUs each
rank has its own device and NCCL, and the step time at a fixed global batch should fall close to
1/N — that has not been measured here (no GPU was lent), see docs/gpu-checklist.md.
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from bench._harness import RESULTS, Timer, Transcript, parser, write_result
from jobs.launch import Launch, build_command, job_env
from lab.core.events import read_events
from lab.core.yamlio import dump_yaml


def run(model: str, processes: int, batch: int, steps: int, root: Path) -> tuple[float, float, float]:
    """One job: (seconds per step, wall seconds, final loss)."""
    run_dir = root / f"p{processes}"
    run_dir.mkdir()
    config = {"kind": "finetune", "model": model, "dataset": "obqa", "data_files": ["bundled"],
              "limit": batch * steps, "epochs": 1, "batch_size": batch // processes, "val_split": None,
              "device": "cpu", "learning_rate": 2e-5, "warmup_ratio": 0.0}
    (run_dir / "config.yaml").write_text(dump_yaml(config))
    argv = build_command(run_dir / "config.yaml", run_dir, Launch(processes=processes))
    timer = Timer()
    with open(run_dir / "log.txt", "wb") as log:
        code = subprocess.run(argv, env=job_env(()), stdout=log, stderr=subprocess.STDOUT).returncode
    wall = timer.seconds
    if code != 0:
        raise SystemExit(f"{processes} process(es) failed (exit {code}); see {run_dir / 'log.txt'}")
    trained = [e for e in read_events(run_dir / "events.jsonl")[0] if e["stage"] == "train" and "loss" in e]
    per_step = (trained[-1]["time"] - trained[0]["time"]) / (len(trained) - 1)
    return per_step, wall, trained[-1]["loss"]


def main() -> None:
    options = parser(__doc__, out=RESULTS / "train_scaling_cpu.txt")
    options.add_argument("--model", default="bundled")
    options.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    options.add_argument("--batch", type=int, default=8, help="global batch (examples per optimizer step)")
    options.add_argument("--steps", type=int, default=12)
    args = options.parse_args()
    if any(args.batch % n for n in args.processes):
        raise SystemExit(f"--batch {args.batch} must divide evenly among {args.processes} processes")
    with tempfile.TemporaryDirectory() as tmp:
        results = {n: run(args.model, n, args.batch, args.steps, Path(tmp)) for n in args.processes}
    base = results[args.processes[0]][0]
    report = Transcript()
    report.print(f"model {args.model}, global batch {args.batch}, {args.steps} steps, full fine-tuning, CPU",
                 f"{'processes':>9}  {'s/step':>7}  {'vs ' + str(args.processes[0]):>6}  {'job wall s':>10}  "
                 f"{'final loss':>10}")
    for n, (per_step, wall, loss) in results.items():
        report.print(f"{n:>9}  {per_step:>7.3f}  {per_step / base:>5.2f}x  {wall:>10.1f}  {loss:>10.4f}")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
