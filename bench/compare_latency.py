"""How long a compare takes through the inference lane: cold, warm, and beside a training job.

    python bench/compare_latency.py [--repeats 3] [--no-training]

Two models, as a user compares a fine-tune with its base: the bundled SmolLM2-135M-Instruct and
the same base with a LoRA adapter (random, made here: only its cost matters). Measured in one run:

- **job path**: the compare as the queued ``compare`` job ran it before the lane: a fresh
  ``python -m lab run`` process that imports torch and loads its models (the baseline; it also
  waits for a free slot when a training job holds it, which is not counted here);
- **cold**: the lane's first compare (its worker starts, torch imports, the base loads once and
  the adapter attaches to it);
- **warm**: the next compares, same models, a new question each time (median of ``--repeats``);
- **warm, list of 3**: three questions in one request;
- **during training**: a warm compare while ``examples/finetune-quick.yaml`` (on 1,000 questions) trains in its own
  process on the same CPU (the lane does not queue behind it; the CPU is shared, so it is slower).

Then the case the issue measured (41 s through the job queue): the bundled model with itself at
T = 2, which the lane asks once, in a fresh lane, cold and warm. Prints seconds and the ratios
cold / warm and job path / warm.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a plain script from anywhere

from jobs.lane import Lane  # noqa: E402
from lab.compare import history_dir  # noqa: E402

OPTIONS = ["Oslo", "Helsinki", "Stockholm", "Copenhagen"]
QUESTIONS = ["What is the capital of Norway?", "What is the capital of Sweden?", "What is the capital of Denmark?",
             "What is the capital of Finland?", "Which city is the largest in Scandinavia?",
             "Where is the Nobel Peace Prize awarded?", "Which of these cities lies furthest north?"]


def _adapter(folder: Path) -> str:
    """A LoRA adapter on the bundled model, saved as a training run would leave it."""
    import torch
    from peft import LoraConfig, get_peft_model

    from lab.models import load_model

    torch.manual_seed(0)
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
    start = time.perf_counter()
    lane.call("compare", {"config": config, "out": str(history_dir(runs, config["questions"]))})
    return time.perf_counter() - start


def _job_path(runs: Path, adapter: str, question: str) -> float:
    """The compare as a fresh worker process, as the job system ran it."""
    import yaml

    folder = runs / "job"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "compare.yaml"
    config.write_text(yaml.safe_dump({"kind": "compare", "device": "cpu", **_config(adapter, question)}))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lab", "run", str(config), "--out", str(folder / "out")], cwd=ROOT,
                   check=True, capture_output=True)
    return time.perf_counter() - start


def _training(runs: Path) -> subprocess.Popen:
    """examples/finetune-quick.yaml on 1,000 questions (minutes, so that it outlasts the compare) in
    its own process; returns once its training loop is stepping."""
    import yaml

    out = runs / "training"
    config = yaml.safe_load((ROOT / "examples" / "finetune-quick.yaml").read_text())
    config.update(limit=1000, val_limit=16)
    (runs / "training.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "lab", "run", str(runs / "training.yaml"), "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-training", action="store_true", help="skip the compare beside a training job")
    args = parser.parse_args()
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
        same = Lane(runs / ".lane-same", device="cpu")  # the case: one model with itself at T = 2
        try:
            same_cold = _timed(same, runs, None, QUESTIONS[0])
            same_warm = statistics.median(_timed(same, runs, None, q) for q in QUESTIONS[1:1 + args.repeats])
        finally:
            same.stop()
    print("compare of 2 models (bundled, bundled + LoRA) on 1 question with 4 options, 24 new tokens, CPU")
    print(f"  job path (fresh process)    {job:7.2f} s")
    print(f"  lane, cold (first compare)  {cold:7.2f} s")
    print(f"  lane, warm (median of {args.repeats})   {warm:7.2f} s   cold/warm {cold / warm:5.1f}x   "
          f"job/warm {job / warm:5.1f}x")
    print(f"  lane, warm, 3 questions     {listed:7.2f} s")
    if during is not None:
        print(f"  lane, warm, during training {during:7.2f} s   ({during / warm:.1f}x warm; the training job was "
              f"{'still' if still else 'no longer'} running when it answered)")
    print(f"  held after: {', '.join(h['model'] + (' + adapter' if h['adapter'] else '') for h in held)} "
          "(the base loaded once)")
    print("bundled and bundled at T = 2 (one model, asked once; T rescales its option probabilities)")
    print(f"  lane, cold                  {same_cold:7.2f} s")
    print(f"  lane, warm (median of {args.repeats})   {same_warm:7.2f} s   cold/warm {same_cold / same_warm:5.1f}x")


if __name__ == "__main__":
    main()
