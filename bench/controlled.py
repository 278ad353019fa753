"""The papers' effects on the controlled task, over training seeds: bench/results/controlled_cpu.md.

    .venv/bin/python -m bench.controlled [--seeds 5 | --only SEED ...] [--no-report] [--threads 1]
                                         [--out runs/bench-controlled-seeds]

A task from :mod:`lab.data.synthetic` (8 objects, 4 colours, the stated answer the rule's with
q = 0.95 in bright light and 0.6 in dim light; the shifted split 0.8 / 0.45) and a small Llama
created from scratch (:mod:`lab.models.scratch`). The *base* model learns the rule on 600 questions of
its own (3 epochs); every experiment starts from it, as the papers start from a pretrained model:

1. **Epochs on noisy labels** (the alignment-calibration paper's "ECE grows with epochs"): the
   base fine-tuned on 100 other questions for 16 epochs, full and LoRA, with the held-out ECE
   per epoch and each model's test and shifted ECE.
2. **FIRST**: the full fine-tune of (1) as the over-confident teacher (it is also the "fine-tune"
   student: the same config and seed), direct distill / LS distill / FIRST students, and the oracle
   student (distilled from the true distribution written as a top-k store: the upper bound),
   in-domain and on the shifted split.
3. **CFT / RCFT** from the over-confident model of (1), with temperature scaling and label
   smoothing as baselines, RCFT at λ = 0 (prompt + answer SFT alone), 0.4 and 1.8, and CFT and
   RCFT again at a 5× smaller learning rate.

**Seeds.** The same seeds on another 2-core CPU moved these figures far outside their bootstrap
intervals (issue 34): a thread count or kernel dispatch that differs changes float rounding, and 16
epochs on 100 noisy labels grow that into another model (bench.determinism measures it). So the
bench is run for ``--seeds`` seeds 0, 1, …, each in ``out/seed-N/``, and every figure is the mean over
seeds with Student's t 95 % interval over seeds (:func:`lab.calibration.spread.mean_interval`), the
first seed's bootstrap interval over questions beside it. A seed is the seed of *every* training job: the
scratch model's initialisation, the base, the fine-tunes, the students and the CFT rows (whose seed
also carves the CFT pool into train / validation / test). The base is not shared: a machine that
rebuilds the bench rebuilds it, so its variation belongs in the spread. The questions of
experiments 1 and 2 are the same for every seed. An effect is stated (the *claims* table) only where
the paired difference over seeds holds under Holm's adjustment over the table (bench.claims).

Every job is a config (written beside its run under ``out/seed-N/configs/``, built from the shipped
presets ``examples/*-controlled.yaml`` with this bench's data and sizes) run by the lab's own worker,
so a finished job is not redone when the bench is run again: a killed run resumes where it stopped.
Each table also gives the Bayes predictor (the rule, confident q) on the same questions: the ECE a
perfect model would still show on that many questions. The seeds are jobs of their own and not a
``series`` job's seed axis because FIRST and CFT are pipelines, which a series does not train.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._controlled_task import (EPOCHS, SIZES, base_model, cft_job, common, finetune_job, full_finetune, history,
                                    job, jobs_parser, mean_cell, prepare)
from bench._harness import REPO, RESULTS, Only, Timer, preset, write_result
from bench.claims import Claim, Row, claims_section
from lab.core.events import read_events
from lab.core.layout import ADAPTER_DIR, EVENTS_FILE, METRICS_FILE, MODEL_DIR
from lab.results.reports import pct

# The pool's carve (the preset's train 600, the paper's 3000): 300 halve CFT's rows, a third of a seed's compute.
CFT_SIZES = {"train_size": 300, "val_size": 200, "test_size": 700}
LAMBDAS = [0.0, 0.4, 1.8]  # λ = 0 isolates RCFT's prompt + answer SFT from its regulariser
SLOW_RATE, SLOW_LAMBDAS = 2.0e-4, [0.4]  # the 5× smaller step: does RCFT keep its accuracy?
DEFAULT_OUT = REPO / "runs" / "bench-controlled-seeds"
TARGET = RESULTS / "controlled_cpu.md"
Split = str  # "in" (test, or CFT's in-domain test part) or "out" (the shifted split)


def busy_seconds(run_dir: Path) -> float:
    """A job's compute, whichever invocations ran it: per worker start, the seconds from its ``start``
    event to the last event before the next (a killed and resumed job is not charged the pause)."""
    events, _ = read_events(run_dir / EVENTS_FILE)
    starts = [i for i, e in enumerate(events) if e["stage"] == "start"] or [0]
    ends = [*starts[1:], len(events)]
    return sum(events[end - 1]["time"] - events[begin]["time"] for begin, end in zip(starts, ends))


def metrics(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / METRICS_FILE).read_text())


@dataclass
class SeedRuns:
    """What one seed's jobs measured: ``figures[row, split]`` a metrics dict with ece, its bootstrap
    interval, accuracy and nll; the per-epoch curves; FIRST's temperature; the jobs' compute."""

    figures: dict[tuple[str, Split], dict[str, Any]] = field(default_factory=dict)
    curves: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    oracle: dict[Split, dict[str, Any]] = field(default_factory=dict)
    temperature: float = 0.0
    seconds: float = 0.0
    span: tuple[float, float] = (0.0, 0.0)  # the first job's first event and the last job's last, epoch seconds


def report_figures(run_dir: Path, prefix: str) -> dict[tuple[str, Split], dict[str, Any]]:
    """A first or cft job's report rows keyed (``prefix:method``, in / out)."""
    rows = json.loads((run_dir / "report.json").read_text())["rows"]
    return {(f"{prefix}:{r['method']}", "in" if r["in_domain"] else "out"): r for r in rows}


