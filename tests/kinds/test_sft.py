"""The ``sft`` kind: TRL's SFTTrainer puts the loss on the response only (checked against cross-entropy
computed by hand over the response's tokens), and a job trains, measures every calibration task before
training and after each epoch (the events the job page draws), saves full weights or an adapter, and
does not train again when rerun."""
import json
from pathlib import Path

import pytest
import torch

from lab.core.config import ConfigError
from lab.core.events import read_events
from lab.core.layout import CALIBRATION_DIR, METRICS_FILE
from lab.data import load
from lab.jobkit.kinds import parse_config
from lab.jobkit.worker import JobContext
from lab.kinds.sft.run import run_job

CALIBRATION = [{"task": "mcq", "dataset": "synthetic", "data_files": ["bundled"], "split": "test", "limit": 12,
                "scoring": "letter"}]


def _config(model: Path, **fields) -> dict:
    return {"kind": "sft", "model": str(model), "dataset": "alpaca", "data_files": ["bundled"], "limit": 8,
            "epochs": 1, "batch_size": 4, "learning_rate": 1e-3, "max_length": 256, "device": "cpu",
            "bootstrap": 20, "calibration": CALIBRATION, **fields}


def _run(config: dict, out: Path) -> dict:
    _, cfg = parse_config(config)
    out.mkdir(parents=True, exist_ok=True)
    return run_job(cfg, JobContext(out))


@pytest.mark.model
def test_the_loss_is_cross_entropy_over_the_response_tokens_only(tiny_model_dir, tmp_path):
    from trl import SFTConfig, SFTTrainer

    from lab.models.loading import load_model

    loaded = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    records = load("alpaca", "train", ["bundled"], task="sft", limit=2).records
    args = SFTConfig(output_dir=str(tmp_path), completion_only_loss=True, max_length=256, report_to="none",
                     use_cpu=True, bf16=False, gradient_checkpointing=False, per_device_train_batch_size=2)
    from datasets import Dataset

    trainer = SFTTrainer(model=loaded.model, args=args, processing_class=loaded.tokenizer,
                         train_dataset=Dataset.from_list([r.example() for r in records]))
    row = trainer.train_dataset[0]  # TRL marks the prompt's tokens -100 in its labels: no loss there
    ids, mask = torch.tensor(row["input_ids"]), torch.tensor(row["labels"]) != -100
    prompt = loaded.tokenizer.apply_chat_template(records[0].prompt, tokenize=False, add_generation_prompt=True)
    n_prompt = len(loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert mask[:n_prompt].sum() == 0 and mask[n_prompt:].all()  # the response and its end of turn, nothing else
    assert records[0].completion in loaded.tokenizer.decode(ids[mask.bool()])

    batch = trainer.data_collator([trainer.train_dataset[0]])
    loaded.model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(loaded.model, batch)
        logits = loaded.model(input_ids=batch["input_ids"]).logits[0, :-1]
    targets = batch["input_ids"][0, 1:]
    scored = mask[1:]
    by_hand = torch.nn.functional.cross_entropy(logits[scored], targets[scored])
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)


@pytest.mark.model
def test_an_sft_job_measures_calibration_before_and_after_each_epoch_and_is_not_redone(tiny_model_dir, tmp_path):
    out = tmp_path / "runs" / "00001-sft"
    summary = _run(_config(tiny_model_dir, epochs=2), out)
    evals = [e for e in read_events(out / "events.jsonl")[0] if e["stage"] == "train_eval"]
    assert [e["step"] for e in evals] == [0, 2, 4]  # before training, then each epoch (8 rows in batches of 4)
    for event in evals:
        task = event["tasks"]["t0-mcq"]
        metrics = json.loads((out / CALIBRATION_DIR / f"step-{event['step']}" / "t0-mcq" / METRICS_FILE).read_text())
        assert (task["n"], task["accuracy"], task["ece"]) == (12, metrics["accuracy"], metrics["ece"])
        assert event["ece"] == task["ece"] and task["label"] == "mcq · synthetic/test"
    assert summary["n_train"] == 8 and summary["final_t0-mcq_ece"] == evals[-1]["ece"]
    assert (out / "model" / "model.safetensors").is_file()

    weights = (out / "model" / "model.safetensors").stat().st_mtime_ns
    _run(_config(tiny_model_dir, epochs=2), out)  # finished: resumed at its last checkpoint, nothing to train
    assert (out / "model" / "model.safetensors").stat().st_mtime_ns >= weights
    assert len([e for e in read_events(out / "events.jsonl")[0] if e["stage"] == "train_eval"]) == 3


@pytest.mark.model
def test_lora_sft_saves_an_adapter_on_the_layers_named(tiny_model_dir, tmp_path):
    """The paper's LoRA adapts q_proj and v_proj only: the adapter holds those and nothing else."""
    from safetensors import safe_open

    out = tmp_path / "runs" / "00002-sft"
    _run(_config(tiny_model_dir, method="lora", lora_r=4, lora_targets=["q_proj", "v_proj"], calibration=[]), out)
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"] and not (out / "model").exists()
    with safe_open(out / "adapter" / "adapter_model.safetensors", "pt") as f:
        adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in f.keys()}
    assert adapted == {"q_proj", "v_proj"}


