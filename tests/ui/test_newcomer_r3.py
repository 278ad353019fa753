"""What a newcomer met in round 3 (issue 43): an sft or dpo job's page summarises each calibration task
before → after training, every evaluation with its interval and DPO's rewards (written run folders, no
model); a training job names what it does while it scores its calibration tasks (a tiny model's job);
the Launch form's dataset dropdowns offer what the kind and task accept, with the task's defaults (and in
Chromium: tests/browser/test_launch_form.py)."""
import json
from pathlib import Path

import pytest

from lab.core.events import read_events
from tests.helpers import row, write_eval
from ui.job_results import job_results
from ui.progress import progress

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
    assert "(step 0, no evaluation after training yet)" in text
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


CALIBRATION = [{"task": "mcq", "dataset": "synthetic", "data_files": ["bundled"], "split": "test", "limit": 12,
                "scoring": "letter"}]


def _train(kind: str, model: Path, out: Path, **fields) -> list[dict]:
    from lab.jobkit.kinds import parse_config
    from lab.jobkit.worker import JobContext
    from lab.kinds.dpo.run import run_job as dpo
    from lab.kinds.sft.run import run_job as sft

    data = {"dataset": "alpaca", "data_files": ["bundled"]} if kind == "sft" else {"preferences": ["bundled"]}
    _, cfg = parse_config({"kind": kind, "model": str(model), **data, "limit": 8, "epochs": 1, "batch_size": 4,
                           "learning_rate": 1e-3, "max_length": 256, "device": "cpu", "bootstrap": 20,
                           "calibration": CALIBRATION, **fields})
    out.mkdir(parents=True)
    {"sft": sft, "dpo": dpo}[kind](cfg, JobContext(out))
    return read_events(out / "events.jsonl")[0]


@pytest.mark.model
@pytest.mark.slow
def test_a_training_job_names_each_calibration_task_while_it_scores_it(tiny_model_dir, tmp_path):
    """The job read `starting… 5m05s` for the minutes it scored its calibration tasks before training."""
    out = tmp_path / "00001-sft"
    events = _train("sft", tiny_model_dir, out)
    name = "scoring calibration task 1/1 (mcq · synthetic/test) before training"
    counted = [i for i, e in enumerate(events) if e["stage"] == name]
    assert counted and events[counted[-1]]["step"] == events[counted[-1]]["total"] == 12
    assert progress(events[:counted[0] + 1], now=events[counted[0]]["time"]).text.startswith(name + " 0/12")
    first_step = next(i for i, e in enumerate(events) if e["stage"] == "train")
    assert [e.get("name") for e in events[counted[-1]:first_step] if e["stage"] == "stage"] == ["training"]
    assert progress(events[:first_step]).text.startswith("training…")
    assert any(e["stage"] == "scoring calibration task 1/1 (mcq · synthetic/test) at step 2" for e in events)
    said = [e["message"] for e in events if e["stage"] == "log"]
    assert any(m.startswith(f"{name.removeprefix('scoring ')}: accuracy ") and "n = 12" in m for m in said)
    # after training, the evaluation names the trained run, not the base model it started from
    after = json.loads((out / "calibration" / "step-2" / "t0-mcq" / "metrics.json").read_text())
    assert (after["model"], after["base_model"]) == ("00001-sft step 2", str(tiny_model_dir))
    assert "00001-sft step 2" in job_results(tmp_path, "sft", str(out)).text


@pytest.mark.model
@pytest.mark.slow
def test_a_dpo_job_logs_its_rewards_for_the_page(tiny_model_dir, tmp_path):
    out = tmp_path / "00002-dpo"
    events = _train("dpo", tiny_model_dir, out)
    rewards = [e for e in events if e["stage"] == "rewards"]
    assert [e["step"] for e in rewards] == [1, 2] and all(0 <= e["rewards/accuracies"] <= 1 for e in rewards)
    text = job_results(tmp_path, "dpo", str(out)).text
    assert "| epoch 1 | 1–2 |" in text and "| final (last log) | 2 |" in text


# ---------------------------------------------------------------- the Launch form's dataset dropdowns
def _launch_blocks(tmp_path) -> list:
    import gradio as gr

    from ui.context import LabContext
    from ui.launch_page import build_launch

    with gr.Blocks() as demo:
        build_launch(LabContext(tmp_path / "runs"))
    return list(demo.blocks.values())


def _choices(dropdown) -> list[str]:
    return [value for _, value in dropdown.choices]


@pytest.mark.unit
@pytest.mark.slow
def test_each_dataset_dropdown_offers_what_its_kind_accepts(tmp_path):
    """The sft form offered only question sets, every one refused by sft, and not alpaca, dolly or instructions;
    and its upload box took questions, which it refuses too."""
    blocks = _launch_blocks(tmp_path)
    by_id = {b.elem_id: b for b in blocks if getattr(b, "elem_id", None)}
    assert _choices(by_id["sft-dataset"]) == ["alpaca", "dolly", "instructions"]
    question_kinds = ("evaluate", "finetune", "first", "extract")
    for kind in question_kinds:
        offered = _choices(by_id[f"{kind}-dataset"])
        assert "obqa" in offered and "alpaca" not in offered and "text" not in offered, kind
    assert sum(getattr(b, "label", None) == "Question file" for b in blocks) == len(question_kinds)


@pytest.mark.unit
@pytest.mark.parametrize("task, shown, dataset, split", [
    ("clm", ["synthetic", "text", "trex"], "text", "test"),  # what Show config alone said clm resolves to
    ("facts", ["synthetic", "trex"], "trex", "test"),
])
def test_the_evaluate_form_follows_its_task(task, shown, dataset, split):
    from ui.launch_page import change_task

    datasets, splits = change_task("evaluate", task, "arc_easy", "validation")
    assert datasets["choices"] == shown
    assert (datasets["value"], splits["value"]) == (dataset, split)
    back, back_split = change_task("evaluate", "mcq", dataset, split)
    assert "obqa" in back["choices"] and (back["value"], back_split["value"]) == ("arc_easy", "validation")


@pytest.mark.unit
def test_a_dataset_the_new_task_reads_is_kept_with_its_split():
    from ui.launch_page import change_task

    datasets, splits = change_task("evaluate", "clm", "synthetic", "train")
    assert (datasets["value"], splits["value"]) == ("synthetic", "train")
    datasets, splits = change_task("evaluate", "clm", "obqa", "dev-carve:0.5")  # the user's own split stays
    assert (datasets["value"], splits["value"]) == ("text", "dev-carve:0.5")
