"""Cross-check our cloze accuracy against lm-evaluation-harness on the same questions, and race it.

    python bench/vs_lm_eval.py --lm-eval-python /work/lmeval-venv/bin/python [--limit 200]

lm-evaluation-harness is a bench extra, not a dependency: ``pip install lm_eval`` in this venv
(which already has transformers), or ``pip install "lm_eval[hf]"`` (the extra brings
transformers, accelerate, peft) in a separate venv passed with ``--lm-eval-python`` (default:
this interpreter), since lm_eval may want other ``datasets`` / ``transformers`` versions than our
pinned stack. In a fresh venv install ``torch==2.13.0`` first, pinned, so nothing pulls CUDA
wheels. The bench itself installs nothing.

For ARC-Challenge test and OpenBookQA test (the original AI2 files in ``--data-dir``) it runs,
one subprocess per tool and dataset, same machine, same run, ours first:

- ``python -m lab evaluate --scoring cloze`` with ``cloze_qa`` (ARC) / ``cloze_plain`` (OBQA);
- ``python -m lm_eval run --model hf`` on the same safetensors directory (the bundled model, fp32,
  CPU), with a task YAML written to a temp dir (``--include_path``). Its prompt, choices and gold
  are lm-eval's own ``doc_to_text`` / ``doc_to_choice`` / ``doc_to_target``, read from the
  installed ``arc_easy.yaml`` (which ``arc_challenge.yaml`` includes) and ``openbookqa.yaml`` and
  rewritten from the hub schema to the files' (``question.stem``, ``question.choices[].text/label``).

It then checks that lm-eval's logged (context, continuation) pairs are exactly our template's
prompt and options, and prints both tools' ``acc`` / ``acc_norm``, every question where the
predictions differ with both tools' log-likelihoods, the largest log-likelihood difference, and
each tool's time: wall and CPU seconds of the whole subprocess (model load included), wall
seconds of scoring alone (ours: metrics.json ``seconds``; lm-eval's: its progress bar, whole
seconds), and the CPU other processes used meanwhile, since a shared core skews the race.

Why we are faster, as lm_eval 0.4.13 does it (``HFLM._loglikelihood_tokens``): each (context,
" option") pair is a request of its own; requests are sorted longest-first and right-padded into
batches of ``--batch_size`` *pairs*, and each pair runs as one full sequence ``(context +
option)[:-1]`` with no KV cache, so a K-option question runs its context K times. The model is
called without ``logits_to_keep``, so the LM head (49152 × 576 here) and a float32
``log_softmax`` run over every position of every sequence before the option positions are
sliced out. Its logits cache (``group_by="contexts"``) only merges pairs that differ in the last
token alone, i.e. single-token options, not the option texts of ARC / OBQA. Our evaluator runs
each question's context once and shares its KV cache across the options, batches questions
longest-first (``--batch-size`` counts questions), and computes logits only at option tokens.
The measured gap is smaller than the ~2.7× fewer tokens we run, most on OBQA, whose contexts are
short: our option pass pads every option row of a batch to the batch's longest option, and two
passes per batch cost more fixed overhead than one. Both tools get the same ``--batch-size``
number, so lm-eval's batches hold 3-5× fewer questions; on a CPU that matters little
(``bench/eval_throughput.py``: 1.19× from batch size 1 to 16 for full sequences per option).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a plain script from anywhere

from lab.data import load_records
from lab.models.bundled import bundled_model_dir
from lab.data.templates import get_template


@dataclass(frozen=True)
class Pair:
    """One dataset as both tools see it."""

    dataset: str  # our dataset name
    lm_eval_yaml: str  # lm-eval's own task file, under lm_eval/tasks
    data_file: str  # under --data-dir, original AI2 schema
    template: str  # our cloze template that should render lm-eval's prompt


PAIRS = (
    Pair("arc_challenge", "arc/arc_challenge.yaml", "arc_challenge/test.jsonl", "cloze_qa"),
    Pair("obqa", "openbookqa/openbookqa.yaml", "openbookqa/test.jsonl", "cloze_plain"),
)
# lm-eval's definitions read the hub schema (`question` or `question_stem`, `choices.{text,label}`);
# the original files nest the same fields as `question.{stem, choices[{text, label}]}`.
HUB_TO_FILE = (
    ("{{question}}", "{{question.stem}}"),
    ("choices.label", "(question.choices | map(attribute='label') | list)"),
    ("choices.text", "(question.choices | map(attribute='text') | list)"),
)
DOC_FIELDS = ("doc_to_text", "doc_to_choice", "doc_to_target")
KEPT_FIELDS = ("output_type", "target_delimiter", "fewshot_delimiter", "metric_list", "metadata")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # both tools read local files only
TQDM_DONE = re.compile(r"Running loglikelihood requests: 100%\|[^|]*\| (\d+)/\1 \[([\d:]+)<")


def adapt(definition: str) -> str:
    """A hub-schema ``doc_to_*`` definition rewritten for the original files' schema."""
    if definition == "question_stem":  # a bare column name: lm-eval uses that field verbatim
        return "{{question.stem}}"
    for hub, original in HUB_TO_FILE:
        definition = definition.replace(hub, original)
    return definition


