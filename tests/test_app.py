import json

import pytest

import app


def test_runs_table_lists_runs_and_survives_a_damaged_file(tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "metrics.json").write_text(json.dumps({"model": "bundled", "n": 3, "accuracy": 0.5, "ece": 0.25}))
    (tmp_path / "half-written").mkdir()
    (tmp_path / "half-written" / "metrics.json").write_text('{"model": ')
    table = app.runs_table(tmp_path)
    assert list(table["run"]) == ["good"] and table.loc[0, "ece"] == 0.25 and list(table.columns) == app.COLUMNS


def test_jobs_table_shows_the_queue(tmp_path):
    from jobs.store import JobStore

    store = JobStore(tmp_path)
    job = store.submit({"kind": "evaluate", "model": "bundled", "dataset": "boolq"})
    table = app.jobs_table(tmp_path)
    assert list(table.columns) == app.JOB_COLUMNS
    assert table.loc[0, "id"] == job.id and table.loc[0, "status"] == "queued" and table.loc[0, "kind"] == "evaluate"


def test_loopback_needs_no_login_but_a_network_address_does(monkeypatch):
    monkeypatch.delenv("CALIBRATION_LAB_AUTH", raising=False)
    assert app._auth("127.0.0.1") is None and app._auth("localhost") is None
    with pytest.raises(SystemExit, match="CALIBRATION_LAB_AUTH"):
        app._auth("0.0.0.0")
    monkeypatch.setenv("CALIBRATION_LAB_AUTH", "ada:s3cret")
    assert app._auth("0.0.0.0") == ("ada", "s3cret")


def test_catalogue_names_every_dataset_and_escapes_markup():
    text = app.catalogue()
    assert "`arc_challenge`" in text and "`custom`" in text and "&lt;option text&gt;" in text
