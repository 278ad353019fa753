"""The papers' effects on the controlled task, whose true confidence is known: bench/results/controlled_cpu.md.

    .venv/bin/python bench/controlled.py [--out runs/bench-controlled] [--threads 2]

A task from :mod:`lab.data.synthetic` (8 objects, 4 colours, the stated answer the rule's with
q = 0.95 in bright light and 0.6 in dim light; the shifted split 0.8 / 0.45) and a small Llama
created from scratch (:mod:`lab.models.scratch`). The *base* model learns the rule on 600 questions of
its own (3 epochs); every experiment starts from it, as the papers start from a pretrained model:

1. **Epochs on noisy labels** (the alignment-calibration paper's "ECE grows with epochs"): the
   base fine-tuned on 100 other questions for many epochs, full and LoRA, with the held-out ECE
   per epoch and each model's test and shifted ECE with 95 % bootstrap intervals.
2. **FIRST**: a teacher (the base fine-tuned to memorisation), fine-tune / direct distill / LS
   distill / FIRST students, and the oracle student (distilled from the true distribution written
   as a top-k store: the upper bound), in-domain and on the shifted split.
3. **CFT / RCFT** from the over-confident model of (1), with temperature scaling and label
   smoothing as baselines and a λ sweep.

Every job is a config (written beside its run under ``--out``, built from the shipped presets'
``examples/*-controlled.yaml`` with this bench's data and sizes) run by the lab's own worker, so
a finished job is not redone when the bench is run again. Each table also gives the Bayes
predictor (the rule, confident q) on the same questions: the ECE a perfect model would still
show on that many questions.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a plain script from anywhere

from lab.data.synthetic import Task, write_splits  # noqa: E402
from lab.core.events import read_events  # noqa: E402
from lab.core.layout import ADAPTER_DIR, EVENTS_FILE, METRICS_FILE, MODEL_DIR, RESULT_FILE  # noqa: E402
from lab.jobkit.worker import run  # noqa: E402
from lab.core.yamlio import dump_yaml, load_yaml  # noqa: E402

TASK = Task()  # the shipped task: 8 objects, seed 0
SIZES = {"pretrain": 600, "train": 100, "validation": 500, "test": 1000, "shifted": 1000, "pool": 1600}
EPOCHS = 16  # experiments 1 and 2: enough for a hard-label fine-tune to memorise its 100 noisy labels
COMMON = {"dataset": "synthetic", "device": "cpu", "seed": 0}  # experiments 1 and 2 (a cft job names data per source)


def preset(name: str) -> dict[str, Any]:
    return load_yaml((REPO / "examples" / f"{name}.yaml").read_text(), name)


def job(out: Path, name: str, config: dict[str, Any]) -> Path:
    """Run ``config`` in ``out/name``. A finished run of the same config is kept; any other run
    (killed, or its config changed: a CFT job given one more λ) resumes there, where the worker's
    stages skip what is done. A changed setting of a stage that is done needs another ``name``."""
    target = out / name
    result = target / RESULT_FILE
    path = out / "configs" / f"{name}.yaml"
    text = dump_yaml(config)
    if (result.is_file() and json.loads(result.read_text()).get("status") == "succeeded" and path.is_file()
            and path.read_text() == text):
        return target
    target.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    start = time.time()
    code = run(path, target)
    if code != 0:
        raise SystemExit(f"{name} failed (exit code {code}); see {target}/log.txt or {target}/{EVENTS_FILE}")
    print(f"{name}: {(time.time() - start) / 60:.1f} min", flush=True)
    return target


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The per-epoch validation records of a finetune run."""
    events, _ = read_events(run_dir / EVENTS_FILE)
    return [e for e in events if e["stage"] == "train_eval" and "ece" in e and float(e["epoch"]).is_integer()]


def metrics(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / METRICS_FILE).read_text())


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def ece_cell(m: dict[str, Any]) -> str:
    return f"{pct(m['ece'])} [{pct(m['ece_ci_low'])}, {pct(m['ece_ci_high'])}]"


def eval_row(label: str, inside: dict[str, Any], shifted: dict[str, Any]) -> str:
    return (f"| {label} | {ece_cell(inside)} | {pct(inside['ece_gap_to_oracle'])} | {pct(inside['accuracy'])} | "
            f"{inside['nll']:.3f} | {ece_cell(shifted)} | {pct(shifted['accuracy'])} |")


def oracle_row(inside: dict[str, Any], shifted: dict[str, Any]) -> str:
    a, b = inside["oracle"], shifted["oracle"]
    return (f"| Bayes predictor (the rule, confident q) | {pct(a['ece'])} (expected {pct(a['expected']['ece'])}) | 0 | "
            f"{pct(a['accuracy'])} | {a['nll']:.3f} | {pct(b['ece'])} (expected {pct(b['expected']['ece'])}) | "
            f"{pct(b['accuracy'])} |")


