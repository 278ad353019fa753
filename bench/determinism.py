"""What makes two CPU runs of one seeded training differ: bench/results/determinism_cpu.txt.

    .venv/bin/python -m bench.determinism [--out runs/bench-determinism]

Issue 34: bench.controlled rerun from nothing on another 2-core machine (same seeds, same torch)
moved its figures far outside their bootstrap intervals. The seeds fix every random draw, so what
differs is float rounding: the order a reduction adds in, which follows the thread count and the
kernels torch (ATEN_CPU_CAPABILITY), MKL (MKL_CBWR) and oneDNN (DNNL_MAX_CPU_ISA) pick for the CPU. Each
condition below runs in a process of its own (those variables are read when the libraries load),
trains with the lab's own worker (the configs of bench.controlled, seed 0) and is compared with
the reference run of the same invocation:

1. *One epoch* of the base (the seed-0 scratch model on the 600 pretrain questions, 75 steps): the
   largest |Δ| of the final weights and of the per-step losses. The same condition twice must give 0.
2. *Sixteen epochs*: experiment 1's full fine-tune (100 noisy questions) from one shared base,
   under the conditions of ``GROWN`` that differed in (1): what that ulp-level difference grows to
   in the final validation ECE and accuracy.

Finished runs are kept under ``--out`` (a rerun only compares); the conditions are emulated on this
CPU, so "AVX2" stands for a machine without AVX-512.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._controlled_task import EPOCHS, base_model, common, data_files, finetune_job, history, job
from bench._harness import REPO, RESULTS, parser, preset, write_result
from lab.core.events import read_events
from lab.core.layout import EVENTS_FILE, MODEL_DIR
from lab.results.reports import pct

TARGET = RESULTS / "determinism_cpu.txt"
AVX2_MACHINE = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}


@dataclass(frozen=True)
class Condition:
    """How one run's process is set up: torch's threads, environment variables, oneDNN on or off."""

    threads: int = 2
    env: dict[str, str] = field(default_factory=dict)
    mkldnn: bool = True


CONDITIONS = {
    "reference": Condition(),
    "same again": Condition(),
    "1 thread": Condition(threads=1),
    "ATEN_CPU_CAPABILITY=avx2": Condition(env={"ATEN_CPU_CAPABILITY": "avx2"}),
    "ATEN_CPU_CAPABILITY=default": Condition(env={"ATEN_CPU_CAPABILITY": "default"}),
    "MKL_CBWR=AVX2": Condition(env={"MKL_CBWR": "AVX2"}),
    "MKL_CBWR=COMPATIBLE": Condition(env={"MKL_CBWR": "COMPATIBLE"}),
    "DNNL_MAX_CPU_ISA=AVX2": Condition(env={"DNNL_MAX_CPU_ISA": "AVX2"}),
    "torch.backends.mkldnn off": Condition(mkldnn=False),
    "an AVX2 machine (the three variables)": Condition(env=AVX2_MACHINE),
}
# The conditions that part two trains 16 epochs (where they differed in part one): what differs between
# two machines in practice, the thread count and the instruction set; the reference twice as the control.
GROWN = ("reference", "same again", "1 thread", "an AVX2 machine (the three variables)")


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def child(out: Path, phase: str, name: str) -> None:
    """In the condition's own process: its run of ``phase`` (``base``: the shared base; ``short``: one
    epoch from the scratch model; ``long``: 16 epochs from the base), then torch's kernel level."""
    import torch

    condition = CONDITIONS[name]
    torch.set_num_threads(condition.threads)
    torch.backends.mkldnn.enabled = condition.mkldnn
    files = data_files(out)
    if phase == "base":
        base_model(out, files)
    elif phase == "short":
        job(out / "short", slug(name), {
            **preset("finetune-controlled"), **common(0), "model": str(out / "scratch"),
            "data_files": [files["pretrain"]], "split": "train", "limit": None,
            "val_data_files": [files["validation"]], "val_limit": None, "epochs": 1})
    else:
        finetune_job(out / "long", files, out / "base", slug(name), 0)
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}))


def spawn(out: Path, phase: str, name: str) -> dict[str, Any]:
    """Run ``child`` for ``name`` in a fresh interpreter with the condition's environment."""
    env = {**os.environ, **CONDITIONS[name].env}
    done = subprocess.run([sys.executable, "-m", "bench.determinism", "--out", str(out), "--child", phase, name],
                          env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{phase} run under {name!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def weights(run_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / MODEL_DIR / "model.safetensors"))


def losses(run_dir: Path) -> list[float]:
    events, _ = read_events(run_dir / EVENTS_FILE)
    return [e["loss"] for e in events if e["stage"] == "train" and "loss" in e]


def largest_gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    """max |a − b| over every weight of two state dicts of one architecture."""
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def cpu_flags() -> str:
    """The CPU's vector extensions that the question turns on (the header gives its model)."""
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return "CPU flags: " + " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")
                                    if f in flags)


def main() -> int:
    options = parser(__doc__, out=REPO / "runs" / "bench-determinism", out_help="where the runs are kept")
    options.add_argument("--child", nargs=2, metavar=("PHASE", "CONDITION"), help=argparse.SUPPRESS)
    args = options.parse_args()
    out = args.out.resolve()
    if args.child:
        child(out, *args.child)
        return 0
    lines = [cpu_flags(),
             "Each condition a fresh process, compared with the reference run (2 threads, no variables set).", "",
             "1. One epoch of the base (75 steps of 8 from the seed-0 scratch model):",
             f"{'condition':40} {'kernels':>8} {'threads':>7} {'max |Δ weight|':>15} {'max |Δ loss|':>13} "
             f"{'first step differing':>20}"]
    spawn(out, "base", "reference")
    reference = out / "short" / slug("reference")
    differing = []
    for name in CONDITIONS:
        seen = spawn(out, "short", name)
        run_dir = out / "short" / slug(name)
        gap = largest_gap(weights(reference), weights(run_dir))
        a, b = losses(reference), losses(run_dir)
        steps = [i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y]
        lines.append(f"{name:40} {seen['capability']:>8} {seen['threads']:>7} {gap:>15.3g} "
                     f"{max(abs(x - y) for x, y in zip(a, b)):>13.3g} {steps[0] if steps else '–':>20}")
        print(lines[-1], flush=True)
        if name in GROWN and (gap > 0 or name in ("reference", "same again")):
            differing.append(name)
    lines += ["", f"2. {EPOCHS} epochs of experiment 1's full fine-tune (100 noisy questions) from one shared base, "
              "under the thread count and the AVX2 machine where they differed above, and the reference twice:",
              f"{'condition':40} {'max |Δ weight|':>15} {'val ECE %':>9} {'val acc %':>9} "
              "ECE % after epochs 1, 4, 8, 12, 16"]
    reference = out / "long" / slug("reference")
    for name in differing:
        spawn(out, "long", name)
        run_dir = out / "long" / slug(name)
        curve = history(run_dir)
        lines.append(f"{name:40} {largest_gap(weights(reference), weights(run_dir)):>15.3g} "
                     f"{pct(curve[-1]['ece']):>9} {pct(curve[-1]['accuracy']):>9} "
                     f"{' '.join(pct(curve[e - 1]['ece']) for e in (1, 4, 8, 12, 16))}")
        print(lines[-1], flush=True)
    write_result(TARGET, lines)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
