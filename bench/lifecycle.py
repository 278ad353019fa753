"""A model's life cycle on the controlled task, over training seeds: bench/results/lifecycle_cpu.md.

    .venv/bin/python -m bench.lifecycle [--seeds 5] [--out runs/bench-lifecycle] [--threads 2]
    # on 2 cores, faster: two processes of one thread (the models are too small for two), then the report
    .venv/bin/python -m bench.lifecycle --threads 1 --only 0 2 4 & .venv/bin/python -m bench.lifecycle \
        --threads 1 --only 1 3; wait; .venv/bin/python -m bench.lifecycle --seeds 5

The alignment-calibration paper follows ECE along a model's life (its §5–6: scale and pre-training
steps, instruction tuning, RLHF); the CFT paper blames DPO for over-confidence and restores calibration
with CFT / RCFT. This bench walks the same chain on the controlled task (:mod:`lab.data.synthetic`),
whose Bayes predictor is known, so every figure stands beside the ECE a perfect model shows on the
same questions (its *oracle* ECE: the binned estimator's own bias at that many questions):

(a) **pre-training**: scratch models of three sizes (:mod:`lab.models.scratch`) trained on the task's
    pretrain questions, a ``series`` job on the step axis: ECE against scale (the final weights) and
    against steps (a snapshot after every epoch);
(b) **SFT** (the ``sft`` kind) of the middle-sized base on instruction rows made from 100 other
    questions of the task, the response the *stated* (noisy) answer: *narrow* (2 phrasings, one of them
    the evaluation's prompt) against *diverse* (9 phrasings of the same questions, of which the same
    one), each full and LoRA, ECE after every epoch;
(c) **DPO** (the ``dpo`` kind) from the diverse full SFT model on pairs "the rule's answer over another
    answer" at three β, ECE and accuracy before and after;
(d) **CFT / RCFT** (the ``cft`` kind) from the DPO model of ``CFT_BETA``, with temperature scaling beside.

Every evaluation is the ``cft_chat`` letter prompt (the CFT paper's, in the model's chat template, as
the sft and dpo kinds render their rows), on the same ``test`` questions: the series' cells, the sft
and dpo jobs' per-epoch ``calibration`` task, and the cft job's out-of-domain set (its in-domain set is
a carve of its own pool, reported beside). The base models are pre-trained in that prompt too, so the
chain is measured in one format from start to end. The DPO prompt is the evaluation's user turn; the
dpo kind gives it the chat template's default system prompt where the evaluation has the CFT system
prompt, and the diverse set holds that form (no system message) so that its model has seen both.

**Seeds.** Every training figure is the mean over ``--seeds`` seeds with Student's t 95 % interval
over seeds (:func:`lab.calibration.spread.mean_interval`), seed 0's bootstrap interval over questions
and each seed's figure beside it. A seed is the seed of every job of its chain, *and* of the scratch
models' initialisation: the named scratch models (``model: scratch-s``) are all created with seed 0,
so a series with a ``seeds`` list would vary only the data order; each seed's series therefore
trains scratch models initialised with its seed (``seeds: [N]``, the seed axis of one point). The
questions are the same for every seed. An effect is stated (the *claims* table) only where the paired
difference over seeds holds under Holm's adjustment over the table (bench.claims).

Every job is a config written beside its run under ``out/seed-N/configs/`` and run by the lab's own
worker (:func:`bench._controlled_task.job`), so a rerun skips what is finished and a killed run resumes where
it stopped; the report can be written from the seeds that have finished (``--seeds`` fewer).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from bench._controlled_task import job, jobs_parser, mean_cell
from bench._harness import REPO, RESULTS, Only, Timer, write_result
from bench.claims import ZERO, Claim, Row, claims_section
from lab.core.events import read_events
from lab.core.layout import CALIBRATION_DIR, EVENTS_FILE, METRICS_FILE, MODEL_DIR, SERIES_FILE
from lab.data.synthetic import Task, write_splits
from lab.data.templates import CFT_SYSTEM, get_template, option_letters
from lab.results.reports import pct
from lab.training.snapshots import final_weights

TASK = Task()  # the shipped task: 8 objects, seed 0
# The splits every seed shares. 300 test questions keep a bootstrap interval of about ±4 points and cost
# a few seconds a scoring; the sft and dpo jobs score them after every epoch.
SIZES = {"pretrain": 600, "sft": 100, "prefs": 200, "pool": 1000, "test": 300}
TEMPLATE = "cft_chat"  # the one prompt of the whole chain (module docstring)
SCALE = ("scratch-xs", "scratch-s", "scratch")  # 0.05, 0.17 and 0.56 M parameters (lab.models.weights)
BASE = "scratch"  # the size the chain (b)–(d) starts from
PRETRAIN_EPOCHS = 6  # a snapshot each epoch (75 steps at batch 8); after 4, a first run's base knew half the rule
SFT_EPOCHS = 12  # the controlled bench needed 16 on 100 questions for over-confidence; 6 showed none
SFT_RATES = {"full": 1.0e-3, "lora": 3.0e-3}  # the controlled presets' rates (finetune-controlled, bench 1)
BETAS = (0.1, 1.0, 5.0)  # at 0.02–0.5 (a first run) DPO ended alike: where does it stop?
DPO_EPOCHS, DPO_RATE = 2, 2.0e-4
CFT_BETA = 0.1  # the DPO model CFT starts from
CFT_SIZES = {"train_size": 300, "val_size": 200, "test_size": 500}
DEFAULT_OUT = REPO / "runs" / "bench-lifecycle"
TARGET = RESULTS / "lifecycle_cpu.md"
Figures = dict[str, Any]  # ece, ece_low, ece_high, accuracy, nll, gap (mean confidence − accuracy), oracle


# ---------------------------------------------------------------- data: the questions as instruction rows

def _lines(choices: list[str], form: str) -> str:
    return "\n".join(form.format(letter=letter, choice=c) for letter, c in zip(option_letters(len(choices)), choices))


def _inline(choices: list[str]) -> str:
    return " ".join(f"({letter}) {c}" for letter, c in zip(option_letters(len(choices)), choices))


def evaluation_user(row: dict[str, Any]) -> str:
    """The user turn of the evaluation's prompt (``cft_chat``), checked token for token by :func:`check_narrow`."""
    options = _lines(row["choices"], "{letter}. {choice}")
    return f"{row['question']}\nOptions:\n{options}\nAnswer with only a single letter:"


