"""The Life cycle page (a series' ECE and accuracy along its axis), through its figure and handlers:
on series tables written here with the series' own writer, and on a real series of three tiny models.
The browser test is tests/browser/test_lifecycle.py."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import gradio as gr
import pytest

from lab.core.layout import SERIES_CSV, SERIES_FILE
from lab.results import runs, series
from tests.helpers import row, run_series, tiny_models, write_eval
from ui.app import open_in_reliability
from ui.context import LabContext
from ui.job_results import job_results
from ui.jobs_page import temperature_link
from ui.lifecycle_page import NO_SERIES, picked_cell, redraw, series_view, show_series
from ui.messages import refusal
from ui.plots.common import TITLE_NAME
from ui.plots.lifecycle import ORACLE_NAME, lifecycle_figure, params_label

SKIP = gr.skip()
TASKS = [{"key": "t0-mcq", "task": "mcq", "dataset": "synthetic", "split": "test", "label": "mcq · synthetic/test"},
         {"key": "t1-clm", "task": "clm", "dataset": "text", "split": "test", "label": "clm · text/test"}]
SIZES = (135e6, 1.4e9, 12e9)
STAGES = ("base", "SFT", "DPO")  # not in alphabetical order: the axis keeps the entries' order


def _cells(axis: str, xs, seeds=(None,)) -> list[dict]:
    """One cell per x, seed and task; the ECE of the first lies below its bootstrap interval, as
    ECE's resamples, which run high, often put it."""
    cells = []
    for i, x in enumerate(xs):
        for seed in seeds:
            for j, task in enumerate(TASKS):
                point = f"m{i}" + ("" if seed is None else f"-seed{seed}")
                ece, acc = 0.05 + 0.02 * i + 0.01 * (seed or 0), 0.4 + 0.1 * i - 0.02 * (seed or 0)
                low = ece + 0.01 if i == 0 else ece - 0.02
                cells.append({"task": task["key"], "entry": 0 if axis == "seed" else i, "point": point,
                              "stage": x if axis == "stage" else None,
                              "seed": x if axis == "seed" else seed, "step": x if axis == "step" else None,
                              "params": x if axis == "params" else None, "model": f"/models/{point}",
                              "adapter": None, "n": 100, "accuracy": acc, "accuracy_low": acc - 0.05,
                              "accuracy_high": acc + 0.05, "ece": ece, "ece_low": low, "ece_high": ece + 0.03,
                              "oracle_ece": 0.02 if task["task"] == "mcq" else None,
                              "run": f"00003-series/cells/{point}_{task['key']}"})
    return cells


def _doc(axis: str = "params", xs=SIZES, seeds=(None,)) -> dict:
    return series.document(axis, TASKS, _cells(axis, xs, seeds))


def _write(root: Path, doc: dict, name: str = "00003-series", evaluations: bool = True) -> Path:
    """``doc`` as the series writes it into ``root/name``, with an evaluation in each cell's folder."""
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    series.write(directory, doc)
    if evaluations:
        for cell in doc["cells"]:
            task = "clm" if cell["task"].endswith("clm") else "mcq"
            write_eval(root / cell["run"], [row(i, [0.7, 0.3], i % 2) for i in range(20)], task=task)
    return directory


def _per_run(figure, metric: str = "ECE") -> list:
    return [t for t in figure.data if t.name == f"{metric} of each run, 95 % bootstrap interval"]


def _means(figure) -> list:
    return [t for t in figure.data if (t.name or "").startswith("mean over") and t.fill != "toself"]


# ---------------------------------------------------------------- the figure
@pytest.mark.unit
def test_the_figure_has_a_panel_per_task_and_a_marker_per_run_with_its_bootstrap_interval():
    doc = _doc()
    figure = lifecycle_figure(doc)
    titles = [a.text for a in figure.layout.annotations if a.name == TITLE_NAME]
    assert titles == [t["label"] for t in TASKS]  # one panel a task, titled by its label
    assert {figure.layout[f"xaxis{i}"].type for i in ("", 2, 3, 4)} == {"log"}  # parameters: log scale
    assert list(figure.layout.xaxis.ticktext) == ["135M", "1.4B", "12B"]
    for metric, key in (("ECE", "ece"), ("accuracy", "accuracy")):
        traces = _per_run(figure, metric)
        assert len(traces) == len(TASKS)
        for trace, task in zip(traces, TASKS):
            cells = [c for c in doc["cells"] if c["task"] == task["key"]]
            assert list(trace.x) == [c["x"] for c in cells] and list(trace.y) == [c[key] for c in cells]
            assert list(trace.error_y.array) == pytest.approx([c[f"{key}_high"] - c[key] for c in cells])
            assert list(trace.error_y.arrayminus) == pytest.approx([c[key] - c[f"{key}_low"] for c in cells])
    first = doc["cells"][0]  # drawn from its interval's low end, above the point: the interval, exactly
    assert first["ece"] - _per_run(figure)[0].error_y.arrayminus[0] == pytest.approx(first["ece_low"])
    assert not _means(figure)  # one run per x: nothing to average
    oracle = [t for t in figure.data if t.name == ORACLE_NAME]
    assert len(oracle) == 1 and oracle[0].line.dash == "dash" and oracle[0].yaxis == "y"  # the mcq task's ECE panel


