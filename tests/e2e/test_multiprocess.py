"""Multi-process runs executed, not only their command lines: ``accelerate launch --num_processes 2``
on this CPU, ranks joined over gloo (the launcher, process group, samplers, gathers and rank-0
writes a multi-GPU run uses), compared with one process on the same global batch and seed.

Tolerances: the two runs differ only in how float sums are split between ranks (DDP averages the
two halves' gradients; one process averages one batch), so losses agree to 1e-4 relative and
metrics to 1e-5; the E-step's bins and the top-k store's token ids agree exactly.
"""
import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest

from jobs.launch import Launch, build_command, job_env
from jobs.scheduler import Scheduler
from jobs.store import ConfigError, JobStore
from lab.core.events import read_events
from lab.core.yamlio import dump_yaml
from lab.jobkit import worker
from tests.helpers import wait_for

LOSS_RTOL = 1e-4
METRIC_ATOL = 1e-5


def run(config: dict, run_dir: Path, processes: int, timeout: float = 300) -> list[dict]:
    """Run ``config`` in ``processes`` CPU processes; its events. More than one: the launch command the scheduler
    builds (``accelerate launch``). One, the reference: in this process, through what ``python -m lab run`` calls
    (:func:`lab.jobkit.worker.run`), which a fresh process would only precede with seconds of imports."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_yaml(config))
    if processes == 1:
        assert worker.run(run_dir / "config.yaml", run_dir) == 0, (run_dir / "result.json").read_text()
    else:
        argv = build_command(run_dir / "config.yaml", run_dir, Launch(processes=processes))
        done = subprocess.run(argv, env=job_env(()), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "succeeded"
    return read_events(run_dir / "events.jsonl")[0]


def finetune_config(model: Path, **overrides) -> dict:
    return {"kind": "finetune", "model": str(model), "dataset": "obqa", "data_files": ["bundled"], "limit": 32,
            "val_limit": 16, "epochs": 2, "learning_rate": 1e-3, "device": "cpu", "warmup_ratio": 0.0,
            "lora_dropout": 0.0, **overrides}


def stage_events(events: list[dict], stage: str) -> list[dict]:
    return [e for e in events if e["stage"] == stage]


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_rcft_in_two_processes_equals_one_process_on_the_same_global_batch(tmp_path, tiny_model_dir):
    """Training steps (DDP), validation per epoch and the E-step over every training question,
    split across ranks and gathered, against one process: equal within the module's tolerances."""
    config = finetune_config(tiny_model_dir, objective="rcft", ece_lambda=1.0)
    one = run({**config, "batch_size": 8}, tmp_path / "one", processes=1)
    two = run({**config, "batch_size": 4}, tmp_path / "two", processes=2)

    assert len(stage_events(two, "start")) == 1, "only rank 0 writes events"
    steps_one = [e for e in stage_events(one, "train") if "loss" in e]
    steps_two = [e for e in stage_events(two, "train") if "loss" in e]
    assert [e["step"] for e in steps_two] == [e["step"] for e in steps_one] == list(range(1, 9))
    np.testing.assert_allclose([e["loss"] for e in steps_two], [e["loss"] for e in steps_one], rtol=LOSS_RTOL)

    esteps_one, esteps_two = stage_events(one, "train_estep"), stage_events(two, "train_estep")
    assert len(esteps_two) == len(esteps_one) == 2
    for a, b in zip(esteps_one, esteps_two):
        assert sum(b["counts"]) == 32, "the E-step saw every training question, not one rank's half"
        assert b["counts"] == a["counts"] and b["train_accuracy"] == a["train_accuracy"]

    evals_one, evals_two = stage_events(one, "train_eval"), stage_events(two, "train_eval")
    assert len(evals_two) == len(evals_one) == 2
    for a, b in zip(evals_one, evals_two):
        assert b["n"] == a["n"] == 16
        for key in ("accuracy", "ece", "nll", "brier"):
            assert b[key] == pytest.approx(a[key], abs=METRIC_ATOL), key
    assert (tmp_path / "two" / "model" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_extraction_is_split_across_ranks_and_merged_into_one_store(tmp_path, tiny_model_dir):
    from lab.kinds.extract.store import TopKStore

    config = {"kind": "extract", "model": str(tiny_model_dir), "dataset": "obqa", "data_files": ["bundled"],
              "limit": 40, "shard_size": 8, "device": "cpu"}
    run(config, tmp_path / "one", processes=1)
    run(config, tmp_path / "two", processes=2)
    one, two = TopKStore(tmp_path / "one" / "topk"), TopKStore(tmp_path / "two" / "topk")
    two.verify()
    assert two.manifest["complete"] and len(two.manifest["shards"]) == 5 and len(two) == len(one) == 40
    assert not list((tmp_path / "two" / "topk").glob("manifest-rank*")), "the ranks' partial manifests are merged"
    assert [e["sha256"] for e in two.manifest["shards"]] == [e["sha256"] for e in one.manifest["shards"]]
    assert two.manifest["coverage"] == one.manifest["coverage"]
    for i in range(len(one)):
        np.testing.assert_array_equal(two[i][0], one[i][0])


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_first_pipeline_runs_in_two_processes(tmp_path, tiny_model_dir):
    """Teacher fine-tune, extraction, sweep, a FIRST student (top-k KL under DDP) and the
    evaluations, in two processes: one report, every stage once, as in one process."""
    config = {"kind": "first", "teacher": str(tiny_model_dir), "student": str(tiny_model_dir),
              "dataset": "obqa", "data_files": ["bundled"], "train_limit": 24, "val_limit": 16, "test_limit": 16,
              "students": ["first"], "device": "cpu", "bootstrap": 0,
              "training": {"epochs": 1, "batch_size": 4, "learning_rate": 1e-3, "warmup_ratio": 0.0}}
    one = run({**config, "training": {**config["training"], "batch_size": 8}}, tmp_path / "one", processes=1)
    two = run(config, tmp_path / "two", processes=2)
    rows = {p: json.loads((tmp_path / p / "report.json").read_text())["rows"] for p in ("one", "two")}
    assert [r["method"] for r in rows["two"]] == [r["method"] for r in rows["one"]]
    for a, b in zip(rows["one"], rows["two"]):
        for key in ("accuracy", "ece", "nll"):
            assert b[key] == pytest.approx(a[key], abs=1e-4), (a["method"], key)
    for stage in ("teacher", "extract", "student:first"):
        assert len([e for e in two if e.get("stage") == "stage" and e.get("name") == stage]) == 1, stage
    assert [e["loss"] for e in stage_events(two, "student:first")] == pytest.approx(
        [e["loss"] for e in stage_events(one, "student:first")], rel=LOSS_RTOL)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_cft_protocol_runs_in_two_processes(tmp_path, tiny_model_dir):
    """Base evaluation and temperature scaling (rank 0's), label smoothing and RCFT rows (DDP, the
    E-step gathered across ranks), evaluations and win rates: one report, equal to one process's."""
    config = {"kind": "cft", "model": str(tiny_model_dir), "train_size": 8, "val_size": 12, "test_size": 8,
              "in_domain": [{"dataset": "obqa", "data_files": ["bundled"], "split": "train", "limit": 28}],
              "ood": [{"dataset": "arc_challenge", "data_files": ["bundled"], "split": "test", "limit": 6}],
              "methods": ["ts", "ls", "rcft"], "lambdas": [1.0], "preferences": ["bundled"], "preference_limit": 3,
              "max_response_tokens": 8, "bootstrap": 0, "device": "cpu",
              "training": {"epochs": 1, "batch_size": 4, "learning_rate": 1e-3, "warmup_ratio": 0.0}}
    run({**config, "training": {**config["training"], "batch_size": 8}}, tmp_path / "one", processes=1)
    two = run(config, tmp_path / "two", processes=2)
    rows = {p: json.loads((tmp_path / p / "report.json").read_text())["rows"] for p in ("one", "two")}
    assert [(r["method"], r["set"]) for r in rows["two"]] == [(r["method"], r["set"]) for r in rows["one"]]
    for a, b in zip(rows["one"], rows["two"]):
        for key in ("accuracy", "ece", "nll"):
            assert b[key] == pytest.approx(a[key], abs=1e-4), (a["method"], a["set"], key)
    esteps = [e for e in two if e["stage"].endswith("_estep")]
    assert esteps and all(sum(e["counts"]) == 8 for e in esteps), "RCFT's E-step saw the whole training set"


def _ranks(pid: int) -> dict[int, psutil.Process]:
    """The worker processes of a launch, by their RANK."""
    found = {}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            rank = child.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None and "lab" in child.cmdline():
            found[int(rank)] = child
    return found


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_a_rank_that_dies_fails_the_job_naming_it_and_leaves_no_process(tmp_path, tiny_model_dir):
    store = JobStore(tmp_path / "runs")
    scheduler = Scheduler(store, gpus=[])
    job = store.submit(finetune_config(tiny_model_dir, epochs=50, val_split=None), processes=2)
    scheduler.tick()
    run_dir = Path(store.get(job.id).run_dir)
    wait_for(lambda: any(e["stage"] == "train" and e.get("step", 0) >= 2
                         for e in read_events(run_dir / "events.jsonl")[0]), timeout=180, tick=scheduler.tick)
    ranks = _ranks(store.get(job.id).pid)
    assert set(ranks) == {0, 1}
    every = [store.get(job.id).pid, *(p.pid for p in psutil.Process(store.get(job.id).pid).children(recursive=True))]
    ranks[1].send_signal(signal.SIGKILL)
    wait_for(lambda: store.get(job.id).status != "running", timeout=120, tick=scheduler.tick)
    ended = store.get(job.id)
    assert ended.status == "failed"
    assert "rank 1" in ended.error and "SIGKILL" in ended.error, ended.error
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                             for p in every), timeout=30)


