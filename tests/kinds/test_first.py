"""The FIRST pipeline end to end on a tiny random model: every stage, the report, resuming."""
import json

import pytest
import torch
import yaml

from lab.core.config import ConfigError
from lab.core.events import EventWriter, read_events
from lab.kinds.first.config import FirstConfig
from lab.kinds.first.report import markdown, sweep_summary
from lab.kinds.first.run import run_first
from lab.training.distill import DistillTrainer
from lab.training.kd_losses import topk_kl_loss


@pytest.mark.model
def test_distill_trainer_loss_equals_the_kl_on_full_logits(tiny_model_dir):
    """Logits only at supervised positions give the same loss as full logits masked afterwards."""
    from transformers import AutoModelForCausalLM, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    ids = torch.randint(3, 500, (2, 7))
    labels = torch.full_like(ids, -100)
    labels[0, 4:] = ids[0, 4:]
    labels[1, 2:5] = ids[1, 2:5]
    teacher_ids = torch.randint(3, 500, (2, 7, 3))
    teacher_lp = torch.log_softmax(torch.randn(2, 7, 3), -1)
    trainer = DistillTrainer(model=model, args=TrainingArguments(output_dir="/tmp/unused", report_to="none", use_cpu=True),
                             kd_loss=topk_kl_loss)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
              "teacher_ids": teacher_ids, "teacher_logprobs": teacher_lp}
    loss = trainer.compute_loss(model, inputs)
    mask = torch.zeros_like(labels, dtype=torch.bool)
    mask[:, :-1] = labels[:, 1:] != -100  # position t describes token t+1
    expected = topk_kl_loss(model(ids).logits, teacher_ids, teacher_lp, mask)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.slow
def test_first_pipeline_runs_every_stage_and_resumes(tiny_model_dir, shared_data, tmp_path):
    csqa = shared_data / "commonsenseqa"
    cfg = FirstConfig(
        teacher=str(tiny_model_dir), teacher_method="lora", student=str(tiny_model_dir), student_method="full",
        dataset="csqa", data_files=[f"train={csqa / 'train.jsonl'}", f"test={csqa / 'dev.jsonl'}"],
        train_split="train:train", val_split="train:validation", test_split="test",
        train_limit=8, val_limit=6, test_limit=5, training={"epochs": 1, "batch_size": 4, "learning_rate": 1e-3},
        bootstrap=50, bin_edges="left", ts_grid=[0.5],  # one value: the sweep must widen, and say so
        ood=[{"dataset": "obqa", "data_files": [str(shared_data / "openbookqa" / "test.jsonl")], "limit": 5}],
    )
    events = EventWriter(tmp_path / "events.jsonl")
    report = run_first(cfg, tmp_path, events, lambda: False)
    rows = report["rows"]
    assert [(r["method"], r["dataset"]) for r in rows] == [
        (m, d) for m in ("teacher", "finetune", "distill", "distill_ls", "first") for d in ("csqa", "obqa")]
    assert all(r["n"] == 5 and 0 <= r["ece"] <= 1 and 0 <= r["accuracy"] <= 1 for r in rows)
    assert [r["temperature"] is not None for r in rows] == [m == "first" for m in (r["method"] for r in rows)]
    assert report["sweep"]["best_ece"] <= report["sweep"]["identity_ece"] + 1e-12
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["rows"] == rows
    md = (tmp_path / "report.md").read_text()
    assert "| FIRST (temperature scaling) |" in md and "csqa (in-domain, n=5)" in md and "obqa (out-of-domain, n=5)" in md
    manifest = json.loads((tmp_path / "topk" / "train" / "manifest.json").read_text())
    assert manifest["k"] == 5 and manifest["n_sequences"] == 8
    stages = [e.get("name") for e in read_events(tmp_path / "events.jsonl")[0] if e["stage"] == "stage"]
    assert stages[:4] == ["teacher", "extract", "sweep", "student:finetune"]
    # bin_edges reaches the sweep and every evaluation, as bins does
    sweep = report["sweep"]
    assert sweep["bin_edges"] == "left" and sweep["widened"] and sweep["widened"][0]["from"] == 0.5
    assert all(yaml.safe_load(path.read_text())["bin_edges"] == "left"
               for path in (tmp_path / "eval").glob("*/config.yaml"))
    assert len(list((tmp_path / "eval").glob("*/config.yaml"))) == len(rows)
    logged = read_events(tmp_path / "events.jsonl")[0]
    sweeps = [e for e in logged if e["stage"] == "sweep"]
    assert [e["value"] for e in sweeps] == [r["value"] for r in sweep["records"]] and sweeps[0]["grid"] == "coarse"
    warned = [e for e in logged if e["stage"] == "warning" and "temperature sweep" in e["message"]]
    assert len(warned) == 1 and warned[0]["widened"] == sweep["widened"]
    assert "so the grid was widened" in md
    assert (tmp_path / "topk" / "train" / "manifest.json").read_text().count('"tokenizer"') == 1
    # A rerun finds every stage done and rebuilds the same report without training anything.
    before = len(read_events(tmp_path / "events.jsonl")[0])
    again = run_first(cfg, tmp_path, events, lambda: False)
    new = read_events(tmp_path / "events.jsonl")[0][before:]
    assert again["rows"] == rows and not any(e["stage"] in ("stage", "teacher", "extract") for e in new)


@pytest.mark.unit
def test_first_config_sweep_and_smoothing_fields():
    cfg = FirstConfig.from_dict({})
    assert cfg.ts_grid is None and cfg.ls_renormalise is False and cfg.bin_edges == "right"
    left = FirstConfig.from_dict({"bin_edges": "left"})  # the per-epoch validation ECE of every model it trains
    assert left.train_config(left.student, "full").bin_edges == "left"
    assert left.train_config(left.teacher, "lora", epochs=2).bin_edges == "left"
    assert FirstConfig.from_dict({"ts_grid": [0.5, 2], "ls_renormalise": True}).ts_grid == [0.5, 2]
    with pytest.raises(ConfigError, match=r"ts_grid\[1\]: must be a finite number ≥ 0.001 and ≤ 1,000, got 0"):
        FirstConfig.from_dict({"ts_grid": [0.5, 0]})
    with pytest.raises(ConfigError, match="ts_grid: has 101 entries; the limit is 100"):
        FirstConfig.from_dict({"ts_grid": [1.0] * 101})


@pytest.mark.unit
def test_report_states_the_widening_in_words():
    sweep = {"form": "logit", "objective": "ece", "best": 12.1, "best_ece": 0.006, "best_nll": 1.2,
             "identity_ece": 0.3, "on_edge": False, "widened": [{"side": "above", "from": 8.0, "to": 32.0}],
             "records": [{"value": 1.0, "ece": 0.3}]}
    said = "The optimum lay on the edge of the grid at T = 8, so the grid was widened above it as far as T = 32."
    assert sweep_summary(sweep) == said
    row = {"method": "first", "dataset": "csqa", "in_domain": True, "n": 5, "ece": 0.1, "accuracy": 0.5, "trust": 0.4}
    assert said in markdown([row], sweep)
    stuck = {**sweep, "best": 1000.0, "on_edge": True, "widened": [{"side": "above", "from": 8.0, "to": 1000.0}]}
    assert "T = 1000 is still on the edge of every value tried, a hard bound" in sweep_summary(stuck)
    assert sweep_summary({**sweep, "widened": []}) == ""
    paper = {**sweep, "form": "paper", "widened": [{"side": "below", "from": 0.1, "to": 0.025}]}
    assert "at c = 0.1, so the grid was widened below it as far as c = 0.025" in sweep_summary(paper)
