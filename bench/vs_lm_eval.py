"""Race lm-evaluation-harness on its own tasks, and check that the lab's answers are lm-eval's, document by document.

    python -m bench.vs_lm_eval [--lm-eval-python PYTHON] [--out bench/results/vs_lm_eval_cpu.txt]
    python -m bench.vs_lm_eval --include examples/lm_eval_tasks --race csqa_local:0:100 --race csqa_local:5:50 \
        --race medmcqa_local:5:50 --race local_group:0:30 --out bench/results/vs_lm_eval_own_tasks_cpu.txt

For each task below, the same lm-eval task runs through both tools, one subprocess each, same machine,
same run, ours first, the bundled model (SmolLM2-135M-Instruct, safetensors, float32, CPU):

- ``python -m lab evaluate --dataset lm-eval:TASK --num-fewshot K --limit N``: the lab builds its
  requests through lm-eval's TaskManager (:mod:`lab.data.harness`) and scores them with its own scorer;
- ``python -m lm_eval run --model hf --tasks TASK --num_fewshot K --limit N --log_samples``, with the lab's
  task folder as ``--include_path`` (the ``bundled_*`` tasks: lm-eval's prompts over the bundled samples).

With ``--include DIR --race TASK:SHOTS:LIMIT`` it runs a folder of the user's own task YAMLs instead
(``examples/lm_eval_tasks``: data the lab does not bundle, a ``!function``, a group), both tools as a
user runs them. It prints, per task: whether every request's context and continuation are the same text in both, both
tools' ``acc`` / ``acc_norm``, how many documents agree on both, the largest log-likelihood difference,
and each tool's time: wall and CPU seconds of the whole subprocess (start-up, task building and model load
included), wall seconds of scoring alone (ours: metrics.json ``seconds``; lm-eval's: its progress bar,
whole seconds), and the CPU other processes used meanwhile, since a shared core skews a race.

Why the lab is faster, as lm_eval 0.4.13 does it (``HFLM._loglikelihood_tokens``): each (context,
continuation) pair is a request of its own, run as one full sequence ``(context + continuation)[:-1]``
with no KV cache, so a K-option question runs its context K times (its cache merges pairs only when the
continuation is a single token, as MMLU's " A"…" D"); the model is called without ``logits_to_keep``, so
the LM head (49152 × 576 here) and a float32 ``log_softmax`` run over every position. The lab runs each
context once, shares its KV cache across the options and computes logits only at option tokens. Both
tools get the same ``--batch-size`` number (ours counts questions, lm-eval's pairs).

lm-eval is a dependency of the lab (requirements.txt), so this interpreter has it; ``--lm-eval-python``
races another install instead.
"""
from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench._harness import REPO, RESULTS, Only, Timer, Transcript, parser, write_result
from lab.data.harness import SHIPPED
from lab.models.bundled import bundled_model_dir


@dataclass(frozen=True)
class Race:
    task: str  # an lm-eval task or group both tools run
    shots: int
    limit: int  # documents of each (sub)task


RACES = (
    Race("bundled_arc_challenge", 0, 200),  # ARC-Challenge test: 4 options of a few words
    Race("bundled_openbookqa", 0, 200),  # OpenBookQA test: short contexts, 4 options
    Race("bundled_mmlu", 5, 1),  # MMLU 5-shot, 1 question of each of 57 subjects: long contexts, 1-token options
    Race("bundled_mmlu_high_school_psychology", 5, 40),  # ... 40 questions of one subject, which share their 5 shots
)
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # both tools read local files only
TQDM_DONE = re.compile(r"Running loglikelihood requests: 100%\|[^|]*\| (\d+)/\1 \[([\d:]+)<")


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by our finished children, and by the whole machine (Linux)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:  # /proc/stat cpu line: user nice system idle iowait irq softirq steal ..., in clock ticks
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        machine = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except OSError:
        machine = float("nan")
    return usage.ru_utime + usage.ru_stime, machine


def run(cmd: list[str], log: Path, cwd: Path = REPO) -> tuple[float, float, float]:
    """Run ``cmd`` with its output in ``log``: wall and CPU seconds of the whole subprocess, and the CPU
    seconds other processes used meanwhile (both tools run 2 compute threads: a neighbour slows either)."""
    timer, (child0, machine0) = Timer(), cpu_seconds()
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env={**os.environ, **OFFLINE}).returncode
    elapsed, (child1, machine1) = timer.seconds, cpu_seconds()
    if code:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        sys.exit(f"error: {' '.join(cmd[:4])} ... exited with {code}; the end of {log}:\n{tail}")
    return elapsed, child1 - child0, max(machine1 - machine0 - (child1 - child0), 0.0)