# A phrasing: (system message or None: the chat template's default, the user turn, the response "letter"
# or "colour" of the stated answer). The first is the evaluation's prompt; the third the DPO pairs' form.
Phrasing = tuple[Optional[str], Callable[[dict[str, Any]], str], str]
PHRASINGS: tuple[Phrasing, ...] = (
    (CFT_SYSTEM, evaluation_user, "letter"),
    (CFT_SYSTEM, lambda r: f"{r['question']}\n{_lines(r['choices'], '({letter}) {choice}')}\n"
                           "Reply with the letter of your answer.", "letter"),
    (None, evaluation_user, "letter"),
    (None, lambda r: f"Question: {r['question']}\nChoices: {_inline(r['choices'])}\nAnswer:", "letter"),
    (None, lambda r: r["question"], "colour"),
    ("You describe how objects look.", lambda r: f"{r['question']} Say {', '.join(r['choices'])}.", "colour"),
    (CFT_SYSTEM, lambda r: f"Options: {_inline(r['choices'])}\n{r['question']}\nRespond with "
                           f"{', '.join(option_letters(len(r['choices'])))}.", "letter"),
    ("Answer in one word.", lambda r: f"Here is a question about colours. {r['question']}", "colour"),
    (None, lambda r: f"Pick the right option.\n{_lines(r['choices'], '{letter}) {choice}')}\n{r['question']}",
     "letter"),
)
SETS = {"narrow": PHRASINGS[:2], "diverse": PHRASINGS}


