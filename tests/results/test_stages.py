"""Chains of runs on the Life cycle page (lab.results.stages, ui.lifecycle_page): base → SFT → DPO, read from the
run folders as the jobs write them (config.yaml by the lab's own writer, metrics.json and predictions.jsonl,
start.json, result.json, calibration/step-<n>/), listed beside the series and drawn as a series over stages;
then through a real pipeline of the tiny model."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import gradio as gr
import numpy as np
import pytest

from lab.calibration.spread import accuracy_bootstrap
from lab.core.layout import CALIBRATION_DIR, CONFIG_FILE, START_FILE
from lab.jobkit import pipeline
from lab.jobkit.kinds import write_config
from lab.kinds.dpo.config import DpoConfig
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.sft.config import SftConfig
from lab.results import runs, series, stages
from lab.results.reports import csv_text
from tests.helpers import row, write_eval
from ui.app import open_in_reliability
from ui.context import LabContext
from ui.lifecycle_page import choices, picked_cell, redraw, series_view
from ui.plots.lifecycle import lifecycle_figure

TASK = {"task": "mcq", "dataset": "synthetic", "data_files": ["bundled"], "split": "test", "limit": 12,
        "scoring": "letter"}
BOOTSTRAP = 50
SKIP = gr.skip()


def _evaluation(directory: Path, model: str, right: int, ece: float, adapter=None, task=TASK, mtime=None,
                **info) -> Path:
    """An evaluation folder as lab.kinds.evaluate.run leaves it: its config resolved, ``right`` of 12 questions
    right, its ECE with a bootstrap interval around it."""
    write_config(directory, "evaluate", EvalConfig.from_checked({**task, "model": model, "adapter": adapter,
                                                                "bootstrap": BOOTSTRAP}))
    rows = [row(i, [0.7, 0.3], 0 if i < right else 1) for i in range(12)]
    return write_eval(directory, rows, mtime, model=model, adapter=adapter, dataset=task["dataset"],
                      split=task["split"], accuracy=right / 12, ece=ece, ece_ci_low=ece - 0.01, ece_ci_high=ece + 0.02,
                      **info)


def _ended(directory: Path, status: str = "succeeded") -> None:
    (directory / "result.json").write_text(json.dumps({"status": status, "error": None}))


def _start(directory: Path, given: str, model: str, adapter=None) -> None:
    """What lab.jobkit.chain records when a job's run:<id> resolved at its start."""
    (directory / START_FILE).write_text(json.dumps({"model": {"given": given, "job": int(given[4:]), "model": model,
                                                              "adapter": adapter}}))


def _evaluate_job(root: Path, number: int, model: str, right: int, ece: float, given=None, adapter=None,
                  **kw) -> Path:
    """An evaluate job: its config.yaml holds the weights a run:<id> resolved to, start.json what it named."""
    directory = _evaluation(root / f"{number:05d}-evaluate", model, right, ece, adapter, **kw)
    if given:
        _start(directory, given, model, adapter)
    _ended(directory)
    return directory


def _trained(root: Path, number: int, kind: str, model: str, steps: dict[int, tuple[int, float]],
             status: Optional[str] = "succeeded", calibrated=TASK) -> Path:
    """An sft or dpo job with a LoRA adapter and its calibration task evaluated at ``steps`` (step: right, ECE):
    step 0 on the model it started from (a run:<id> merged into start/model), later steps on its weights."""
    directory = root / f"{number:05d}-{kind}"
    config = (SftConfig if kind == "sft" else DpoConfig).from_checked(
        {"model": model, "method": "lora", "calibration": [calibrated], "bootstrap": BOOTSTRAP,
         **({"dataset": "alpaca", "data_files": ["bundled"]} if kind == "sft" else {})})
    write_config(directory, kind, config)
    start = model
    if model.startswith("run:"):
        start = str(directory / "start" / "model")
        _start(directory, model, start)
    if status == "succeeded":
        (directory / "adapter").mkdir()
        (directory / "adapter" / "adapter_config.json").write_text("{}")
    for step, (right, ece) in steps.items():
        _evaluation(directory / CALIBRATION_DIR / f"step-{step}" / "t0-mcq", start if step == 0 else
                    f"{directory.name} step {step}", right, ece, task=calibrated, step=step, base_model=start)
    if status:  # None: still running, no ending yet
        _ended(directory, status)
    return directory


