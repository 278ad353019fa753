"""The sbatch file the lab writes, run by a real Slurm: ``scripts/slurm_single_node.sh`` brings up a
one-node cluster on Debian. These tests use a Slurm that answers ``scontrol ping`` and skip, saying
so, where none does (the suite does not install one: that needs root and apt)."""
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jobs.launch import slurm_script
from lab.events import read_events
from lab.yamlio import dump_yaml

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


@pytest.fixture(scope="module")
def slurm():
    if shutil.which("scontrol") is None or subprocess.run(["scontrol", "ping"], capture_output=True).returncode:
        pytest.skip("no Slurm answers here; scripts/slurm_single_node.sh starts one (root and apt)")


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job -o``'s one line as a mapping (values without spaces, as these are)."""
    line = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True).stdout
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def run_on_slurm(config: dict, run_dir: Path, **resources) -> tuple[dict[str, str], dict[str, str]]:
    """Submit ``config`` as the lab's sbatch file; (fields while it ran, fields once it ended)."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_yaml(config))
    (run_dir / "job.sbatch").write_text(slurm_script(run_dir / "config.yaml", run_dir, hours=1, **resources))
    job_id = subprocess.run(["sbatch", "--parsable", str(run_dir / "job.sbatch")], capture_output=True, text=True,
                            check=True).stdout.strip().split(";")[0]
    running, deadline = {}, time.time() + 300
    while time.time() < deadline:
        fields = job_fields(job_id)
        if fields["JobState"] == "RUNNING" and not running:
            running = fields
        if fields["JobState"] in TERMINAL:
            return running, fields
        time.sleep(0.5)
    subprocess.run(["scancel", job_id])
    raise AssertionError(f"Slurm job {job_id} did not end in 300 s: {fields['JobState']}")


def test_a_two_process_cpu_finetune_runs_as_one_slurm_job(slurm, tmp_path, tiny_model_dir):
    config = {"kind": "finetune", "model": str(tiny_model_dir), "dataset": "obqa", "data_files": ["bundled"],
              "limit": 16, "val_limit": 8, "epochs": 1, "batch_size": 2, "device": "cpu"}
    running, ended = run_on_slurm(config, tmp_path / "run", nodes=1, gpus_per_node=0, processes=2)
    log = (tmp_path / "run" / "log.txt").read_text()
    assert ended["JobState"] == "COMPLETED" and ended["ExitCode"] == "0:0", log[-3000:]
    assert (running or ended)["NumCPUs"] == "2" and ended["NumNodes"] == "1"
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "succeeded"
    events = read_events(tmp_path / "run" / "events.jsonl")[0]
    assert len([e for e in events if e["stage"] == "start"]) == 1, "one rank 0 in the whole Slurm job"
    assert [e["step"] for e in events if e["stage"] == "train" and "loss" in e] == [1, 2, 3, 4]
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_an_evaluation_on_slurm_writes_what_a_local_one_does(slurm, tmp_path, tiny_model_dir):
    config = {"kind": "evaluate", "model": str(tiny_model_dir), "dataset": "obqa", "data_files": ["bundled"],
              "limit": 12, "bootstrap": 0, "device": "cpu"}
    _, ended = run_on_slurm(config, tmp_path / "run", nodes=1, gpus_per_node=0)
    assert ended["JobState"] == "COMPLETED", (tmp_path / "run" / "log.txt").read_text()[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["n"] == 12 and 0 <= metrics["ece"] <= 1