def instruction_rows(rows: list[dict[str, Any]], phrasings: tuple[Phrasing, ...]) -> list[dict[str, Any]]:
    """The questions as chat rows (:mod:`lab.data.instructions`), question i in phrasing i mod their
    number, the response its stated answer: the same questions and labels in either set."""
    out = []
    for i, row in enumerate(rows):
        system, user, response = phrasings[i % len(phrasings)]
        answer = option_letters(len(row["choices"]))[row["answer"]] if response == "letter" else \
            row["choices"][row["answer"]]
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user(row)}, {"role": "assistant", "content": answer}]
        out.append({"id": row["id"], "messages": messages})
    return out


def preference_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DPO pairs: the rule's answer (the true distribution's argmax) over one of the others, drawn per question."""
    rng = np.random.default_rng([TASK.seed, 7])
    out = []
    for row in rows:
        letters = option_letters(len(row["choices"]))
        rule = int(np.argmax(row["true_probs"]))
        other = int(rng.choice([k for k in range(len(letters)) if k != rule]))
        out.append({"id": row["id"], "prompt": evaluation_user(row), "chosen": letters[rule],
                    "rejected": letters[other]})
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def data_files(out: Path) -> dict[str, Path]:
    """The bench's files under ``out/data`` (written on first use): the task's splits, the narrow and
    diverse instruction sets and the preference pairs."""
    data = out / "data"
    files = {part: data / f"{part}.jsonl" for part in (*SIZES, *SETS, "pairs")}
    if not files["pairs"].is_file():
        write_splits(data, TASK, SIZES)
        for name, phrasings in SETS.items():
            write_rows(files[name], instruction_rows(read_rows(files["sft"]), phrasings))
        write_rows(files["pairs"], preference_rows(read_rows(files["prefs"])))
    return files


def check_narrow(tokenizer: Any, files: dict[str, Path]) -> None:
    """The first phrasing, rendered by the chat template as the sft kind renders it, must be the
    evaluation's prompt, or SFT would not train the format the chain is measured in."""
    from lab.data import load

    record = load("synthetic", "test", [f"test={files['sft']}"]).records[0]
    row = read_rows(files["narrow"])[0]
    rendered = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
    if rendered != get_template(TEMPLATE).render(record, tokenizer).text:
        raise SystemExit(f"the narrow set's first phrasing is not the {TEMPLATE} prompt: {rendered!r}")


# ---------------------------------------------------------------- the jobs of one seed

def loader(files: dict[str, Path], part: str, split: str = "train") -> str:
    """A data_files entry ``split=path`` (the synthetic dataset's splits are train / validation / test / shifted)."""
    return f"{split}={files[part]}"


def evaluation(files: dict[str, Path]) -> dict[str, Any]:
    """The evaluation of every stage: the test questions in the chain's prompt."""
    return {"task": "mcq", "dataset": "synthetic", "data_files": [loader(files, "test", "test")], "split": "test",
            "limit": None, "scoring": "letter", "template": TEMPLATE}


def scratch_models(out: Path, files: dict[str, Path], seed: int) -> dict[str, Path]:
    """Each size's scratch model initialised with ``seed``, its tokenizer learnt on the pretrain questions."""
    from lab.data import load
    from lab.models.scratch import create, sized

    made = {}
    for size in SCALE:
        folder = out / size
        if not (folder / "config.json").is_file():
            create(folder, load("synthetic", "train", [loader(files, "pretrain")]).records,
                   replace(sized(size), seed=seed))
        made[size] = folder
    return made


def pretrain(out: Path, files: dict[str, Path], seed: int) -> Path:
    """(a): the series over steps of the three sizes trained on the pretrain questions."""
    from transformers import AutoTokenizer

    models = scratch_models(out, files, seed)
    check_narrow(AutoTokenizer.from_pretrained(models[BASE]), files)
    train = {"dataset": "synthetic", "data_files": [loader(files, "pretrain")], "split": "train", "limit": None,
             "val_split": None, "template": TEMPLATE, "epochs": PRETRAIN_EPOCHS, "learning_rate": 1.0e-3,
             "batch_size": 8, "lr_scheduler": "constant", "warmup_ratio": 0.05, "save_optimizer": False}
    return job(out, "pretrain", {
        "kind": "series", "axis": "step", "seeds": [seed], "seed": seed, "device": "cpu", "bootstrap": 1000,
        "models": [{"train": {**train, "model": str(models[size])}, "stage": size} for size in SCALE],
        "tasks": [evaluation(files)]})