EVAL_HEAD = ["| model | test ECE % [95 % CI] | gap to oracle | test accuracy % | test NLL | shifted ECE % [95 % CI] | "
             "shifted accuracy % |", "|---|---|---|---|---|---|---|"]


def data_files(out: Path) -> dict[str, str]:
    """The bench's splits (written under ``out/data`` on first use) as loader arguments ``split=path``."""
    data = out / "data"
    if not (data / "pool.jsonl").is_file():
        write_splits(data, TASK, SIZES)
    # The loaders know the splits train / validation / test / shifted: the bench's other parts are read as train.
    return {part: f"{part if part in ('validation', 'test', 'shifted') else 'train'}={data / f'{part}.jsonl'}"
            for part in SIZES}


def base_model(out: Path, files: dict[str, str]) -> Path:
    """The run of the *base*: the scratch model trained 3 epochs on its own pretrain questions."""
    from lab.models.scratch import ScratchConfig, create
    from lab.data import load_records

    scratch = out / "scratch"
    if not (scratch / "config.json").is_file():
        create(scratch, load_records("synthetic", "train", [files["pretrain"]]).records, ScratchConfig())
    return job(out, "base", {**preset("finetune-controlled"), **COMMON, "model": str(scratch),
                             "data_files": [files["pretrain"]], "split": "train", "limit": None,
                             "val_data_files": [files["validation"]], "val_limit": None, "epochs": 3})


def full_finetune(out: Path, files: dict[str, str], base: Path) -> Path:
    """Experiment 1's full fine-tune: the over-confident model that experiment 3 starts from."""
    return job(out, "e1-full", {**preset("finetune-controlled"), **COMMON, "model": str(base / MODEL_DIR),
                                "data_files": [files["train"]], "limit": None,
                                "val_data_files": [files["validation"]], "val_limit": None, "epochs": EPOCHS})


def cft_job(out: Path, files: dict[str, str], start: Path, name: str, **overrides: Any) -> Path:
    """A CFT job from ``start`` (a finetune run: the over-confident model of experiment 1), on the
    bench's pool and shifted split; ``overrides`` are top-level fields of the cft-controlled preset."""
    return job(out, name, {
        **preset("cft-controlled"), "device": "cpu", "seed": 0, "model": str(start / MODEL_DIR),
        "in_domain": [{"dataset": "synthetic", "data_files": [files["pool"]], "split": "train"}],
        "ood": [{"dataset": "synthetic", "data_files": [files["shifted"]], "split": "shifted"}], **overrides})


