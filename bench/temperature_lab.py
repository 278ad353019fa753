"""How fast the temperature lab answers a slider move, against asking the model again.

    python -m bench.temperature_lab [--out bench/results/temperature_lab_cpu.txt]

One slider move recomputes, from a run's stored option probabilities: the probabilities at the
new temperature and two summaries (ECE, NLL, Brier, cw-ECE, accuracy, reliability table; at T and
at T = 1) — the numbers ``ui.temperature_page.slider_moved`` recomputes per move (it also draws the
figures and bootstraps the ECE's interval, not timed here); the 81-point ECE/NLL sweep is computed
once per run and cached. Timed on synthetic runs of 1,000 and 10,000 four-option
questions. The baseline, measured in the same
run, is what re-scoring would cost instead: the bundled model's letter-scoring time per question
(32 ARC-Challenge-like prompts) times the run's size.
"""
from __future__ import annotations

import statistics

import numpy as np

from bench._harness import RESULTS, Transcript, parser, timed, write_result
from lab.results import analysis, predictions
from lab.data.record import MCQRecord

REPEATS = 5


def synthetic(n: int, seed: int = 0) -> predictions.Predictions:
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2, size=(n, 4))
    probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    labels = rng.integers(0, 4, size=n)
    rows = [{"probs": p.tolist(), "answer": int(y)} for p, y in zip(probs, labels)]
    return predictions.Predictions(probs, np.ones_like(probs, dtype=bool), labels, rows)


def slider_move(pred: predictions.Predictions, t: float) -> None:
    analysis.calibration_summary(analysis.recalibrate(pred, t), pred.mask, pred.labels)
    analysis.calibration_summary(pred.probs, pred.mask, pred.labels)


def scoring_seconds_per_question(n: int = 32) -> float:
    from lab.models.loading import load_model
    from lab.models.scoring import score_letter
    from lab.data.templates import get_template

    loaded = load_model("bundled", device="cpu")
    render = get_template("cft_chat").render
    records = [MCQRecord(f"q{i}", f"Which of these is number {i}?", (f"{i}", f"{i + 1}", f"{i + 2}", f"{i + 3}"), 0, "x")
               for i in range(n)]
    prompts = [render(r, loaded.tokenizer) for r in records]
    score_letter(loaded.model, loaded.tokenizer, prompts[:4])  # warm-up
    return timed(lambda: score_letter(loaded.model, loaded.tokenizer, prompts, batch_size=16)) / n


def main() -> None:
    args = parser(__doc__, out=RESULTS / "temperature_lab_cpu.txt").parse_args()
    report = Transcript()
    per_question = scoring_seconds_per_question()
    report.print(f"baseline: re-scoring with the bundled model, {1000 * per_question:.1f} ms per question "
                 "(CPU, batch 16)")
    for n in (1_000, 10_000):
        pred = synthetic(n)
        times = [timed(lambda: slider_move(pred, float(t))) for t in np.linspace(0.5, 3.0, REPEATS)]
        ms = 1000 * statistics.median(times)
        sweep_ms = 1000 * timed(lambda: analysis.temperature_sweep(pred))
        report.print(f"n = {n:>6}: slider move {ms:6.1f} ms (the sweep, once per run: {sweep_ms:6.1f} ms); "
                     f"re-scoring would take {n * per_question:7.1f} s = {n * per_question / (ms / 1000):,.0f}x longer")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
