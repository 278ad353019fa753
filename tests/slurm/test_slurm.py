"""Jobs on a real Slurm: ``scripts/slurm_single_node.sh`` brings up a one-node cluster on Debian.

The tests use a Slurm that answers ``scontrol ping``. Where none does they skip, saying why, unless
``CALIBRATION_LAB_START_SLURM=1`` lets them start one with that script (root and apt: it installs
Debian's Slurm and munge, so only throwaway machines such as CI set it).
"""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobs.launch import Launch, build_command, job_env
from lab.core.events import read_events
from lab.core.yamlio import dump_yaml

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


def _answers() -> bool:
    return shutil.which("scontrol") is not None and subprocess.run(["scontrol", "ping"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def slurm():
    if _answers():
        return
    if os.environ.get("CALIBRATION_LAB_START_SLURM") != "1":
        pytest.skip("no Slurm answers here; CALIBRATION_LAB_START_SLURM=1 lets the tests start a one-node one "
                    "with scripts/slurm_single_node.sh (root, apt)")
    done = subprocess.run([str(ROOT / "scripts" / "slurm_single_node.sh")], capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not _answers():
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        pytest.skip(f"scripts/slurm_single_node.sh could not start Slurm here: {said}")


@pytest.fixture
def no_stray_output():
    """Fails a test after which Slurm left its default ``slurm-<id>.out`` in the current folder or
    the checkout (the jobs' working folder): every byte of a job belongs in its run directory."""
    def found() -> set[Path]:
        return {p.resolve() for folder in (Path.cwd(), ROOT) for p in folder.glob("slurm-*.out")}

    before = found()
    yield
    assert found() - before == set(), "Slurm wrote a job's output outside its run directory"


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job -o``'s one line as a mapping (values without spaces, as these are)."""
    line = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True).stdout
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


# ---------------------------------------------------------------- the store and scheduler
def run_scheduler(store, ids, timeout: float = 300) -> None:
    from jobs.scheduler import Scheduler

    scheduler, deadline = Scheduler(store, gpus=[]), time.time() + timeout
    while time.time() < deadline and any(store.get(i).status in ("queued", "running") for i in ids):
        scheduler.tick()
        time.sleep(0.5)


def on_real_slurm(test):
    """The marks of a test that runs jobs on a real Slurm (the one-node cluster they share is started once)."""
    for mark in (pytest.mark.slow, pytest.mark.e2e, pytest.mark.model, pytest.mark.slurm):
        test = mark(test)
    return test


def lab_processes(run_dir: Path) -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]


@on_real_slurm
def test_jobs_with_executor_slurm_from_the_cli_and_the_api_succeed_as_local_ones(slurm, tmp_path, tiny_model_dir,
                                                                                 no_stray_output):
    from jobs.cli import main
    from jobs.store import JobStore
    from ui import api
    from ui.context import LabContext

    runs = tmp_path / "runs"
    evaluate = {"kind": "evaluate", "model": str(tiny_model_dir), "dataset": "obqa", "data_files": ["bundled"],
                "limit": 12, "bootstrap": 0, "device": "cpu"}
    (tmp_path / "evaluate.yaml").write_text(dump_yaml(evaluate))
    assert main(["--root", str(runs), "submit", str(tmp_path / "evaluate.yaml"), "--executor", "slurm",
                 "--time", "10", "--sbatch=--mem=2G"]) == 0
    finetune = {"kind": "finetune", "model": str(tiny_model_dir), "dataset": "obqa", "data_files": ["bundled"],
                "limit": 16, "val_limit": 8, "epochs": 1, "batch_size": 2, "device": "cpu"}
    ctx = LabContext(runs, (tiny_model_dir.parent,))
    answer = api.submit_job(ctx, dump_yaml(finetune), 0, 2, "slurm", '{"minutes": 15}')
    assert answer["ok"], answer
    store = JobStore(runs)
    run_scheduler(store, [1, 2])
    for job in map(store.get, (1, 2)):
        assert job.status == "succeeded", (job.error, (Path(job.run_dir) / "log.txt").read_text()[-2000:])
        assert job.executor == "slurm" and job.devices == f"slurm {job.slurm_id} (default partition)"
        assert job_fields(job.slurm_id)["StdOut"] == os.path.abspath(Path(job.run_dir) / "log.txt")
    asked = {i: job_fields(store.get(i).slurm_id) for i in (1, 2)}
    assert asked[1]["TimeLimit"] == "00:10:00" and asked[1]["MinMemoryNode"] == "2G"
    assert asked[2]["TimeLimit"] == "00:15:00" and asked[2]["NumCPUs"] == "2"
    local = tmp_path / "local"
    local.mkdir()
    (local / "config.yaml").write_text(dump_yaml(evaluate))
    subprocess.run(build_command(local / "config.yaml", local), check=True, capture_output=True)
    on_slurm = json.loads((Path(store.get(1).run_dir) / "metrics.json").read_text())
    here = json.loads((local / "metrics.json").read_text())
    assert (on_slurm["accuracy"], on_slurm["ece"]) == (here["accuracy"], here["ece"])
    assert (Path(store.get(2).run_dir) / "model" / "model.safetensors").is_file()
    local2 = tmp_path / "local2"
    local2.mkdir()
    (local2 / "config.yaml").write_text(dump_yaml(finetune))
    subprocess.run(build_command(local2 / "config.yaml", local2, Launch(processes=2)), env=job_env(()), check=True,
                   capture_output=True)
    evals = [[e for e in read_events(d / "events.jsonl")[0] if e["stage"] == "train_eval"]
             for d in (Path(store.get(2).run_dir), local2)]
    assert [(e["accuracy"], e["ece"]) for e in evals[0]] == [(e["accuracy"], e["ece"]) for e in evals[1]]


@on_real_slurm
def test_a_slurm_job_cancelled_while_running_ends_cancelled_with_no_process_left(slurm, tmp_path, slower_model_dir,
                                                                                 no_stray_output):
    from jobs.scheduler import Scheduler, cancel
    from jobs.store import JobStore

    store = JobStore(tmp_path / "runs")
    job = store.submit({"kind": "finetune", "model": str(slower_model_dir), "dataset": "obqa", "data_files": ["bundled"],
                        "epochs": 500, "val_split": None, "device": "cpu"}, executor="slurm", slurm={"minutes": 10})
    scheduler, deadline = Scheduler(store, gpus=[]), time.time() + 120
    run_dir = Path(job.run_dir)
    while time.time() < deadline and not any(e["stage"] == "train" for e in read_events(run_dir / "events.jsonl")[0]):
        scheduler.tick()
        time.sleep(0.5)
    assert store.get(job.id).status == "running"
    ended = cancel(store, job.id, grace=5)
    assert ended.status == "cancelled", ended.error
    time.sleep(2)
    assert lab_processes(run_dir) == []
    assert job_fields(ended.slurm_id)["JobState"] in TERMINAL


@on_real_slurm
def test_a_slurm_job_past_its_time_limit_fails_with_timeout_and_a_restart_sees_it(slurm, tmp_path, slower_model_dir,
                                                                                  no_stray_output):
    """Submitted by one scheduler, which then stops (the server restarts); another, new one
    follows the job to its end: Slurm's TIMEOUT, in words. Once it trains, the job hangs (stopped,
    as a rank stuck in a collective would be): Slurm must end it all the same, and its minute past
    the limit costs the other tests no CPU."""
    from jobs.scheduler import Scheduler
    from jobs.store import JobStore

    store = JobStore(tmp_path / "runs")
    # 500 epochs of 8 steps at 46 ms a step: three minutes, three times the limit.
    job = store.submit({"kind": "finetune", "model": str(slower_model_dir), "dataset": "obqa", "data_files": ["bundled"],
                        "epochs": 500, "val_split": None, "device": "cpu"}, executor="slurm", slurm={"minutes": 1})
    first, deadline, run_dir = Scheduler(store, gpus=[]), time.time() + 120, Path(job.run_dir)
    while time.time() < deadline and not any(e["stage"] == "train" for e in read_events(run_dir / "events.jsonl")[0]):
        first.tick()
        time.sleep(0.5)
    assert store.get(job.id).status == "running"
    del first
    hung = lab_processes(run_dir)
    assert hung
    for process in hung:
        process.send_signal(signal.SIGSTOP)
    run_scheduler(store, [job.id], timeout=240)
    ended = store.get(job.id)
    assert ended.status == "failed" and ended.error.startswith("timeout: the job ran past its Slurm time limit"), \
        ended.error
    assert job_fields(ended.slurm_id)["JobState"] == "TIMEOUT"
    assert lab_processes(Path(job.run_dir)) == []


@pytest.mark.unit
@pytest.mark.parametrize("options, message", [
    ({"extra": ["--mem=1G\nrm -rf /"]}, "is not one --option"),
    ({"extra": ["--wrap=$(id)"]}, "is not one --option"),
    ({"extra": "--x;ls"}, "is not one --option"),
    ({"nodes": "2"}, r"slurm.nodes: must be an integer"),
    ({"nodes": True}, r"slurm.nodes: must be an integer"),
    ({"minutes": 10**9}, r"slurm.minutes: must be an integer"),
    ({"partition": "../gpu"}, "slurm.partition: must be a name"),
    ({"account": {"$ne": 1}}, "slurm.account: must be a name"),
    ({"qos": "high"}, "unknown option"),
    ([1, 2], "must be a mapping"),
    ("{not json", "must be a JSON object"),
])
def test_hostile_slurm_options_are_refused_naming_the_field(tmp_path, options, message):
    from jobs.store import ConfigError, JobStore

    store = JobStore(tmp_path / "runs")
    with pytest.raises(ConfigError, match=message):
        store.submit({"kind": "evaluate"}, executor="slurm", slurm=options)
    with pytest.raises(ConfigError, match="executor: must be one of local, slurm"):
        store.submit({"kind": "evaluate"}, executor="kubernetes")
    with pytest.raises(ConfigError, match="slurm: options are for executor slurm"):
        store.submit({"kind": "evaluate"}, slurm={"nodes": 2})
    with pytest.raises(ConfigError, match="gpus_per_node"):
        store.submit({"kind": "evaluate"}, gpus=1, executor="slurm")
    assert store.list() == []


# Options that would write, truncate or move files, or override what the lab set (issue 30, S1).
PATH_OPTIONS = ["--output=/tmp/outside.txt", "--open-mode=truncate", "--error=/tmp/outside.err", "--chdir=/tmp",
                "--out=/tmp/outside.txt", "#SBATCH --output=/tmp/x", "--input=/etc/passwd", "--export=ALL",
                "--nodelist=/etc/hosts", "--exclude=/tmp/nodes", "--nodes=64", "--time=99999", "--job-name=x",
                "--get-user-env", "--uid=0", "--wrap=id"]


@pytest.mark.unit
@pytest.mark.parametrize("option", PATH_OPTIONS)
def test_extra_options_that_name_paths_or_override_the_lab_are_refused_everywhere(tmp_path, monkeypatch, capsys,
                                                                                  option):
    from jobs.cli import main as jobs_cli
    from jobs.store import ConfigError, JobStore
    from ui import forms, launch_page
    from ui.api import submit_job
    from ui.context import LabContext

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # a server with Slurm's tools
    store = JobStore(tmp_path / "runs")
    with pytest.raises(ConfigError, match="slurm.extra"):
        store.submit({"kind": "evaluate"}, executor="slurm", slurm={"extra": [option]})
    config = tmp_path / "job.yaml"
    config.write_text("kind: evaluate\n")
    assert jobs_cli(["--root", str(store.root), "submit", str(config), "--executor", "slurm",
                     f"--sbatch={option}"]) == 2
    assert "slurm.extra" in capsys.readouterr().err
    ctx = LabContext(tmp_path / "runs")
    said = submit_job(ctx, "kind: evaluate\n", executor="slurm", slurm=json.dumps({"extra": [option]}))
    assert not said["ok"] and "slurm.extra" in said["error"]
    said = launch_page.submit_anywhere(ctx, "evaluate", 0, 1, "slurm", "", 1, 0, 30, "", option,
                                       *forms.preset_values("evaluate", None))
    assert "slurm.extra" in said
    assert store.list() == []


@pytest.mark.unit
def test_the_lab_s_own_lines_come_after_the_user_s(tmp_path):
    from jobs.slurm import batch_file, parse_options

    lines = batch_file(tmp_path, parse_options({"extra": ["--mem=4G", "--qos=high"]}), 1).splitlines()
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    assert sbatch[:2] == ["#SBATCH --mem=4G", "#SBATCH --qos=high"]
    assert f"#SBATCH --output={tmp_path}/log.txt" in sbatch[2:] and "#SBATCH --open-mode=append" in sbatch[2:]


@pytest.mark.unit
def test_a_job_s_output_goes_to_its_run_directory_never_the_current_folder(tmp_path, monkeypatch):
    """Without a Slurm: the batch file names the run directory's log for both streams, absolutely
    (the job's working folder is the checkout, not the lab's), with Slurm's % patterns escaped; and
    sbatch (a stand-in recording where it ran) runs in the run directory, leaving nothing in the
    current folder even where the store's root is a relative path."""
    from jobs import slurm

    here = tmp_path / "cwd"
    (here / "runs" / "00001-evaluate").mkdir(parents=True)
    monkeypatch.chdir(here)
    run_dir, log = Path("runs/00001-evaluate"), here / "runs" / "00001-evaluate" / "log.txt"
    text = slurm.batch_file(run_dir, slurm.parse_options({}), 1)
    assert f"#SBATCH --output={log}" in text and f"#SBATCH --error={log}" in text
    assert f"run {here / run_dir / 'config.yaml'} --run-dir {here / run_dir}" in text
    odd = tmp_path / "100%x"
    assert f"#SBATCH --output={tmp_path}/100%%x/log.txt" in slurm.batch_file(odd, slurm.parse_options({}), 1)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(  # Slurm's default: slurm-<id>.out where it runs, unless told --output
        f'#!/bin/sh\npwd > {tmp_path}/sbatch-ran-in\n'
        'grep -q "^#SBATCH --output=/" "$2" || : > slurm-4242.out\necho 4242\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert slurm.submit(run_dir, slurm.parse_options({}), 1) == "4242"
    assert (tmp_path / "sbatch-ran-in").read_text().strip() == str(here / run_dir)
    assert (here / run_dir / slurm.BATCH_FILE).is_file()
    assert list(here.glob("slurm-*.out")) == [] and list(Path.cwd().glob("slurm-*.out")) == []


@pytest.mark.unit
def test_the_batch_file_carries_every_option(tmp_path):
    from jobs.slurm import batch_file, parse_options

    text = batch_file(tmp_path, parse_options({"partition": "gpu", "nodes": 2, "gpus_per_node": 4, "minutes": 90,
                                               "account": "lab1", "extra": ["#SBATCH --mem=64G", "--exclusive"]}), 1)
    for line in ("--partition=gpu", "--nodes=2", "--gpus-per-node=4", "--time=90", "--account=lab1", "--mem=64G",
                 "--exclusive"):
        assert f"#SBATCH {line}" in text, line


@pytest.mark.unit
def test_the_launch_form_sends_slurm_fields_only_for_slurm(tmp_path, monkeypatch):
    from ui import forms, launch_page
    from ui.context import LabContext

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # a server with Slurm's tools
    ctx = LabContext(tmp_path / "runs")
    values = forms.preset_values("evaluate", None)
    said = launch_page.submit_anywhere(ctx, "evaluate", 0, 1, "slurm", "debug", 2.0, 0.0, 30.0, "", "--mem=4G\n\n",
                                       *values)
    assert "queued (evaluate) for Slurm" in said
    job = ctx.store.get(1)
    assert (job.executor, json.loads(job.slurm)) == ("slurm", {"partition": "debug", "nodes": 2, "gpus_per_node": 0,
                                                               "minutes": 30, "account": None, "extra": ["--mem=4G"]})
    refused = launch_page.submit_anywhere(ctx, "evaluate", 0, 1, "slurm", "", 1, 0, 30, "", "--mem=4G; rm -rf ~",
                                          *values)
    assert "slurm.extra" in refused and len(ctx.store.list()) == 1
    launch_page.submit_anywhere(ctx, "evaluate", 0, 1, "local", "debug", 1, 0, 30, "", "--mem=4G", *values)
    assert (ctx.store.get(2).executor, ctx.store.get(2).slurm) == ("local", None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "this server has no Slurm" in launch_page.submit_anywhere(ctx, "evaluate", 0, 1, "slurm", "", 1, 0, 30, "",
                                                                      "", *values)
