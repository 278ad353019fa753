"""bench.gpu's sections for models larger than a GPU: FSDP training and ``device_map`` inference.

**FSDP** (CUDA only: accelerate refuses ``--cpu`` with ``--use_fsdp``): ``finetune`` jobs with
``sharding: fsdp``, each launched as the scheduler launches it (:func:`jobs.launch.build_command`:
``accelerate launch`` with FSDP2's options, world size 1 on one lent GPU), in a subprocess:

1. the bench's ~1 B Llama, no offload, one epoch; then the same config with two epochs in the same run
   directory, which must resume from the first run's sharded checkpoint (weights, AdamW's state,
   scheduler) and end with one consolidated safetensors folder that the lab's evaluation loads;
2. a ~1.8 B Llama with ``fsdp_offload``, in a process allowed :data:`CAP_GIB` of the GPU
   (``torch.cuda.set_per_process_memory_fraction``, set by a ``sitecustomize`` the bench puts first on
   the workers' ``PYTHONPATH``): unsharded, its full fine-tune holds 16 bytes a parameter (28 GiB)
   before activations, more than the cap, so only the offloaded run fits. A bigger model does not fit
   the lent machine's 64 GiB disk, where its checkpoint (12 bytes a parameter) must go.

Each job's own ``memory_used`` event gives the run's GPU peak (``max_memory_allocated``) and host peak
(peak resident memory), read against the worker's ``memory`` event and pre-flight's plan.

**device_map**: the ~1 B Llama evaluated with ``device_map: auto`` and a ``max_memory`` that holds only
part of it on the GPU (the rest in host memory) against the same evaluation in fp32 on the CPU.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from bench._harness import Timer
from jobs import preflight
from jobs.launch import Launch, build_command, job_env
from lab.core.events import read_events
from lab.core.layout import CHECKPOINTS_DIR, EVENTS_FILE, MODEL_DIR, PREDICTIONS_FILE, RESULT_FILE
from lab.core.yamlio import dump_yaml
from lab.models.weights import count_parameters

GIB = 1024**3
CAP_GIB = 20  # what the offloaded run's process may allocate on the GPU
CAP_ENV = "GPU_BENCH_MEMORY_FRACTION"
SITECUSTOMIZE = f'''import os
if os.environ.get("{CAP_ENV}") and os.environ.get("LOCAL_RANK") is not None:  # the ranks, not the launcher
    import torch
    torch.cuda.set_per_process_memory_fraction(float(os.environ["{CAP_ENV}"]))
'''
SYNTHETIC = {"dataset": "synthetic", "data_files": ["bundled"]}
DEVICE_MAP_QUESTIONS = 100  # the in-memory side runs a ~1 B model in fp32 on the CPU
TIMEOUT_S = 200  # a run that hangs (a collective never answered) must not take the whole device call


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown table (every section of bench.gpu writes its figures so)."""
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + \
           ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def launched(run_dir: Path, config: dict[str, Any], offload: bool, cap: Optional[float] = None,
             again: bool = False) -> tuple[str, Optional[str], float, list[dict[str, Any]]]:
    """Run ``config`` in ``run_dir`` as the scheduler would with ``sharding: fsdp`` on GPU 0 (``cap``: the
    fraction of the GPU the ranks may allocate); (status, error, seconds, events)."""
    run_dir.mkdir(parents=True, exist_ok=again)
    (run_dir / "config.yaml").write_text(dump_yaml(config))
    env = job_env((0,))
    if cap is not None:
        site = run_dir.parent / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
        env[CAP_ENV] = str(cap)
    argv = build_command(run_dir / "config.yaml", run_dir, Launch(gpus=(0,), fsdp=True, fsdp_offload=offload))
    timer = Timer()
    with open(run_dir / "log.txt", "a" if again else "w") as log:
        try:
            subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            pass
    seconds = timer.seconds
    result = run_dir / RESULT_FILE
    outcome = json.loads(result.read_text()) if result.is_file() else {"status": "failed", "error": f"no {RESULT_FILE}"}
    if outcome["status"] != "succeeded":
        print("".join((run_dir / "log.txt").read_text().splitlines(keepends=True)[-40:]), file=sys.stderr)
    return outcome["status"], outcome.get("error"), seconds, read_events(run_dir / EVENTS_FILE)[0]


