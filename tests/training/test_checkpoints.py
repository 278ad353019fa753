"""Checkpoints that fit (issue 31): what a checkpoint holds and weighs, one kept, resuming from one
without the optimizer's state, and a job that fails with the sizes before it fills the disk."""
import json
import shutil
from pathlib import Path

import pytest
import yaml

from lab.core.errors import Stopped
from lab.core.events import EventWriter, read_events
from lab.models.weights import count_parameters, model_shape
from lab.training.config import TrainConfig
from lab.training.estimates import CHECKPOINT_EXTRA, checkpoint_bytes
from lab.training.trainer import finetune

pytestmark = pytest.mark.model


def _config(tiny_model_dir, csqa_files, **fields) -> TrainConfig:
    return TrainConfig(**{"model": str(tiny_model_dir), "dataset": "csqa", "data_files": csqa_files, "limit": 8,
                          "val_split": None, "batch_size": 4, "epochs": 2, "learning_rate": 1e-3,
                          "warmup_ratio": 0.0, **fields})


def _checkpoints(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("checkpoint-*"))


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_checkpoint_weighs_what_the_estimate_says_and_one_is_kept(method, tiny_model_dir, csqa_files, tmp_path):
    finetune(_config(tiny_model_dir, csqa_files, method=method), tmp_path, EventWriter(tmp_path / "events.jsonl"))
    (kept,) = _checkpoints(tmp_path)  # two epochs, two saves: the first removed once the second was whole
    assert kept.name == "checkpoint-4" and (kept / "optimizer.pt").is_file()
    shape = model_shape(tiny_model_dir)
    trainable = count_parameters(tiny_model_dir) if method == "full" else shape.lora_params(16)
    estimate = checkpoint_bytes(4 * trainable, trainable, save_optimizer=True)  # fp32 weights + AdamW's moments
    assert estimate - CHECKPOINT_EXTRA <= _bytes(kept) <= estimate


@pytest.mark.slow
def test_without_the_optimizer_a_checkpoint_is_weights_only_and_resume_goes_on_with_the_schedule(
        tiny_model_dir, csqa_files, tmp_path):
    cfg = _config(tiny_model_dir, csqa_files, save_optimizer=False)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    finetune(cfg, whole, EventWriter(whole / "events.jsonl"))
    (kept,) = _checkpoints(whole)
    names = {f.name for f in kept.iterdir()}
    assert "model.safetensors" in names and not names & {"optimizer.pt", "scheduler.pt"}
    assert _bytes(kept) <= checkpoint_bytes(4 * count_parameters(tiny_model_dir), 0, save_optimizer=False)

    stops = iter([False, True])  # stop after the second step
    with pytest.raises(Stopped):
        finetune(cfg, cut, EventWriter(cut / "events.jsonl"), should_stop=lambda: next(stops, False))
    finetune(cfg, cut, EventWriter(cut / "events.jsonl"))
    events = read_events(cut / "events.jsonl")[0]
    (resumed,) = [e for e in events if e["stage"] == "resumed"]
    assert resumed["step"] == 2 and "AdamW starts afresh" in resumed["message"]
    lr = {e["step"]: e["lr"] for e in read_events(whole / "events.jsonl")[0] if e["stage"] == "train"}
    after = {e["step"]: e["lr"] for e in events if e["stage"] == "train" and e["step"] > 2}
    assert after == {3: lr[3], 4: lr[4]}  # the cosine schedule goes on from step 2, not from its start


@pytest.mark.e2e
def test_a_job_that_cannot_save_fails_naming_the_sizes_before_writing(tiny_model_dir, csqa_files, tmp_path,
                                                                     monkeypatch):
    from lab.jobkit.worker import run

    run_dir = tmp_path / "run"
    real = shutil.disk_usage
    free = 1024**2  # 1 MiB: less than one checkpoint of the tiny model, even of its weights alone (1.15 MiB)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free)
                        if str(path).startswith(str(run_dir)) else real(path))
    config = tmp_path / "finetune.yaml"
    config.write_text(yaml.safe_dump({"kind": "finetune", "model": str(tiny_model_dir), "dataset": "csqa",
                                      "data_files": csqa_files, "limit": 4, "val_split": None, "epochs": 1,
                                      "batch_size": 4, "device": "cpu"}))
    assert run(config, run_dir) == 2
    need = checkpoint_bytes(4 * count_parameters(tiny_model_dir), count_parameters(tiny_model_dir), True)
    error = json.loads((run_dir / "result.json").read_text())["error"]
    assert error == (f"disk full: the checkpoint needs {need / 1024**2:.1f} MiB, 1.0 MiB free in {run_dir}/checkpoints; "
                     f"free space (or set save_optimizer: false: "
                     f"{checkpoint_bytes(4 * count_parameters(tiny_model_dir), 0, False) / 1024**2:.1f} MiB a "
                     "checkpoint, weights only), then resume the job")
    assert not _checkpoints(run_dir)  # nothing half-written