def _pipeline(root: Path, base: str = "bundled") -> None:
    """base → SFT (two epochs) → DPO → an evaluation of the DPO run, as examples/pipeline-quick.yaml leaves them."""
    _evaluate_job(root, 1, base, 4, 0.10)
    _trained(root, 2, "sft", base, {0: (4, 0.11), 2: (5, 0.15), 4: (6, 0.20)})
    _trained(root, 3, "dpo", "run:2", {0: (6, 0.21), 2: (7, 0.25)})
    dpo = root / "00003-dpo"
    _evaluate_job(root, 4, str(dpo / "start" / "model"), 7, 0.26, given="run:3", adapter=str(dpo / "adapter"))


def _runs(chain: stages.Chain) -> dict[str, str]:
    return {cell["stage"]: cell["run"] for cell in chain.doc["cells"]}


# ---------------------------------------------------------------- chains found in the run folders
@pytest.mark.unit
def test_a_pipeline_is_one_chain_over_its_stages_shaped_as_a_series_over_stages(tmp_path):
    _pipeline(tmp_path)
    [chain] = stages.find_chains(tmp_path)
    assert chain.name == "chain:00003-dpo" and chain.stages == ("base", "sft step 2", "sft", "dpo")
    # One evaluation a stage: the evaluate job before the sft run's step 0, the sft run's own last step before the
    # dpo run's step 0 (the same weights), the evaluation of run:3 before the dpo run's last step.
    assert _runs(chain) == {"base": "00001-evaluate", "sft step 2": "00002-sft/calibration/step-2/t0-mcq",
                            "sft": "00002-sft/calibration/step-4/t0-mcq", "dpo": "00004-evaluate"}
    doc = chain.doc
    assert doc["axis"] == "stage" and [t["label"] for t in doc["tasks"]] == ["mcq · synthetic/test · letter · first 12"]
    assert [c["x"] for c in doc["cells"]] == list(chain.stages) and [c["ece"] for c in doc["cells"]] == [
        0.10, 0.15, 0.20, 0.26]
    assert doc["folders"] == ["00002-sft", "00003-dpo"]
    assert all(r["runs"] == 1 and r["ece_low"] is None for r in doc["summary"])  # one run a stage: no t-interval
    rows = [json.loads(line) for line in (tmp_path / "00002-sft/calibration/step-2/t0-mcq/predictions.jsonl")
            .read_text().splitlines()]  # the accuracy's interval, as a series computes it from the predictions
    second = doc["cells"][1]
    expected = accuracy_bootstrap([r["correct"] for r in rows], BOOTSTRAP, seed=0)
    assert (second["accuracy_low"], second["accuracy_high"]) == pytest.approx(expected)
    assert (second["ece_low"], second["ece_high"]) == pytest.approx((0.14, 0.17))
    figure = lifecycle_figure(doc)  # drawn as a series over stages: the stages in chain order, no mean over seeds
    assert list(figure.layout.xaxis.categoryarray) == list(chain.stages)
    assert not [t for t in figure.data if (t.name or "").startswith("mean over")]


