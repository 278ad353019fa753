"""The series kind (lab.kinds.series): the spreads it reports (over seeds, over questions), its table,
its config's refusals, the training snapshots it reads, and whole series over model sizes, training
steps and seeds, resumed cell by cell."""
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from scipy import stats

from lab.calibration import metrics
from lab.calibration.spread import accuracy_bootstrap, mean_interval
from lab.core.config import ConfigError
from lab.core.errors import DataError, Stopped
from lab.core.events import EventWriter
from lab.core.layout import (CELLS_DIR, CONFIG_FILE, DONE_FILE, METRICS_FILE, PREDICTIONS_FILE, SERIES_CSV, SERIES_FILE,
                             STOP_FILE)
from lab.jobkit.kinds import load_config, parse_config, write_config
from lab.jobkit.worker import JobContext
from lab.kinds.series import run as series_run
from lab.results import series
from lab.results.runs import evaluation
from lab.training.config import TrainConfig
from lab.training.snapshots import TrainedPoint, final_weights, snapshots, training_points
from tests.helpers import tiny_config

MCQ = {"task": "mcq", "dataset": "synthetic", "scoring": "letter", "limit": 40}
CLM = {"task": "clm", "data_files": ["bundled"], "limit": 10}
# A few full fine-tuning steps of a tiny model: 16 examples in batches of 8, two epochs, a save after each.
TRAIN = {"dataset": "synthetic", "data_files": ["bundled"], "limit": 16, "val_split": None, "batch_size": 8,
         "epochs": 2, "learning_rate": 1e-3, "lr_scheduler": "constant", "warmup_ratio": 0.0}


class Interrupted(Exception):
    """What a test raises inside a series to cut it short."""


def _counting(monkeypatch, owner, name: str, fail_after: int | None = None) -> list[tuple]:
    """Replace ``owner.name`` by a wrapper that records each call's arguments (and raises
    :class:`Interrupted` on the call after ``fail_after`` of them); the list of calls."""
    real, calls = getattr(owner, name), []

    def wrapper(*args, **kwargs):
        if fail_after is not None and len(calls) >= fail_after:
            raise Interrupted(f"{name} cut after {fail_after} calls")
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def _run(config: dict, out: Path) -> dict:
    """A series run in this process, as the worker runs it, into ``out``."""
    _, cfg = parse_config({"kind": "series", **config})
    out.mkdir(parents=True, exist_ok=True)
    return series_run.run_job(cfg, JobContext(out))