def task_config(tasks_dir: Path, pair: Pair, data_file: Path) -> dict:
    """lm-eval's own task config for ``pair``, pointed at the local JSONL in its original schema."""
    path = tasks_dir / pair.lm_eval_yaml
    config = yaml.safe_load(path.read_text())
    while "include" in config:  # arc_challenge.yaml = arc_easy.yaml + a new name and subset
        config = {**yaml.safe_load((path.parent / config.pop("include")).read_text()), **config}
    return {
        "task": f"{pair.dataset}_local", "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}}, "test_split": "test",
        **{k: config[k] for k in KEPT_FIELDS if k in config},
        **{k: adapt(config[k]) for k in DOC_FIELDS},
    }


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by our finished children, and by the whole machine (Linux)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:  # /proc/stat cpu line: user nice system idle iowait irq softirq steal ..., in clock ticks
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        machine = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except OSError:
        machine = float("nan")
    return usage.ru_utime + usage.ru_stime, machine


def run(cmd: list[str], log: Path) -> tuple[float, float, float]:
    """Run ``cmd`` with its output in ``log``: wall and CPU seconds of the whole subprocess, and
    the CPU seconds other processes used meanwhile.

    The 2 cores may be shared: another process slows whichever tool it overlaps (badly, since
    both tools run 2 compute threads), so each figure says how much else ran beside it.
    """
    start, (child0, machine0) = time.perf_counter(), cpu_seconds()
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **OFFLINE}).returncode
    elapsed, (child1, machine1) = time.perf_counter() - start, cpu_seconds()
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


def lm_eval_info(python: str) -> tuple[str, Path]:
    """lm_eval's version line and its tasks folder, as installed for ``python``."""
    probe = ("import importlib.metadata as m, importlib.util as u; "
             "print(*[m.version(p) for p in ('lm_eval', 'transformers', 'torch')]); "
             "print(u.find_spec('lm_eval').submodule_search_locations[0])")
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        sys.exit(f"error: {python} cannot run lm_eval ({last}); install the bench extra there (pip install "
                 "lm_eval; in a fresh venv torch==2.13.0 first, then 'lm_eval[hf]') or pass --lm-eval-python")
    versions, folder = proc.stdout.split("\n")[:2]
    lm, tf, th = versions.split()
    return f"lm_eval {lm}, transformers {tf}, torch {th}", Path(folder) / "tasks"


