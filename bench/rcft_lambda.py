"""RCFT's λ on the controlled task: scale, stale bins or seed luck? bench/results/rcft_lambda_cpu.md.

    .venv/bin/python -m bench.rcft_lambda [--out runs/bench-controlled] [--threads 2]
                                          [--lambdas 1.8] [--seeds 0 1] [--estep-steps 5]

In bench.controlled's single-seed run of before (issue 34), its RCFT rows (learning rate 1e-3)
lost accuracy at every λ, and λ = 1.8 collapsed (accuracy 23 %, ECE 56 %) where λ = 10 did not; over
5 seeds its claims table (bench.claims) shows the loss at λ = 0.4 only. Three readings fit one run each:

* **scale**: with ``lambda_scale: paper`` the SFT term is a mean over every prompt + answer token
  (~45 per question here) while the regulariser is a mean over questions, all of it at the answer
  position, so λ weighs each question like λ × 45 tokens of cross-entropy. Measured here with
  autograd on the start model: the gradient each term puts on the option logits at the answer;
* **stale bins**: the E-step runs once per epoch, and the M-step pulls towards bin accuracies
  that the model has long left (with targets that rank another option first);
* **seed luck**: one seeded run per row.

So ``--lambdas`` (1.8 by default) are rerun as a 2 × 2: {E-step every epoch (as
bench.controlled), every ``--estep-steps`` optimiser steps} × ``--seeds``; the first seed's
per-epoch job also has the preset's other λ (0.4, 10), as bench.controlled's RCFT rows. A
seed is the cft job's: it carves the pool into train / validation / test and orders the
batches, so the seed-1 rows are scored on another 800 test questions (the shifted split is the
same 1,000). The start, the splits and the jobs are
bench.controlled's (:mod:`bench._controlled_task`, the same ``--out``: the base and the over-confident
model are trained once and shared).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from bench._controlled_task import base_model, cft_job, ece_cell, full_finetune, jobs_parser, prepare
from bench._harness import REPO, RESULTS, Timer, preset, write_result
from lab.core.layout import MODEL_DIR
from lab.results.reports import pct

SWEEP = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 1.0, 1.8, 10.0)  # the λ the measured pull is shown at
TARGET = RESULTS / "rcft_lambda_cpu.md"
READING = "## What it shows"  # the hand-written reading, kept when the script rewrites the tables above it


def answer_pull(model_dir: Path, records: Sequence[Any], template: str, batch_size: int, n_bins: int,
                edges: str, weights: Optional[Path] = None) -> dict[str, Any]:
    """Each RCFT term's gradient on the option logits at the answer position, per training question.

    The terms are the trainer's (:class:`lab.training.cft.RCFTTrainer` on ``lambda_scale: paper``):
    the model's mean cross-entropy over every supervised token of a batch (prompt + answer) and
    :func:`lab.training.cft_losses.ece_regulariser` with the bins of an E-step on this model, over batches
    of ``batch_size`` consecutive training questions. ``weights``: a trainer checkpoint to score
    instead of ``model_dir``'s weights (a checkpoint holds no tokenizer).

    Returns the supervised tokens per question; per λ of ``SWEEP`` the median over questions of
    ‖λ·g_ECE‖ / ‖g_SFT‖, the same ratio of the two norms' means, and the share of the questions the
    model gets right whose stated answer's logit a step on the sum would lower; and the share of
    questions whose M-step targets rank another option first.
    """
    import torch

    from lab.calibration import metrics
    from lab.training.cft_losses import bin_accuracy, ece_regulariser
    from lab.models.loading import load_model
    from lab.training.data import build_examples, pad_option_batch
    from lab.training.validation import letter_probs
    from lab.training.tokens import supervised_positions

    loaded = load_model(str(model_dir), device="cpu", dtype="float32")
    model, tokenizer = loaded.model, loaded.tokenizer
    if weights is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
    examples = build_examples(records, template, tokenizer, completion_only=False)
    probs, _ = metrics.padded([list(p) for p in letter_probs(model, tokenizer, [records[e["record"]] for e in examples],
                                                            template)])
    probs = torch.from_numpy(probs)
    answers = torch.tensor([e["answer"] for e in examples])
    bin_acc, _ = bin_accuracy(probs.max(dim=-1).values, probs.argmax(dim=-1) == answers, n_bins, edges)
    model.eval()  # no dropout: the gradients of the weights the E-step scored
    sft_grads, reg_grads, correct, broken, tokens = [], [], [], [], []
    for start in range(0, len(examples), batch_size):
        batch = pad_option_batch(examples[start:start + batch_size], tokenizer.pad_token_id)
        outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        rows = torch.arange(len(batch["answer"]))
        option_ids = batch["option_ids"].clamp(min=0)
        option_logits = outputs.logits[rows, batch["answer_pos"]].gather(1, option_ids)
        regulariser, violations = ece_regulariser(option_logits, batch["option_mask"], bin_acc, None, edges)
        for loss, grads in ((outputs.loss, sft_grads), (regulariser, reg_grads)):
            (grad,) = torch.autograd.grad(loss, outputs.logits, retain_graph=True)
            grads.append(grad[rows, batch["answer_pos"]].gather(1, option_ids).masked_fill(~batch["option_mask"], 0.0))
        top = option_logits.masked_fill(~batch["option_mask"], float("-inf")).argmax(dim=-1)
        correct.append(top == batch["answer"])
        broken.append(violations)
        tokens += supervised_positions(batch["labels"]).sum(dim=-1).tolist()
    g_sft, g_reg, correct = torch.cat(sft_grads).double(), torch.cat(reg_grads).double(), torch.cat(correct)
    norm_sft, norm_reg = g_sft.norm(dim=-1), g_reg.norm(dim=-1)
    median = float((norm_reg / norm_sft)[norm_reg > 0].median())
    of_means = float(norm_reg.mean() / norm_sft.mean())
    on_answer = lambda g: g.gather(1, answers[:, None])[:, 0]  # noqa: E731  (∂L/∂z of the stated answer)
    return {
        "questions": len(examples), "correct": int(correct.sum()), "batch_size": batch_size,
        "tokens": statistics.mean(tokens), "tokens_range": (min(tokens), max(tokens)),
        "rank_broken": float(torch.cat(broken).double().mean()),
        "sweep": [{"lambda": lam, "median_ratio": lam * median, "ratio_of_means": lam * of_means,
                   "answer_lowered": float((on_answer(g_sft + lam * g_reg)[correct] > 0).double().mean())}
                  for lam in SWEEP],
    }


def run_name(seed: int, estep_steps: Optional[int]) -> str:
    """The job's folder under ``--out``: one per (seed, E-step interval), so a rerun finds it."""
    return f"rcft-lambda-s{seed}-" + ("epoch" if estep_steps is None else f"every{estep_steps}")


