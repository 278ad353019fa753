"""The run folders are the truth a lost store is rebuilt from (issue 43): every ending is written
there, a refused pipeline leaves nothing, a folder that is no job's record is never run, crafted
``job.json``/``events.jsonl``/``result.json`` stall neither the rebuild nor the queue, and
``python -m lab run --out`` never writes into a store."""
import json
import sys
import time
from pathlib import Path

import pytest

from jobs import cli as jobs_cli
from jobs.scheduler import Scheduler, cancel
from jobs.store import DB_FILE, JobStore
from lab import cli as lab_cli
from lab.core.config import ConfigError
from lab.core.events import read_events_checked
from lab.core.layout import CONFIG_FILE, EVENTS_FILE, JOB_FILE, RESULT_FILE
from lab.core.yamlio import dump_yaml
from lab.jobkit.chain import ended_as
from lab.jobkit.kinds import load_config
from lab.jobkit.worker import ROOTS_ENV, allowed_folders
from tests.helpers import CONFIG, fake_launcher, wait_for

RECORD = {"gpus": 0, "processes": 1, "executor": "local", "slurm": None, "roots": None, "waits_on": None}


def _lose_the_store(root: Path) -> None:
    for name in (DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm"):
        (root / name).unlink(missing_ok=True)


def _states(store: JobStore) -> dict[int, tuple[str, str]]:
    return {job.id: (job.status, job.error) for job in store.list()}


def _recording_scheduler(store: JobStore) -> tuple[Scheduler, list[int]]:
    """A scheduler whose launcher only notes which jobs it was asked to start (each then ends at once)."""
    started: list[int] = []

    def launcher(job, launch):
        started.append(job.id)
        return [sys.executable, "-c", "pass"]

    return Scheduler(store, gpus=[], launcher=launcher), started


def _plant(root: Path, name: str, config: dict, record=None, **files: str) -> Path:
    """A numbered folder written by hand, not by the store: ``record`` its job.json (None: none)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / CONFIG_FILE).write_text(dump_yaml(config))
    if record is not None:
        (folder / JOB_FILE).write_text(json.dumps(record))
    for file, text in files.items():
        (folder / file.replace("_", ".")).write_text(text)
    return folder


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------- R1: every ending in the folder
@pytest.mark.unit
def test_cancelled_refused_and_failed_by_dependency_stay_so_in_a_rebuilt_store_and_nothing_runs(tmp_path):
    root = tmp_path / "runs"
    store = JobStore(root)
    cancelled, earlier = store.submit(CONFIG), store.submit(CONFIG)
    waiting = store.submit(CONFIG, after=[earlier.id])
    refused = {"pipeline": [{"name": "a", **CONFIG}, {"name": "b", **CONFIG, "device": "cuda:0"}]}
    with pytest.raises(ConfigError, match=r"pipeline\[1\] \(b\)\.device: cuda:0 needs a GPU"):
        store.submit_pipeline(refused)
    cancel(store, cancelled.id)
    cancel(store, earlier.id)
    scheduler, started = _recording_scheduler(store)
    scheduler.tick()  # the waiting job fails: the one it waits for was cancelled
    before = _states(store)
    assert [status for status, _ in before.values()] == ["failed", "cancelled", "cancelled"] and started == []
    for job_id in before:
        assert ended_as(Path(store.get(job_id).run_dir))["status"] == before[job_id][0]
    _lose_the_store(root)
    reopened = JobStore(root)  # as any page does
    assert _states(reopened) == before
    scheduler, started = _recording_scheduler(reopened)
    scheduler.tick()
    assert started == [] and _states(reopened) == before
    assert before[waiting.id][1].startswith(f"stage {earlier.id} (evaluate) cancelled (cancelled before it started)")


@pytest.mark.e2e
def test_a_worker_that_died_unrecorded_is_failed_in_its_folder_too(tmp_path):
    root = tmp_path / "runs"
    store = JobStore(root)
    job = store.submit(CONFIG)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({job.id: "crash"}))
    scheduler.tick()
    wait_for(lambda: store.get(job.id).status != "running", tick=scheduler.tick)
    ended = store.get(job.id)
    assert ended.status == "failed" and ended_as(Path(job.run_dir)) == {"status": "failed", "error": ended.error}
    _lose_the_store(root)
    assert _states(JobStore(root)) == {job.id: ("failed", ended.error)}


# ---------------------------------------------------------------- R3: a refused pipeline leaves nothing
@pytest.mark.unit
def test_a_pipeline_refused_at_a_later_stage_queues_no_stage_and_leaves_no_folder(tmp_path):
    store = JobStore(tmp_path / "runs")
    data = {"pipeline": [{"name": "a", **CONFIG}, {"name": "b", **CONFIG}, {"name": "c", **CONFIG, "device": "cuda:1"}]}
    with pytest.raises(ConfigError, match=r"^pipeline\[2\] \(c\)\.device"):
        store.submit_pipeline(data, gpus=0)
    assert store.list() == [] and sorted(p.name for p in store.root.iterdir() if p.is_dir()) == []
    data["pipeline"][2]["device"] = "cpu"
    queued = store.submit_pipeline(data)
    assert [job.id for job in queued] == [1, 2, 3] and all(job.status == "queued" for job in queued)


# ---------------------------------------------------------------- R2: a planted folder is no job
@pytest.mark.e2e
@pytest.mark.parametrize("record", [None, {**RECORD, "gpus": "abc"}, {"roots": None}, [1, 2], "{not json"])
def test_a_folder_without_a_valid_record_of_its_submission_is_never_queued_and_left_as_it_is(tmp_path, capsys,
                                                                                              record):
    root = tmp_path / "runs"
    store = JobStore(root)
    good = store.submit(CONFIG)
    planted = _plant(root, "00005-evaluate", CONFIG)
    if record is not None:
        (planted / JOB_FILE).write_text(record if isinstance(record, str) else json.dumps(record))
    files = _listing(planted)
    _lose_the_store(root)
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher({good.id: "ok"}))
    scheduler.tick()  # a bad gpus must not fail the tick: the good job starts
    assert [job.id for job in store.list()] == [good.id] and store.get(good.id).status == "running"
    assert "00005-evaluate" in capsys.readouterr().err and store.strays() == ["00005-evaluate"]
    assert jobs_cli.main(["--root", str(root), "list"]) == 0
    assert "00005-evaluate" in capsys.readouterr().err
    wait_for(lambda: store.get(good.id).status == "succeeded", tick=scheduler.tick)
    assert _listing(planted) == files


@pytest.mark.unit
def test_a_servers_worker_reads_inside_the_servers_folders_whatever_its_job_json_says(tmp_path, monkeypatch):
    root, outside = tmp_path / "runs", tmp_path / "elsewhere"
    outside.mkdir()
    secret = outside / "secret.jsonl"
    secret.write_text('{"question": "q", "choices": ["a", "b"], "answer": 0}\n')
    store = JobStore(root, roots=[root])
    config = {"kind": "evaluate", "dataset": "custom", "data_files": [str(secret)]}
    planted = _plant(root, "00003-evaluate", config, {**RECORD, "roots": None})
    env = Scheduler(store, gpus=[])._env(())
    assert json.loads(env[ROOTS_ENV]) == store.roots
    monkeypatch.setenv(ROOTS_ENV, env[ROOTS_ENV])
    assert allowed_folders(planted) == [Path(r) for r in store.roots]
    with pytest.raises(ConfigError, match="leads outside"):
        load_config(planted / CONFIG_FILE, allowed_folders(planted), runs=root)


@pytest.mark.e2e
def test_a_planted_roots_null_folder_run_by_a_servers_scheduler_reads_nothing_outside(tmp_path):
    root, outside = tmp_path / "runs", tmp_path / "elsewhere"
    outside.mkdir()
    secret = outside / "secret.jsonl"
    secret.write_text('{"question": "q", "choices": ["a", "b"], "answer": 0}\n')
    store = JobStore(root, roots=[root])
    _plant(root, "00003-evaluate", {"kind": "evaluate", "dataset": "custom", "data_files": [str(secret)]},
           {**RECORD, "roots": None})
    _lose_the_store(root)
    scheduler = Scheduler(store, gpus=[])  # the real worker, python -m lab run
    wait_for(lambda: store.get(3).status not in ("queued", "running"), timeout=120, step=0.5, tick=scheduler.tick)
    job = store.get(3)
    assert job.status == "failed" and "leads outside" in job.error, job.error


# ---------------------------------------------------------------- R6: crafted files stall nothing
@pytest.mark.unit
def test_the_events_reader_skips_and_names_lines_that_are_no_event(tmp_path):
    path = tmp_path / EVENTS_FILE
    good = {"time": 1.0, "stage": "train", "step": 1}
    lines = [b"[1, 2]", b'"text"', b'{"time": 1, "stage": "a\xff"}', b'{"time": "soon", "stage": "x"}',
             b"[" * 100_000 + b"]" * 100_000, json.dumps({"time": 2, "stage": "x", "deep": [[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]}).encode(),
             b'{"time": 3, "stage": 7}', b'{"time": NaN, "stage": "x"}', b"", json.dumps(good).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    read = read_events_checked(path)
    assert read.events == [good] and read.offset == path.stat().st_size
    assert len(read.skipped) == 8 and read.skipped[0] == "byte 0: not a JSON object (list)"
    assert any("nested too deeply" in s for s in read.skipped) and any("time is not a number" in s for s in read.skipped)


@pytest.mark.e2e
def test_a_rebuild_reads_past_a_bad_events_line_and_the_queue_fails_only_the_bad_jobs(tmp_path):
    root = tmp_path / "runs"
    store = JobStore(root)
    died, itself, weird, after_weird, good = (store.submit(CONFIG) for _ in range(5))
    (Path(died.run_dir) / EVENTS_FILE).write_text(
        '["not", "an", "event"]\n' + json.dumps({"time": time.time(), "stage": "start", "pid": 2**22 + 17}) + "\n")
    (Path(itself.run_dir) / JOB_FILE).write_text(json.dumps({**RECORD, "waits_on": [itself.id]}))
    (Path(weird.run_dir) / RESULT_FILE).write_text(json.dumps({"status": "paused", "error": None}))
    (Path(after_weird.run_dir) / JOB_FILE).write_text(json.dumps({**RECORD, "waits_on": [weird.id]}))
    _lose_the_store(root)
    assert store.get(died.id).status == "interrupted"  # the rebuild went on
    assert store.get(weird.id).status == "failed" and "no status the lab records" in store.get(weird.id).error
    scheduler, started = _recording_scheduler(store)
    scheduler.tick()
    assert started == [good.id]
    for bad, why in ((itself, "would wait forever"), (after_weird, f"stage {weird.id} (evaluate) failed")):
        job = store.get(bad.id)
        assert job.status == "failed" and why in job.error
        assert ended_as(Path(job.run_dir)) == {"status": "failed", "error": job.error}


@pytest.mark.e2e
def test_a_row_the_scheduler_cannot_weigh_fails_that_job_and_the_next_one_starts(tmp_path, capsys):
    store = JobStore(tmp_path / "runs")
    bad, good = store.submit(CONFIG), store.submit(CONFIG)
    store.update(bad.id, gpus="abc")
    scheduler, started = _recording_scheduler(store)
    scheduler.tick()
    assert started == [good.id]
    job = store.get(bad.id)
    assert job.status == "failed" and job.error.startswith("the scheduler failed on this job: TypeError")
    assert ended_as(Path(job.run_dir))["status"] == "failed"


# ---------------------------------------------------------------- R14: lab run never writes into a store
@pytest.mark.unit
def test_lab_run_refuses_an_out_inside_a_store_and_says_to_submit(tmp_path, capsys):
    root = tmp_path / "runs"
    store = JobStore(root)
    store.submit(CONFIG)
    pipeline = tmp_path / "pipe.yaml"
    pipeline.write_text(dump_yaml({"pipeline": [{"name": "a", **CONFIG}]}))
    config = tmp_path / "one.yaml"
    config.write_text(dump_yaml(CONFIG))
    before = sorted(p.name for p in root.iterdir())
    for argv in (["run", str(pipeline), "--out", str(root)], ["run", str(config), "--out", str(root / "00009-evaluate")],
                 ["evaluate", "--out", str(root / "00002-evaluate")]):
        assert lab_cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "is a job store's folder" in err and "python -m jobs" in err and "submit" in err
    assert sorted(p.name for p in root.iterdir()) == before


@pytest.mark.unit
def test_a_second_folder_of_one_id_leaves_the_store_readable_and_says_what_is_true(tmp_path, capsys):
    root = tmp_path / "runs"
    store = JobStore(root)
    job = store.submit(CONFIG)
    _plant(root, "00001-sft", {"kind": "sft", "model": "bundled"})  # what lab run --out runs/ wrote before
    _lose_the_store(root)
    assert [j.id for j in store.list()] == [job.id] and store.get(job.id).run_dir == job.run_dir
    err = capsys.readouterr().err
    assert "00001-sft (no job.json" in err and "mv " not in err and ".broken" not in err
    _plant(root, "00001-dpo", {"kind": "dpo", "model": "bundled"}, RECORD)  # two records of job 1: neither is listed
    _lose_the_store(root)
    assert store.list() == []
    err = capsys.readouterr().err
    assert "00001-dpo, 00001-evaluate (each records job 1" in err and ".broken" not in err


@pytest.mark.unit
def test_a_result_json_nested_past_any_ending_is_no_ending_and_the_rebuild_goes_on(tmp_path):
    """json.loads of a 100,000-deep result.json raises RecursionError, which is no ValueError: the
    rebuild and the scheduler's finish read every result.json through ended_as."""
    root = tmp_path / "runs"
    store = JobStore(root)
    deep, good = store.submit(CONFIG), store.submit(CONFIG)
    (Path(deep.run_dir) / RESULT_FILE).write_text("[" * 100_000 + "]" * 100_000)
    assert ended_as(Path(deep.run_dir)) is None
    _lose_the_store(root)
    assert store.get(deep.id).status == "failed" and "no status the lab records" in store.get(deep.id).error
    assert store.get(good.id).status == "queued"


@pytest.mark.unit
def test_a_resumed_job_is_queued_again_in_a_rebuilt_store_not_its_last_attempt_interrupted(tmp_path):
    """Resume deletes the last attempt's result.json, but that attempt's start event stays: without a
    mark in the folder, a rebuild took the job for one whose worker died, not one waiting to start."""
    root = tmp_path / "runs"
    store = JobStore(root)
    job = store.submit(CONFIG)
    (Path(job.run_dir) / EVENTS_FILE).write_text(json.dumps({"time": time.time(), "stage": "start", "pid": 2**22 + 17}) + "\n")
    store.end(job.id, "failed", "its worker died")
    store.resume(job.id)
    _lose_the_store(root)
    assert store.get(job.id).status == "queued"