@pytest.mark.unit
def test_only_the_same_questions_scored_the_same_way_join_stages(tmp_path):
    _evaluate_job(tmp_path, 1, "bundled", 4, 0.10, task={**TASK, "limit": 20})  # other questions: not the base
    _evaluate_job(tmp_path, 2, "bundled", 4, 0.30, task={**TASK, "scoring": "cloze"})  # other scoring: neither
    _trained(tmp_path, 3, "sft", "bundled", {0: (4, 0.11), 1: (5, 0.12)})
    [chain] = stages.find_chains(tmp_path)
    assert _runs(chain) == {"base": "00003-sft/calibration/step-0/t0-mcq", "sft": "00003-sft/calibration/step-1/t0-mcq"}
    _evaluate_job(tmp_path, 4, "bundled", 5, 0.13, given="run:3", adapter=str(tmp_path / "00003-sft" / "adapter"),
                  task={**TASK, "limit": 20})  # run:3, its adapter on its base, on job 1's questions: a second task
    [chain] = stages.find_chains(tmp_path)
    assert [t["label"] for t in chain.doc["tasks"]] == ["mcq · synthetic/test · letter · first 20",
                                                        "mcq · synthetic/test · letter · first 12"]
    assert [(c["task"], c["x"], c["run"]) for c in chain.doc["cells"]] == [
        ("t0-mcq", "base", "00001-evaluate"), ("t1-mcq", "base", "00003-sft/calibration/step-0/t0-mcq"),
        ("t0-mcq", "sft", "00004-evaluate"), ("t1-mcq", "sft", "00003-sft/calibration/step-1/t0-mcq")]


@pytest.mark.unit
def test_a_lone_stage_is_no_chain_and_a_run_that_did_not_finish_shows_its_steps(tmp_path):
    _evaluate_job(tmp_path, 1, "bundled", 4, 0.10)
    assert stages.find_chains(tmp_path) == []  # one stage: nothing to follow
    _trained(tmp_path, 2, "sft", "bundled", {0: (4, 0.11)}, status="failed")
    assert stages.find_chains(tmp_path) == []  # only its step 0, the base again: still one stage
    _trained(tmp_path, 3, "sft", "bundled", {0: (4, 0.11), 2: (5, 0.15)}, status="failed")
    [chain] = stages.find_chains(tmp_path)
    assert chain.stages == ("base", "sft step 2")  # step 2 is not its final weights: it never finished


@pytest.mark.unit
def test_two_runs_from_one_base_are_two_chains_and_a_kind_twice_is_told_apart(tmp_path):
    _evaluate_job(tmp_path, 1, "bundled", 4, 0.10)
    _trained(tmp_path, 2, "sft", "bundled", {4: (6, 0.2)})
    _trained(tmp_path, 3, "sft", "bundled", {4: (7, 0.3)})
    _trained(tmp_path, 4, "sft", "run:3", {0: (7, 0.3), 4: (8, 0.4)})
    found = {c.name: c.stages for c in stages.find_chains(tmp_path)}
    assert found == {"chain:00002-sft": ("base", "sft"), "chain:00004-sft": ("base", "sft 3", "sft 4")}


@pytest.mark.unit
def test_an_evaluation_of_a_run_s_weights_by_folder_joins_its_stage_and_a_loop_ends(tmp_path):
    external = tmp_path / "models" / "tiny"
    external.mkdir(parents=True)
    root = tmp_path / "runs"
    _evaluate_job(root, 1, str(external), 4, 0.10)
    sft = _trained(root, 2, "sft", str(external), {})
    (sft / "model").mkdir()
    (sft / "model" / "config.json").write_text("{}")
    _evaluate_job(root, 3, str(sft / "model"), 6, 0.2)  # the run's model/ named as a folder, not run:2
    [chain] = stages.find_chains(root)
    assert _runs(chain) == {"base": "00001-evaluate", "sft": "00003-evaluate"}
    assert chain.doc["cells"][0]["model"] == "models/tiny"  # no server path: the folder's last two parts
    _evaluate_job(root, 4, str(root / "00001-evaluate"), 6, 0.2)  # a folder of the runs holding no weights: no stage
    looped = _trained(root, 5, "sft", "run:6", {0: (1, 0.1), 1: (2, 0.2)})
    _trained(root, 6, "sft", "run:5", {1: (3, 0.3)})  # hand-edited: each started from the other
    assert {c.name for c in stages.find_chains(root)} >= {"chain:00002-sft"} and looped.is_dir()