def main() -> int:
    parser = jobs_parser(__doc__, REPO / "runs" / "bench-controlled", "bench.controlled's folder: its base and "
                         "over-confident model are reused")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[1.8],
                        help="the λ of the 2 × 2 (the first seed's per-epoch job also has the preset's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--estep-steps", type=int, default=5, help="the frequent E-step's interval, optimiser steps")
    args = parser.parse_args()
    out, files = prepare(args)
    timer = Timer()
    start = full_finetune(out, files, base_model(out, files))
    cft = preset("cft-controlled")
    runs: dict[tuple[int, Optional[int]], Path] = {}
    for seed in args.seeds:
        for every in (None, args.estep_steps):
            training = cft["training"] if every is None else {**cft["training"], "estep_steps": every}
            # The first seed's per-epoch job repeats bench/controlled.py's RCFT rows: all the preset's λ.
            lambdas = sorted({*cft["lambdas"], *args.lambdas}) if (seed, every) == (args.seeds[0], None) \
                else args.lambdas
            runs[seed, every] = cft_job(out, files, start, run_name(seed, every), seed=seed, methods=["rcft"],
                                        lambdas=lambdas, training=training)

    from lab.kinds.cft.config import CftConfig
    from lab.kinds.cft.run import load_pool

    first = runs[args.seeds[0], None]
    cfg = CftConfig.from_dict(json.loads((first / "report.json").read_text())["config"])
    train = load_pool(cfg)["train"]
    tcfg = cfg.train_config("rcft", completion_only=False)
    pull = {"the start (the over-confident model, E-step 0)": answer_pull(
        start / MODEL_DIR, train, cfg.template, tcfg.batch_size, tcfg.ece_bins, cfg.bin_edges)}
    for lam in args.lambdas:  # the last per-epoch E-step of each λ: the bins the third epoch is pulled to
        checkpoint = last_estep_checkpoint(first / "models" / f"rcft_{lam:g}")
        if checkpoint is not None:
            pull[f"λ = {lam:g}, seed {args.seeds[0]}, after {checkpoint.name.split('-')[-1]} steps (its last "
                 "per-epoch E-step)"] = answer_pull(start / MODEL_DIR, train, cfg.template, tcfg.batch_size,
                                                    tcfg.ece_bins, cfg.bin_edges, weights=checkpoint)

    previous = TARGET.read_text() if TARGET.is_file() else ""
    reading = previous[previous.index(READING):] if READING in previous else ""
    lines = render(out, runs, pull, args, timer.seconds)
    write_result(TARGET, [*lines, "", reading.rstrip("\n")] if reading else lines)
    print(f"wrote {TARGET}")
    return 0