def trained_job(kind: str, model: str, files: dict[str, Path], seed: int, **fields: Any) -> dict[str, Any]:
    """An sft or dpo config: ``model`` trained with the chain's step settings, the test questions
    scored before training and after every epoch."""
    return {"kind": kind, "model": model, "seed": seed, "device": "cpu", "batch_size": 8, "lr_scheduler": "constant",
            "warmup_ratio": 0.05, "max_length": 256, "save_optimizer": False, "bootstrap": 1000,
            "calibration": [evaluation(files)], **fields}


@dataclass
class SeedRuns:
    """What one seed's jobs measured: the series' cells, the sft / dpo curves (per epoch, epoch 0 the
    start), the cft rows keyed (method, set), and when its jobs ran: each job's first and last event."""

    cells: list[dict[str, Any]] = field(default_factory=list)
    curves: dict[str, list[Figures]] = field(default_factory=dict)
    cft: dict[tuple[str, str], Figures] = field(default_factory=dict)
    spans: list[tuple[float, float]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """The jobs' compute: the sum of their spans, whichever invocations ran them."""
        return sum(end - start for start, end in self.spans)


def span(run_dir: Path) -> tuple[float, float]:
    """A job's first and last event time (seconds since the epoch)."""
    events, _ = read_events(run_dir / EVENTS_FILE)
    return events[0]["time"], events[-1]["time"]


def figures(metrics: dict[str, Any]) -> Figures:
    """An evaluation's figures, with mean confidence − accuracy (from its reliability bins: > 0 is
    over-confidence, which ECE alone does not tell from under-confidence) and the Bayes predictor's ECE."""
    bins = [b for b in metrics["reliability"] if b["count"]]
    confidence = sum(b["count"] * b["conf"] for b in bins) / sum(b["count"] for b in bins)
    return {"ece": metrics["ece"], "ece_low": metrics.get("ece_ci_low"), "ece_high": metrics.get("ece_ci_high"),
            "accuracy": metrics["accuracy"], "nll": metrics["nll"], "gap": confidence - metrics["accuracy"],
            "oracle": metrics["oracle"]["ece"]}


def read_metrics(path: Path) -> dict[str, Any]:
    return json.loads((path / METRICS_FILE).read_text())


def curve(run_dir: Path) -> list[Figures]:
    """An sft or dpo run's evaluation at the start and after every epoch, read from its calibration folder."""
    events, _ = read_events(run_dir / EVENTS_FILE)
    points = [e for e in events if e["stage"] == "train_eval" and e.get("tasks") and float(e["epoch"]).is_integer()]
    return [{"epoch": int(e["epoch"]), **figures(read_metrics(run_dir / CALIBRATION_DIR / f"step-{e['step']}" /
                                                             next(iter(e["tasks"]))))} for e in points]


def cft_rows(run_dir: Path) -> dict[tuple[str, str], Figures]:
    """A cft job's rows on its in-domain carve ("carve") and on the chain's test questions ("test")."""
    out = {}
    for folder in sorted((run_dir / "eval").iterdir()):
        method, _, where = folder.name.rpartition("-")
        if where in ("in_domain", "synthetic") and (folder / METRICS_FILE).is_file():
            out[method, "carve" if where == "in_domain" else "test"] = figures(read_metrics(folder))
    return out


def run_seed(root: Path, files: dict[str, Path], seed: int) -> SeedRuns:
    """Every job of one seed, in ``root/seed-N`` (finished ones kept), and what they measured."""
    out = root / f"seed-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    runs = SeedRuns()
    # ------------------------------------------------------------ (a) pre-training: sizes × steps
    series = pretrain(out, files, seed)
    runs.cells = json.loads((series / SERIES_FILE).read_text())["cells"]
    for cell in runs.cells:  # a cell's run is named from the series' parent folder
        cell.update(figures(read_metrics(series.parent / cell["run"])))
    base = final_weights(series / "train" / f"m{SCALE.index(BASE)}-seed{seed}")
    # ------------------------------------------------------------ (b) SFT: narrow / diverse × full / LoRA
    sft_runs = {}
    for name in SETS:
        for method, rate in SFT_RATES.items():
            key = f"sft-{name}-{method}"
            sft_runs[key] = job(out, key, trained_job(
                "sft", base.model, files, seed, dataset="instructions", data_files=[loader(files, name)],
                split="train", limit=None, method=method, learning_rate=rate, epochs=SFT_EPOCHS))
            runs.curves[key] = curve(sft_runs[key])
    # ------------------------------------------------------------ (c) DPO from the diverse full SFT model
    start = str(sft_runs["sft-diverse-full"] / MODEL_DIR)
    dpo_runs = {}
    for beta in BETAS:
        key = f"dpo-{beta:g}"
        dpo_runs[beta] = job(out, key, trained_job(
            "dpo", start, files, seed, preferences=[str(files["pairs"])], limit=None, beta=beta, loss_type="sigmoid",
            method="full", learning_rate=DPO_RATE, epochs=DPO_EPOCHS))
        runs.curves[key] = curve(dpo_runs[beta])
    # ------------------------------------------------------------ (d) CFT / RCFT from the DPO model
    cft = job(out, "cft", {
        "kind": "cft", "model": str(dpo_runs[CFT_BETA] / MODEL_DIR), "template": TEMPLATE, "seed": seed,
        "device": "cpu", "bootstrap": 1000,
        "in_domain": [{"dataset": "synthetic", "data_files": [loader(files, "pool")], "split": "train"}],
        "ood": [{"dataset": "synthetic", "data_files": [loader(files, "test", "test")], "split": "test"}],
        **CFT_SIZES, "methods": ["ts", "cft", "rcft"], "lambdas": [0.4], "preference_limit": 4,
        "max_response_tokens": 32, "training": {"method": "full", "epochs": 3, "learning_rate": 1.0e-3,
                                                "batch_size": 8, "lr_scheduler": "constant", "warmup_ratio": 0.05}})
    runs.cft = cft_rows(cft)
    runs.spans = [span(p) for p in (series, *sft_runs.values(), *dpo_runs.values(), cft)]
    return runs


# ---------------------------------------------------------------- the report

def boot(f: Figures) -> str:
    """One run's bootstrap interval over questions."""
    return f"[{pct(f['ece_low'])}, {pct(f['ece_high'])}]" if f.get("ece_low") is not None else "–"


def spread_cells(points: list[Figures]) -> list[str]:
    """ECE mean [t over seeds], seed 0's bootstrap interval, each seed's ECE; accuracy and confidence −
    accuracy as mean [t]; the mean NLL; the Bayes predictor's ECE on the same questions (mean over seeds
    where the questions differ by seed)."""
    oracle = sum(p["oracle"] for p in points) / len(points)
    return [mean_cell([p["ece"] for p in points]), boot(points[0]), " / ".join(pct(p["ece"]) for p in points),
            mean_cell([p["accuracy"] for p in points]), mean_cell([p["gap"] for p in points]),
            f"{sum(p['nll'] for p in points) / len(points):.3f}", pct(oracle)]


SPREAD_HEAD = ("ECE % [t 95 %] | seed 0 bootstrap | per seed | accuracy % [t] | confidence − accuracy % [t] | NLL "
               "| oracle ECE %")


def table(head: str, rows: list[tuple[str, list[Figures]]]) -> list[str]:
    """A table of models, each row the spread over seeds of one model's figures."""
    return [f"| {head} | {SPREAD_HEAD} |", "|" + "---|" * (head.count("|") + 8),
            *(f"| {label} | " + " | ".join(spread_cells(points)) + " |" for label, points in rows)]


def size_cells(seeds: list[SeedRuns], size: str) -> list[list[Figures]]:
    """Per step (in order), the cells of ``size`` over the seeds, its base model (step 0) included."""
    entry = SCALE.index(size)
    steps = sorted({c["step"] for c in seeds[0].cells if c["entry"] == entry})
    return [[next(c for c in s.cells if c["entry"] == entry and c["step"] == step) for s in seeds] for step in steps]


def scale_rows(seeds: list[SeedRuns]) -> list[str]:
    rows = [(f"{size} ({size_cells(seeds, size)[-1][0]['params'] / 1e6:.2f} M)", size_cells(seeds, size)[-1])
            for size in SCALE]
    return table("model (parameters)", rows)


def step_rows(seeds: list[SeedRuns]) -> list[str]:
    """ECE and accuracy against the step, one column pair per size (mean [t] over seeds)."""
    per_size = {size: size_cells(seeds, size) for size in SCALE}
    lines = ["| step | " + " | ".join(f"{size}: ECE % [t] | accuracy %" for size in SCALE) + " | oracle ECE % |",
             "|---|" + "---|---|" * len(SCALE) + "---|"]
    for i, points in enumerate(per_size[BASE]):
        cells = [str(points[0]["step"])]
        for size in SCALE:
            here = per_size[size][i]
            cells += [mean_cell([p["ece"] for p in here]), pct(sum(p["accuracy"] for p in here) / len(here))]
        lines.append("| " + " | ".join(cells) + f" | {pct(points[0]['oracle'])} |")
    return lines


SFT_LABELS = {f"sft-{name}-{method}": f"{name}, {'LoRA' if method == 'lora' else method}"
              for name in SETS for method in SFT_RATES}


def epoch_rows(seeds: list[SeedRuns]) -> list[str]:
    """ECE (mean [t]) and accuracy per SFT epoch, one column pair per SFT variant; epoch 0 is the base."""
    lines = ["| epoch | " + " | ".join(f"{label}: ECE % [t] | accuracy %" for label in SFT_LABELS.values()) + " |",
             "|---|" + "---|---|" * len(SFT_LABELS)]
    for epoch in range(SFT_EPOCHS + 1):
        cells = [str(epoch)]
        for key in SFT_LABELS:
            points = [s.curves[key][epoch] for s in seeds]
            cells += [mean_cell([p["ece"] for p in points]), pct(sum(p["accuracy"] for p in points) / len(points))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def last(seeds: list[SeedRuns], key: str, epoch: int = -1) -> list[Figures]:
    return [s.curves[key][epoch] for s in seeds]


def dpo_rows(seeds: list[SeedRuns]) -> list[str]:
    rows = [("before: the diverse full SFT model", last(seeds, f"dpo-{BETAS[0]:g}", 0))]
    rows += [(f"after DPO, β = {beta:g}", last(seeds, f"dpo-{beta:g}")) for beta in BETAS]
    return table("model", rows)


CFT_LABELS = {"base": f"as it is (DPO, β = {CFT_BETA:g})", "ts": "temperature scaling", "cft": "CFT",
              "rcft_0.4": "RCFT λ = 0.4"}


def cft_table(seeds: list[SeedRuns], where: str) -> list[str]:
    return table("model", [(label, [s.cft[method, where] for s in seeds]) for method, label in CFT_LABELS.items()])


def claims(seeds: list[SeedRuns]) -> list[Claim]:
    """Each claim: its text, its metric, the row said to be lower, the row said to be higher (ZERO: against 0),
    every figure in percent (bench/claims.py tests it on the per-seed differences)."""
    ece = lambda points: Row.of([100 * p["ece"] for p in points])  # noqa: E731
    gap = lambda points: Row.of([100 * p["gap"] for p in points])  # noqa: E731
    final = {size: size_cells(seeds, size)[-1] for size in SCALE}
    steps = size_cells(seeds, BASE)
    base = last(seeds, "sft-narrow-full", 0)
    rows = [
        (f"larger models are better calibrated: {SCALE[-1]} below {SCALE[0]}", "ECE", ece(final[SCALE[-1]]),
         ece(final[SCALE[0]])),
        (f"… {SCALE[-1]} below {SCALE[1]}", "ECE", ece(final[SCALE[-1]]), ece(final[SCALE[1]])),
        (f"longer pre-training is better calibrated: {BASE} at step {steps[-1][0]['step']} below step "
         f"{steps[1][0]['step']}", "ECE", ece(steps[-1]), ece(steps[1])),
        (f"… at step {steps[-1][0]['step']} below step {steps[len(steps) // 2][0]['step']}", "ECE", ece(steps[-1]),
         ece(steps[len(steps) // 2])),
    ]
    for key, label in SFT_LABELS.items():
        rows.append((f"SFT worsens ECE ({label}, epoch {SFT_EPOCHS} above the base)", "ECE", ece(base),
                     ece(last(seeds, key))))
    rows += [
        ("the diverse full SFT model is under-confident (confidence − accuracy below 0)", "confidence − accuracy",
         gap(last(seeds, "sft-diverse-full")), ZERO),
        ("… the diverse LoRA SFT model", "confidence − accuracy", gap(last(seeds, "sft-diverse-lora")), ZERO),
        ("narrow data worsens it more than diverse (full)", "ECE", ece(last(seeds, "sft-diverse-full")),
         ece(last(seeds, "sft-narrow-full"))),
        ("… (LoRA)", "ECE", ece(last(seeds, "sft-diverse-lora")), ece(last(seeds, "sft-narrow-lora"))),
        (f"more epochs worsen it (narrow full: epoch {SFT_EPOCHS} above epoch 1)", "ECE",
         ece(last(seeds, "sft-narrow-full", 1)), ece(last(seeds, "sft-narrow-full"))),
        (f"… (diverse full: epoch {SFT_EPOCHS} above epoch 1)", "ECE", ece(last(seeds, "sft-diverse-full", 1)),
         ece(last(seeds, "sft-diverse-full"))),
        ("LoRA worsens it less than full (narrow)", "ECE", ece(last(seeds, "sft-narrow-lora")),
         ece(last(seeds, "sft-narrow-full"))),
        ("… (diverse)", "ECE", ece(last(seeds, "sft-diverse-lora")), ece(last(seeds, "sft-diverse-full"))),
    ]
    before = last(seeds, f"dpo-{BETAS[0]:g}", 0)
    for beta in BETAS:
        after = last(seeds, f"dpo-{beta:g}")
        rows += [(f"DPO β = {beta:g} raises ECE (the CFT paper; the alignment paper: it stays)", "ECE", ece(before),
                  ece(after)),
                 (f"… β = {beta:g} makes the model over-confident (confidence − accuracy above the SFT model's)",
                  "confidence − accuracy", gap(before), gap(after))]
    strongest = last(seeds, f"dpo-{BETAS[-1]:g}")
    for beta in BETAS[:-1]:
        rows.append((f"a larger β keeps DPO calibrated better: β = {BETAS[-1]:g} below β = {beta:g}", "ECE",
                     ece(strongest), ece(last(seeds, f"dpo-{beta:g}"))))
    dpo = [s.cft["base", "test"] for s in seeds]
    for method in ("cft", "rcft_0.4", "ts"):
        rows.append((f"{CFT_LABELS[method]} brings the DPO model's ECE down", "ECE",
                     ece([s.cft[method, "test"] for s in seeds]), ece(dpo)))
    return [Claim(text, f"{metric} %", low, high) for text, metric, low, high in rows]


def claim_rows(seeds: list[SeedRuns]) -> list[str]:
    return claims_section(claims(seeds), len(seeds))


def render(seeds: list[SeedRuns], seconds: float, threads: int, out: Path) -> list[str]:
    n = len(seeds)
    busy = [s.seconds / 60 for s in seeds]
    spans = [pair for s in seeds for pair in s.spans]
    wall = (max(end for _, end in spans) - min(start for start, _ in spans)) / 60
    return [
        "# A model's life cycle on the controlled task, over training seeds (cpu)", "",
        f"{threads} CPU thread{'s' if threads > 1 else ''} a process. The jobs' compute per seed (their "
        f"events' span): {min(busy):.1f}–{max(busy):.1f} min, {sum(busy):.0f} min in all; wall clock from the first "
        f"job's start to the last one's end {wall:.0f} min (processes side by side, pauses between invocations "
        f"included); this invocation took {seconds / 60:.1f} min (jobs finished in `{out.name}/` are not rerun). "
        f"Configs: `{out.name}/seed-N/configs/`.", "",
        f"Task: `Task()` (8 objects, seed 0) of `lab.data.synthetic`, splits "
        f"{', '.join(f'{k} {v}' for k, v in SIZES.items())}; the same questions for every seed. Every evaluation: "
        f"the {SIZES['test']} test questions in the `{TEMPLATE}` prompt (but CFT's own carve, last table). Seeds "
        f"0–{n - 1}, each the seed of every job of its chain and of its scratch models' initialisation. Figures in "
        "percent but NLL: the mean over seeds with Student's t 95 % interval over seeds [t], seed 0's 95 % interval "
        "from 1,000 bootstrap resamples of its questions, each seed's figure; *confidence − accuracy* > 0 is "
        "over-confidence; *oracle* is the Bayes predictor's ECE on the same questions (the rule with confidence q: "
        "what a perfect model still shows at this n). Intervals are as computed, not clipped to [0, 100].", "",
        *claim_rows(seeds), "",
        "## (a) Pre-training: scale and steps", "",
        f"Scratch models trained {PRETRAIN_EPOCHS} epochs on the {SIZES['pretrain']} pretrain questions (learning "
        f"rate 1e-3, batch 8, constant), a snapshot after every epoch (`seed-N/pretrain/`, a series on the "
        "step axis). Final weights against scale:", "",
        *scale_rows(seeds), "",
        "Against steps (step 0: the initialised model), mean over seeds:", "",
        *step_rows(seeds), "",
        "## (b) SFT: narrow vs diverse instructions, full vs LoRA", "",
        f"The {BASE} base of (a) fine-tuned with the sft kind {SFT_EPOCHS} epochs on {SIZES['sft']} other questions "
        "as chat rows, the response the stated (noisy) answer: *narrow* in 2 phrasings (one the evaluation's "
        f"prompt), *diverse* in {len(PHRASINGS)} (the same one among them; letters or colour words). Full: "
        f"learning rate {SFT_RATES['full']:g}; LoRA r = 16: {SFT_RATES['lora']:g}. Test ECE after each epoch "
        "(epoch 0: the base):", "",
        *epoch_rows(seeds), "",
        f"After epoch {SFT_EPOCHS}:", "",
        *table("model", [("base (before SFT)", last(seeds, "sft-narrow-full", 0)),
                         *((label, last(seeds, key)) for key, label in SFT_LABELS.items())]), "",
        "## (c) DPO from the diverse full SFT model", "",
        f"{SIZES['prefs']} pairs: the evaluation's question, the rule's letter chosen over another drawn at random; "
        f"full, {DPO_EPOCHS} epochs, learning rate {DPO_RATE:g}, sigmoid loss.", "",
        *dpo_rows(seeds), "",
        f"## (d) CFT / RCFT from the DPO model (β = {CFT_BETA:g})", "",
        f"The cft kind in the `{TEMPLATE}` prompt: its pool ({SIZES['pool']} questions) carved by the seed into "
        f"train {CFT_SIZES['train_size']} / validation {CFT_SIZES['val_size']} / test {CFT_SIZES['test_size']}, 3 "
        "epochs at 1e-3; temperature fitted on the validation part. On the chain's test questions:", "",
        *cft_table(seeds, "test"), "",
        "On the cft job's own in-domain carve (its questions differ by seed; oracle: the mean):", "",
        *cft_table(seeds, "carve"),
    ]


def main() -> int:
    parser = jobs_parser(__doc__, out=DEFAULT_OUT, seeds=5, only=Only("SEED", (
        "run only these seeds' jobs and write no report: seeds share nothing, so processes given other seeds run "
        "beside it; a later run with --seeds writes the report from the finished jobs"), int))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    files = data_files(out)
    if args.only:
        for seed in args.only:
            print(f"seed {seed} done: {run_seed(out, files, seed).seconds / 60:.1f} min of compute", flush=True)
        return 0
    timer = Timer()
    seeds = []
    for seed in range(args.seeds):
        seeds.append(run_seed(out, files, seed))
        print(f"seed {seed} done: {seeds[-1].seconds / 60:.1f} min of compute", flush=True)
    lines = render(seeds, timer.seconds, args.threads, out)
    write_result(TARGET, lines)
    print("\n".join(lines))
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