# ---------------------------------------------------------------- the page
@pytest.mark.unit
def test_the_page_lists_draws_exports_and_opens_a_chain_as_a_series(tmp_path):
    ctx = LabContext(tmp_path)
    _pipeline(tmp_path)
    (label, name), = choices(ctx.runs)
    assert name == "chain:00003-dpo" and label.startswith("chain to 00003-dpo: base → sft step 2 → sft → dpo · 1 task")
    figure, cells, summary, message, download, drawn = series_view(ctx, name)
    assert list(cells["stage"]) == ["base", "sft step 2", "sft", "dpo"] and list(cells["run"])[-1] == "00004-evaluate"
    assert summary["visible"] is False and "1 seed" in message and "no interval over seeds" in message
    chain = stages.chain(ctx.runs, name)
    assert Path(download["value"]).read_bytes().decode("utf-8") == csv_text(series.cells_frame(chain.doc))
    assert list(figure.layout.xaxis.categoryarray) == list(chain.stages)
    assert redraw(ctx, name, drawn) == (SKIP,) * 6  # nothing new
    _evaluate_job(tmp_path, 5, str(tmp_path / "00003-dpo/start/model"), 8, 0.3, given="run:3",
                  adapter=str(tmp_path / "00003-dpo/adapter"), mtime=time.time() + 5)  # dpo evaluated again, later
    assert list(redraw(ctx, name, drawn)[1]["run"])[-1] == "00005-evaluate"
    run, said, button = picked_cell(ctx, name, [2, 0])
    assert run == "00002-sft/calibration/step-4/t0-mcq" and button["interactive"] is True and "Picked 00002-sft" in said
    tabs, picker, *_ = open_in_reliability(ctx, [], [], run)
    assert tabs.selected == "reliability" and picker["value"] == [run]


@pytest.mark.unit
def test_hostile_names_and_labels_open_nothing_and_no_server_path_is_shown(tmp_path):
    ctx = LabContext(tmp_path / "runs")
    _pipeline(ctx.runs, base="<b>base</b>")  # a hand-edited model name
    for name in ("chain:../00003-dpo", "chain:/etc", "chain:00001-evaluate", "chain:", "chain:00003-dpo\0", "00003-dpo"):
        figure, cells, _, message, download, _ = series_view(ctx, name)
        assert figure is None and cells.empty and not download["visible"]
        assert message.count("No chain of runs called" if name.startswith("chain:") else "No series called") == 1
        assert picked_cell(ctx, name, 0)[0] is None
    assert stages.chain(ctx.runs, ["chain:00003-dpo"]) is None
    figure, cells, _, message, _, _ = series_view(ctx, "chain:00003-dpo")
    hovers = [text for trace in figure.data for text in (trace.hovertext or ())]
    assert any("&lt;b&gt;base&lt;/b&gt;" in text for text in hovers) and not any("<b>base</b>" in t for t in hovers)
    shown = json.dumps([choices(ctx.runs), cells.to_dict(), message, hovers])
    assert str(tmp_path) not in shown and os.path.realpath(tmp_path) not in shown


