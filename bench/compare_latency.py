"""How long a compare takes through the inference lane: cold, warm, and beside a training job.

    python -m bench.compare_latency [--repeats 3] [--no-training] [--out bench/results/compare_latency_cpu.txt]

Two models, as a user compares a fine-tune with its base: the bundled SmolLM2-135M-Instruct and
the same base with a LoRA adapter (random, made here: only its cost matters). Measured in one run:

- **job path**: the compare as the queued ``compare`` job ran it before the lane: a fresh
  ``python -m lab run`` process that imports torch and loads its models (the baseline; it also
  waits for a free slot when a training job holds it, which is not counted here);
- **cold**: the lane's first compare (its worker starts, torch imports, the base loads once and
  the adapter attaches to it);
- **warm**: the next compares, same models, a new question each time (median of ``--repeats``);
- **pre-loaded**: the first compare in a new lane that was pre-loaded as the Compare page opened
  (:meth:`jobs.lane.Lane.preload`, waited for: the user types the question meanwhile) with the
  models the form showed: both models, or the form's default (the bundled model alone) and then
  the adapter picked, which the first compare attaches;
- **warm, list of 3**: three questions in one request;
- **during training**: a warm compare while ``examples/finetune-quick.yaml`` (on 1,000 questions) trains in its own
  process on the same CPU (the lane does not queue behind it; the CPU is shared, so it is slower).

Then the case the issue measured (41 s through the job queue): the bundled model with itself at
T = 2, which the lane asks once, in a fresh lane, cold, warm, and pre-loaded with the form's
default (the bundled model). Prints seconds and the ratios cold / warm, cold / pre-loaded (issue
31's goal: at least 10) and job path / warm.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench._harness import REPO, RESULTS, Timer, Transcript, parser, seed, timed, write_result
from jobs.lane import Lane
from lab.kinds.compare.result import history_dir

OPTIONS = ["Oslo", "Helsinki", "Stockholm", "Copenhagen"]
QUESTIONS = ["What is the capital of Norway?", "What is the capital of Sweden?", "What is the capital of Denmark?",
             "What is the capital of Finland?", "Which city is the largest in Scandinavia?",
             "Where is the Nobel Peace Prize awarded?", "Which of these cities lies furthest north?"]


def _adapter(folder: Path) -> str:
    """A LoRA adapter on the bundled model, saved as a training run would leave it."""
    from peft import LoraConfig, get_peft_model

    from lab.models.loading import load_model

    seed(0)
    loaded = load_model("bundled", device="cpu")
    model = get_peft_model(loaded.model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(folder)
    return str(folder)


def _config(adapter: Optional[str], *questions: str) -> dict:
    """Two models: the base and the base with ``adapter``, or (None) the base and the base at T = 2."""
    second = {"adapter": adapter, "label": "bundled + LoRA"} if adapter else {"temperature": 2.0}
    return {"questions": [{"question": q, "options": OPTIONS} for q in questions], "max_new_tokens": 24,
            "models": [{"model": "bundled"}, {"model": "bundled", **second}]}


def _timed(lane: Lane, runs: Path, adapter: Optional[str], *questions: str) -> float:
    config = _config(adapter, *questions)
    return timed(lambda: lane.call("compare", {"config": config, "out": str(history_dir(runs, config["questions"]))}))


def _preloaded(home: Path, runs: Path, preload: list[dict], adapter: Optional[str],
               question: str) -> tuple[float, float]:
    """(seconds the pre-load took, seconds of the first compare after it) in a new lane: the page was
    opened with ``preload`` in its form, and the question typed once the lane was warm."""
    lane = Lane(home, device="cpu")
    try:
        warmup = lane.preload(preload)
        while not warmup.done:
            time.sleep(0.05)
        if warmup.error:
            raise SystemExit(f"the pre-load failed: {warmup.error}")
        return warmup.seconds, _timed(lane, runs, adapter, question)
    finally:
        lane.stop()


def _job_path(runs: Path, adapter: str, question: str) -> float:
    """The compare as a fresh worker process, as the job system ran it."""
    import yaml

    folder = runs / "job"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "compare.yaml"
    config.write_text(yaml.safe_dump({"kind": "compare", "device": "cpu", **_config(adapter, question)}))
    return timed(lambda: subprocess.run([sys.executable, "-m", "lab", "run", str(config), "--out", str(folder / "out")],
                                        cwd=REPO, check=True, capture_output=True))


def _training(runs: Path) -> subprocess.Popen:
    """examples/finetune-quick.yaml on 1,000 questions (minutes, so that it outlasts the compare) in
    its own process; returns once its training loop is stepping."""
    import yaml

    out = runs / "training"
    config = yaml.safe_load((REPO / "examples" / "finetune-quick.yaml").read_text())
    config.update(limit=1000, val_limit=16)
    (runs / "training.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "lab", "run", str(runs / "training.yaml"), "--out", str(out)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    waited = Timer()
    while waited.seconds < 300 and proc.poll() is None:
        try:
            events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        except (OSError, ValueError):
            events = []
        if any(e.get("stage") == "train" and e.get("step", 0) > 0 for e in events):
            return proc
        time.sleep(1)
    proc.kill()
    raise SystemExit(f"the training job did not start stepping within 300 s; see {out / 'log.txt'}")


def main() -> None:
    options = parser(__doc__, out=RESULTS / "compare_latency_cpu.txt")
    options.add_argument("--repeats", type=int, default=3)
    options.add_argument("--no-training", action="store_true", help="skip the compare beside a training job")
    args = options.parse_args()
    with tempfile.TemporaryDirectory(prefix="compare-latency-") as tmp:
        runs = Path(tmp)
        adapter = _adapter(runs / "adapter")
        questions = iter(QUESTIONS)
        job = _job_path(runs, adapter, next(questions))
        lane = Lane(runs / ".lane", device="cpu")
        try:
            cold = _timed(lane, runs, adapter, next(questions))
            warm = statistics.median(_timed(lane, runs, adapter, next(questions)) for _ in range(args.repeats))
            listed = _timed(lane, runs, adapter, *QUESTIONS[:3])
            during = None
            if not args.no_training:
                training = _training(runs)
                try:
                    during = _timed(lane, runs, adapter, QUESTIONS[-1])
                    still = training.poll() is None
                finally:
                    training.kill()
            held = lane.status()["held"]
        finally:
            lane.stop()
        both = [{"model": "bundled"}, {"model": "bundled", "adapter": adapter}]
        both_load, both_first = _preloaded(runs / ".lane-both", runs, both, adapter, QUESTIONS[1])
        base_load, base_first = _preloaded(runs / ".lane-base", runs, both[:1], adapter, QUESTIONS[1])
        same = Lane(runs / ".lane-same", device="cpu")  # the case: one model with itself at T = 2
        try:
            same_cold = _timed(same, runs, None, QUESTIONS[0])
            same_warm = statistics.median(_timed(same, runs, None, q) for q in QUESTIONS[1:1 + args.repeats])
        finally:
            same.stop()
        same_load, same_first = _preloaded(runs / ".lane-same-pre", runs, both[:1], None, QUESTIONS[0])
    report = Transcript()
    line = lambda label, seconds, ratios="": report.print(f"  {label:<46}{seconds:7.2f} s   {ratios}".rstrip())  # noqa: E731
    report.print("compare of 2 models (bundled, bundled + LoRA) on 1 question with 4 options, 24 new tokens, CPU")
    line("job path (fresh process)", job)
    line("lane, cold (first compare)", cold)
    line(f"lane, warm (median of {args.repeats})", warm,
         f"cold/warm {cold / warm:5.1f}x   job/warm {job / warm:5.1f}x")
    line("lane, pre-loaded with both, first compare", both_first,
         f"cold/pre-loaded {cold / both_first:5.1f}x   (the pre-load took {both_load:.2f} s)")
    line("lane, pre-loaded with bundled, first compare", base_first,
         f"cold/pre-loaded {cold / base_first:5.1f}x   (the pre-load took {base_load:.2f} s; the compare "
         "attaches the adapter)")
    line("lane, warm, 3 questions", listed)
    if during is not None:
        line("lane, warm, during training", during, f"({during / warm:.1f}x warm; the training job was "
             f"{'still' if still else 'no longer'} running when it answered)")
    report.print(f"  held after: {', '.join(h['model'] + (' + adapter' if h['adapter'] else '') for h in held)} "
                 "(the base loaded once)")
    report.print("bundled and bundled at T = 2 (one model, asked once; T rescales its option probabilities)")
    line("lane, cold", same_cold)
    line(f"lane, warm (median of {args.repeats})", same_warm, f"cold/warm {same_cold / same_warm:5.1f}x")
    line("lane, pre-loaded with bundled, first compare", same_first,
         f"cold/pre-loaded {same_cold / same_first:5.1f}x   (the pre-load took {same_load:.2f} s)")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