def clock(text: str) -> float:
    """tqdm's ``MM:SS`` or ``H:MM:SS`` in seconds."""
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds


def lm_eval_version(python: str) -> str:
    probe = ("import importlib.metadata as m; "
             "print(*[m.version(p) for p in ('lm_eval', 'transformers', 'torch')])")
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"error: {python} cannot run lm_eval: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    lm, tf, th = proc.stdout.split()
    return f"lm_eval {lm}, transformers {tf}, torch {th}"


def lm_eval_samples(out: Path) -> tuple[dict[str, dict], dict[tuple[str, int], dict]]:
    """lm-eval's aggregated results per task and its logged samples by (task, doc_id)."""
    (results,) = out.rglob("results_*.json")
    samples = {}
    for path in out.rglob("samples_*.jsonl"):
        task = re.sub(r"^samples_|_\d{4}-\d\d-\d\dT.*$", "", path.name)
        for line in path.read_text().splitlines():
            row = json.loads(line)
            samples[(task, int(row["doc_id"]))] = row
    return json.loads(results.read_text())["results"], samples


def compare(ours_dir: Path, lm_dir: Path) -> list[str]:
    """Lines saying how far the two tools agree: prompts, per-document predictions, accuracies."""
    ours = {(r["task"], int(r["doc_id"])): r
            for r in map(json.loads, (ours_dir / "predictions.jsonl").read_text().splitlines())}
    metrics = json.loads((ours_dir / "metrics.json").read_text())
    agg, theirs = lm_eval_samples(lm_dir)
    same_prompt = agree = agree_norm = lm_acc = lm_norm = 0
    max_diff, differ = 0.0, []
    for key, their in theirs.items():
        mine = ours[key]
        args = [their["arguments"][f"gen_args_{k}"] for k in range(len(their["arguments"]))]
        same_prompt += all(a["arg_0"] == mine["context"] for a in args) and len(args) == len(mine["choices"])
        lm_ll = np.array([float(r[0]) for r in their["filtered_resps"]])
        max_diff = max(max_diff, float(np.abs(lm_ll - np.array(mine["logliks"])).max()))
        acc = float(their["acc"])
        agree += acc == float(mine["correct"])
        lm_acc += acc
        if "acc_norm" in their:
            agree_norm += float(their["acc_norm"]) == float(mine["pred_norm"] == mine["answer"])
            lm_norm += float(their["acc_norm"])
        if acc != float(mine["correct"]):
            differ.append(f"  {key[0]}/{key[1]}: lm-eval logliks {np.round(lm_ll, 5).tolist()} ours "
                          f"{np.round(mine['logliks'], 5).tolist()}")
    n, with_norm = len(theirs), sum("acc_norm" in t for t in theirs.values())
    if n != len(ours):
        sys.exit(f"error: lm-eval logged {n} documents, the lab scored {len(ours)}")
    lines = [f"documents {n}; same context for every option: {same_prompt}/{n}; same acc: {agree}/{n}"
             + (f"; same acc_norm: {agree_norm}/{with_norm}" if with_norm else ""),
             f"{'':<10}{'lm-eval':>9}{'lab':>9}{'diff (pt)':>11}",
             f"{'acc':<10}{lm_acc / n:>9.4f}{metrics['accuracy']:>9.4f}{100 * (metrics['accuracy'] - lm_acc / n):>+11.2f}"]
    if with_norm == n:
        lines.append(f"{'acc_norm':<10}{lm_norm / n:>9.4f}{metrics['accuracy_norm']:>9.4f}"
                     f"{100 * (metrics['accuracy_norm'] - lm_norm / n):>+11.2f}")
    lines.append(f"ECE of the lab's run (lm-eval has none): {metrics['ece']:.4f} (acc's confidence), "
                 f"{metrics['ece_norm']:.4f} (acc_norm's)")
    lines.append(f"largest |log-likelihood difference|: {max_diff:.2e}; documents whose acc differs: {len(differ)}")
    return lines + differ[:5]


