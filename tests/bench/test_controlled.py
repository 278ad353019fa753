"""The controlled task's first effect, on this machine: fine-tuning many epochs on noisy labels
makes a model over-confident against the oracle (the alignment-calibration paper's "ECE grows with
epochs"). A seeded model created from scratch (lab.models.scratch) first learns the task's rule on 600
questions of its own (the *base*, about as calibrated as the Bayes predictor); then it is
fine-tuned on 100 other noisy questions, each a text of its own (its card number), for 16 epochs:
it memorises their labels and its held-out ECE and NLL climb. About two minutes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lab.calibration.oracle import oracle
from lab.cli import main
from lab.data import load
from lab.data.synthetic import Task, write_splits
from lab.models.scratch import create

pytestmark = [pytest.mark.model, pytest.mark.e2e, pytest.mark.slow]

EPOCHS = 16
STEADY = {"--learning-rate": "1e-3", "--batch-size": "8", "--lr-scheduler": "constant", "--seed": "0",
          "--device": "cpu"}


def _finetune(model: Path, train: str, limit: int, validation: str, epochs: int, out: Path, warmup: float) -> list[dict]:
    flags = [x for item in STEADY.items() for x in item]
    code = main(["finetune", "--model", str(model), "--dataset", "synthetic", "--data-files", train, "--split", "train",
                 "--limit", str(limit), "--val-split", "validation", "--val-data-files", validation, "--val-limit", "500",
                 "--epochs", str(epochs), "--warmup-ratio", str(warmup), *flags, "--out", str(out)])
    assert code == 0
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e.get("stage") == "train_eval" and "ece" in e]


def test_many_epochs_on_noisy_labels_raise_ece_against_the_oracle(tmp_path):
    data = tmp_path / "task"
    write_splits(data, Task(), sizes={"pretrain": 600, "train": 100, "validation": 500})
    pretrain, train = f"train={data / 'pretrain.jsonl'}", f"train={data / 'train.jsonl'}"
    validation = f"validation={data / 'validation.jsonl'}"
    scratch = create(tmp_path / "scratch", load("synthetic", "train", [pretrain]).records)
    base = _finetune(scratch, pretrain, 600, validation, 3, tmp_path / "base", warmup=0.05)[-1]
    tuned = _finetune(tmp_path / "base" / "model", train, 100, validation, EPOCHS, tmp_path / "tuned", warmup=0.0)
    assert len(tuned) == EPOCHS

    held_out = load("synthetic", "validation", [validation]).records
    bayes = oracle([r.meta["true_probs"] for r in held_out], [r.answer for r in held_out])
    # The base has learnt the rule and is nearly as calibrated as the Bayes predictor on these questions
    # (seeds 0-2 measured: accuracy 0.80 against the Bayes 0.78-0.80, ECE 0.05-0.09 against 0.02-0.05).
    assert base["accuracy"] >= bayes["accuracy"] - 0.05, (base, bayes)
    assert base["ece"] <= bayes["ece"] + 0.1, (base, bayes)
    # Then memorising 100 noisy labels makes it over-confident: ECE and NLL well above the base's
    # (seeds 0-2: the last four epochs' ECE 0.19-0.26 and NLL 1.10-1.40, the base's 0.05-0.09 and 0.67-0.75).
    late = tuned[-4:]
    late_ece, late_nll = np.mean([h["ece"] for h in late]), np.mean([h["nll"] for h in late])
    assert late_ece >= base["ece"] + 0.06, ([h["ece"] for h in tuned], base["ece"])
    assert late_nll >= base["nll"] + 0.15, ([h["nll"] for h in tuned], base["nll"])