@pytest.mark.unit
def test_seeds_at_one_x_add_their_mean_with_its_t_interval_beside_each_run():
    doc = _doc(seeds=(0, 1, 2))
    figure = lifecycle_figure(doc)
    assert [len(t.x) for t in _per_run(figure)] == [9, 9]  # every run is still drawn
    assert all(t.mode == "markers" for t in _per_run(figure))  # replicates: no zigzag line through them
    means = _means(figure)
    assert len(means) == 4 and {t.name for t in means} == {"mean over 3 seeds, 95 % t-interval"}
    ece = means[0]
    rows = [r for r in doc["summary"] if r["task"] == "t0-mcq"]
    assert list(ece.x) == list(SIZES) and list(ece.y) == pytest.approx([r["ece_mean"] for r in rows])
    bands = [t for t in figure.data if t.fill == "toself"]
    assert len(bands) == 4 and not any(t.showlegend for t in bands)
    assert list(bands[0].y) == pytest.approx([r["ece_high"] for r in rows] + [r["ece_low"] for r in rows][::-1])
    assert sum(bool(t.showlegend) for t in means) == 1  # one legend entry for all panels
    low, high = figure.layout.yaxis.range  # the ECE axis holds every run's interval and the t-band whole
    cells = [c for c in doc["cells"] if c["task"] == "t0-mcq"]
    assert high > max([c["ece_high"] for c in cells] + [r["ece_high"] for r in rows])
    assert low <= min([0.0] + [r["ece_low"] for r in rows])


@pytest.mark.unit
def test_stages_keep_the_entries_order_and_seeds_share_one_mean_across_them():
    figure = lifecycle_figure(_doc("stage", STAGES))
    assert figure.layout.xaxis.type == "category" and list(figure.layout.xaxis.categoryarray) == list(STAGES)
    assert list(_per_run(figure)[0].x) == list(STAGES)
    seeds = lifecycle_figure(_doc("seed", (3, 7, 11)))
    assert seeds.layout.xaxis.type == "linear" and list(seeds.layout.xaxis.tickvals) == [3, 7, 11]
    mean = _means(seeds)[0]
    assert list(mean.x) == [3, 11] and mean.y[0] == mean.y[1]  # the mean over all seeds, level across them
    assert lifecycle_figure(_doc("step", (0, 1000, 143000))).layout.xaxis.type == "linear"


@pytest.mark.unit
def test_two_trained_entries_along_the_steps_are_two_mean_curves():
    """Two learning rates, each trained with two seeds and kept at the same steps: a mean line each,
    not one line zigzagging between them at every step."""
    cells = [{**cell, "entry": entry, "point": f"m{entry}-{cell['point']}", "ece": cell["ece"] + 0.1 * entry}
             for entry in (0, 1) for cell in _cells("step", (200, 400, 600), seeds=(0, 1))]
    means = _means(lifecycle_figure(series.document("step", TASKS, cells)))
    assert len(means) == 8 and all(list(t.x) == [200, 400, 600] for t in means)  # 2 entries × 2 tasks × 2 rows


@pytest.mark.unit
def test_crowded_parameter_ticks_are_thinned_and_counts_read_as_models_are_named():
    assert [params_label(n) for n in (39840, 999_600, 70_426_624, 1.4e9, 12e9)] == ["39.8K", "1M", "70.4M", "1.4B",
                                                                                    "12B"]
    pythia = (70e6, 160e6, 410e6, 1.0e9, 1.4e9, 2.8e9, 6.9e9, 12e9)
    wide = lifecycle_figure(series.document("params", TASKS[:1], _cells("params", pythia)[::2]))
    assert list(wide.layout.xaxis.ticktext) == [params_label(x) for x in pythia]  # one panel: room for all
    crowded = lifecycle_figure(series.document("params", TASKS * 3, [
        {**c, "task": f"{c['task']}-{k}"} for k in range(3) for c in _cells("params", pythia)]))
    ticks = list(crowded.layout.xaxis.ticktext)
    assert "1B" in ticks and "1.4B" not in ticks and ticks[0] == "70M"