def run_seed(root: Path, files: dict[str, str], seed: int) -> SeedRuns:
    """Every job of one seed, in ``root/seed-N`` (finished ones kept), and what they measured."""
    out = root / f"seed-{seed}"
    runs = SeedRuns()
    # ------------------------------------------------------------ the base model and experiment 1
    base = base_model(out, files, seed)
    full = full_finetune(out, files, base, seed)
    lora = finetune_job(out, files, base, "e1-lora", seed, method="lora", learning_rate=3.0e-3, lora_r=16,
                        lora_alpha=32)
    runs.curves = {"full": history(full), "lora": history(lora)}
    for name, model, adapter in (("base", base / MODEL_DIR, None), ("full", full / MODEL_DIR, None),
                                 ("lora", base / MODEL_DIR, lora / ADAPTER_DIR)):
        for split, part in (("in", "test"), ("out", "shifted")):
            evaluation = job(out, f"e1-eval-{name}-{part}", {
                "kind": "evaluate", **common(seed), "model": str(model),
                "adapter": str(adapter) if adapter else None, "data_files": [files[part]], "split": part,
                "limit": None, "scoring": "letter", "template": "first", "bootstrap": 1000})
            runs.figures[name, split] = metrics(evaluation)
            runs.oracle[split] = runs.figures[name, split]["oracle"]
    # ------------------------------------------------------------ experiment 2: FIRST
    first = preset("first-controlled")
    first_run = job(out, "e2-first", {
        **first, **common(seed), "teacher": str(full / MODEL_DIR), "finetune_teacher": False,
        "student": str(base / MODEL_DIR), "students": ["distill", "distill_ls", "first", "oracle"],
        "training": {**first["training"], "epochs": EPOCHS},
        "data_files": [files["train"], files["validation"], files["test"]], "train_limit": None, "val_limit": None,
        "test_limit": None, "ood": [{"dataset": "synthetic", "data_files": [files["shifted"]], "split": "shifted"}]})
    runs.figures.update(report_figures(first_run, "first"))
    runs.temperature = json.loads((first_run / "report.json").read_text())["sweep"]["best"]
    # ------------------------------------------------------------ experiment 3: CFT / RCFT
    cft = preset("cft-controlled")
    sizes = {**CFT_SIZES, "preference_limit": 4}  # the win rate is not reported here: four pairs keep it cheap
    cft_run = cft_job(out, files, full, "e3-cft", seed=seed, lambdas=LAMBDAS, **sizes)
    slow = cft_job(out, files, full, "e3-slow", seed=seed, methods=["cft", "rcft"], lambdas=SLOW_LAMBDAS,
                   training={**cft["training"], "learning_rate": SLOW_RATE}, **sizes)
    runs.figures.update(report_figures(cft_run, "cft"))
    runs.figures.update(report_figures(slow, "slow"))
    jobs = [base, full, lora, first_run, cft_run, slow, *out.glob("e1-eval-*")]
    runs.seconds = sum(busy_seconds(p) for p in jobs)
    times = [e["time"] for p in jobs for e in read_events(p / EVENTS_FILE)[0]]
    runs.span = (min(times), max(times))
    return runs


