"""``report_to`` on the alignment stages (sft, dpo): each tracker, offline, gets the loss per step and every
calibration task's ECE, accuracy and NLL at each validation — the figures the job's own events hold —
read back from what the tracker wrote: TensorBoard's event files, W&B's offline run file
(:func:`tests.helpers.wandb_history`) and MLflow's local file store (through MLflow's own client). Each
tracker writes into the stage's folder, not the working directory. The finetune kind's TensorBoard test is
in tests/e2e/test_multiprocess.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from lab.core.events import read_events
from lab.jobkit.kinds import parse_config
from lab.jobkit.worker import JobContext
from tests.helpers import wandb_history

CALIBRATION = [{"task": "mcq", "dataset": "synthetic", "data_files": ["bundled"], "split": "test", "limit": 12,
                "scoring": "letter"},
               {"task": "mcq", "dataset": "synthetic", "data_files": ["bundled"], "split": "shifted", "limit": 12,
                "scoring": "letter"}]
KINDS = {"sft": {"dataset": "alpaca", "data_files": ["bundled"]}, "dpo": {"preferences": ["bundled"]}}
METRICS = ("ece", "accuracy", "nll")


def _run(kind: str, model: Path, out: Path, tracker: str) -> list[dict]:
    """Train ``kind`` 2 epochs of 2 steps with ``report_to: tracker``; its validation events."""
    from importlib import import_module

    _, cfg = parse_config({"kind": kind, "model": str(model), "limit": 8, "epochs": 2, "batch_size": 4,
                           "learning_rate": 1e-3, "max_length": 256, "device": "cpu", "bootstrap": 20,
                           "calibration": CALIBRATION, "report_to": tracker, **KINDS[kind]})
    out.mkdir(parents=True)
    import_module(f"lab.kinds.{kind}.run").run_job(cfg, JobContext(out))
    events = read_events(out / "events.jsonl")[0]
    return [e for e in events if e["stage"] == "train_eval"], [e for e in events if e["stage"] == "train"]


def _expected(evals: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of each tracked figure: every task's, and the headline (the first task's)."""
    expected = {m: [(e["step"], e[m]) for e in evals] for m in METRICS}
    for key in evals[0]["tasks"]:
        expected.update({f"{key}_{m}": [(e["step"], e["tasks"][key][m]) for e in evals] for m in METRICS})
    return expected


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """The variables the lab points at the stage's folder, restored afterwards; W&B offline; the working
    directory elsewhere, to see that nothing lands there."""
    for name in ("TENSORBOARD_LOGGING_DIR", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(name, "")  # remembered as it was (unset), so the lab's values are undone after
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def _tensorboard(out: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = EventAccumulator(str(out / "tensorboard")).Reload()
    return {tag.removeprefix("eval/"): [(s.step, s.value) for s in logs.Scalars(tag)]
            for tag in logs.Tags()["scalars"] if tag.startswith("eval/") or tag == "train/loss"}


def _wandb(out: Path) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for row in wandb_history(out):
        for key, value in row.items():
            if key.startswith("eval/") or key == "train/loss":
                found.setdefault(key.removeprefix("eval/"), []).append((row["train/global_step"], value))
    return found


def _mlflow(out: Path) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    (run,) = client.search_runs(["0"])
    keys = [k for k in run.data.metrics if k.startswith("eval_") or k == "loss"]
    return {("train/loss" if k == "loss" else k.removeprefix("eval_")): [(m.step, m.value) for m in
                                                                           client.get_metric_history(run.info.run_id, k)]
            for k in keys}


READERS = {"tensorboard": _tensorboard, "wandb": _wandb, "mlflow": _mlflow}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("tracker", sorted(READERS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_tracker_gets_the_loss_and_every_calibration_tasks_figures(clean_env, tiny_model_dir, kind, tracker):
    out = clean_env / "runs" / f"00001-{kind}"
    evals, steps = _run(kind, tiny_model_dir, out, tracker)
    assert [e["step"] for e in evals] == [0, 2, 4] and set(evals[0]["tasks"]) == {"t0-mcq", "t1-mcq"}
    found = READERS[tracker](out)
    for name, want in _expected(evals).items():
        assert [s for s, _ in found[name]] == [s for s, _ in want], name
        assert [v for _, v in found[name]] == pytest.approx([v for _, v in want], abs=1e-6), name
    losses = [e for e in steps if "loss" in e]
    assert [v for _, v in found["train/loss"]] == pytest.approx([e["loss"] for e in losses], rel=1e-5)
    assert list((clean_env / "cwd").iterdir()) == []  # nothing in the working directory: all in the stage's folder


# ---------------------------------------------------------------- offline by default (issue 43, R11)
CI_VARIABLES = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS")  # MLflow turns its telemetry off under these alone


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.model
@pytest.mark.parametrize("tracker", ["mlflow", "wandb"])
def test_a_tracker_writes_only_into_the_run_folder_and_stays_offline(tiny_model_dir, tmp_path, tracker):
    """A job as the worker runs it (its own process, outside pytest, where MLflow's telemetry is on by default),
    on a server whose operator is logged in to W&B: it ends well (W&B offline: no API key asked for, none used),
    its tracker's files are in the run folder, and nothing is written in the home folder or the working one."""
    import os
    import subprocess
    import sys

    import yaml

    home, cwd, run = tmp_path / "home", tmp_path / "cwd", tmp_path / "runs" / "00001-finetune"
    home.mkdir(), cwd.mkdir()
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"kind": "finetune", "model": str(tiny_model_dir), "dataset": "synthetic",
                                      "data_files": ["bundled"], "limit": 4, "val_limit": 4, "epochs": 1,
                                      "batch_size": 4, "device": "cpu", "report_to": tracker}))
    env = {k: v for k, v in os.environ.items() if k not in CI_VARIABLES and not k.startswith(("WANDB_", "MLFLOW_"))}
    env.update(HOME=str(home), MPLCONFIGDIR=str(tmp_path / "matplotlib"), HF_HUB_OFFLINE="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]), WANDB_API_KEY="0" * 40)
    done = subprocess.run([sys.executable, "-m", "lab", "run", str(config), "--out", str(run)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == [".netrc"]
    assert list(cwd.iterdir()) == []
    assert (run / "mlruns").is_dir() if tracker == "mlflow" else list((run / "wandb").glob("offline-run-*"))


@pytest.mark.unit
def test_trackers_go_online_only_when_the_operator_says_so(tmp_path, monkeypatch):
    """Offline (W&B offline, an MLflow file store, telemetry off, every folder in the run's) whatever the
    server's environment says; online, the operator's W&B mode and MLflow server are theirs."""
    from lab.training import trainer
    from lab.training.config import TRACKERS_ONLINE_ENV, trackers_online

    monkeypatch.setattr(trainer, "OPERATOR_TRACKER_ENV", frozenset({"WANDB_MODE", "MLFLOW_TRACKING_URI"}))
    monkeypatch.delenv(TRACKERS_ONLINE_ENV, raising=False)
    assert not trackers_online()
    env = trainer.tracker_env(tmp_path)
    assert env["WANDB_MODE"] == "offline" and env["MLFLOW_TRACKING_URI"] == (tmp_path / "mlruns").as_uri()
    assert env["MLFLOW_DISABLE_TELEMETRY"] == env["DO_NOT_TRACK"] == "true"
    for name, value in env.items():
        if name.endswith("_DIR"):
            assert Path(value).is_relative_to(tmp_path), name
    monkeypatch.setenv(TRACKERS_ONLINE_ENV, "1")
    online = trainer.tracker_env(tmp_path, trackers_online())
    assert not {"WANDB_MODE", "MLFLOW_TRACKING_URI", "WANDB_CONFIG_DIR"} & set(online)
    assert online["MLFLOW_DISABLE_TELEMETRY"] == "true"