def lm_eval_rows(out: Path, task: str) -> tuple[dict, list[dict]]:
    """lm-eval's aggregated results and its per-question samples (``--log_samples``)."""
    (results,) = out.rglob("results_*.json")
    (samples,) = out.rglob(f"samples_{task}_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    return json.loads(results.read_text())["results"][task], sorted(rows, key=lambda r: r["doc_id"])


def compare(pair: Pair, data_file: Path, limit: int, ours_dir: Path, lm_dir: Path) -> None:
    """Print whether the prompts are identical, both accuracies and every disagreement."""
    task = f"{pair.dataset}_local"
    records = load_records(pair.dataset, "test", [str(data_file)], limit=limit).records
    ours = [json.loads(line) for line in (ours_dir / "predictions.jsonl").read_text().splitlines()]
    metrics = json.loads((ours_dir / "metrics.json").read_text())
    agg, theirs = lm_eval_rows(lm_dir, task)
    if not len(records) == len(ours) == len(theirs):
        sys.exit(f"error: {len(records)} records, {len(ours)} ours, {len(theirs)} lm-eval rows for {pair.dataset}")

    template = get_template(pair.template)
    bad_prompt, bad_gold, disagree, max_diff = [], [], [], 0.0
    for rec, mine, their in zip(records, ours, theirs):
        args = [their["arguments"][f"gen_args_{k}"] for k in range(len(their["arguments"]))]
        prompt = template.render(rec, None)
        if their["doc"]["id"] != mine["id"] or [(a["arg_0"], a["arg_1"]) for a in args] != [(prompt.text, o) for o in prompt.options]:
            bad_prompt.append((rec.id, args[0]["arg_0"], prompt.text))
        if int(their["target"]) != mine["answer"]:
            bad_gold.append(rec.id)
        lm_ll = np.array([float(r[0]) for r in their["filtered_resps"]])  # (K,)
        our_ll = np.array(mine["logliks"])  # (K,)
        chars = np.array([len(c) for c in rec.choices], dtype=float)  # lm-eval's acc_norm divisor
        lm_pred, lm_norm = int(np.argmax(lm_ll)), int(np.argmax(lm_ll / chars))
        max_diff = max(max_diff, float(np.abs(lm_ll - our_ll).max()))
        if (lm_pred, lm_norm) != (mine["pred"], mine["pred_norm"]):
            disagree.append((rec, lm_pred, lm_norm, mine, lm_ll, our_ll))

    print(f"prompts identical (context, each continuation): {len(records) - len(bad_prompt)}/{len(records)}; "
          f"gold identical: {len(records) - len(bad_gold)}/{len(records)}")
    for qid, theirs_ctx, ours_ctx in bad_prompt[:3]:
        print(f"  prompt differs on {qid}: lm-eval {theirs_ctx!r} vs ours {ours_ctx!r}")
    figures = {"acc": (agg["acc,none"], metrics["accuracy"]), "acc_norm": (agg["acc_norm,none"], metrics["accuracy_norm"])}
    print(f"{'':<10}{'lm-eval':>9}{'ours':>9}{'diff (pt)':>11}")
    for name, (lm, us) in figures.items():
        print(f"{name:<10}{lm:>9.4f}{us:>9.4f}{100 * (us - lm):>+11.2f}")
    print(f"largest |log-likelihood difference| over {sum(len(r.choices) for r in records)} options: {max_diff:.2e}")
    print(f"questions where a prediction differs: {len(disagree)}")
    for rec, lm_pred, lm_norm, mine, lm_ll, our_ll in disagree:
        print(f"  {rec.id} (gold {rec.answer}): acc pred lm-eval {lm_pred} / ours {mine['pred']}, "
              f"acc_norm pred lm-eval {lm_norm} / ours {mine['pred_norm']}")
        print("    lm-eval logliks " + " ".join(f"{x:12.6f}" for x in lm_ll))
        print("    our logliks     " + " ".join(f"{x:12.6f}" for x in our_ll))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm-eval-python", default=sys.executable, help="interpreter with lm_eval[hf] installed")
    parser.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data", help="holds arc_challenge/, openbookqa/")
    parser.add_argument("--limit", type=int, default=200, help="first N questions of each test set")
    parser.add_argument("--batch-size", type=int, default=16, help="passed to both tools (ours: questions; lm-eval: pairs)")
    parser.add_argument("--keep", type=Path, default=None, help="keep both tools' outputs here (default: a temp dir)")
    args = parser.parse_args()

    versions, tasks_dir = lm_eval_info(args.lm_eval_python)
    model_dir = bundled_model_dir()
    print(f"{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads; "
          f"ours: torch {torch.__version__}; lm-eval side: {versions}")
    print(f"model {model_dir} (float32, cpu), batch size {args.batch_size}, first {args.limit} test questions")
    with tempfile.TemporaryDirectory(prefix="vs-lm-eval-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for pair in PAIRS:
            data_file = (args.data_dir / pair.data_file).resolve()
            task_dir = work / f"tasks-{pair.dataset}"
            task_dir.mkdir(exist_ok=True)
            config = task_config(tasks_dir, pair, data_file)
            (task_dir / f"{config['task']}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            ours_dir, lm_dir = work / f"ours-{pair.dataset}", work / f"lm-eval-{pair.dataset}"
            ours_log, lm_log = work / f"ours-{pair.dataset}.log", work / f"lm-eval-{pair.dataset}.log"
            ours_wall, ours_cpu, ours_others = run([
                sys.executable, "-m", "lab", "evaluate", "--model", str(model_dir), "--dataset", pair.dataset,
                "--data-files", str(data_file), "--split", "test", "--limit", str(args.limit), "--scoring", "cloze",
                "--template", pair.template, "--batch-size", str(args.batch_size), "--device", "cpu",
                "--dtype", "float32", "--out", str(ours_dir),
            ], ours_log)
            lm_wall, lm_cpu, lm_others = run([
                args.lm_eval_python, "-m", "lm_eval", "run", "--model", "hf", "--model_args",
                f"pretrained={model_dir},dtype=float32", "--device", "cpu", "--batch_size", str(args.batch_size),
                "--tasks", config["task"], "--include_path", str(task_dir), "--limit", str(args.limit),
                "--log_samples", "--output_path", str(lm_dir),
            ], lm_log)

            print(f"\n== {pair.dataset}: {data_file} (lm-eval doc_to_* from {pair.lm_eval_yaml}, ours: {pair.template})")
            compare(pair, data_file, args.limit, ours_dir, lm_dir)
            ours_scoring = json.loads((ours_dir / "metrics.json").read_text())["seconds"]
            bars = TQDM_DONE.findall(lm_log.read_text(errors="replace"))
            lm_scoring = clock(bars[-1][1]) if bars else float("nan")
            print(f"{'seconds':<36}{'lm-eval':>9}{'ours':>9}{'lm-eval / ours':>16}")
            for what, lm, us in [("wall, whole subprocess (with load)", lm_wall, ours_wall),
                                 ("CPU (user + sys), whole subprocess", lm_cpu, ours_cpu),
                                 ("wall, scoring only", lm_scoring, ours_scoring)]:
                print(f"{what:<36}{lm:>9.1f}{us:>9.1f}{lm / us:>15.2f}x")
            print(f"{'CPU of other processes meanwhile':<36}{lm_others:>9.1f}{ours_others:>9.1f}")


if __name__ == "__main__":
    main()