@pytest.mark.unit
def test_more_than_one_process_is_refused_where_it_would_only_repeat_work(tmp_path):
    store = JobStore(tmp_path / "runs")
    with pytest.raises(ConfigError, match="processes: a evaluate job does not split"):
        store.submit({"kind": "evaluate"}, processes=2)
    with pytest.raises(ConfigError, match="one process per GPU"):
        store.submit({"kind": "finetune"}, gpus=2, processes=2)
    assert store.list() == []


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_a_killed_run_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(tmp_path, slower_model_dir):
    """kill -9 mid-epoch, then Resume: it continues from the last whole checkpoint with optimizer,
    scheduler and RNG state, says so, and its losses after that step equal an uninterrupted run's."""
    config = finetune_config(slower_model_dir, epochs=1, limit=100, batch_size=2, save_steps=10, val_split=None)
    straight = run(config, tmp_path / "straight", processes=1)

    store = JobStore(tmp_path / "runs")
    scheduler = Scheduler(store, gpus=[])
    job = store.submit(config)
    scheduler.tick()
    run_dir = Path(store.get(job.id).run_dir)
    wait_for(lambda: (run_dir / "checkpoints" / "checkpoint-20" / "trainer_state.json").is_file(), timeout=120,
             tick=scheduler.tick)
    os.killpg(store.get(job.id).pid, signal.SIGKILL)
    wait_for(lambda: store.get(job.id).status == "failed", timeout=30, tick=scheduler.tick)
    killed_at = max(e.get("step", 0) for e in read_events(run_dir / "events.jsonl")[0] if e["stage"] == "train")
    assert 20 <= killed_at < 50, "killed mid-epoch, after a checkpoint"

    store.resume(job.id)
    wait_for(lambda: store.get(job.id).status not in ("queued", "running"), timeout=180, tick=scheduler.tick)
    assert store.get(job.id).status == "succeeded", store.get(job.id).error
    events = read_events(run_dir / "events.jsonl")[0]
    resumed = stage_events(events, "resumed")
    assert len(resumed) == 1 and resumed[0]["step"] >= 20 and "resumed from step" in resumed[0]["message"]
    after = {e["step"]: e["loss"] for e in events if e["stage"] == "train" and "loss" in e
             and e["time"] > resumed[0]["time"]}
    want = {e["step"]: e["loss"] for e in straight if e["stage"] == "train" and "loss" in e}
    assert sorted(after) == list(range(resumed[0]["step"] + 1, 51))
    np.testing.assert_allclose([after[s] for s in sorted(after)], [want[s] for s in sorted(after)], rtol=LOSS_RTOL)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_tensorboard_gets_the_loss_and_validation_calibration(tmp_path, tiny_model_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(finetune_config(tiny_model_dir, epochs=2, report_to="tensorboard"), tmp_path / "run", processes=1)
    logs = EventAccumulator(str(tmp_path / "run" / "tensorboard")).Reload()
    tags = set(logs.Tags()["scalars"])
    assert {"train/loss", "eval/ece", "eval/accuracy", "eval/nll", "eval/brier"} <= tags, tags
    events = read_events(tmp_path / "run" / "events.jsonl")[0]
    ece = [e["ece"] for e in stage_events(events, "train_eval")]
    assert [s.value for s in logs.Scalars("eval/ece")] == pytest.approx(ece, abs=1e-6)
    assert len(logs.Scalars("train/loss")) == len([e for e in stage_events(events, "train") if "loss" in e])
    args = json.loads(logs.Tensors("args/text_summary")[0].tensor_proto.string_val[0])
    assert args["run_name"] == "run train" and args["learning_rate"] == 1e-3


@pytest.mark.unit
def test_a_tracker_that_is_not_installed_is_refused_naming_the_package(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="report_to: wandb is not installed.*pip install wandb"):
        JobStore(tmp_path / "runs").submit({"kind": "finetune", "report_to": "wandb"})


@pytest.mark.unit
def test_a_lost_peer_is_left_to_the_launcher_to_report(monkeypatch):
    """Rank 0's collective fails when rank 1 dies; its own result would blame itself ("internal
    error"), so it writes none and the launcher's report names the rank that died first."""
    from lab.jobkit.worker import _peer_lost

    lost = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:50051: Connection reset by peer.")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _peer_lost(lost) and not _peer_lost(RuntimeError("boom in step 3"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not _peer_lost(lost)
