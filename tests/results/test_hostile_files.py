"""Hostile files under runs/ (issue 43): each shape planted beside a good run, the pages still draw the good
one and name the bad one by its run (never the server's absolute path); exports neutralise formula
cells; user labels are text on plots; a series' t-intervals are shown as computed."""
from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import pandas as pd
import pytest

from lab.calibration import calibrators
from lab.core import stored
from lab.core.layout import CALIBRATOR_FILE, EVENTS_FILE, SERIES_CSV, SERIES_FILE
from lab.results import runs, series, tables
from tests.helpers import overconfident_rows, write_eval
from ui import cases_page, components, lifecycle_page, reliability_page, results_page
from ui.compare_page import _export_table
from ui.context import LabContext
from ui.plots.lifecycle import lifecycle_figure
from ui.progress import progress

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on it, no ValueError
TASKS = [{"key": "t0", "task": "mcq", "dataset": "synthetic", "split": "test", "label": "mcq · synthetic/test"}]
FORMULAS = ["=HYPERLINK(\"http://x\",\"y\")", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx"]


def _runs(tmp_path: Path) -> tuple[LabContext, Path]:
    """A runs folder with one good evaluation, ``00001-evaluate``."""
    write_eval(tmp_path / "00001-evaluate", overconfident_rows(0, 40, 0))
    return LabContext(tmp_path), tmp_path / "00002-evaluate"


def _bad_eval(root: Path, predictions: bytes | str) -> Path:
    """A second evaluation whose predictions.jsonl is ``predictions``."""
    directory = write_eval(root / "00002-evaluate", overconfident_rows(1, 3, 100))
    path = directory / "predictions.jsonl"
    path.write_bytes(predictions if isinstance(predictions, bytes) else predictions.encode())
    return directory


def _no_path(text: str, root: Path) -> None:
    assert str(root) not in text and str(root.resolve()) not in text


def _cell(point, x, ece, acc, **extra) -> dict:
    return {"task": "t0", "entry": 0, "point": point, "stage": None, "seed": extra.pop("seed", None), "step": None,
            "params": x, "model": "bundled", "adapter": None, "n": 50, "accuracy": acc, "accuracy_low": acc - 0.05,
            "accuracy_high": acc + 0.05, "ece": ece, "ece_low": ece - 0.02, "ece_high": ece + 0.02, "run": None,
            **extra}


def _write_series(directory: Path, doc: dict | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SERIES_FILE).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return directory


# ---------------------------------------------------------------- the bounded reader
@pytest.mark.unit
def test_the_reader_refuses_deep_large_and_torn_input_naming_file_and_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n5\n{"b": "\xff\xfe"}\n' + b"[" * 5000 + b"\n" + b"[" * 40 + b"]" * 40 + b"\n{}")
    read = stored.read_lines(path, "run/x.jsonl")
    assert [n for n, _ in read.rows] == [1, 6]
    assert [p.split(":")[1] for p in read.problems] == ["2", "3", "4", "5"]
    assert "object" in read.problems[0] and "UTF-8" in read.problems[1] and "deeper" in read.problems[2]
    (tmp_path / "deep.json").write_text(DEEP)
    with pytest.raises(stored.StoredFileError, match="deep.json: nested deeper"):
        stored.read_json(tmp_path / "deep.json")
    with pytest.raises(stored.StoredFileError, match="larger than"):
        stored.read_json(path, max_bytes=10)


# ---------------------------------------------------------------- R5, R13: pages over hostile files
@pytest.mark.unit
def test_a_deep_metrics_json_leaves_pickers_results_and_its_export_to_the_good_runs(tmp_path):
    ctx, bad = _runs(tmp_path)
    _bad_eval(tmp_path, "")
    (bad / "metrics.json").write_text(DEEP)
    assert [name for _, name in runs.evaluation_choices(tmp_path)] == ["00001-evaluate"]
    assert results_page.results_view(ctx)["folder"].tolist() == ["00001-evaluate"]
    said = results_page.left_out(ctx)
    assert "00002-evaluate/metrics.json" in said and "nested deeper" in said
    _no_path(said, tmp_path)
    assert results_page.export_csv(ctx)["visible"] is True


@pytest.mark.unit
@pytest.mark.parametrize("content, line, why", [
    (json.dumps(overconfident_rows(1, 1, 0)[0]) + "\n" + DEEP + "\n", 2, "nested deeper"),
    (json.dumps(overconfident_rows(1, 1, 0)[0]) + "\n", None, None),  # replaced below by torn UTF-8
])
def test_bad_predictions_are_named_by_line_and_the_good_run_still_draws(tmp_path, content, line, why):
    ctx, _ = _runs(tmp_path)
    if line is None:
        content, line, why = content.encode() + b'{"question": "caf\xc3"}\n', 2, "UTF-8"
    _bad_eval(tmp_path, content)
    figure, said = reliability_page.reliability_view(ctx, ["00001-evaluate", "00002-evaluate"], None,
                                                     reliability_page.VIEWS[0])
    assert figure is not None and f"00002-evaluate/predictions.jsonl:{line}" in said and why in said
    _no_path(said, tmp_path)
    table, _, said = cases_page.cases_view(ctx, "00002-evaluate", "all", 0.0, 1.0, None)
    assert table.empty and f"predictions.jsonl:{line}" in said
    _no_path(said, tmp_path)


@pytest.mark.unit
def test_choices_that_are_no_list_still_show_the_question(tmp_path):
    ctx, _ = _runs(tmp_path)
    rows = overconfident_rows(1, 3, 0)
    rows[0]["choices"] = 5
    rows[1]["top_tokens"] = [{"token": "A"}]  # no prob: the top-k table leaves the row out
    _bad_eval(tmp_path, "".join(json.dumps(r) + "\n" for r in rows))
    table, _, said = cases_page.cases_view(ctx, "00002-evaluate", "all", 0.0, 1.0, None)
    assert len(table) == 3 and "5" in table["options"].tolist()
    assert tables.positionwise_topk(ctx.results.predictions(runs.evaluation(tmp_path, "00002-evaluate"))).empty


@pytest.mark.unit
def test_a_deep_or_damaged_series_json_leaves_the_picker_to_the_good_series(tmp_path):
    ctx = LabContext(tmp_path)
    good = series.document("params", TASKS, [_cell("m0", 1e6, 0.1, 0.5), _cell("m1", 2e6, 0.08, 0.6)])
    _write_series(tmp_path / "00001-series", good)
    _write_series(tmp_path / "00002-series", DEEP)
    hostile = series.document("params", TASKS, [_cell("m0", 1e6, 0.1, 0.5)])
    hostile["cells"].append(_cell([1, 2], 2e6, 0.1, 0.5))  # point: [1, 2] cannot be grouped or listed
    _write_series(tmp_path / "00003-series", hostile)
    assert sorted(name for _, name in runs.series_choices(tmp_path)) == ["00001-series", "00002-series",
                                                                          "00003-series"]
    figure, cells, _, said, _, _ = lifecycle_page.series_view(ctx, "00001-series")
    assert len(cells) == 2 and not said
    figure, cells, _, said, _, _ = lifecycle_page.series_view(ctx, "00002-series")
    assert figure is None and "00002-series/series.json" in said and "nested deeper" in said
    _no_path(said, tmp_path)
    figure, cells, _, said, _, _ = lifecycle_page.series_view(ctx, "00003-series")
    assert len(cells) == 1 and "00003-series/series.json: cell 2" in said and "&#x27;point&#x27;" in said


@pytest.mark.unit
def test_a_deep_calibrator_json_is_listed_as_unreadable_and_named_when_picked(tmp_path):
    _runs(tmp_path)
    folder = tmp_path / "calibrators" / "bad"
    folder.mkdir(parents=True)
    (folder / CALIBRATOR_FILE).write_text(DEEP)
    assert ("calibrators/bad (unreadable)", "calibrators/bad") in components.calibrator_choices(tmp_path)
    with pytest.raises(ValueError, match="nested deeper") as refused:
        components.picked_calibrator(LabContext(tmp_path), "calibrators/bad")
    assert f"calibrators/bad/{CALIBRATOR_FILE}" in str(refused.value)
    _no_path(str(refused.value), tmp_path)
    with pytest.raises(ValueError):
        calibrators.load(folder)


@pytest.mark.unit
def test_events_whose_counts_are_no_numbers_are_left_out_of_the_progress(tmp_path):
    ctx = LabContext(tmp_path)
    lines = [{"time": 1.0, "stage": "train", "step": 1, "total": 4},
             {"time": 2.0, "stage": "train", "step": "x", "total": 4},
             {"time": 3.0, "stage": "train", "step": 2, "total": 4, "tokens": [1], "tokens_total": 9}]
    (tmp_path / EVENTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in lines))
    events = ctx.events.events(tmp_path)
    assert [e["time"] for e in events] == [1.0]
    assert progress(events, now=4.0).step == 1


