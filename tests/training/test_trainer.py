"""Fine-tuning: supervised sequences, the Trainer loop with events and per-epoch ECE, stopping."""
import json

import pytest
import torch

from lab.core.errors import Stopped
from lab.core.events import EventWriter, read_events
from lab.data.record import MCQRecord
from lab.models.loading import load_model
from lab.training.config import TrainConfig
from lab.training.data import IGNORE, build_examples, pad_batch
from lab.training.trainer import finetune


@pytest.mark.model
def test_examples_supervise_the_answer_only_or_everything(bundled):
    record = MCQRecord("q", "Where do fish live?", ("tree", "water"), 1, "csqa")
    tok = bundled.tokenizer
    (only,) = build_examples([record], "first_lower", tok, completion_only=True)
    (full,) = build_examples([record], "first_lower", tok, completion_only=False)
    assert only["input_ids"] == full["input_ids"] and only["input_ids"][-1] == tok.eos_token_id
    text = tok.decode(only["input_ids"])
    assert text.endswith("A: The answer is (b)." + tok.eos_token)
    supervised = [t for t, label in zip(only["input_ids"], only["labels"]) if label != IGNORE]
    assert tok.decode(supervised) == "b)." + tok.eos_token
    assert full["labels"] == full["input_ids"]
    assert build_examples([record], "first_lower", tok, max_length=10) == []  # too long: dropped, not cut


@pytest.mark.unit
def test_pad_batch_masks_padding():
    batch = pad_batch([{"input_ids": [5, 6, 7], "labels": [IGNORE, 6, 7]}, {"input_ids": [8], "labels": [8]}], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 6, 7], [8, IGNORE, IGNORE]]


@pytest.mark.unit
@pytest.mark.parametrize("bad, field", [({"method": "dora"}, "method"), ({"epochs": 0}, "epochs"),
                                        ({"template": "cloze_qa"}, "cloze"), ({"batch_size": 0}, "batch_size"),
                                        ({"dataset": "csq"}, "csq"), ({"lr": 1}, "lr")])
def test_train_config_refuses_bad_values(bad, field):
    with pytest.raises((ValueError, KeyError), match=field):
        TrainConfig.from_dict(bad)


@pytest.mark.model
@pytest.mark.parametrize("method", ["full", "lora"])
def test_finetune_trains_saves_and_reports_validation_ece(tiny_model_dir, csqa_files, tmp_path, method):
    cfg = TrainConfig(model=str(tiny_model_dir), method=method, dataset="csqa", data_files=csqa_files, limit=8,
                      val_limit=6, epochs=2, batch_size=4, learning_rate=1e-3, warmup_ratio=0.0)
    result = finetune(cfg, tmp_path, EventWriter(tmp_path / "events.jsonl"))
    events, _ = read_events(tmp_path / "events.jsonl")
    losses = [e["loss"] for e in events if e["stage"] == "train"]
    assert len(losses) == 4 and [e["step"] for e in events if e["stage"] == "train"] == [1, 2, 3, 4]
    evals = [e for e in events if e["stage"] == "train_eval"]
    assert [e["epoch"] for e in evals] == [1.0, 2.0] and all(e["n"] == 6 and 0 <= e["ece"] <= 1 for e in evals)
    assert result["history"] == [{k: v for k, v in e.items() if k not in ("time", "stage")} for e in evals]
    trained = load_model(result["model"], adapter=result["adapter"], device="cpu")
    base = load_model(str(tiny_model_dir), device="cpu")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert (trained.model(ids).logits - base.model(ids).logits).abs().max() > 1e-4  # it learned something
    assert (result["adapter"] is not None) == (method == "lora")


@pytest.mark.model
def test_a_stop_request_ends_training_keeping_a_checkpoint(tiny_model_dir, csqa_files, tmp_path):
    cfg = TrainConfig(model=str(tiny_model_dir), dataset="csqa", data_files=csqa_files, limit=8, val_split=None,
                      epochs=3, batch_size=4)
    with pytest.raises(Stopped, match="stopped at step 1"):
        finetune(cfg, tmp_path, EventWriter(tmp_path / "events.jsonl"), should_stop=lambda: True)
    assert list((tmp_path / "checkpoints").glob("checkpoint-1"))
    state = json.loads(next((tmp_path / "checkpoints").glob("checkpoint-1/trainer_state.json")).read_text())
    assert state["global_step"] == 1


@pytest.mark.unit
def test_checkpoint_rotation_leaves_no_mtime_notice_in_the_job_log(tmp_path):
    """Issue 30: a fine-tune's log said "mtime may not be reliable on this filesystem": transformers
    says so whenever two checkpoints were saved within a second (a small model's epochs), then
    orders them by step, as our checkpoints are named. Nothing is wrong, so nothing is said."""
    import logging

    from transformers.trainer_utils import sort_checkpoints
    from transformers.utils import logging as hf_logging

    said: list[str] = []
    listener = logging.Handler()
    listener.emit = lambda record: said.append(record.getMessage())
    source = logging.getLogger("transformers.trainer_utils")  # where transformers says it
    source.addHandler(listener)
    hf_logging.warning_once.cache_clear()  # said earlier in this process: said again
    try:
        for step in (5, 10):
            (tmp_path / f"checkpoint-{step}").mkdir()
        assert sort_checkpoints(str(tmp_path), use_mtime=True) == [str(tmp_path / "checkpoint-5"),
                                                                    str(tmp_path / "checkpoint-10")]
    finally:
        source.removeHandler(listener)
    assert not [m for m in said if "mtime" in m]


@pytest.mark.model
def test_a_lora_model_is_made_and_loaded_without_a_future_warning(tiny_model_dir, tmp_path):
    """Issue 30's log noise, in a LoRA job: peft reads transformers' `is_gradient_checkpointing`,
    renamed in transformers 5, and every LoRA job's log carried the FutureWarning it raises."""
    import warnings

    from lab.training.trainer import prepare_model

    cfg = TrainConfig(model=str(tiny_model_dir), method="lora", dataset="csqa", epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        model, _, _ = prepare_model(cfg)
        model.save_pretrained(tmp_path / "adapter")
        load_model(str(tiny_model_dir), adapter=str(tmp_path / "adapter"), device="cpu")
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []
