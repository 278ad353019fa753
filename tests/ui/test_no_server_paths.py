"""No message the web app or its API shows names a server path (issue 43, newcomer's walk 6): refusals at
submit, a job's failure on its page and through the API, a page's error or hint. Each is driven through
the handler a browser or the API reaches, over a ``tmp_path`` whose absolute path (and the model cache's,
and the package's) must be absent from every message; files are named from the run, the allowed folder
by its own name, or what the user typed."""
from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from jobs.store import JobStore
from lab.calibration import calibrators
from lab.core.config import ConfigError
from lab.core.files import cache_dir
from lab.core.layout import CALIBRATOR_FILE, CONFIG_FILE, RESULT_FILE, TEMPERATURE_FILE
from lab.core.reads import PathNotAllowed, restricted, shown, shown_in
from lab.data import samples
from lab.jobkit.worker import run as run_worker
from ui import api, forms, jobs_page, knowledge_page, launch_page, recalibration_page
from ui.context import LabContext

pytestmark = pytest.mark.unit

QUESTION = json.dumps({"question": "2+2?", "choices": ["4", "5"], "answer": "A"}) + "\n"


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A server over tmp_path: its runs folder, an allowed data folder, a model cache, no hub."""
    monkeypatch.setenv("CALIBRATION_LAB_CACHE", str(tmp_path / "cache" / "calibration-lab"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("lab.core.hub.hub_reachable", lambda: False)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "q.jsonl").write_text(QUESTION)
    return LabContext(tmp_path / "runs", allowed=(tmp_path / "data",))


def no_server_path(text: str, root: Path) -> str:
    """``text`` once it is known to name neither ``root`` (as given or resolved), nor the model cache,
    nor the package's folder."""
    for where in (root, root.resolve(), cache_dir(), Path(samples.ROOT).parent.parent.parent):
        assert str(where) not in text, text
    return text


def refusal(ctx: LabContext, config: dict) -> str:
    """What the Launch page and the API answer a config with, both checked, one of them returned."""
    with pytest.raises(ConfigError) as refused:
        ctx.submit(config)
    said = api.submit_job(ctx, json.dumps(config))
    assert not said["ok"] and said["error"] == str(refused.value)
    return str(refused.value)


def _calibrator(tokens: bool) -> calibrators.Calibrator:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), 60)
    rows = [{"id": f"q{i}", "question": f"q{i}?", "confidence": float(p.max()), "probs": p.tolist()}
            for i, p in enumerate(probs)]
    cal = calibrators.fit("histogram", probs, np.ones(probs.shape, bool), rng.integers(0, 4, 60).tolist(), rows,
                          n_bins=5, run="00002-evaluate", label="validation")
    return dataclasses.replace(cal, tokens=tokens)