# ---------------------------------------------------------------- R9, R10: injection
@pytest.mark.unit
def test_every_csv_the_lab_writes_neutralises_formula_cells_and_keeps_numbers(tmp_path):
    ctx, _ = _runs(tmp_path)
    runs.write_label(tmp_path / "00001-evaluate", FORMULAS[0])
    text = tables.results_csv(results_page.results_view(ctx))
    first = pd.read_csv(pd.io.common.StringIO(text))
    assert first["run"][0] == "'" + FORMULAS[0] and first["ECE"][0] == pytest.approx(0.1)
    doc = series.document("params", TASKS, [_cell(p, 1e6 * (i + 1), 0.1, 0.5) for i, p in enumerate(FORMULAS)])
    (tmp_path / "00003-series").mkdir()
    series.write(tmp_path / "00003-series", doc)
    cells = pd.read_csv(tmp_path / "00003-series" / SERIES_CSV, keep_default_na=False)
    assert [c[:2] for c in cells["point"]] == [f"'{p[0]}" for p in FORMULAS]
    assert cells["ece"].tolist() == [0.1] * len(FORMULAS)
    shown = _export_table(ctx, pd.DataFrame({"model": FORMULAS, "confidence": [-0.5] * 6}), "c")
    exported = pd.read_csv(shown["value"], keep_default_na=False)
    assert all(m.startswith("'") for m in exported["model"]) and exported["confidence"].tolist() == [-0.5] * 6