def boot_cell(m: dict[str, Any]) -> str:
    return f"[{pct(m['ece_ci_low'])}, {pct(m['ece_ci_high'])}]" if m.get("ece_ci_low") is not None else "–"


def figure_row(label: str, seeds: list[SeedRuns], key: str) -> str:
    """One model's row: per split the mean ECE [t over seeds], the first seed's bootstrap interval, each seed's
    ECE, the mean accuracy; the in-domain NLL."""
    cells = [label]
    for split in ("in", "out"):
        ms = [s.figures[key, split] for s in seeds]
        cells += [mean_cell([m["ece"] for m in ms]), boot_cell(ms[0]), " / ".join(pct(m["ece"]) for m in ms),
                  mean_cell([m["accuracy"] for m in ms])]
        if split == "in":
            cells.append(f"{sum(m['nll'] for m in ms) / len(ms):.3f}")
    return "| " + " | ".join(cells) + " |"


FIGURE_HEAD = ["| model | in-domain ECE % [t 95 %] | first seed's bootstrap | per seed | accuracy % [t] | NLL | "
               "shifted ECE % [t 95 %] | first seed's bootstrap | per seed | accuracy % [t] |",
               "|---|---|---|---|---|---|---|---|---|---|"]


def oracle_row(oracle: dict[Split, dict[str, Any]]) -> str:
    a, b = oracle["in"], oracle["out"]
    return (f"| Bayes predictor (the rule, confident q) | {pct(a['ece'])} (expected {pct(a['expected']['ece'])}) | – "
            f"| – | {pct(a['accuracy'])} | {a['nll']:.3f} | {pct(b['ece'])} (expected {pct(b['expected']['ece'])}) "
            f"| – | – | {pct(b['accuracy'])} |")


# (what the papers or the old README say, metric, split, the row said to be lower, the row it is said to be below)
CLAIMS: tuple[tuple[str, str, Split, str, str], ...] = (
    ("16 epochs on noisy labels raise ECE (full fine-tune above the base)", "ece", "in", "base", "full"),
    ("… and on the shifted split", "ece", "out", "base", "full"),
    ("LoRA grows less over-confident than full fine-tuning", "ece", "in", "lora", "full"),
    ("… LoRA below full, shifted split", "ece", "out", "lora", "full"),
    ("FIRST below plain fine-tuning (the teacher)", "ece", "in", "first:first", "first:teacher"),
    ("FIRST below direct distillation", "ece", "in", "first:first", "first:distill"),
    ("FIRST below distillation + label smoothing", "ece", "in", "first:first", "first:distill_ls"),
    ("distillation + label smoothing below direct distillation", "ece", "in", "first:distill_ls", "first:distill"),
    ("FIRST below direct distillation, shifted split", "ece", "out", "first:first", "first:distill"),
    ("the oracle student below FIRST", "ece", "in", "first:oracle", "first:first"),
    ("CFT brings the over-confident model back", "ece", "in", "cft:cft", "cft:base"),
    ("temperature scaling brings it back", "ece", "in", "cft:ts", "cft:base"),
    ("label smoothing brings it back", "ece", "in", "cft:ls", "cft:base"),
    ("CFT below temperature scaling", "ece", "in", "cft:cft", "cft:ts"),
    ("CFT below label smoothing", "ece", "in", "cft:cft", "cft:ls"),
    ("RCFT λ = 0.4 below CFT (the CFT paper's claim), in-domain", "ece", "in", "cft:rcft_0.4", "cft:cft"),
    ("… shifted split", "ece", "out", "cft:rcft_0.4", "cft:cft"),
    ("RCFT λ = 0.4 loses accuracy against CFT", "accuracy", "in", "cft:rcft_0.4", "cft:cft"),
    ("RCFT λ = 1.8 loses accuracy against CFT", "accuracy", "in", "cft:rcft_1.8", "cft:cft"),
    ("RCFT λ = 0 (prompt + answer SFT) loses accuracy against CFT", "accuracy", "in", "cft:rcft_0", "cft:cft"),
    ("RCFT λ = 0.4 loses accuracy against λ = 0 (the regulariser's share)", "accuracy", "in", "cft:rcft_0.4",
     "cft:rcft_0"),
    (f"at learning rate {SLOW_RATE:g}: RCFT λ = 0.4 below CFT, shifted split", "ece", "out", "slow:rcft_0.4",
     "slow:cft"),
    (f"at learning rate {SLOW_RATE:g}: RCFT λ = 0.4 below CFT, in-domain", "ece", "in", "slow:rcft_0.4", "slow:cft"),
)