@pytest.mark.unit
def test_a_chain_queued_through_the_store_is_followed_as_its_next_stage_trains(tmp_path):
    """Queued as examples/pipeline-quick.yaml queues its stages (job.json, config.yaml by the store), the outputs
    written as the workers write them: the picked chain grows into its next stage's and says which job still runs."""
    ctx = LabContext(tmp_path)
    base = ctx.store.submit({"kind": "evaluate", **TASK, "model": "bundled", "bootstrap": BOOTSTRAP})
    sft = ctx.store.submit({"kind": "sft", "model": "bundled", "method": "lora", "dataset": "alpaca",
                            "data_files": ["bundled"], "calibration": [TASK], "bootstrap": BOOTSTRAP})
    dpo = ctx.store.submit({"kind": "dpo", "model": f"run:{sft.id}", "method": "lora", "calibration": [TASK],
                            "bootstrap": BOOTSTRAP})
    assert json.loads((Path(dpo.run_dir) / "job.json").read_text())["waits_on"] == [sft.id]
    _evaluate_job(tmp_path, base.id, "bundled", 4, 0.10)
    _trained(tmp_path, sft.id, "sft", "bundled", {0: (4, 0.11), 1: (5, 0.15)})
    for job in (base, sft):
        ctx.store.update(job.id, status="succeeded", finished=time.time())
    (_, name), = choices(ctx.runs)
    *_, message, _, drawn = series_view(ctx, name)
    assert name == "chain:00002-sft" and "still" not in message
    ctx.store.update(dpo.id, status="running", started=time.time())
    _trained(tmp_path, dpo.id, "dpo", f"run:{sft.id}", {0: (5, 0.15), 2: (6, 0.3)}, status=None)
    figure, cells, _, message, _, drawn = redraw(ctx, name, drawn)  # the page still holds the name it picked
    assert list(cells["stage"]) == ["base", "sft", "dpo step 2"] and "Job 3 (dpo) of this chain is running" in message
    _ended(Path(dpo.run_dir))
    (Path(dpo.run_dir) / "adapter").mkdir()
    ctx.store.update(dpo.id, status="succeeded", finished=time.time())
    figure, cells, _, message, _, _ = redraw(ctx, name, drawn)
    assert list(cells["stage"]) == ["base", "sft", "dpo"] and "running" not in message
    assert [n for _, n in choices(ctx.runs)] == ["chain:00003-dpo"]


# ---------------------------------------------------------------- a real chain
@pytest.mark.model
@pytest.mark.slow
def test_a_real_base_sft_dpo_pipeline_of_the_tiny_model_is_drawn_over_its_stages(tiny_model_dir, tmp_path):
    """examples/pipeline-quick.yaml's chain shrunk to the tiny model (about 20 s on a loaded 2-core CPU)."""
    task = {**TASK, "data_files": ["bundled"]}
    train = {"limit": 8, "epochs": 1, "batch_size": 8, "learning_rate": 1e-3, "warmup_ratio": 0.0, "max_length": 256,
             "device": "cpu", "bootstrap": 20, "calibration": [task], "method": "lora", "lora_r": 4, "lora_alpha": 8}
    data = {"pipeline": [
        {"name": "base", "kind": "evaluate", "model": str(tiny_model_dir), **task, "bootstrap": 20, "device": "cpu"},
        {"name": "sft", "kind": "sft", "model": str(tiny_model_dir), "dataset": "alpaca", "data_files": ["bundled"],
         **train},
        {"name": "dpo", "kind": "dpo", "model": "stage:sft", "preferences": ["bundled"], **train}]}
    out = tmp_path / "runs" / "pipeline-quick"  # lab run … --out runs/pipeline-quick: jobs one level down
    assert pipeline.run_here(pipeline.parse_pipeline(data, runs=out), out) == 0
    ctx = LabContext(tmp_path / "runs")
    (_, name), = choices(ctx.runs)
    figure, cells, _, message, _, _ = series_view(ctx, name)
    assert name == "chain:pipeline-quick/00003-dpo" and list(cells["stage"]) == ["base", "sft", "dpo"]
    assert list(cells["run"]) == ["pipeline-quick/00001-evaluate", "pipeline-quick/00002-sft/calibration/step-1/t0-mcq",
                                  "pipeline-quick/00003-dpo/calibration/step-1/t0-mcq"]
    assert all(runs.evaluation(ctx.runs, run) for run in cells["run"])  # each opens in Reliability
    assert "model: run:2" in (out / "00003-dpo" / CONFIG_FILE).read_text()  # linked through run:<id>, as queued
    assert list(figure.layout.xaxis.categoryarray) == ["base", "sft", "dpo"] and "1 seed" in message
    shown = json.dumps([cells.to_dict(), [list(t.hovertext) for t in figure.data if t.hovertext is not None]])
    assert str(tmp_path) not in shown and all(np.isfinite(cells["n"]))