@pytest.mark.unit
@pytest.mark.parametrize("fields, message", [
    ({"calibration": [{**CALIBRATION[0], "model": "bundled"}]}, r"^calibration\[0\]\.model: may not be set here"),
    ({"calibration": [{"task": "mcq", "scoring": "letter", "template": "cloze_plain"}]},
     r"^calibration\[0\]: template: 'cloze_plain' is a cloze template"),
    ({"calibration": [CALIBRATION[0]] * 9}, r"^calibration: has 9 entries; the limit is 8"),
    ({"method": "dora"}, r"^method: must be one of 'full', 'lora', 'qlora'"),
    ({"epochs": 0}, r"^epochs: must be"),
    ({"dataset": "arc"}, r"^dataset: unknown dataset 'arc'"),
    ({"dataset": "obqa"}, r"^dataset: 'obqa' holds no instruction-response pairs; use one of: alpaca, dolly"),
    ({"lora_targets": ["all-linear", "q_proj"]}, r"^lora_targets: all-linear already adapts every linear layer"),
    ({"lora_targets": ["q_proj.*"]}, r"^lora_targets\[0\]: 'q_proj.\*' is not valid here"),
    ({"lora_targets": ["model.layers.0.self_attn.q_proj"]}, r"^lora_targets\[0\]: .* is not valid here"),
    ({"lora_targets": []}, r"^lora_targets: must have at least 1 entry"),
    ({"lora_targets": {"q_proj": 1}}, r"^lora_targets: must be a list"),
])
def test_an_sft_config_is_refused_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"kind": "sft", **fields})


@pytest.mark.unit
def test_a_row_without_a_chat_template_is_stanford_alpacas_prompt():
    (record,) = load("alpaca", "train", ["bundled"], task="sft", limit=1).records
    instruction = record.prompt[0]["content"]
    assert record.plain_example() == {
        "prompt": "Below is an instruction that describes a task. Write a response that appropriately completes the "
                  f"request.\n\n### Instruction:\n{instruction}\n\n### Response:\n",
        "completion": record.completion}


@pytest.mark.model
def test_a_base_model_without_a_chat_template_is_tuned_on_alpaca_prompts(base_model_dir, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from lab.models.loading import load_model

    loaded = load_model(str(base_model_dir), device="cpu", dtype="float32")
    assert not loaded.tokenizer.chat_template  # what made SFTTrainer raise before
    records = load("alpaca", "train", ["bundled"], task="sft", limit=2).records
    args = SFTConfig(output_dir=str(tmp_path), completion_only_loss=True, max_length=256, report_to="none",
                     use_cpu=True, bf16=False, gradient_checkpointing=False)
    trainer = SFTTrainer(model=loaded.model, args=args, processing_class=loaded.tokenizer,
                         train_dataset=Dataset.from_list([r.plain_example() for r in records]))
    row = trainer.train_dataset[0]
    ids, mask = torch.tensor(row["input_ids"]), torch.tensor(row["labels"]) != -100
    n_prompt = len(loaded.tokenizer(records[0].plain_example()["prompt"])["input_ids"])
    assert mask[:n_prompt].sum() == 0 and mask[n_prompt:].all()  # the loss on the response (and its end) only
    assert ids[-1] == loaded.tokenizer.eos_token_id and records[0].completion in loaded.tokenizer.decode(ids[mask])
    out = tmp_path / "runs" / "00003-sft"
    _run(_config(base_model_dir, calibration=[]), out)
    assert (out / "model" / "model.safetensors").is_file()
    assert "as Stanford Alpaca prompts" in (out / "events.jsonl").read_text()


@pytest.mark.model
@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_examples_whose_prompt_fills_max_length_are_a_clear_refusal(tiny_model_dir, tmp_path, kind):
    """TRL drops them; none left used to end in an internal error ("num_samples=0") deep in its sampler."""
    from importlib import import_module

    from lab.core.errors import DataError

    data = {"sft": {"dataset": "alpaca", "data_files": ["bundled"]}, "dpo": {"preferences": ["bundled"]}}[kind]
    _, cfg = parse_config({"kind": kind, "model": str(tiny_model_dir), **data, "limit": 4, "epochs": 1,
                           "batch_size": 2, "max_length": 16, "device": "cpu", "calibration": []})
    out = tmp_path / kind
    out.mkdir()
    with pytest.raises(DataError, match=r"4 of the 4 training examples were dropped: .*max_length \(16 tokens\)"):
        import_module(f"lab.kinds.{kind}.run").run_job(cfg, JobContext(out))


@pytest.mark.model
@pytest.mark.slow
def test_an_sft_runs_snapshots_feed_a_series_on_the_step_axis(tiny_model_dir, tmp_path):
    """The issue's "its checkpoints feed the series view": a series' run entry reads an sft run as it reads
    a finetune run's, its base model at step 0 and each epoch's snapshot after it."""
    from lab.jobkit.kinds import write_config
    from lab.kinds.series.run import run_job as run_series

    out = tmp_path / "runs" / "00001-sft"
    out.mkdir(parents=True)
    _, cfg = parse_config(_config(tiny_model_dir, epochs=2, calibration=[], snapshots=True))
    write_config(out, "sft", cfg)  # as the worker writes it: the series reads the run's base model there
    run_job(cfg, JobContext(out))
    _, series = parse_config({"kind": "series", "axis": "step", "models": [{"run": str(out)}], "tasks": CALIBRATION,
                              "device": "cpu", "bootstrap": 0}, [tmp_path / "runs"])
    folder = tmp_path / "runs" / "00002-series"
    folder.mkdir()
    assert run_series(series, JobContext(folder))["points"] == 3
    cells = json.loads((folder / "series.json").read_text())["cells"]
    assert [c["x"] for c in cells] == [0, 2, 4]  # 8 rows in batches of 4: a snapshot after each epoch