def last_estep_checkpoint(row: Path) -> Optional[Path]:
    """The epoch checkpoint before the last one (the weights the last per-epoch E-step scored)."""
    checkpoints = sorted((row / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return checkpoints[-2] if len(checkpoints) >= 2 else None


def times(x: float) -> str:
    """A ratio to two significant digits, without an exponent."""
    return f"{x:.2g}" if x < 100 else f"{x:.0f}"


def render(out: Path, runs: dict[tuple[int, Optional[int]], Path], pull: dict[str, dict[str, Any]],
           args: argparse.Namespace, seconds: float) -> list[str]:
    start = next(iter(pull.values()))
    lines = [
        "# RCFT's λ on the controlled task: scale, stale bins or seed luck (cpu)", "",
        f"{args.threads} CPU threads; this invocation took {seconds / 60:.1f} min (jobs already finished in "
        f"`{out.name}/` are not rerun). Start: bench.controlled's experiment-3 model (the base fine-tuned 16 "
        "epochs on 100 noisy questions); every run is `examples/cft-controlled.yaml` (3 epochs, learning rate 1e-3, "
        f"batch 8, 600 training questions: 75 steps an epoch) with `methods: [rcft]`, the λ, seed and "
        f"`training.estep_steps` of its row. Configs: `{out.name}/configs/rcft-lambda-*.yaml`.", "",
        "## 1. The two terms' scale (`lambda_scale: paper`)", "",
        f"RCFT's SFT term is the mean cross-entropy over every supervised token of the batch: prompt + answer, "
        f"{start['tokens']:.1f} tokens a question here ({start['tokens_range'][0]}–{start['tokens_range'][1]}); its "
        "regulariser is the mean over the batch's questions of Σ_options (p − t)², all of it at the answer "
        f"position. Per question, λ·L_ECE therefore weighs like λ × {start['tokens']:.0f} tokens of cross-entropy, "
        "while the answer letter is one of those tokens.", "",
        "Measured with autograd on the training questions (batches of "
        f"{start['batch_size']}, as the trainer's): the gradient each term puts on the option logits at the "
        "answer position. *Pull*: the median over questions of ‖λ·∂L_ECE/∂z‖ / ‖∂L_SFT/∂z‖ there, and "
        "in brackets the ratio of the two norms' means (1: the regulariser pulls the answer position as hard "
        "as SFT does). *Answer lowered*: the share of the "
        "questions the model gets right whose stated answer's logit a gradient step on L_SFT + λ·L_ECE lowers.", "",
        "| model and bins | questions (right) | rank broken % | " + " | ".join(f"λ = {x:g}" for x in SWEEP) + " |",
        "|---|---|---|" + "---|" * len(SWEEP),
    ]
    for label, p in pull.items():
        lines.append(f"| {label}: pull | {p['questions']} ({p['correct']}) | {pct(p['rank_broken'])} | "
                     + " | ".join(f"{times(s['median_ratio'])} ({times(s['ratio_of_means'])})" for s in p["sweep"])
                     + " |")
        lines.append("| … answer lowered % | | | " + " | ".join(pct(s["answer_lowered"]) for s in p["sweep"]) + " |")
    lines += ["", "*Rank broken*: the share of the training questions whose M-step targets, under these bins, put "
              "another option above the model's top one (A.4's condition).", "",
              f"## 2. Each λ under {{E-step every epoch, every {args.estep_steps} steps}} × seeds", "",
              "Validation accuracy after each epoch; the E-steps' figures over the run (training questions): the "
              "largest share with rank-breaking targets, and the last E-step's training accuracy / mean confidence.",
              "",
              "| λ | E-step | seed | in-domain ECE % [95 % CI] | accuracy % | shifted ECE % [95 % CI] | accuracy % | "
              "validation accuracy by epoch % | E-steps | most rank broken % | last E-step: accuracy / confidence % |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for seed in dict.fromkeys(s for s, _ in runs):  # the start first, once per seed: each scores its own test split
        report = json.loads((runs[seed, None] / "report.json").read_text())
        inside, shifted = (next(r for r in report["rows"] if r["method"] == "base" and r["in_domain"] == flag)
                           for flag in (True, False))
        lines.append(f"| start | – | {seed} | {ece_cell(inside)} | {pct(inside['accuracy'])} | {ece_cell(shifted)} | "
                     f"{pct(shifted['accuracy'])} | | | | |")
    for lam in sorted({*preset("cft-controlled")["lambdas"], *args.lambdas}):
        for (seed, every), path in runs.items():
            report = json.loads((path / "report.json").read_text())
            method = f"rcft_{lam:g}"
            if method not in report["esteps"]:
                continue  # only the first seed's per-epoch job has every λ
            inside, shifted = (next(r for r in report["rows"] if r["method"] == method and r["in_domain"] == flag)
                               for flag in (True, False))
            curve = " / ".join(pct(h["accuracy"]) for h in report["training"][method])
            esteps = report["esteps"][method]
            last = esteps[-1]
            lines.append(f"| {lam:g} | {'epoch' if every is None else f'every {every} steps'} | {seed} | "
                         f"{ece_cell(inside)} | {pct(inside['accuracy'])} | {ece_cell(shifted)} | "
                         f"{pct(shifted['accuracy'])} | {curve} | {len(esteps)} | "
                         f"{pct(max(e['rank_violations'] for e in esteps))} | "
                         f"{pct(last['train_accuracy'])} / {pct(last['confidence'])} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
