"""Chained stages (lab.jobkit.chain, lab.jobkit.pipeline, the store's waits_on): ``model: run:<id>`` resolved to
a finished training job's weights, checked at submit and again at start; a later stage never starting after an
earlier one failed, and starting from its weights once it succeeded; the pipeline preset queued as jobs."""
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from jobs import cli as jobs_cli
from jobs.scheduler import Scheduler
from jobs.store import DB_FILE, ConfigError, JobStore
from lab.core.events import START, read_events
from lab.core.layout import CONFIG_FILE, EVENTS_FILE, RESULT_FILE, START_FILE
from lab.core.yamlio import load_yaml
from lab.jobkit import kinds, pipeline
from lab.jobkit.kinds import parse_config
from lab.jobkit.worker import run
from tests.helpers import fake_launcher, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EVALUATE = {"kind": "evaluate", "model": "bundled", "dataset": "arc_easy", "data_files": ["bundled"],
            "split": "validation", "limit": 4}
# A few training steps of the tiny model: 16 examples in batches of 8, one epoch, no validation.
TRAIN = {"kind": "finetune", "dataset": "synthetic", "data_files": ["bundled"], "limit": 16, "val_split": None,
         "batch_size": 8, "epochs": 1, "learning_rate": 1e-3, "lr_scheduler": "constant", "warmup_ratio": 0.0,
         "lora_r": 4, "lora_alpha": 8, "device": "cpu"}


@pytest.fixture
def store(tmp_path) -> JobStore:
    return JobStore(tmp_path / "runs")


def _ended(store: JobStore, job_id: int, status: str = "succeeded", error=None) -> None:
    """What a worker and the scheduler leave when a job ends, without running one."""
    (Path(store.get(job_id).run_dir) / RESULT_FILE).write_text(json.dumps({"status": status, "error": error}))
    store.update(job_id, status=status, error=error, finished=time.time())


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    shared = a.keys() & b.keys()  # save_pretrained leaves out a tied output layer
    return len(shared) >= len(a) - 1 and all(torch.equal(a[k], b[k]) for k in shared)


# ---------------------------------------------------------------- what run:<id> may name
@pytest.mark.unit
@pytest.mark.parametrize("value, message", [
    ("run:../x", r"'run:\.\./x' is not a job reference: write run:<id>"),
    ("run:1e3", "'run:1e3' is not a job reference"),
    ("run:-1", "'run:-1' is not a job reference"),
    ("run:0", "'run:0' is not a job reference"),
    ("run:01", "'run:01' is not a job reference"),
    ("run: 1", "'run: 1' is not a job reference"),
    ("run:99999", "there is no job 99999 in .*python -m jobs list"),
    ({"run": 1}, "must be text"),
])
def test_a_hostile_or_unknown_reference_is_refused_at_submit(store, value, message):
    with pytest.raises(ConfigError, match=f"^model: .*{message}"):
        store.submit({**EVALUATE, "model": value})
    with pytest.raises(ConfigError, match=f"^models\\[0\\].model: .*{message}"):  # a series entry
        store.submit({"kind": "series", "models": [{"model": value}], "tasks": [{"task": "clm", "limit": 2}]})
    assert store.list() == []