@pytest.mark.unit
def test_the_figure_never_raises_and_user_text_is_shown_literally():
    assert "no data" in lifecycle_figure({"axis": "params", "tasks": TASKS, "cells": []}).layout.annotations[0].text
    bad = lifecycle_figure({"axis": "params", "tasks": TASKS, "cells": [{"task": "t0-mcq", "x": "many"}]})
    assert "cannot draw" in bad.layout.annotations[0].text
    doc = _doc("stage", ("<b>base</b>", "SFT", "DPO"))
    hover = _per_run(lifecycle_figure(doc))[0].hovertext[0]
    assert "&lt;b&gt;base&lt;/b&gt;" in hover and "<b>base</b>" not in hover


# ---------------------------------------------------------------- the catalogue
@pytest.mark.unit
def test_the_catalogue_finds_series_newest_first_and_refuses_names_outside(tmp_path):
    older = _write(tmp_path, _doc(), "00002-series", evaluations=False)
    newer = _write(tmp_path, _doc(seeds=(0, 1)), "00003-series", evaluations=False)
    (older / "sub").mkdir()
    stamp = time.time() - 60
    os.utime(older / SERIES_FILE, (stamp, stamp))
    assert list(runs.scan(tmp_path).series) == ["00003-series", "00002-series"]
    (label, name), _ = runs.series_choices(tmp_path)
    assert name == "00003-series" and label.startswith("00003 · params · 12 cells: 6 points × 2 tasks · ")
    runs.write_label(older, "Pythia sizes")
    assert runs.series_choices(tmp_path)[1] == ("Pythia sizes", "00002-series")
    assert runs.series_dir(tmp_path, "00003-series") == newer.resolve()
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    _write(outside, _doc(), "00001-series", evaluations=False)
    for hostile in (f"../{outside.name}/00001-series", str(outside / "00001-series"), "00002-series/sub", "/etc", "",
                    None, ["00003-series"], "00003-series\0"):
        assert runs.series_dir(tmp_path, hostile) is None, hostile


# ---------------------------------------------------------------- the page's handlers
@pytest.mark.unit
def test_the_page_draws_a_series_with_its_cells_its_means_and_its_csv(tmp_path):
    ctx = LabContext(tmp_path)
    directory = _write(tmp_path, _doc(seeds=(0, 1)))
    figure, cells, summary, message, download, drawn = series_view(ctx, "00003-series")
    assert len(_per_run(figure)) == 2 and message == ""
    assert list(cells.columns[:3]) == ["task", "parameters", "point"] and len(cells) == 12
    assert cells.loc[0, "parameters"] == "135M" and cells.loc[0, "run"] == "00003-series/cells/m0-seed0_t0-mcq"
    assert cells.loc[0, "ECE (95% CI)"] == "5.0% [6.0%, 8.0%]"
    assert summary["visible"] is True and list(summary["value"]["runs"]) == [2] * 6
    assert download["visible"] is True
    assert Path(download["value"]).read_bytes() == (directory / SERIES_CSV).read_bytes()  # the download is series.csv
    assert redraw(ctx, "00003-series", drawn) == (SKIP,) * 6  # a poll on a quiet series sends nothing
    _write(tmp_path, _doc(), evaluations=False)  # rewritten (a cell finished)
    assert redraw(ctx, "00003-series", drawn)[2]["visible"] is False  # one run per x now: no means table


@pytest.mark.unit
def test_the_page_says_what_to_do_with_no_series_a_running_one_or_a_damaged_one(tmp_path):
    ctx = LabContext(tmp_path)
    figure, cells, _, message, download, _ = series_view(ctx, None)
    assert figure is None and cells.empty and download["visible"] is False
    assert "examples/series-scale-quick.yaml" in message and "series tab" in message and "lab-note" in message
    assert NO_SERIES.startswith("No series yet")
    job = ctx.store.submit({"kind": "series"})
    assert f"Series job {job.id} is queued" in series_view(ctx, None)[3]
    _write(tmp_path, _doc(xs=SIZES[:1]), Path(job.run_dir).name, evaluations=False)
    ctx.store.update(job.id, status="running", started=time.time())
    figure, _, _, message, _, drawn = series_view(ctx, Path(job.run_dir).name)
    assert "still running: 2 cells so far" in message and len(_per_run(figure)[0].x) == 1  # what is there
    ctx.store.update(job.id, status="succeeded", finished=time.time())
    assert redraw(ctx, Path(job.run_dir).name, drawn)[3] == ""  # it ended: redrawn, no longer "running"
    damaged = tmp_path / "00009-series"
    damaged.mkdir()
    (damaged / SERIES_FILE).write_text('{"axis": "params", "tasks": [], "cells": [{"task": "t0", "ece": 0.1}]')
    assert "cannot be read" in series_view(ctx, "00009-series")[3]
    (damaged / SERIES_FILE).write_text('{"axis": "params", "tasks": [], "cells": [{"task": "t0", "ece": 0.1, '
                                       '"accuracy": 0.5, "entry": []}]}')  # an entry the summary cannot group by
    assert "no finished cell yet" in series_view(ctx, "00009-series")[3]  # that cell is left out, the page stands
    assert refusal(series_view(ctx, "../00003-series")[3]).startswith("No series called '../00003-series' here")