def _last(events: list[dict[str, Any]], stage: str) -> dict[str, Any]:
    return next((e for e in reversed(events) if e["stage"] == stage), {})


def _gib(value: Optional[float]) -> str:
    return f"{value / GIB:.2f}" if value else "n/a"


def _tokens_per_s(events: list[dict[str, Any]], tokens_a_step: int) -> Optional[float]:
    resumed = max((i for i, e in enumerate(events) if e["stage"] == "resumed"), default=-1)  # this run's steps only
    stamps = [e["time"] for e in events[resumed + 1:] if e["stage"] == "train" and "loss" in e][1:]  # 1st warms up
    return tokens_a_step * (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 2 else None


def memory_row(label: str, status: str, seconds: float, events: list[dict[str, Any]], config: dict[str, Any],
               tokens_a_step: int) -> list[Any]:
    """One table row: the run's peaks against the worker's and pre-flight's estimates, and its speed."""
    used, estimate = _last(events, "memory_used"), _last(events, "memory").get("peak")
    plans = preflight.plan("finetune", config)
    planned = plans[0].memory if plans else None
    gpu = used.get("gpu")
    speed = _tokens_per_s(events, tokens_a_step)
    return [label, f"**{status}**", f"{seconds:.0f}", _gib(gpu), _gib(estimate),
            f"{estimate / gpu:.2f}" if estimate and gpu else "n/a", _gib(planned),
            f"{planned / gpu:.2f}" if planned and gpu else "n/a", _gib(used.get("host")),
            _gib(plans[0].cpu if plans else None), f"{speed:,.0f}" if speed else "n/a"]


def fsdp(bench: Any) -> list[str]:
    """The FSDP runs (the module docstring); ``bench``: bench.gpu's :class:`Bench`, after its setup."""
    import torch

    if bench.device.type != "cuda":
        return ["skipped: FSDP needs CUDA GPUs (accelerate refuses `--cpu` with `--use_fsdp`); tests/jobs/test_sharding.py "
                "checks the launch and its options on a CPU"]
    rows, notes = [], []
    batch, length = 8, 256
    base = {"kind": "finetune", **SYNTHETIC, "limit": 128, "val_limit": 64, "batch_size": batch,
            "max_length": length, "learning_rate": 1e-5, "warmup_ratio": 0.0, "lr_scheduler": "constant",
            "sharding": "fsdp"}
    small = {**base, "model": str(bench.big), "epochs": 1}
    run = bench.work / "fsdp-1b"
    first = launched(run, small, offload=False)
    rows.append(memory_row("~1 B, 1 epoch", first[0], first[2], first[3], small, batch * length))
    again = launched(run, {**small, "epochs": 2}, offload=False, again=True)
    rows.append(memory_row("~1 B, resumed to 2 epochs", again[0], again[2], again[3], small, batch * length))
    resumed = _last(again[3], "resumed")
    steps = [e["step"] for e in again[3] if e["stage"] == "train" and "loss" in e]
    notes.append(f"- resume: {resumed.get('message', '**no resumed event**')}; the second run's steps "
                 f"{steps[0] if steps else '-'}–{steps[-1] if steps else '-'}; errors: {first[1] or 'none'}, "
                 f"{again[1] or 'none'}")
    consolidated = run / MODEL_DIR
    stored = count_parameters(consolidated) if consolidated.is_dir() else None
    notes.append(f"- consolidated: {MODEL_DIR}/ holds {stored or 0:,} parameters in safetensors "
                 f"(the model: {bench.n_params:,}); sharded checkpoint folders: "
                 f"{sorted(p.name for p in (run / CHECKPOINTS_DIR).glob('checkpoint-*/*') if p.is_dir())}")
    if stored:
        metrics, _ = bench.evaluation(consolidated, "bfloat16", bench.work / "fsdp-eval")
        notes.append(f"- the consolidated weights evaluated by lab.kinds.evaluate (synthetic test, letter): "
                     f"accuracy {metrics['accuracy']:.3f}, ECE {metrics['ece']:.3f}, n = {metrics['n']}")
    first_val = [e for e in first[3] if e["stage"] == "train_eval"]
    notes.append(f"- validation under FSDP (every rank scores every question): "
                 f"{[round(e['accuracy'], 3) for e in first_val] or 'none'}")
    shutil.rmtree(run, ignore_errors=True)  # 12 bytes a parameter of checkpoint: room for the next run
    big = bench.work / "llama-1.8b"
    n_big = bench.make(big, bench.sizes.offload_shape)
    total = torch.cuda.get_device_properties(bench.device).total_memory
    offloaded = {**base, "model": str(big), "epochs": 1, "limit": 48, "val_split": None, "fsdp_offload": True}
    out = launched(bench.work / "fsdp-offload", offloaded, offload=True, cap=CAP_GIB * GIB / total)
    rows.append(memory_row(f"{n_big / 1e9:.2f} B, fsdp_offload, {CAP_GIB} GiB cap", out[0], out[2], out[3],
                           offloaded, batch * length))
    notes.append(f"- offloaded run: {out[1] or 'no error'}; unsharded, its full fine-tune holds "
                 f"{16 * n_big / GIB:.1f} GiB of weights, gradients and AdamW moments, over the {CAP_GIB} GiB cap")
    shutil.rmtree(bench.work / "fsdp-offload", ignore_errors=True)
    return table(["run", "status", "seconds", "GPU peak GiB", "worker's estimate GiB", "estimate / peak",
                        "pre-flight GiB", "pre-flight / peak", "host peak GiB", "pre-flight host GiB", "tokens/s"], rows) + ["", *notes, "",
        f"`finetune` jobs with `sharding: fsdp`, launched as the scheduler launches them (accelerate launch, FSDP2, "
        f"world size 1), {batch} × {length}-token batches of the synthetic task. GPU peak: the job's own "
        "`memory_used` event (max_memory_allocated, no CUDA context). Goal: estimates within ±15 %."]


def device_map(bench: Any) -> list[str]:
    """The ~1 B Llama spread over the GPU and host memory (``device_map: auto``, a ``max_memory`` holding a
    third of it on the GPU) against a fp32 CPU evaluation of the same questions."""
    budget = {"0": f"{max(1, bench.n_params * 4 // 3 // GIB)}GiB", "cpu": "200GiB"} if bench.device.type == "cuda" \
        else {"cpu": f"{max(1, bench.n_params * 4 // 3 // 2**20)}MiB"}
    rows = []
    runs = {}
    for label, extra in (("in memory, fp32, CPU", {"device": "cpu"}),
                         ("device_map auto, fp32", {"device_map": "auto", "max_memory": budget})):
        timer = Timer()
        metrics, predictions = bench.evaluation(bench.big, "float32", bench.work / "dmap" / label[:9],
                                                limit=DEVICE_MAP_QUESTIONS, **extra)
        runs[label] = predictions
        rows.append([label, metrics["n"], f"{metrics['accuracy']:.4f}", f"{metrics['ece']:.4f}",
                     f"{timer.seconds:.1f}"])
    (a, pa), (b, pb) = runs.items()
    shared = pa.keys() & pb.keys()
    delta = max(abs(x - y) for q in shared for x, y in zip(pa[q]["probs"], pb[q]["probs"]))
    return table(["evaluation", "questions", "accuracy", "ECE", "seconds"], rows) + [
        "", f"max |Δp| between the two: **{delta:.2e}** (goal ≤ 1e-5); max_memory {json.dumps(budget)} for the "
            f"{bench.n_params / 1e9:.2f} B model's {bench.n_params * 4 / GIB:.1f} GiB of fp32 weights; predictions "
            f"from each run's {PREDICTIONS_FILE}."]