def _tensors(folder: Path, name: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(str(folder / name))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _stamp(path: Path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


def _without_run(doc: dict) -> dict:
    """``doc`` less each cell's run directory name (two series in two folders differ only there)."""
    return {**doc, "cells": [{k: v for k, v in c.items() if k != "run"} for c in doc["cells"]]}


# ---------------------------------------------------------------- lab.calibration.spread


@pytest.mark.unit
def test_mean_interval_is_students_t_interval_of_the_mean():
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    half = 4.302652729749462 / math.sqrt(3)  # t(0.975, 2 df) × s / √n, with s = 1
    assert mean == 2.0 and low == pytest.approx(2 - half, rel=1e-12) and high == pytest.approx(2 + half, rel=1e-12)
    values = [0.031, 0.087, 0.052, 0.066]
    for level in (0.95, 0.9):
        expected = stats.t.interval(level, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
        mean, low, high = mean_interval(values, level)
        assert mean == pytest.approx(np.mean(values)) and (low, high) == pytest.approx(expected, rel=1e-12)
    assert mean_interval([0.25]) == (0.25, None, None)  # one run: no interval
    assert mean_interval([0.1, 0.1]) == (0.1, 0.1, 0.1)


@pytest.mark.unit
@pytest.mark.parametrize("values", [[], [0.1, float("nan")], [float("inf"), 0.2], [[0.1, 0.2], [0.3, 0.4]]])
def test_mean_interval_refuses_what_is_not_a_list_of_finite_values(values):
    with pytest.raises(ValueError, match="non-empty 1-D array of finite values"):
        mean_interval(values)


@pytest.mark.unit
def test_accuracy_bootstrap_contains_the_accuracy_is_seeded_and_narrows_with_n():
    rng = np.random.default_rng(7)
    correct = rng.random(200) < 0.6
    low, high = accuracy_bootstrap(correct, 500, seed=3)
    assert low <= correct.mean() <= high and high - low > 0
    assert accuracy_bootstrap(correct, 500, seed=3) == (low, high)
    assert len({accuracy_bootstrap(correct, 500, seed=s) for s in (0, 1, 2)}) > 1
    few, many = np.tile([1, 1, 1, 0, 0], 10), np.tile([1, 1, 1, 0, 0], 1000)  # 60 % of 50, of 5,000
    (a, b), (c, d) = accuracy_bootstrap(few, 1000), accuracy_bootstrap(many, 1000)
    assert b - a > 5 * (d - c) > 0  # √100 = 10 times narrower in theory
    assert accuracy_bootstrap(np.ones(30), 100) == (1.0, 1.0)
    assert accuracy_bootstrap([False] * 30, 100) == (0.0, 0.0)
    for bad in ([], [[1, 0], [0, 1]]):
        with pytest.raises(ValueError, match="non-empty 1-D"):
            accuracy_bootstrap(bad, 100)


@pytest.mark.unit
def test_accuracy_bootstrap_agrees_with_resampling_the_questions():
    """Drawing the number right as Binomial(n, accuracy) is the ordinary bootstrap over questions."""
    correct = (np.random.default_rng(11).random(200) < 0.6).astype(float)
    n_boot = 4000
    rng = np.random.default_rng(5)
    means = correct[rng.integers(0, correct.size, size=(n_boot, correct.size))].mean(axis=1)
    expected = np.quantile(means, [0.025, 0.975])
    # s.d. of the accuracy ≈ 0.035; the Monte-Carlo error of a 2.5 % quantile of 4,000 draws ≈ 0.002
    assert accuracy_bootstrap(correct, n_boot, seed=0) == pytest.approx(tuple(expected), abs=0.015)


# ---------------------------------------------------------------- lab.results.series

TASKS = [{"key": "t0-mcq", "task": "mcq", "dataset": "synthetic", "split": "validation", "label": "mcq"},
         {"key": "t1-clm", "task": "clm", "dataset": "text", "split": "test", "label": "clm"}]


def _cell(task: str, point: str, seed, params: int, accuracy: float, ece, stage=None) -> dict:
    return {"task": task, "entry": int(point.split("-")[0][1:]), "point": point, "stage": stage, "seed": seed,
            "step": None, "model": f"/models/{point}",
            "adapter": None, "n": 50, "accuracy": accuracy, "accuracy_low": accuracy - 0.1,
            "accuracy_high": accuracy + 0.1, "ece": ece, "ece_low": None if ece is None else ece / 2,
            "ece_high": None if ece is None else ece * 2, "oracle_ece": None, "params": params,
            "run": f"s/cells/{point}_{task}"}


# Three seeds of one trained model (1,000 parameters), the clm task on two of them, and a bigger model once.
CELLS = [_cell("t0-mcq", "m0-seed0", 0, 1000, 0.5, 0.10), _cell("t1-clm", "m0-seed0", 0, 1000, 0.30, 0.05),
         _cell("t0-mcq", "m0-seed1", 1, 1000, 0.6, 0.14), _cell("t1-clm", "m0-seed1", 1, 1000, 0.20, 0.07),
         _cell("t0-mcq", "m0-seed2", 2, 1000, 0.7, 0.12), _cell("t1-clm", "m0-seed2", 2, 1000, 0.25, None),
         _cell("t0-mcq", "m1", None, 5000, 0.8, 0.02)]


def _t_interval(values: list[float]) -> tuple[float, float]:
    """The 95 % Student-t interval of the mean of ``values``, as computed (never cut to [0, 1]: over two
    seeds it passes 0 and says so)."""
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    return float(low), float(high)


@pytest.mark.unit
def test_the_summary_averages_replicates_at_each_x_with_a_t_interval():
    doc = series.document("params", TASKS, CELLS)
    assert doc["axis"] == "params" and doc["axis_title"] == "parameters" and doc["tasks"] == TASKS
    assert [c["x"] for c in doc["cells"]] == [1000] * 6 + [5000]
    assert [c for c in doc["cells"]] == [{**c, "x": c["params"]} for c in CELLS]
    rows = doc["summary"]
    assert [(r["task"], r["x"], r["runs"]) for r in rows] == [("t0-mcq", 1000, 3), ("t1-clm", 1000, 2),
                                                              ("t0-mcq", 5000, 1)]
    mcq, clm, single = rows  # the clm cell without an ECE is left out of its mean
    assert mcq["accuracy_mean"] == pytest.approx(0.6) and mcq["ece_mean"] == pytest.approx(0.12)
    assert (mcq["accuracy_low"], mcq["accuracy_high"]) == pytest.approx(_t_interval([0.5, 0.6, 0.7]))
    assert (mcq["ece_low"], mcq["ece_high"]) == pytest.approx(_t_interval([0.10, 0.14, 0.12]))
    assert (clm["ece_low"], clm["ece_high"]) == pytest.approx(_t_interval([0.05, 0.07]))
    assert clm["ece_low"] < 0  # 6 % ± 13 % (t with one degree of freedom is 12.7): shown as computed, not cut at 0
    assert clm["accuracy_mean"] == pytest.approx(0.25)
    assert single == {"task": "t0-mcq", "entry": 1, "x": 5000, "runs": 1, "accuracy_mean": 0.8, "accuracy_low": None,
                      "accuracy_high": None, "ece_mean": 0.02, "ece_low": None, "ece_high": None}
    assert list(series.summary_frame(doc).columns) == list(series.SUMMARY_COLUMNS)


@pytest.mark.unit
def test_on_the_seed_axis_each_seed_is_a_point_and_the_summary_is_over_all_of_them():
    cells = CELLS[:6]
    doc = series.document("seed", TASKS, cells)
    assert [c["x"] for c in doc["cells"]] == [0, 0, 1, 1, 2, 2]
    assert [(r["task"], r["x"], r["runs"]) for r in doc["summary"]] == [("t0-mcq", "all seeds", 3),
                                                                       ("t1-clm", "all seeds", 2)]
    assert (doc["summary"][0]["ece_low"], doc["summary"][0]["ece_high"]) == pytest.approx(
        _t_interval([0.10, 0.14, 0.12]))
    staged = series.document("stage", TASKS, [_cell("t0-mcq", "m0", None, 9, 0.5, 0.1, stage="base"),
                                              _cell("t0-mcq", "m1", None, 9, 0.6, 0.2, stage="SFT")])
    assert [c["x"] for c in staged["cells"]] == ["base", "SFT"]
    assert [(r["x"], r["runs"], r["ece_low"]) for r in staged["summary"]] == [("base", 1, None), ("SFT", 1, None)]


@pytest.mark.unit
def test_the_table_round_trips_through_its_files(tmp_path):
    doc = series.document("params", TASKS, CELLS)
    series.write(tmp_path, doc)
    assert series.read(tmp_path) == {**doc, "problems": []}  # read back, no cell left out
    frame = series.cells_frame(doc)
    assert list(frame.columns) == list(series.CELL_COLUMNS) and len(frame) == len(CELLS)
    table = pd.read_csv(tmp_path / SERIES_CSV)
    assert list(table.columns) == list(series.CELL_COLUMNS)
    assert table["point"].tolist() == [c["point"] for c in CELLS]
    assert table["ece"].tolist() == pytest.approx([np.nan if c["ece"] is None else c["ece"] for c in CELLS],
                                                  nan_ok=True)
    assert table["x"].tolist() == [c["params"] for c in CELLS]


@pytest.mark.unit
@pytest.mark.parametrize("content", [
    None, b"{\"axis\": \"params\", \"cells\": [", b"\xff\xfe not text", b"[1, 2]", b"\"a string\"",
    json.dumps({"axis": "time", "tasks": [], "cells": []}).encode(),
    json.dumps({"axis": "params", "tasks": [], "cells": {"0": {}}}).encode(),
    json.dumps({"axis": "params", "tasks": None, "cells": []}).encode(),
], ids=["absent", "half-written", "not-utf8", "a-list", "a-string", "wrong-axis", "cells-not-a-list", "no-tasks"])
def test_read_refuses_what_is_not_a_series_table(tmp_path, content):
    if content is not None:
        (tmp_path / SERIES_FILE).write_bytes(content)
    assert series.read(tmp_path) is None


@pytest.mark.unit
def test_read_drops_malformed_cells_and_non_finite_figures(tmp_path):
    cells = series.document("params", TASKS, [CELLS[0], CELLS[2]])["cells"]
    cells = [cells[0], "junk", {"task": 3}, {**cells[1], "ece": "NaN"}]
    text = json.dumps({"axis": "params", "tasks": TASKS, "cells": cells}).replace('"NaN"', "NaN")
    (tmp_path / SERIES_FILE).write_text(text)
    doc = series.read(tmp_path)
    assert [c["point"] for c in doc["cells"]] == ["m0-seed0", "m0-seed1"] and doc["cells"][1]["ece"] is None
    assert [(r["task"], r["runs"]) for r in doc["summary"]] == [("t0-mcq", 1)]


# ---------------------------------------------------------------- the config's refusals

TRAIN_ENTRY = {"train": {"dataset": "synthetic", "data_files": ["bundled"]}}
A_FOLDER = str(Path(__file__).parent)  # a folder that exists, for the path fields: their checks come first


@pytest.mark.unit
@pytest.mark.parametrize("config, message", [
    ({"models": [{"model": "bundled", "train": TRAIN_ENTRY["train"]}]},
     "models[0]: give exactly one of model, run or train (got model, train)"),
    ({"models": [{"model": "bundled"}, {"stage": "base"}]},
     "models[1]: give exactly one of model, run or train (got none)"),
    ({"models": [{"adapter": A_FOLDER}]}, "models[0]: give exactly one of model, run or train (got none)"),
    ({"models": [{**TRAIN_ENTRY, "adapter": A_FOLDER}]}, "models[0].adapter: … goes with a model"),
    ({"models": [{"run": A_FOLDER, "adapter": A_FOLDER}]}, "models[0].adapter: … goes with a model"),
    ({"models": [{"run": A_FOLDER, "revision": "step1000"}]}, "models[0].revision: … goes with a model"),
    ({"models": [{"model": "bundled", "revision": "../../etc"}]}, "models[0].revision:"),
    ({"models": [{"model": "bundled", "revision": "r" * 65}]}, "models[0].revision:"),
    ({"axis": "stage", "models": [{"model": "bundled", "stage": "base"}, {"model": "bundled"}]},
     "models[1].stage: every entry needs a stage label"),
    ({"axis": "step", "models": [{"model": "bundled", "step": 0}, {"model": "bundled"}]},
     "models[1].step: a model on the step axis needs its step"),
    ({"axis": "seed", "seeds": [0, 1], "models": [TRAIN_ENTRY, {"model": "bundled"}]},
     "models: on the seed axis every entry is a train entry"),
    ({"seeds": [3, 1, 3], "models": [TRAIN_ENTRY]}, "seeds: each seed once, got [3, 1, 3]"),
    ({"tasks": [{"task": "mcq", "model": "bundled"}]}, "tasks[0].model: may not be set here"),
    ({"tasks": [MCQ, {"task": "clm", "seed": 4}]}, "tasks[1].seed: may not be set here"),
    ({"tasks": [{"task": "mcq", "device": "cpu"}]}, "tasks[0].device: may not be set here"),
    ({"tasks": [{"task": "mcq", "adapter": "x"}]}, "tasks[0].adapter: may not be set here"),
    ({"tasks": [{"task": "mcq", "scoring": "letter", "template": "cloze_qa"}]},
     "tasks[0]: template: 'cloze_qa' is a cloze template"),
    ({"models": [{"train": {**TRAIN_ENTRY["train"], "seed": 1}}]}, "models[0].train.seed: may not be set here"),
    ({"models": [{"train": {**TRAIN_ENTRY["train"], "device": "cpu"}}]}, "models[0].train.device: may not be set"),
    ({"models": [{"train": {**TRAIN_ENTRY["train"], "epochs": 0}}]}, "models[0].train.epochs:"),
    ({"models": {"model": "bundled"}}, "models: must be a list"),
    ({"models": "bundled"}, "models: must be a list"),
    ({"models": [[{"model": "bundled"}]]}, "models[0]: must be a mapping"),
    ({"models": [{"model": "bundled"}] * 10**6}, "models: has 1,000,000 entries; the limit is 64"),
    ({"models": []}, "models:"),
    ({"tasks": [MCQ] * 17}, "tasks: has 17 entries; the limit is 16"),
    ({"seeds": list(range(33)), "models": [TRAIN_ENTRY]}, "seeds:"),
    ({"models": [{"model": "bundled", "stage": "x" * 41}]}, "models[0].stage: is 41 characters long; the limit is 40"),
    ({"models": [{"model": "bundled", "stage": "a\x00b"}]}, "models[0].stage: must not contain a NUL character"),
    ({"models": [{"model": "bundled", "stage": ["base"]}]}, "models[0].stage:"),
    ({"models": [{"model": "bundled", "step": -1}]}, "models[0].step: must be an integer ≥ 0"),
    ({"models": [{"model": "bundled", "step": 10**13}]}, "models[0].step:"),
    ({"models": [{"model": "bundled", "step": "5"}]}, "models[0].step:"),
    ({"models": [{"model": "bundled", "weights": "x"}]}, "models[0].weights:"),
    ({"axis": "time"}, "axis:"),
], ids=lambda v: None if isinstance(v, dict) else v[:40])
def test_the_config_refuses_with_the_field_path_first(config, message):
    """``message``: how the refusal starts (the field's path), then, after " … ", words it holds."""
    start, _, words = message.partition(" … ")
    with pytest.raises(ConfigError) as refused:
        parse_config({"kind": "series", **config})
    assert str(refused.value).startswith(start) and words in str(refused.value), str(refused.value)


@pytest.mark.unit
def test_paths_outside_the_allowed_folders_are_refused(tmp_path):
    roots = [tmp_path / "runs"]
    inside, outside = roots[0] / "00001-finetune", tmp_path / "elsewhere"
    inside.mkdir(parents=True), outside.mkdir()
    (outside / "q.jsonl").write_text('{"question": "2+2?", "choices": ["4", "5"], "answer": "A"}\n')
    (roots[0] / "link").symlink_to(outside)
    _, cfg = parse_config({"kind": "series", "models": [{"run": str(inside)}]}, roots)
    assert Path(cfg.models[0]["run"]) == inside
    for entry, path in [({"run": str(outside)}, "models[0].run"), ({"run": str(roots[0] / "link")}, "models[0].run"),
                        ({"run": str(roots[0] / ".." / "elsewhere")}, "models[0].run"),
                        ({"model": str(outside)}, "models[0].model"),
                        ({"train": {"dataset": "custom", "data_files": [str(outside / "q.jsonl")]}},
                         "models[0].train.data_files")]:
        with pytest.raises(ConfigError) as refused:
            parse_config({"kind": "series", "models": [entry]}, roots)
        assert str(refused.value).startswith(path), str(refused.value)
    with pytest.raises(ConfigError) as refused:
        parse_config({"kind": "series", "tasks": [{"task": "mcq", "dataset": "custom",
                                                   "data_files": [str(outside / "q.jsonl")]}]}, roots)
    assert str(refused.value).startswith("tasks[0].data_files"), str(refused.value)


@pytest.mark.unit
def test_a_config_file_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "series.yaml"
    path.write_bytes(b"kind: series\nmodels:\n- model: bundled\n  stage: caf\xe9\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(path)


@pytest.mark.unit
def test_two_entries_at_one_x_are_not_replicates_of_each_other():
    """Two train entries (two learning rates, say) at step 200 are two means, not one over four runs."""
    cells = [_cell("t0-mcq", f"m{entry}-seed{seed}", seed, 9, 0.5 + entry / 10, 0.1) for entry in (0, 1)
             for seed in (0, 1)]
    rows = series.document("params", TASKS, cells)["summary"]
    assert [(r["entry"], r["runs"], r["accuracy_mean"]) for r in rows] == [(0, 2, pytest.approx(0.5)),
                                                                          (1, 2, pytest.approx(0.6))]


@pytest.mark.unit
def test_a_stage_label_that_cannot_be_written_is_refused(tmp_path):
    """A lone surrogate passed the text check, then series.csv could not be written after the first cell."""
    path = tmp_path / "series.yaml"
    path.write_text('kind: series\nmodels:\n- model: bundled\n  stage: "a\\uDCFFb"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^models\[0\]\.stage: must be valid Unicode text"):
        load_config(path)


# ---------------------------------------------------------------- training snapshots


def _finetune(model: Path, out: Path, **fields) -> TrainConfig:
    from lab.training.trainer import finetune

    cfg = TrainConfig.from_checked({**TRAIN, "model": str(model), "snapshots": True, **fields})
    write_config(out, "finetune", cfg)
    finetune(cfg, out, EventWriter(out / "events.jsonl"))
    return cfg


@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.slow
def test_a_full_fine_tune_keeps_its_weights_at_every_save_and_a_series_reads_them_in_step_order(
        tiny_model_dir, tmp_path):
    run = tmp_path / "runs" / "00001-finetune"
    _finetune(tiny_model_dir, run)
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == ["step-2", "step-4"]  # an epoch is 2 steps
    assert training_points(run) == [TrainedPoint(0, str(tiny_model_dir), None),
                                    TrainedPoint(2, str(run / "snapshots" / "step-2" / "model"), None),
                                    TrainedPoint(4, str(run / "snapshots" / "step-4" / "model"), None)]
    assert all((run / "snapshots" / s / "model" / "tokenizer.json").is_file() for s in ("step-2", "step-4"))
    weights = [_tensors(tiny_model_dir)] + [_tensors(run / "snapshots" / s / "model") for s in ("step-2", "step-4")]
    assert not _same(weights[0], weights[1]) and not _same(weights[1], weights[2])
    assert _same(weights[2], _tensors(run / "model"))  # the last snapshot is the final model
    assert final_weights(run) == TrainedPoint(4, str(run / "model"), None)

    out = tmp_path / "runs" / "00002-series"
    _run({"axis": "step", "bootstrap": 20, "models": [{"run": str(run), "stage": "SFT"}],
          "tasks": [{**MCQ, "limit": 8}]}, out)
    cells = series.read(out)["cells"]
    assert [(c["point"], c["x"], c["stage"], c["seed"]) for c in cells] == [
        ("m0-step0", 0, "SFT", None), ("m0-step2", 2, "SFT", None), ("m0-step4", 4, "SFT", None)]
    assert [c["model"] for c in cells] == [p.model for p in training_points(run)]


@pytest.mark.model
def test_a_lora_runs_snapshots_are_adapters_on_its_base_model(tiny_model_dir, tmp_path):
    run = tmp_path / "lora"
    _finetune(tiny_model_dir, run, method="lora", lora_r=4, lora_alpha=8)
    base = str(tiny_model_dir)
    points = training_points(run)
    assert points == [TrainedPoint(0, base, None),
                      TrainedPoint(2, base, str(run / "snapshots" / "step-2" / "adapter")),
                      TrainedPoint(4, base, str(run / "snapshots" / "step-4" / "adapter"))]
    assert not any((run / "snapshots" / s / "model").exists() for s in ("step-2", "step-4"))
    adapters = [_tensors(Path(p.adapter), "adapter_model.safetensors") for p in points[1:]]
    assert not _same(*adapters)
    assert _same(adapters[-1], _tensors(run / "adapter", "adapter_model.safetensors"))
    assert final_weights(run) == TrainedPoint(4, base, str(run / "adapter"))


def _fake_run(run: Path, base: str = "bundled") -> Path:
    """A finished full fine-tune's folder, as far as the snapshot reader looks: config, model/config.json."""
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    (run / CONFIG_FILE).write_text(f"kind: finetune\nmodel: {base}\n")
    return run


@pytest.mark.unit
def test_only_whole_snapshot_folders_count_and_in_numeric_step_order(tmp_path):
    run = _fake_run(tmp_path / "run")
    folder = run / "snapshots"
    for name in ("step-10", "step-3", ".step-12.partial", "step-5"):
        (folder / name / "model").mkdir(parents=True)
    for name in ("step-10", "step-3", ".step-12.partial"):  # step-5 holds no weights: killed mid-write
        (folder / name / "model" / "config.json").write_text("{}")
    (folder / "step-x").write_text("not a snapshot")
    (folder / "step-7").write_text("a file, not a folder")
    (folder / "step-8").symlink_to(folder / "step-3")
    (folder / "notes-step-9").mkdir()
    assert [p.step for p in snapshots(run)] == [3, 10]
    assert [(p.step, p.model) for p in training_points(run)] == [
        (0, "bundled"), (3, str(folder / "step-3" / "model")), (10, str(folder / "step-10" / "model"))]
    assert final_weights(run) == TrainedPoint(10, str(run / "model"), None)


@pytest.mark.unit
def test_a_run_without_snapshots_is_refused_on_the_step_axis_saying_how_to_keep_them(tmp_path):
    run = _fake_run(tmp_path / "runs" / "plain")
    assert final_weights(run) == TrainedPoint(0, str(run / "model"), None)
    with pytest.raises(DataError, match="snapshots: true"):
        training_points(run)
    with pytest.raises(DataError, match="snapshots: true"):
        _run({"axis": "step", "models": [{"run": str(run)}], "tasks": [MCQ]}, tmp_path / "runs" / "series")
    with pytest.raises(DataError, match="not a training run"):
        final_weights(tmp_path)
    (run / "model" / "config.json").unlink()
    with pytest.raises(DataError, match="no trained weights"):
        final_weights(run)


# ---------------------------------------------------------------- a series over model sizes, resumed

SIZES = ({"hidden": 16, "intermediate": 32, "layers": 1}, {"hidden": 32, "intermediate": 64, "layers": 1},
         {"hidden": 32, "intermediate": 64, "layers": 2})


@pytest.fixture(scope="module")
def sized_models(tmp_path_factory) -> list[Path]:
    """Three tiny random models of different sizes, each with a tokenizer learned from 40 questions."""
    from lab.data import load
    from lab.models.scratch import create

    records = load("synthetic", "train", ["bundled"], limit=40).records
    root = tmp_path_factory.mktemp("sizes")
    return [create(root / f"size{i}", records, tiny_config(**dims)) for i, dims in enumerate(SIZES)]


def _params_config(models: list[Path]) -> dict:
    return {"axis": "params", "bootstrap": 100, "models": [{"model": str(m)} for m in models], "tasks": [MCQ, CLM]}


@pytest.fixture(scope="module")
def params_series(sized_models, tmp_path_factory) -> tuple[Path, list[tuple]]:
    """The series over the three sizes run in one go: its folder and the models it loaded."""
    import lab.models.loading

    out = tmp_path_factory.mktemp("runs") / "whole"
    with pytest.MonkeyPatch.context() as patch:
        loads = _counting(patch, lab.models.loading, "load_model")
        assert _run(_params_config(sized_models), out) == {"cells": 6, "points": 3, "tasks": 2}
    return out, loads


@pytest.mark.model
@pytest.mark.e2e
def test_a_series_over_model_sizes_evaluates_every_cell_loading_each_model_once(params_series, sized_models):
    from lab.models.loading import load_model

    out, loads = params_series
    assert [args[0] for args, _ in loads] == [str(m) for m in sized_models]
    doc = series.read(out)
    assert doc == {**json.loads((out / SERIES_FILE).read_text()), "problems": []}
    cells = doc["cells"]
    assert [(c["point"], c["task"]) for c in cells] == [(f"m{i}", t) for i in range(3) for t in ("t0-mcq", "t1-clm")]
    assert [t["key"] for t in doc["tasks"]] == ["t0-mcq", "t1-clm"]
    sizes = [sum(p.numel() for p in load_model(str(m), device="cpu").model.parameters()) for m in sized_models]
    assert sizes == sorted(set(sizes))  # three different sizes, in order
    assert [c["x"] for c in cells] == [c["params"] for c in cells] == [s for s in sizes for _ in range(2)]
    for cell in cells:
        directory = out / CELLS_DIR / f"{cell['point']}_{cell['task']}"
        rows = [json.loads(line) for line in (directory / PREDICTIONS_FILE).read_text().splitlines()]
        saved = json.loads((directory / METRICS_FILE).read_text())
        conf = np.array([r["confidence"] for r in rows])
        correct = np.array([bool(r["correct"]) for r in rows])
        assert len(rows) == saved["n"] == cell["n"] == (40 if cell["task"] == "t0-mcq" else 10)
        assert saved["accuracy"] == pytest.approx(correct.mean(), abs=1e-12) == cell["accuracy"]
        assert saved["ece"] == pytest.approx(metrics.ece(conf, correct, 10), abs=1e-12)
        assert (cell["ece"], cell["ece_low"], cell["ece_high"]) == (saved["ece"], saved["ece_ci_low"],
                                                                    saved["ece_ci_high"])
        assert (cell["accuracy_low"], cell["accuracy_high"]) == accuracy_bootstrap(correct, 100, seed=0)
        assert cell["accuracy_low"] <= cell["accuracy"] <= cell["accuracy_high"]
        assert json.loads((directory / DONE_FILE).read_text()) == {
            k: cell[k] for k in ("n", "accuracy", "accuracy_low", "accuracy_high", "ece", "ece_low", "ece_high",
                                 "oracle_ece", "params")}
        assert saved["series_point"] == cell["point"] and saved["model"] == cell["model"]
        assert (cell["oracle_ece"] is None) == (cell["task"] == "t1-clm")
        found = evaluation(out.parent, cell["run"])
        assert found is not None and found.path == directory and found.ece == cell["ece"]
    table = pd.read_csv(out / SERIES_CSV)
    assert len(table) == 6 and list(table.columns) == list(series.CELL_COLUMNS)
    assert table["run"].tolist() == [c["run"] for c in cells] and table["x"].tolist() == [c["x"] for c in cells]
    assert table["ece"].tolist() == [c["ece"] for c in cells]
    assert table["accuracy_high"].tolist() == [c["accuracy_high"] for c in cells]
    assert [(r["task"], r["x"], r["runs"], r["ece_low"]) for r in doc["summary"]] == [
        (c["task"], c["x"], 1, None) for c in cells]


@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.slow
def test_an_interrupted_series_resumes_at_its_first_missing_cell(params_series, sized_models, monkeypatch):
    import lab.models.loading

    whole, _ = params_series
    out = whole.parent / "cut"
    config = _params_config(sized_models)
    with pytest.MonkeyPatch.context() as patch:
        _counting(patch, series_run, "_cell", fail_after=4)
        with pytest.raises(Interrupted):
            _run(config, out)
    finished = sorted(p.name for p in (out / CELLS_DIR).glob(f"*/{DONE_FILE}") for p in [p.parent])
    assert finished == ["m0_t0-mcq", "m0_t1-clm", "m1_t0-mcq", "m1_t1-clm"]
    kept = {path: _stamp(path) for name in finished for path in (out / CELLS_DIR / name / DONE_FILE,
                                                                 out / CELLS_DIR / name / METRICS_FILE)}
    assert len(series.read(out)["cells"]) == 4  # the table so far

    (out / STOP_FILE).touch()  # a stop request: refused before the next model is loaded, nothing lost
    loads = _counting(monkeypatch, lab.models.loading, "load_model")
    with pytest.raises(Stopped, match="before m2"):
        _run(config, out)
    assert loads == [] and len(series.read(out)["cells"]) == 4
    (out / STOP_FILE).unlink()

    cells = _counting(monkeypatch, series_run, "_cell")
    assert _run(config, out) == {"cells": 6, "points": 3, "tasks": 2}
    assert [(args[1].key, args[2]) for args, _ in cells] == [("m2", 0), ("m2", 1)]
    assert [args[0] for args, _ in loads] == [str(sized_models[2])]  # m0 and m1 are not loaded again
    assert {path: _stamp(path) for path in kept} == kept
    assert _without_run(series.read(out)) == _without_run(series.read(whole))
    assert [c["run"] for c in series.read(out)["cells"]][0] == "cut/cells/m0_t0-mcq"

    assert _run(config, out)["cells"] == 6 and len(cells) == 2 and len(loads) == 1  # all done: nothing to do


# ---------------------------------------------------------------- a series that trains, over seeds


@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.slow
def test_a_train_entry_trains_once_per_seed_never_again_and_spreads_over_seeds(tiny_model_dir, tmp_path,
                                                                             monkeypatch):
    import lab.models.loading
    import lab.training.trainer

    config = {"axis": "seed", "seeds": [0, 1], "bootstrap": 50,
              "models": [{"train": {**TRAIN, "model": str(tiny_model_dir)}}],
              "tasks": [{**MCQ, "limit": 20}, {**CLM, "limit": 5}]}
    out = tmp_path / "runs" / "series"
    with pytest.MonkeyPatch.context() as patch:
        _counting(patch, series_run, "_cell", fail_after=0)  # cut at the first cell: after the first training
        with pytest.raises(Interrupted):
            _run(config, out)
    first = out / "train" / "m0-seed0"
    assert (first / DONE_FILE).is_file() and (first / "model").is_dir() and not (out / "train" / "m0-seed1").exists()
    trained = _stamp(first / DONE_FILE), _stamp(first / "model" / "model.safetensors")
    assert load_config(first / CONFIG_FILE)[1].seed == 0

    trains = _counting(monkeypatch, lab.training.trainer, "finetune")
    loads = _counting(monkeypatch, lab.models.loading, "load_model")
    assert _run(config, out) == {"cells": 4, "points": 2, "tasks": 2}
    assert [(args[0].seed, args[1]) for args, _ in trains] == [(1, out / "train" / "m0-seed1")]
    assert (_stamp(first / DONE_FILE), _stamp(first / "model" / "model.safetensors")) == trained
    assert [args[0] for args, _ in loads] == [str(first / "model"), str(out / "train" / "m0-seed1" / "model")]

    doc = series.read(out)
    assert [(c["point"], c["task"], c["x"], c["seed"]) for c in doc["cells"]] == [
        ("m0-seed0", "t0-mcq", 0, 0), ("m0-seed0", "t1-clm", 0, 0),
        ("m0-seed1", "t0-mcq", 1, 1), ("m0-seed1", "t1-clm", 1, 1)]
    assert not _same(_tensors(first / "model"), _tensors(out / "train" / "m0-seed1" / "model"))
    assert len(doc["summary"]) == 2
    for row in doc["summary"]:
        eces = [c["ece"] for c in doc["cells"] if c["task"] == row["task"]]
        accuracies = [c["accuracy"] for c in doc["cells"] if c["task"] == row["task"]]
        assert row["x"] == "all seeds" and row["runs"] == 2
        assert row["ece_mean"] == pytest.approx(np.mean(eces))
        assert (row["ece_low"], row["ece_high"]) == pytest.approx(_t_interval(eces), rel=1e-9)
        _, low, high = mean_interval(eces)
        assert (row["ece_low"], row["ece_high"]) == (low, high)  # as computed, never cut to [0, 1]
        assert row["accuracy_mean"] == pytest.approx(np.mean(accuracies))

    assert _run(config, out)["cells"] == 4 and len(trains) == 1 and len(loads) == 2  # all done: nothing redone
    assert os.path.getsize(out / SERIES_CSV) > 0


@pytest.mark.model
@pytest.mark.slow
def test_on_the_step_axis_the_base_model_is_one_point_for_every_seed(tiny_model_dir, tmp_path, monkeypatch):
    """The base model (step 0) is the same whatever the seed: evaluated once, and its mean has no interval."""
    import lab.models.loading

    loads = _counting(monkeypatch, lab.models.loading, "load_model")
    config = {"axis": "step", "seeds": [0, 1], "bootstrap": 20, "tasks": [{**MCQ, "limit": 12}],
              "models": [{"train": {**TRAIN, "model": str(tiny_model_dir)}}]}
    out = tmp_path / "runs" / "series"
    assert _run(config, out) == {"cells": 5, "points": 5, "tasks": 1}
    doc = series.read(out)
    assert [(c["point"], c["seed"], c["x"]) for c in doc["cells"]] == [
        ("m0-step0", None, 0), ("m0-seed0-step2", 0, 2), ("m0-seed0-step4", 0, 4),
        ("m0-seed1-step2", 1, 2), ("m0-seed1-step4", 1, 4)]
    assert len(loads) == 5 and [args[0] for args, _ in loads].count(str(tiny_model_dir)) == 1
    assert [(r["x"], r["runs"], r["ece_low"] is None) for r in doc["summary"]] == [(0, 1, True), (2, 2, False),
                                                                                  (4, 2, False)]
