"""What a newcomer met in round 3 (issue 43): an sft or dpo job's page summarises each calibration task
before → after training, every evaluation with its interval and DPO's rewards (written run folders, no
model); a training job names what it does while it scores its calibration tasks (a tiny model's job);
the Launch form's dataset dropdowns offer what the kind and task accept, with the task's defaults."""
import json
from pathlib import Path

import pytest

from tests.helpers import row, write_eval
from ui.job_results import job_results

ROWS = [row(i, [0.7, 0.3], i % 2) for i in range(4)]


def _cell(run_dir: Path, step: int, key: str, **metrics) -> None:
    write_eval(run_dir / "calibration" / f"step-{step}" / key, ROWS, **metrics)


def _events(run_dir: Path, events: list[dict]) -> None:
    (run_dir / "events.jsonl").write_text("".join(json.dumps({"time": 1.0, **e}) + "\n" for e in events))


def _alignment_run(root: Path, kind: str) -> Path:
    run_dir = root / f"00007-{kind}"
    _cell(run_dir, 0, "t0-mcq", n=100, accuracy=0.41, ece=0.121, ece_ci_low=0.08, ece_ci_high=0.162,
          dataset="arc_easy", split="validation")
    _cell(run_dir, 0, "t1-clm", n=500, accuracy=0.30, ece=0.05, ece_ci_low=0.03, ece_ci_high=0.07, dataset="text",
          split="test")
    for step, (acc, ece) in ((2, (0.44, 0.10)), (4, (0.47, 0.09))):
        _cell(run_dir, step, "t0-mcq", n=100, accuracy=acc, ece=ece, ece_ci_low=ece - 0.03, ece_ci_high=ece + 0.03,
              dataset="arc_easy", split="validation", model=f"00007-{kind} step {step}")
        _cell(run_dir, step, "t1-clm", n=500, accuracy=0.31, ece=0.083, ece_ci_low=0.061, ece_ci_high=0.102,
              dataset="text", split="test", model=f"00007-{kind} step {step}")
    return run_dir


@pytest.mark.unit
def test_an_sft_page_shows_each_task_before_and_after_with_intervals_not_the_last_cell(tmp_path):
    run_dir = _alignment_run(tmp_path, "sft")
    _events(run_dir, [{"stage": "train_eval", "step": s, "epoch": e} for s, e in ((0, 0), (2, 1.0), (4, 2.0))])
    found = job_results(tmp_path, "sft", str(run_dir))
    lines = found.text.splitlines()
    assert "step 0 → step 4" in lines[0]
    assert "| t0-mcq · arc_easy/validation | 100 | 41.0% → **47.0%** | 12.1% (8.0%–16.2%) → **9.0% (6.0%–12.0%)** |" \
        in lines
    assert "| t1-clm · text/test | 500 | 30.0% → **31.0%** | 5.0% (3.0%–7.0%) → **8.3% (6.1%–10.2%)** |" in lines
    assert "| 2 | 1.0 | t0-mcq · arc_easy/validation | 44.0% | 10.0% (7.0%–13.0%) | 1.000 | 100 |" in lines
    assert "DPO rewards" not in found.text
    # the diagram and the links are the first task's latest evaluation, named for the trained run, not "bundled"
    assert found.run == "00007-sft/calibration/step-4/t0-mcq" and "00007-sft step 4" in found.text
    assert found.figure is not None and "t0-mcq at step 4" in found.figure_label


@pytest.mark.unit
def test_while_training_runs_the_table_says_the_after_is_still_to_come(tmp_path):
    run_dir = tmp_path / "00003-sft"
    _cell(run_dir, 0, "t0-mcq", n=100, accuracy=0.41, ece=0.121, dataset="arc_easy", split="validation")
    text = job_results(tmp_path, "sft", str(run_dir)).text
    assert "| t0-mcq · arc_easy/validation | 100 | 41.0% → … | 12.1% → … |" in text.splitlines()


@pytest.mark.unit
def test_a_dpo_page_tabulates_the_rewards_per_epoch_and_the_last_log(tmp_path):
    run_dir = _alignment_run(tmp_path, "dpo")
    rewards = [{"stage": "rewards", "step": 1, "epoch": 0.5, "rewards/chosen": 0.1, "rewards/rejected": -0.1,
                "rewards/margins": 0.2, "rewards/accuracies": 0.5},
               {"stage": "rewards", "step": 2, "epoch": 1.0, "rewards/chosen": 0.3, "rewards/rejected": -0.3,
                "rewards/margins": 0.6, "rewards/accuracies": 1.0},
               {"stage": "rewards", "step": 3, "epoch": 1.5, "rewards/chosen": 0.5, "rewards/rejected": -0.5,
                "rewards/margins": 1.0, "rewards/accuracies": 1.0},
               # resumed from step 2's checkpoint: step 3 logged again, and that log counts
               {"stage": "rewards", "step": 3, "epoch": 1.5, "rewards/chosen": 0.4, "rewards/rejected": -0.4,
                "rewards/margins": 0.8, "rewards/accuracies": 0.75},
               {"stage": "rewards", "step": 4, "epoch": 2.0, "rewards/chosen": 0.6, "rewards/rejected": -0.6,
                "rewards/margins": 1.2, "rewards/accuracies": 1.0}]
    _events(run_dir, rewards)
    lines = job_results(tmp_path, "dpo", str(run_dir)).text.splitlines()
    assert "| | steps | rewards/chosen | rewards/rejected | rewards/margins | rewards/accuracies |" in lines
    assert "| epoch 1 | 1–2 | +0.200 | -0.200 | +0.400 | 75.0% |" in lines
    assert "| epoch 2 | 3–4 | +0.500 | -0.500 | +1.000 | 87.5% |" in lines
    assert "| final (last log) | 4 | +0.600 | -0.600 | +1.200 | 100.0% |" in lines


@pytest.mark.unit
def test_markup_in_a_run_file_is_shown_as_text(tmp_path):
    run_dir = tmp_path / "00004-sft"
    _cell(run_dir, 0, "t0-mcq", dataset="<img src=x onerror=alert(1)>|x", split="test")
    text = job_results(tmp_path, "sft", str(run_dir)).text
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;&#124;x/test" in text