@pytest.mark.unit
def test_a_stage_label_is_text_on_the_life_cycle_ticks():
    link = '<a href="https://evil.example">SFT</a>'
    cells = [_cell("base", None, 0.1, 0.5, stage="base"), _cell("sft", None, 0.1, 0.5, stage=link)]
    figure = lifecycle_figure(series.document("stage", TASKS, cells))
    ticks = list(figure.layout.xaxis.ticktext)
    assert "&lt;a href" in ticks[1] and "<a" not in "".join(ticks)


# ---------------------------------------------------------------- intervals as computed
@pytest.mark.unit
def test_a_t_interval_passing_zero_is_shown_as_computed_and_the_axis_holds_it(tmp_path):
    cells = [_cell(f"m0-s{s}", 1e6, ece, acc, seed=s) for s, (ece, acc) in enumerate([(0.01, 0.5), (0.4, 0.95)])]
    doc = series.document("params", TASKS, cells)
    mean = doc["summary"][0]
    assert mean["ece_low"] < 0 and mean["accuracy_high"] > 1  # two seeds far apart: t(1 df) is 12.7
    table = lifecycle_page.summary_table({**doc, "axis_title": "parameters"})
    assert f"[{100 * mean['ece_low']:.1f}%" in table.iloc[0, -1]
    figure = lifecycle_figure(doc)
    ece_axis, accuracy_axis = figure.layout.yaxis.range, figure.layout.yaxis2.range
    assert ece_axis[0] < mean["ece_low"] and ece_axis[1] > mean["ece_high"]
    assert accuracy_axis[1] > mean["accuracy_high"] and accuracy_axis[0] < mean["accuracy_low"]


@pytest.mark.unit
def test_the_life_cycle_page_says_there_is_no_series_when_it_opens_on_none(tmp_path):
    said = lifecycle_page.empty_state(LabContext(tmp_path))
    assert "No series yet" in said
    _write_series(tmp_path / "00001-series", series.document("params", TASKS, [_cell("m0", 1e6, 0.1, 0.5)]))
    assert lifecycle_page.empty_state(LabContext(tmp_path)) == gr.skip()


@pytest.mark.unit
def test_a_deep_temperature_json_is_no_saved_temperature(tmp_path):
    _runs(tmp_path)
    (tmp_path / "00001-evaluate" / "temperature.json").write_text(DEEP)
    assert runs.saved_temperature(tmp_path, runs.evaluation(tmp_path, "00001-evaluate")) is None
