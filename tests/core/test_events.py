
import pytest

from jobs import failures, preflight
from lab.core.events import EventWriter, read_events
from lab.models.bundled import bundled_model_dir
from lab.models.weights import count_parameters


@pytest.mark.unit
def test_events_are_read_incrementally_and_a_torn_line_waits(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path)
    assert read_events(path) == ([], 0)  # not written yet
    writer.emit("train", step=1, loss=2.5)
    writer.emit("train", step=2, loss=2.0)
    events, offset = read_events(path)
    assert [(e["stage"], e["step"], e["loss"]) for e in events] == [("train", 1, 2.5), ("train", 2, 2.0)]
    with open(path, "a") as f:
        f.write('{"time": 1.5, "stage": "eval", "ece"')  # being written
    assert read_events(path, offset) == ([], offset)
    with open(path, "a") as f:
        f.write(': 0.1}\n')
    events, end = read_events(path, offset)
    assert events == [{"time": 1.5, "stage": "eval", "ece": 0.1}] and end == path.stat().st_size


@pytest.mark.unit
def test_only_rank_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    EventWriter(tmp_path / "e.jsonl").emit("train", step=1)
    assert not (tmp_path / "e.jsonl").exists()


@pytest.mark.unit
def test_failure_summaries():
    assert failures.classify(1, "x\ntorch.OutOfMemoryError: CUDA out of memory.").startswith("out of memory")
    assert failures.classify(2, "error: Model directory './m' does not exist.").startswith("model not found")
    assert failures.classify(2, "lab.core.errors.DataError: Data file not found: 'x'").startswith("data error")
    assert failures.classify(-9, "step 10").startswith("killed (SIGKILL)")
    assert failures.classify(-15, "") == "killed by SIGTERM"
    assert failures.classify(1, "Traceback\nValueError: bad\n\n") == "crashed (exit code 1): ValueError: bad"
    assert failures.classify(None, "") == "crashed (no exit code (not our child)) with an empty log"


@pytest.mark.model
def test_preflight_counts_parameters_exactly_and_warns_when_it_will_not_fit():
    n = count_parameters(bundled_model_dir())
    assert n == 134_515_008  # SmolLM2-135M: tied embeddings stored once
    assert preflight.inference_bytes(1000, "bfloat16") == 1000 * 2 * 1.2  # training: tests/training/test_estimates.py
    gib = 1024**3
    assert preflight.check("evaluate", {"model": "bundled"}, (0,), free={0: 10 * gib}) == []
    warning = preflight.check("evaluate", {"model": "bundled"}, (0,), free={0: 0.1 * gib})
    assert len(warning) == 1 and "0.13 B parameters" in warning[0] and "0.1 GiB free" in warning[0]
    assert preflight.check("evaluate", {"model": "bundled"}, (), free={}) == []  # CPU job: nothing to check