def race(spec: Race, model_dir: Path, batch_size: int, python: str, work: Path, include: Path) -> list[str]:
    """Both tools on one task; lm_eval runs in the include folder, whose relative data files the lab reads from it."""
    tag = f"{spec.task}-{spec.shots}shot"
    ours_dir, lm_dir = work / f"lab-{tag}", work / f"lm-eval-{tag}"
    ours_wall, ours_cpu, ours_others = run([
        sys.executable, "-m", "lab", "evaluate", "--model", str(model_dir), "--dataset", f"lm-eval:{spec.task}",
        "--num-fewshot", str(spec.shots), "--limit", str(spec.limit), "--batch-size", str(batch_size),
        "--device", "cpu", "--dtype", "float32", "--bootstrap", "0", "--out", str(ours_dir),
        *(["--lm-eval-include", str(include)] if include != SHIPPED else []),
    ], work / f"lab-{tag}.log")
    lm_log = work / f"lm-eval-{tag}.log"
    lm_wall, lm_cpu, lm_others = run([
        python, "-m", "lm_eval", "run", "--model", "hf", "--model_args", f"pretrained={model_dir},dtype=float32",
        "--device", "cpu", "--batch_size", str(batch_size), "--tasks", spec.task, "--include_path", str(include),
        "--num_fewshot", str(spec.shots), "--limit", str(spec.limit), "--log_samples", "--output_path", str(lm_dir),
    ], lm_log, cwd=include)
    lines = [f"\n== lm-eval:{spec.task}, {spec.shots}-shot, --limit {spec.limit}"] + compare(ours_dir, lm_dir)
    ours_scoring = json.loads((ours_dir / "metrics.json").read_text())["seconds"]
    bars = TQDM_DONE.findall(lm_log.read_text(errors="replace"))
    lm_scoring = clock(bars[-1][1]) if bars else float("nan")
    lines.append(f"{'seconds':<36}{'lm-eval':>9}{'lab':>9}{'lm-eval / lab':>15}")
    for what, lm, us in [("wall, whole subprocess (with load)", lm_wall, ours_wall),
                         ("CPU (user + sys), whole subprocess", lm_cpu, ours_cpu),
                         ("wall, scoring only", lm_scoring, ours_scoring)]:
        lines.append(f"{what:<36}{lm:>9.1f}{us:>9.1f}{lm / us:>14.2f}x")
    lines.append(f"{'CPU of other processes meanwhile':<36}{lm_others:>9.1f}{ours_others:>9.1f}")
    return lines


def main() -> None:
    options = parser(__doc__, out=RESULTS / "vs_lm_eval_cpu.txt", out_help="the report",
                     only=Only("TASK", "race these tasks only (default: all)"))
    options.add_argument("--lm-eval-python", default=sys.executable, help="the interpreter lm_eval runs in")
    options.add_argument("--batch-size", type=int, default=16, help="passed to both tools (lab: questions; lm-eval: pairs)")
    options.add_argument("--limit", type=int, default=None, help="documents of each (sub)task (default: each race's own)")
    options.add_argument("--include", type=Path, default=SHIPPED, help="a folder of task YAMLs both tools read "
                         "(default: the lab's bundled_* tasks)")
    options.add_argument("--race", action="append", default=[], metavar="TASK:SHOTS:LIMIT",
                         help="race this task instead of the default ones (repeatable)")
    options.add_argument("--keep", type=Path, default=None, help="keep both tools' outputs here (default: a temp dir)")
    args = options.parse_args()

    import torch

    model_dir = bundled_model_dir()
    report = Transcript()
    report.print(f"# ({torch.get_num_threads()} torch threads; lm-eval side: {lm_eval_version(args.lm_eval_python)})",
                 f"model {model_dir.name} (float32, cpu), batch size {args.batch_size}")
    timer = Timer()
    with tempfile.TemporaryDirectory(prefix="vs-lm-eval-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        races = [Race(t, int(k), int(n)) for t, k, n in (r.split(":") for r in args.race)] if args.race else RACES
        for spec in races:
            if args.only and spec.task not in args.only:
                continue
            if args.limit is not None:
                spec = Race(spec.task, spec.shots, args.limit)
            report.print(*race(spec, model_dir, args.batch_size, args.lm_eval_python, work, args.include.resolve()))
    report.print(f"\n{timer.seconds / 60:.1f} min in all")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