@pytest.mark.unit
def test_a_reference_names_only_a_training_job_of_this_store(store, tmp_path):
    evaluation = store.submit(EVALUATE)
    with pytest.raises(ConfigError, match=f"^model: job {evaluation.id} is an evaluate job, which leaves no trained "
                                          "model; run:<id> names a finetune, sft, dpo job"):
        store.submit({**EVALUATE, "model": f"run:{evaluation.id}"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, store.root / "00050-finetune")  # a link dressed as a run directory
    with pytest.raises(ConfigError, match="is a link or not a folder"):
        store.submit({**EVALUATE, "model": "run:50"})
    with pytest.raises(ConfigError, match="names a job of the job store, and this config is not run from one"):
        parse_config({**EVALUATE, "model": "run:1"})  # a config checked with no store (the Compare page's)
    trained = store.submit({**TRAIN, "model": "bundled"})
    with pytest.raises(ConfigError, match=f"^model: run:{trained.id} brings its own weights .*leave adapter unset"):
        store.submit({**EVALUATE, "model": f"run:{trained.id}", "adapter": str(tmp_path)})
    _ended(store, trained.id, "failed", "out of memory")
    with pytest.raises(ConfigError, match=f"job {trained.id} \\(finetune\\) failed: out of memory. Resume it first"):
        store.submit({**EVALUATE, "model": f"run:{trained.id}"})
    assert sorted(j.id for j in store.list()) == [evaluation.id, trained.id]


@pytest.mark.unit
def test_the_reference_is_resolved_again_when_the_job_starts(store):
    """Accepted while the earlier job was queued; that job failed meanwhile: the later one is refused at its start."""
    trained = store.submit({**TRAIN, "model": "bundled"})
    later = store.submit({**EVALUATE, "model": f"run:{trained.id}"})
    assert later.waits_for == [trained.id] and later.config_dict["model"] == f"run:{trained.id}"
    (Path(trained.run_dir) / RESULT_FILE).write_text(json.dumps({"status": "failed", "error": "killed"}))
    run_dir = Path(later.run_dir)
    assert run(run_dir / CONFIG_FILE, run_dir) == 2
    error = json.loads((run_dir / RESULT_FILE).read_text())["error"]
    assert f"job {trained.id} (finetune) failed: killed" in error and not (run_dir / START_FILE).exists()
    (Path(trained.run_dir) / RESULT_FILE).write_text(json.dumps({"status": "succeeded", "error": None}))
    assert run(run_dir / CONFIG_FILE, run_dir) == 2  # succeeded, but it left no weights
    assert "succeeded but left no trained weights" in json.loads((run_dir / RESULT_FILE).read_text())["error"]


# ---------------------------------------------------------------- the store and the scheduler
@pytest.mark.unit
def test_what_a_job_waits_for_survives_a_restart_a_lost_store_and_an_old_schema(store):
    trained = store.submit({**TRAIN, "model": "bundled"})
    later = store.submit({**EVALUATE, "model": f"run:{trained.id}"})
    assert JobStore(store.root).get(later.id).waits_for == [trained.id]  # a restarted server's store
    for name in (DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm"):
        (store.root / name).unlink(missing_ok=True)
    assert store.get(later.id).waits_for == [trained.id] and store.get(trained.id).waits_for == []  # rebuilt
    old = store.root.parent / "old"
    old.mkdir()
    db = sqlite3.connect(old / DB_FILE)
    db.executescript("CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, config TEXT NOT "
                     "NULL, status TEXT NOT NULL, gpus INTEGER NOT NULL DEFAULT 0, devices TEXT, position REAL NOT "
                     "NULL, pid INTEGER, pid_started REAL, created REAL NOT NULL, started REAL, finished REAL, run_dir "
                     "TEXT, error TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0);")
    db.execute("INSERT INTO jobs (kind, config, status, position, created) VALUES ('evaluate', 'kind: evaluate', "
               "'queued', 1, 0)")
    db.commit()
    db.close()
    assert JobStore(old).get(1).waits_for == []  # the column added on open, as the store adds every new one


@pytest.mark.e2e
def test_a_chain_whose_earlier_stage_failed_does_not_start_the_next_until_both_are_resumed(store):
    first = store.submit({**TRAIN, "model": "bundled"})
    second = store.submit({**EVALUATE, "model": f"run:{first.id}"})
    modes = {first.id: "crash", second.id: "ok"}
    scheduler = Scheduler(store, gpus=[], launcher=fake_launcher(modes))
    wait_for(lambda: store.get(first.id).status == "failed", tick=scheduler.tick)
    scheduler.tick()
    later = store.get(second.id)
    assert later.status == "failed" and later.started is None
    assert later.error.startswith(f"stage {first.id} (finetune) failed (")
    assert "so this job did not start" in later.error and "then resume this one" in later.error
    assert f"Resume job {first.id} (python -m jobs resume {first.id}" in later.error
    assert not [e for e in read_events(Path(later.run_dir) / EVENTS_FILE)[0] if e.get("stage") == START]

    modes[first.id] = "sleep0.5"
    store.resume(first.id)
    store.resume(second.id)  # queued again at once: it waits for the first, which runs again
    scheduler.tick()
    assert store.get(first.id).status == "running" and store.get(second.id).status == "queued"
    wait_for(lambda: store.get(second.id).status == "succeeded", tick=scheduler.tick)
    assert store.get(second.id).started >= store.get(first.id).finished


@pytest.mark.unit
def test_a_job_waiting_for_a_cancelled_or_vanished_one_fails_saying_so(store):
    first = store.submit({**TRAIN, "model": "bundled"})
    second = store.submit({**EVALUATE, "model": f"run:{first.id}"})
    store.update(first.id, status="cancelled", error="cancelled before it started", finished=time.time())
    assert store.dependencies(store.get(second.id)) == (False, (
        f"stage {first.id} (finetune) cancelled (cancelled before it started), so this job did not start. Resume job "
        f"{first.id} (python -m jobs resume {first.id}, or Resume on the Jobs page), then resume this one: it waits "
        "for that one again"))
    with store.transaction() as db:
        db.execute("DELETE FROM jobs WHERE id = ?", (first.id,))
    assert "is no longer in the store" in store.dependencies(store.get(second.id))[1]
    assert store.dependencies(store.submit(EVALUATE)) == (True, None)  # waiting for nothing


# ---------------------------------------------------------------- pipelines
@pytest.mark.unit
def test_the_pipeline_preset_is_queued_as_four_jobs_each_waiting_for_the_stage_it_starts_from(store, capsys):
    data = load_yaml((EXAMPLES / "pipeline-quick.yaml").read_bytes(), "pipeline-quick.yaml")
    base, sft, dpo, cft = store.submit_pipeline(data)
    assert [j.kind for j in (base, sft, dpo, cft)] == ["evaluate", "sft", "dpo", "cft"]
    assert (base.waits_for, sft.waits_for, dpo.waits_for, cft.waits_for) == ([], [], [sft.id], [dpo.id])
    assert dpo.config_dict["model"] == f"run:{sft.id}" and cft.config_dict["model"] == f"run:{dpo.id}"
    assert sft.config_dict["method"] == "lora" and cft.config_dict["methods"] == ["ts", "cft"]
    assert jobs_cli.main(["--root", str(store.root), "submit", str(EXAMPLES / "pipeline-quick.yaml")]) == 0
    out, err = capsys.readouterr()
    assert out.split() == [str(i) for i in range(cft.id + 1, cft.id + 5)]
    assert f"job {cft.id + 3} (dpo) starts once job(s) {cft.id + 2} succeeded" in err


@pytest.mark.unit
@pytest.mark.parametrize("change, message", [
    (lambda p: p[2].update(model="stage:nope"), r"pipeline\[2\] \(dpo\)\.model: 'stage:nope' names no earlier stage "
                                                r"\(earlier: base, sft\)"),
    (lambda p: p[2].update(model="stage:base"), r"pipeline\[2\] \(dpo\)\.model: stage base is an evaluate job"),
    (lambda p: p[2].update(model="stage:cft"), "names no earlier stage"),
    (lambda p: p[1].update(name="base"), r"pipeline\[1\]\.name: 'base' names an earlier stage too"),
    (lambda p: p[1].update(after=["dpo"]), r"pipeline\[1\]\.after: must list earlier stages \(base\)"),
    (lambda p: p[3].update(train_size="many"), r"pipeline\[3\] \(cft\)\.train_size: must be an integer"),
    (lambda p: p[0].pop("name"), r"pipeline\[0\]\.name: each stage needs a name"),
    (lambda p: p[0].update(kind="train"), r"pipeline\[0\]\.kind: must be one of evaluate, "),
])
def test_a_bad_pipeline_is_refused_whole_naming_the_stage_and_the_field(store, change, message):
    data = load_yaml((EXAMPLES / "pipeline-quick.yaml").read_bytes(), "pipeline-quick.yaml")
    change(data["pipeline"])
    with pytest.raises(ConfigError, match=message):
        store.submit_pipeline(data)
    assert store.list() == []


@pytest.mark.unit
def test_lab_run_runs_the_stages_in_order_and_a_failed_one_stops_the_rest(tmp_path, monkeypatch):
    data = load_yaml((EXAMPLES / "pipeline-quick.yaml").read_bytes(), "pipeline-quick.yaml")
    ran, fail = [], {"sft"}

    def worker(config: Path, run_dir: Path) -> int:  # the worker, writing only how the stage ended
        stage = run_dir.name.split("-", 1)[1]
        ran.append((stage, load_yaml(config.read_bytes(), "config")["model"]))
        status = "failed" if stage in fail else "succeeded"
        (run_dir / RESULT_FILE).write_text(json.dumps({"status": status, "error": None}))
        return 2 if stage in fail else 0

    monkeypatch.setattr(pipeline, "run", worker)
    out = tmp_path / "runs" / "chain"
    assert pipeline.run_here(pipeline.parse_pipeline(data, runs=out), out) == 2
    assert ran == [("evaluate", "bundled"), ("sft", "bundled")]  # dpo and cft never started
    fail.clear()
    assert pipeline.run_here(pipeline.parse_pipeline(data, runs=out), out) == 0
    assert ran[2:] == [("sft", "bundled"), ("dpo", "run:2"), ("cft", "run:3")]  # the evaluation was not run again
    assert sorted(p.name for p in out.iterdir()) == ["00001-evaluate", "00002-sft", "00003-dpo", "00004-cft"]


# ---------------------------------------------------------------- weights, with a tiny model
def _train(store: JobStore, model: str, method: str) -> Path:
    """A finetune job of the tiny model run to the end in this process, recorded as the scheduler would."""
    job = store.submit({**TRAIN, "model": model, "method": method})
    run_dir = Path(job.run_dir)
    assert run(run_dir / CONFIG_FILE, run_dir) == 0, (run_dir / RESULT_FILE).read_text()
    _ended(store, job.id)
    return run_dir


def _started_with(store: JobStore, config: dict, monkeypatch) -> tuple[Path, dict[str, torch.Tensor]]:
    """Run ``config`` as a job in this process; the weights its model was loaded with at its start."""
    import lab.training.trainer as trainer

    states, real = [], trainer.load_model

    def load_model(*args, **kwargs):
        loaded = real(*args, **kwargs)
        states.append(_state(loaded.model))  # as loaded: training changes it in place
        return loaded

    monkeypatch.setattr(trainer, "load_model", load_model)
    job = store.submit(config)
    run_dir = Path(job.run_dir)
    assert run(run_dir / CONFIG_FILE, run_dir) == 0, (run_dir / RESULT_FILE).read_text()
    return run_dir, states[0]


@pytest.mark.model
def test_a_later_stage_starts_from_a_full_runs_final_weights(store, tiny_model_dir, monkeypatch):
    first = _train(store, str(tiny_model_dir), "full")
    config = {**TRAIN, "model": f"run:{int(first.name[:5])}", "method": "full"}
    run_dir, started = _started_with(store, config, monkeypatch)
    assert _same(_weights(first / "model"), started)
    assert not _same(_weights(Path(tiny_model_dir)), started)  # the first stage did move the weights
    record = json.loads((run_dir / START_FILE).read_text())["model"]
    assert (record["given"], record["job"], record["adapter"]) == ("run:1", 1, None)
    assert Path(record["model"]).resolve() == (first / "model").resolve()
    assert load_yaml((run_dir / CONFIG_FILE).read_bytes(), "config")["model"] == "run:1"  # as queued


@pytest.mark.model
def test_a_lora_run_is_its_base_with_the_adapter_merged_or_an_evaluation_s_adapter(store, tiny_model_dir,
                                                                                 monkeypatch):
    from lab.models.loading import load_model

    first = _train(store, str(tiny_model_dir), "lora")
    merged = _state(load_model(str(tiny_model_dir), adapter=str(first / "adapter"), device="cpu").model)
    run_dir, started = _started_with(store, {**TRAIN, "model": "run:1", "method": "lora"}, monkeypatch)
    assert _same(merged, started) and (run_dir / "start" / "model" / "done.json").is_file()
    # This run's adapter belongs to those merged weights: a stage after it loads the two together.
    later = store.submit({**EVALUATE, "model": f"run:{int(run_dir.name[:5])}", "dataset": "synthetic",
                          "split": "test", "scoring": "letter", "bootstrap": 0, "device": "cpu"})
    _ended(store, int(run_dir.name[:5]))
    later_dir = Path(later.run_dir)
    assert run(later_dir / CONFIG_FILE, later_dir) == 0, (later_dir / RESULT_FILE).read_text()
    metrics = json.loads((later_dir / "metrics.json").read_text())
    assert Path(metrics["model"]).resolve() == (run_dir / "start" / "model").resolve()
    assert Path(metrics["adapter"]).resolve() == (run_dir / "adapter").resolve()


@pytest.mark.unit
def test_the_launch_page_queues_every_stage_of_a_pipeline_preset_and_lists_it_apart(tmp_path):
    from ui import forms, launch_page
    from ui.context import LabContext

    ctx = LabContext(tmp_path / "runs")
    text = forms.pipelines()["pipeline-quick"]
    assert all("pipeline-quick" not in forms.presets(name) for name in kinds.names())  # not one kind's preset
    said = launch_page.submit_pipeline(ctx, text.replace("limit: 8\n    epochs", "limit: 0\n    epochs", 1), "0")
    assert "pipeline[1] (sft).limit: must be an integer ≥ 1" in said and ctx.store.list() == []
    said = launch_page.submit_pipeline(ctx, text, "0")
    assert "Jobs 1 (evaluate), 2 (sft), 3 (dpo, after 2), 4 (cft, after 3) queued" in said
    assert [job.roots is not None for job in ctx.store.list()] == [True] * 4  # checked inside the server's folders

    from ui.jobs_page import job_view, jobs_table

    table = jobs_table(ctx).set_index("id")
    assert table.loc[3, "progress"] == "waits for job 2" and table.loc[2, "progress"] == ""
    assert "Waits for job 2 (sft, queued): it starts once it has succeeded." in job_view(ctx, 3).text
    _ended(ctx.store, 2)
    assert "Waits for job 2 (sft, succeeded)" in job_view(ctx, 3).text  # the scheduler starts it at its next tick
    assert "Waits for" not in job_view(ctx, 2).text