def arguments(description: str, out_help: str = "where the bench's jobs run (a rerun skips finished ones)"
              ) -> argparse.ArgumentParser:
    """The options every controlled-task bench takes: its folder and torch's CPU threads."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench-controlled", help=out_help)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return parser


def prepare(args: argparse.Namespace) -> tuple[Path, dict[str, str]]:
    """torch's threads set, and the bench's folder (resolved) with its data files in it."""
    import torch

    torch.set_num_threads(args.threads)
    out = args.out.resolve()
    return out, data_files(out)


def main() -> int:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    out, files = prepare(args)
    start = time.time()

    # ------------------------------------------------------------ the base model and experiment 1
    base = base_model(out, files)
    tuned = {
        "full": full_finetune(out, files, base),
        "lora": job(out, "e1-lora", {**preset("finetune-controlled"), **COMMON, "model": str(base / MODEL_DIR),
                                     "method": "lora", "learning_rate": 3.0e-3, "lora_r": 16, "lora_alpha": 32,
                                     "data_files": [files["train"]], "limit": None,
                                     "val_data_files": [files["validation"]], "val_limit": None, "epochs": EPOCHS}),
    }
    evaluations = {}
    for name, model, adapter in (("base", base / MODEL_DIR, None), ("full", tuned["full"] / MODEL_DIR, None),
                                 ("lora", base / MODEL_DIR, tuned["lora"] / ADAPTER_DIR)):
        for split in ("test", "shifted"):
            evaluations[name, split] = metrics(job(out, f"e1-eval-{name}-{split}", {
                "kind": "evaluate", **COMMON, "model": str(model), "adapter": str(adapter) if adapter else None,
                "data_files": [files[split]], "split": split, "limit": None, "scoring": "letter", "template": "first",
                "bootstrap": 1000}))

    # ------------------------------------------------------------ experiment 2: FIRST
    first = preset("first-controlled")
    first_run = job(out, "e2-first", {
        **first, **COMMON, "teacher": str(base / MODEL_DIR), "student": str(base / MODEL_DIR),
        "teacher_epochs": EPOCHS, "training": {**first["training"], "epochs": EPOCHS},
        "data_files": [files["train"], files["validation"], files["test"]], "train_limit": None, "val_limit": None,
        "test_limit": None, "ood": [{"dataset": "synthetic", "data_files": [files["shifted"]], "split": "shifted"}]})

    # ------------------------------------------------------------ experiment 3: CFT / RCFT
    cft = preset("cft-controlled")
    cft_run = cft_job(out, files, tuned["full"], "e3-cft")
    # RCFT trains on prompt + answer (as the paper): is what it does here the prompt's loss, the
    # regulariser, or the step size? λ = 0 isolates the first; a 5× smaller rate the last.
    diagnostics = {
        "λ = 0 (prompt + answer SFT alone), learning rate 1e-3": cft_job(
            out, files, tuned["full"], "e3-rcft-lambda0", methods=["rcft"], lambdas=[0.0]),
        "learning rate 2e-4": cft_job(out, files, tuned["full"], "e3-rcft-lr2e-4", methods=["cft", "rcft"],
                                      lambdas=[0.0, 0.4, 1.8, 10.0],
                                      training={**cft["training"], "learning_rate": 2.0e-4}),
    }

    report = render(out, evaluations, tuned, first_run, cft_run, diagnostics, time.time() - start, args.threads)
    target = REPO / "bench" / "results" / "controlled_cpu.md"
    target.write_text(report)
    print(f"wrote {target}")
    return 0


def render(out: Path, evaluations: dict, tuned: dict[str, Path], first_run: Path, cft_run: Path,
           diagnostics: dict[str, Path], seconds: float, threads: int) -> str:
    import torch

    curves = {name: history(path) for name, path in tuned.items()}
    lines = [
        "# The papers' effects on the controlled task (cpu)", "",
        f"`python bench/controlled.py` — {time.strftime('%Y-%m-%d')}, {platform.machine()}, {threads} CPU threads, "
        f"torch {torch.__version__}; this invocation took {seconds / 60:.1f} min (jobs already finished in "
        f"`{out.name}/` are not rerun). Configs: `{out.name}/configs/`, built from `examples/*-controlled.yaml`.", "",
        f"Task: `Task()` (8 objects, seed 0) of `lab.data.synthetic`, splits {', '.join(f'{k} {v}' for k, v in SIZES.items())}. "
        "Model: `lab.models.scratch` defaults, trained 3 epochs on the pretrain split (the *base*). All figures in percent "
        "but NLL; 95 % intervals from 1,000 bootstrap resamples of the questions.", "",
        "## 1. Fine-tuning epochs on noisy labels, full vs LoRA", "",
        f"The base fine-tuned {EPOCHS} epochs on the 100 train questions (constant learning rate: full 1e-3, "
        "LoRA r = 16 3e-3). Held-out validation (500 questions) after each epoch:", "",
        "| epoch | full: ECE | accuracy | NLL | LoRA: ECE | accuracy | NLL |", "|---|---|---|---|---|---|---|",
    ]
    for full, lora in zip(curves["full"], curves["lora"]):
        lines.append(f"| {full['epoch']:g} | {pct(full['ece'])} | {pct(full['accuracy'])} | {full['nll']:.3f} | "
                     f"{pct(lora['ece'])} | {pct(lora['accuracy'])} | {lora['nll']:.3f} |")
    lines += ["", "Each model on the test split (in-domain) and the shifted split:", "", *EVAL_HEAD,
              oracle_row(evaluations["base", "test"], evaluations["base", "shifted"])]
    for name, label in (("base", "base (3 epochs on its own questions)"), ("full", f"full fine-tune, {EPOCHS} epochs"),
                        ("lora", f"LoRA fine-tune, {EPOCHS} epochs")):
        lines.append(eval_row(label, evaluations[name, "test"], evaluations[name, "shifted"]))
    lines += ["", "## 2. FIRST", "", f"Teacher: the base fine-tuned {EPOCHS} epochs on the 100 train "
              f"questions; every student starts from the base and trains {EPOCHS} epochs on them.",
              "",
              (first_run / "report.md").read_text().split("\n", 2)[2].strip(), "",
              "## 3. CFT / RCFT from the over-confident model", "",
              f"Start: the full fine-tune of experiment 1 ({EPOCHS} epochs). The pool (1,600 questions) is carved "
              "into train / validation / test by the protocol.", "",
              (cft_run / "report.md").read_text().split("\n", 2)[2].strip(), "",
              "### RCFT's failure taken apart", "",
              "The same start and pool; each row is a CFT job of its own (`" + "`, `".join(
                  p.name for p in diagnostics.values()) + "`).", "",
              "| run | row | in-domain ECE % [95 % CI] | accuracy % | shifted ECE % [95 % CI] | accuracy % |",
              "|---|---|---|---|---|---|"]
    for label, path in diagnostics.items():
        rows = json.loads((path / "report.json").read_text())["rows"]
        for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "base"):
            inside, shifted = (next(r for r in rows if r["method"] == method and r["in_domain"] == flag)
                               for flag in (True, False))
            lines.append(f"| {label} | {method} | {ece_cell(inside)} | {pct(inside['accuracy'])} | "
                         f"{ece_cell(shifted)} | {pct(shifted['accuracy'])} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