@pytest.mark.unit
def test_a_selected_row_opens_its_cell_in_reliability_and_hostile_rows_open_nothing(tmp_path):
    ctx = LabContext(tmp_path)
    doc = _doc()
    _write(tmp_path, doc)
    name, said, button = picked_cell(ctx, "00003-series", [3, 1], None)
    assert name == doc["cells"][3]["run"] == "00003-series/cells/m1_t1-clm"
    assert "Picked m1 × clm · text/test" in said and button["interactive"] is True
    tabs, picker, *timers = open_in_reliability(ctx, [], [], name)
    assert tabs.selected == "reliability" and picker["value"] == [name]
    assert name in [n for _, n in picker["choices"]]
    shown = ["mcq", "12B", "m2", 100, "", "", "", doc["cells"][4]["run"]]  # row 0 of a table sorted in the browser
    assert picked_cell(ctx, "00003-series", 0, shown)[0] == doc["cells"][4]["run"]  # the row's own run counts
    for index, row_value in ((99, None), (-1, None), ("3", None), (True, None), (None, None), ([], None),
                             (0.5, None), (0, ["x", "../../etc"])):
        found, _, button = picked_cell(ctx, "00003-series", index, row_value)
        assert (found, button["interactive"]) == ((doc["cells"][0]["run"], True) if index == 0 else (None, False))
    assert picked_cell(ctx, "../00003-series", 0)[0] is None
    assert open_in_reliability(ctx, [], [], "../00003-series/cells/m0_t0-mcq") == (SKIP, SKIP)
    assert open_in_reliability(ctx, [], [], {"evil": 1}) == (SKIP, SKIP)
    *_, run, picked, button = show_series(ctx, "00003-series")  # another series picked: the row is forgotten
    assert (run, picked, button["interactive"]) == (None, "", False)


@pytest.mark.unit
def test_a_series_job_page_shows_its_life_cycle_and_old_token_runs_offer_no_temperature_lab(tmp_path):
    directory = _write(tmp_path, _doc())
    found = job_results(tmp_path, "series", str(directory))
    assert "3 points × 2 tasks" in found.text and "Life cycle" in found.text and found.run is None
    assert found.figure_label.startswith("Life cycle") and len(_per_run(found.figure)) == 2
    ctx = LabContext(tmp_path)
    assert temperature_link(ctx, "00003-series/cells/m0_t1-clm")["visible"] is False  # no log Z kept: refused there
    kept = json.loads((tmp_path / "00003-series/cells/m1_t1-clm/metrics.json").read_text())
    (tmp_path / "00003-series/cells/m1_t1-clm/metrics.json").write_text(json.dumps({**kept, "temperature_grid": [1, 2]}))
    assert temperature_link(ctx, "00003-series/cells/m1_t1-clm")["visible"] is True
    assert temperature_link(ctx, "00003-series/cells/m0_t0-mcq")["visible"] is True
    assert temperature_link(ctx, None)["visible"] is True  # no run: the links row is hidden anyway


# ---------------------------------------------------------------- a real series
@pytest.mark.model
@pytest.mark.slow
def test_a_real_series_of_three_tiny_models_draws_three_points_per_task(tmp_path):
    ctx = LabContext(tmp_path / "runs")
    summary = run_series(ctx.runs / "00001-series", tiny_models(tmp_path / "models"))
    assert summary == {"cells": 6, "points": 3, "tasks": 2}
    figure, cells, means, message, download, _ = series_view(ctx, runs.series_choices(ctx.runs)[0][1])
    assert [len(t.x) for t in _per_run(figure)] == [3, 3] and message == "" and means["visible"] is False
    assert list(_per_run(figure)[0].x) == sorted(_per_run(figure)[0].x)  # the sizes grow along the axis
    assert len(cells) == 6 and all(runs.evaluation(ctx.runs, name) for name in cells["run"])
    assert Path(download["value"]).read_bytes() == (ctx.runs / "00001-series" / SERIES_CSV).read_bytes()