def claim_rows(seeds: list[SeedRuns]) -> list[str]:
    """The claims section, each claim tested on its per-seed differences (bench/claims.py), in percent."""
    found = []
    for text, metric, split, low, high in CLAIMS:
        a, b = (Row.of([100 * s.figures[key, split][metric] for s in seeds]) for key in (low, high))
        found.append(Claim(text, f"{'ECE' if metric == 'ece' else metric} %, "
                                 f"{'in-domain' if split == 'in' else 'shifted'}", a, b))
    return claims_section(found, len(seeds))


def curve_rows(seeds: list[SeedRuns]) -> list[str]:
    """Per epoch, the mean over seeds of the full and the LoRA fine-tune's validation figures."""
    lines = ["| epoch | full: ECE % [t] | accuracy % | NLL | LoRA: ECE % [t] | accuracy % | NLL |",
             "|---|---|---|---|---|---|---|"]
    for epoch in range(EPOCHS):
        cells = [str(epoch + 1)]
        for name in ("full", "lora"):
            points = [s.curves[name][epoch] for s in seeds]
            cells += [mean_cell([p["ece"] for p in points]), pct(sum(p["accuracy"] for p in points) / len(points)),
                      f"{sum(p['nll'] for p in points) / len(points):.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(out: Path, seeds: list[SeedRuns], numbers: list[int], seconds: float, threads: int) -> list[str]:
    n = len(seeds)
    busy = [s.seconds / 60 for s in seeds]
    wall = (max(s.span[1] for s in seeds) - min(s.span[0] for s in seeds)) / 60
    section = lambda rows: [*FIGURE_HEAD, oracle_row(seeds[0].oracle),  # noqa: E731
                            *(figure_row(label, seeds, key) for label, key in rows)]
    return [
        "# The papers' effects on the controlled task, over training seeds (cpu)", "",
        f"{threads} CPU thread{'s' if threads > 1 else ''}. The jobs' compute per seed: "
        f"{min(busy):.1f}–{max(busy):.1f} min, {sum(busy):.0f} min in all; {wall:.0f} min from the first job's start "
        f"to the last one's end; this invocation took {seconds / 60:.1f} min (jobs already finished in "
        f"`{out.name}/` are not rerun). Configs: `{out.name}/seed-N/configs/`, built "
        "from `examples/*-controlled.yaml`.",
        "",
        f"Task: `Task()` (8 objects, seed 0) of `lab.data.synthetic`, splits "
        f"{', '.join(f'{k} {v}' for k, v in SIZES.items())}; the same questions for every seed. Model: "
        "`lab.models.scratch` defaults, initialised with the seed and trained 3 epochs on the pretrain split (the "
        f"*base*). Seeds {', '.join(map(str, numbers))}: each is the seed of every training job of its row. All "
        f"figures in percent but NLL: the mean over the {n} seeds with Student's t 95 % interval over seeds [t], "
        f"seed {numbers[0]}'s 95 % interval from 1,000 bootstrap resamples of its questions beside it, and each "
        "seed's own figure. Intervals are as computed, not clipped to [0, 100].", "",
        *claim_rows(seeds), "",
        "## 1. Fine-tuning epochs on noisy labels, full vs LoRA", "",
        f"The base fine-tuned {EPOCHS} epochs on the 100 train questions (constant learning rate: full 1e-3, "
        f"LoRA r = 16 3e-3). Held-out validation ({SIZES['validation']} questions) after each epoch, mean over seeds:",
        "", *curve_rows(seeds), "",
        f"Each model on the test split ({SIZES['test']}, in-domain) and the shifted split ({SIZES['shifted']}):", "",
        *section((("base (3 epochs on its own questions)", "base"), (f"full fine-tune, {EPOCHS} epochs", "full"),
                  (f"LoRA fine-tune, {EPOCHS} epochs", "lora"))), "",
        "## 2. FIRST", "",
        f"Teacher: the full fine-tune of experiment 1, which is also the fine-tune student (the same config and "
        f"seed); every other student starts from the base and trains {EPOCHS} epochs on the same 100 questions. "
        "FIRST's temperature (paper form, minimising ECE on the teacher's top-k at the validation answers) per seed: "
        f"c = {' / '.join(f'{s.temperature:g}' for s in seeds)}. Each seed's report: `seed-N/e2-first/report.md`.", "",
        *section((("teacher = fine-tune", "first:teacher"), ("distill (direct)", "first:distill"),
                  ("distill + label smoothing", "first:distill_ls"), ("FIRST (temperature scaling)", "first:first"),
                  ("oracle distill (true distribution; upper bound)", "first:oracle"))), "",
        "## 3. CFT / RCFT from the over-confident model", "",
        f"Start: the full fine-tune of experiment 1. The pool ({SIZES['pool']} questions) is carved by the seed into "
        f"train {CFT_SIZES['train_size']} / validation {CFT_SIZES['val_size']} / test {CFT_SIZES['test_size']} (the "
        "in-domain columns); 3 epochs, learning rate 1e-3 (the preset), and again at "
        f"{SLOW_RATE:g} (CFT and RCFT only). RCFT at λ = 0 is its prompt + answer SFT without the regulariser. Each "
        "seed's reports (temperature fits, per-epoch validation, E-steps): `seed-N/e3-cft/report.md`, "
        "`seed-N/e3-slow/report.md`.", "",
        *section((("as it is (the over-confident start)", "cft:base"), ("temperature scaling", "cft:ts"),
                  ("label smoothing", "cft:ls"), ("CFT", "cft:cft"),
                  *((f"RCFT λ = {lam:g}", f"cft:rcft_{lam:g}") for lam in LAMBDAS),
                  (f"CFT, learning rate {SLOW_RATE:g}", "slow:cft"),
                  *((f"RCFT λ = {lam:g}, learning rate {SLOW_RATE:g}", f"slow:rcft_{lam:g}")
                    for lam in SLOW_LAMBDAS))),
    ]


def main() -> int:
    # One thread: the scratch model's ops are too small to gain from a second, and on a shared CPU an OpenMP
    # thread waiting for a descheduled partner made a step several times slower (a seed's base: 9.3 min at
    # two threads under a load of 8 on two cores, 1.0 min at one).
    parser = jobs_parser(__doc__, out=DEFAULT_OUT, threads=1, seeds=5,
                         only=Only("SEED", "these seeds instead of 0 … N-1", int))
    parser.add_argument("--no-report", action="store_true", help=(
        "run the jobs and write no report: seeds share nothing, so processes given other seeds (--only) run "
        "beside this one; a later run writes the report from their finished jobs"))
    args = parser.parse_args()
    out, files = prepare(args)
    timer = Timer()
    numbers = args.only or list(range(args.seeds))
    seeds = []
    for seed in numbers:
        seeds.append(run_seed(out, files, seed))
        print(f"seed {seed} done: {seeds[-1].seconds / 60:.1f} min of compute", flush=True)
    if not args.no_report:
        write_result(TARGET, render(out, seeds, numbers, timer.seconds, args.threads))
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