# ---------------------------------------------------------------- refusals at submit
def test_a_path_outside_lists_the_allowed_folders_by_their_own_names(lab, tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere.jsonl"  # beside the server's folders, not in them
    said = refusal(lab, {"kind": "evaluate", "dataset": "custom", "data_files": [str(outside)]})
    assert "leads outside the folders this server may read (runs, calibration-lab, data, bundled)" in said
    no_server_path(said.replace(repr(str(outside)), "GIVEN"), tmp_path)  # the value typed is quoted back


def test_a_run_reference_to_no_job_names_the_store_by_its_folder(lab, tmp_path):
    said = refusal(lab, {"kind": "evaluate", "model": "run:99"})
    assert "there is no job 99 in the job store runs/" in no_server_path(said, tmp_path)


def test_a_deep_temperature_file_is_named_from_its_run(lab, tmp_path):
    run_dir = lab.runs / "00002-evaluate"
    run_dir.mkdir(parents=True)
    (run_dir / TEMPERATURE_FILE).write_text("[" * 100_000 + "]" * 100_000)
    for given in (str(run_dir), "00002-evaluate"):  # its path, or its name in the runs folder as pages call it
        said = refusal(lab, {"kind": "evaluate", "temperature": given})
        assert f"00002-evaluate/{TEMPERATURE_FILE} is not a temperature file" in said
        no_server_path(said.replace(repr(given), "GIVEN"), tmp_path)
    said = refusal(lab, {"kind": "evaluate", "temperature": "00003-evaluate/temperature.json"})
    assert "there is none at runs/00003-evaluate/temperature.json" in no_server_path(said, tmp_path)


def test_a_calibrator_fitted_on_the_other_kind_of_run_is_named_as_the_page_saved_it(lab, tmp_path):
    saved = recalibration_page.save_calibrator(lab, _calibrator(tokens=True))
    name = saved.split("calibrator: ")[1].split("<")[0]  # the hint: what to type, and it is found
    assert name.startswith("calibrators/") and name in saved
    no_server_path(saved, tmp_path)
    said = refusal(lab, {"kind": "evaluate", "calibrator": name})
    assert f"calibrator: {Path(name).name}/{CALIBRATOR_FILE} was fitted on a token-level run" in said
    no_server_path(said.replace(repr(name), "GIVEN"), tmp_path)
    calibrators.save(_calibrator(tokens=False), lab.runs / name)
    assert lab.submit({"kind": "evaluate", "calibrator": name}).config_dict["calibrator"] == str(
        (lab.runs / name / CALIBRATOR_FILE).resolve())


def test_a_store_fault_names_the_runs_folder_by_its_name(lab, tmp_path, monkeypatch):
    def failing(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(lab.runs / "jobs.db"))

    lab.store  # opened as the server opens it at its start
    monkeypatch.setattr(JobStore, "_connect", failing)
    said = api.submit_job(lab, "kind: evaluate\n")
    assert "the job store in runs/ cannot be used right now (Permission denied)" in no_server_path(said["error"],
                                                                                                   tmp_path)
    monkeypatch.setattr(JobStore, "_connect", lambda *a, **k: (_ for _ in ()).throw(sqlite3.OperationalError("full")))
    page = launch_page.submit_form(lab, "evaluate", 0, 1, *forms.preset_values("evaluate", None))
    assert "the job store in runs/ cannot be used right now (full)" in no_server_path(page, tmp_path)


# ---------------------------------------------------------------- a job's failure, on its page and through the API
def test_a_job_refused_by_its_worker_shows_its_files_by_the_allowed_folder(lab, tmp_path):
    data = tmp_path / "data" / "q.jsonl"
    job = lab.submit({"kind": "evaluate", "dataset": "custom", "data_files": [str(data)]})
    data.unlink()
    data.symlink_to(tmp_path / "cache")  # swapped after submit for a link leading elsewhere
    run_dir = Path(job.run_dir)
    assert run_worker(run_dir / CONFIG_FILE, run_dir) == 2
    error = json.loads((run_dir / RESULT_FILE).read_text())["error"]
    assert str(data) in error  # the worker's own words, as the operator's log keeps them
    lab.store.end(job.id, "failed", error)  # as the scheduler records it
    page = jobs_page.job_view(lab, job.id).text
    assert "data/q.jsonl" in page and f"run directory `runs/{run_dir.name}`" in page
    no_server_path(page, tmp_path)
    no_server_path(jobs_page.jobs_table(lab).to_csv(), tmp_path)
    said = api.job_status(lab, job.id)
    assert said["ok"] and "data/q.jsonl" in no_server_path(said["error"], tmp_path)


def test_the_worker_s_read_refusals_name_neither_the_file_s_path_nor_where_it_now_leads(tmp_path):
    root, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (elsewhere / "q.jsonl").write_text(QUESTION)
    (root / "sub").symlink_to(elsewhere)  # a folder above the file leads out
    from lab.core.reads import read_text

    with restricted([root]), pytest.raises(PathNotAllowed) as refused:
        read_text(root / "sub" / "q.jsonl")
    assert str(refused.value).startswith("runs/sub/q.jsonl now leads outside the folders this job was submitted "
                                         "under (runs)")
    no_server_path(str(refused.value), tmp_path)


# ---------------------------------------------------------------- pages
def test_an_unreadable_top_k_manifest_is_named_by_its_store(lab, tmp_path):
    store = lab.runs / "00004-extract" / "topk"
    store.mkdir(parents=True)
    (store / "manifest.json").write_text("{not json")
    _, said = knowledge_page.knowledge_view(lab, "00004-extract/topk")
    assert "Cannot read 00004-extract/topk/manifest.json" in no_server_path(said, tmp_path)


# ---------------------------------------------------------------- the helper
def test_shown_names_a_path_from_the_innermost_allowed_folder_and_never_its_location(tmp_path):
    runs, uploads = tmp_path / "runs", tmp_path / "runs" / "uploads"
    assert shown(runs / "00012-evaluate" / TEMPERATURE_FILE, [runs]) == "runs/00012-evaluate/temperature.json"
    assert shown(uploads / "a.jsonl", [runs, uploads]) == "uploads/a.jsonl"
    assert shown(tmp_path / "other" / "b.json", [runs]) == "other/b.json"  # outside: its folder and name
    assert shown(runs / "x", None) == str(runs / "x")  # the operator's own shell: the path itself
    runs.mkdir()
    (tmp_path / "link").symlink_to(runs)
    assert shown(tmp_path / "link" / "x", [runs]) == "runs/x"  # reached through a link
    text = f"bad input: '{runs}/00001-evaluate/q.jsonl' and {tmp_path}/other/b.json and /home{runs}"
    assert shown_in(text, [runs]) == f"bad input: 'runs/00001-evaluate/q.jsonl' and {tmp_path}/other/b.json " \
                                      f"and /home{runs}"  # a root found where a path starts, not inside one
    assert shown_in(text, None) == text

