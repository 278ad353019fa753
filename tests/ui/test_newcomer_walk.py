"""What a newcomer's walk of the app found (issue 43, round 3), through the pages' handlers: the Temperature
lab's paper form on a token run, messages that named the server's absolute paths, the Results page's
stale export and its filter, the Life cycle page's stale picker, clicks on its plot and pipelines shown as
series. Its browser test (a click on the Life cycle plot) is in tests/browser/test_lifecycle.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from lab.calibration import calibrators
from lab.core.config import ConfigError
from lab.core.layout import CALIBRATOR_FILE
from tests.helpers import row, write_eval, write_series, write_token_run
from ui import results_page, temperature_page
from ui.context import LabContext

def _no_path(text: str, root: Path) -> None:
    assert str(root) not in text and str(root.resolve()) not in text, text


# ---------------------------------------------------------------- Temperature lab: the paper form on a token run
@pytest.mark.unit
def test_the_paper_form_on_a_token_run_keeps_the_plots_and_t_and_says_it_does_not_apply(tmp_path):
    write_token_run(tmp_path / "00002-evaluate")
    ctx = LabContext(tmp_path)
    drawn = temperature_page.pick_run(ctx, "00002-evaluate", "logit", None)
    moved = temperature_page.typed_temperature(ctx, "00002-evaluate", "1.5", drawn.drawn, "logit", None)
    view = temperature_page.settings_changed(ctx, "00002-evaluate", moved.drawn, "paper", None)
    assert view.reliability is not None and view.sweep is not None  # both plots kept
    assert view.box["value"] == "1.5" and view.drawn == {**moved.drawn, "form": "logit"}
    assert "does not apply to a token run" in view.message and "lab-error" not in view.message
    assert view.form["choices"] == ["logit"] and view.form["value"] == "logit"  # paper not offered here
    _no_path(view.message, tmp_path)


@pytest.mark.unit
def test_saving_a_temperature_names_the_run_not_the_server_path(tmp_path):
    write_token_run(tmp_path / "00002-evaluate")
    said = temperature_page.save_chosen_temperature(LabContext(tmp_path), "00002-evaluate", 1.5, "logit")
    assert "Saved T = 1.5 to 00002-evaluate/temperature.json" in said
    _no_path(said, tmp_path)


# ---------------------------------------------------------------- no server path in a message
@pytest.mark.unit
def test_a_calibrator_that_cannot_be_loaded_is_named_without_the_server_path(tmp_path):
    folder = tmp_path / "calibrators" / "mine"
    folder.mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as missing:
        calibrators.load(folder)
    assert f"mine/{CALIBRATOR_FILE}" in str(missing.value)
    (folder / CALIBRATOR_FILE).write_text("{not json")
    with pytest.raises(ValueError) as damaged:
        calibrators.load(folder)
    assert f"mine/{CALIBRATOR_FILE}: not a calibrator file" in str(damaged.value)
    (folder / CALIBRATOR_FILE).unlink()
    (folder / CALIBRATOR_FILE).mkdir()  # a folder where the file belongs: the OSError's text holds the path
    with pytest.raises(ValueError) as unreadable:
        calibrators.load(folder)
    for caught in (missing, damaged, unreadable):
        _no_path(str(caught.value), tmp_path)


@pytest.mark.unit
def test_a_missing_data_file_is_named_from_the_allowed_folder_holding_it(tmp_path):
    ctx = LabContext(tmp_path / "runs")
    missing = ctx.runs / "uploads" / "mine.jsonl"
    with pytest.raises(ConfigError) as refused:
        ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": [str(missing)]})
    assert str(refused.value).endswith("(looked for runs/uploads/mine.jsonl)")
    assert str(refused.value).count(str(tmp_path)) == 1  # only in the name the user typed, quoted back


# ---------------------------------------------------------------- series written here, with the series' own writer
# ---------------------------------------------------------------- Results: the filter, the series cells, the export
def _results_runs(root: Path) -> LabContext:
    """Two evaluations and a series of three cells, each with its evaluation."""
    rows = [row(i, [0.7, 0.3], i % 2) for i in range(10)]
    write_eval(root / "00001-evaluate", rows, dataset="arc_easy", scoring="cloze", accuracy=0.523, ece=0.0841)
    write_eval(root / "00002-evaluate", rows, dataset="obqa")
    (root / "00003-series").mkdir()
    for point in ("m0", "m1", "m2"):
        write_eval(root / "00003-series" / "cells" / f"{point}_t0-mcq", rows, dataset="synthetic")
    (root / "00003-series" / "series.json").write_text("{}")
    return LabContext(root)


@pytest.mark.unit
def test_results_hide_series_cells_until_asked_and_filter_by_words(tmp_path):
    ctx = _results_runs(tmp_path)
    table, seen, said = results_page.follow_results(ctx, None)
    assert sorted(table["folder"]) == ["00001-evaluate", "00002-evaluate"]
    assert "Showing 2 of 5 evaluations; 3 series cells hidden" in said
    everything, _, said = results_page.follow_results(ctx, seen, "", True)
    assert len(everything) == 5 and said == ""
    narrowed, _, said = results_page.follow_results(ctx, seen, " ARC_easy  cloze ")
    assert narrowed["folder"].tolist() == ["00001-evaluate"] and "Showing 1 of 5" in said
    assert results_page.follow_results(ctx, seen, "arc_easy obqa")[0].empty  # every word must be found
    csv = Path(results_page.export_csv(ctx, "arc_easy")["value"]).read_text()
    assert "00001-evaluate" in csv and "00002-evaluate" not in csv


@pytest.mark.unit
def test_results_show_ece_and_accuracy_in_percent_as_the_other_pages_do(tmp_path):
    table = results_page.follow_results(_results_runs(tmp_path), None, "arc_easy")[0]
    assert table.loc[table.index[0], "accuracy"] == pytest.approx(52.3)
    assert table.loc[table.index[0], "ECE"] == pytest.approx(8.41)
    assert table.loc[table.index[0], "Trust"] == pytest.approx(0.4)  # a score, not a fraction of questions


@pytest.mark.unit
def test_the_results_export_link_goes_away_when_the_table_changes(tmp_path):
    import gradio as gr

    with gr.Blocks() as demo:
        results_page.build_results(LabContext(tmp_path))
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    table, csv_file = by_id["results-table"], by_id["results-csv"]
    hiding = [fn for fn in demo.fns.values() if (table._id, "change") in fn.targets
              and [o._id for o in fn.outputs] == [csv_file._id]]
    assert len(hiding) == 1 and hiding[0].fn() == {"value": None, "visible": False, "__type__": "update"}


# ---------------------------------------------------------------- Life cycle: the picker's count while a series runs
@pytest.mark.unit
def test_the_series_picker_counts_every_new_cell_even_within_one_tick_of_the_clock(tmp_path):
    """A resumed series rewrites series.json once per finished cell, faster than the file system's clock
    ticks: the picker, refreshed after each, must count the cells there are, not the first count."""
    from lab.results import runs
    from ui.components import follow_catalogue

    ctx = LabContext(tmp_path)
    directory = write_series(tmp_path, 1)
    stamp = (directory / "series.json").stat().st_mtime_ns
    first, seen = follow_catalogue(ctx, runs.series_choices, False, True, None, None)
    assert first["choices"][0][0].startswith("00003 · params · 1 cells: 1 points × 1 tasks")
    write_series(tmp_path, 2)
    os.utime(directory / "series.json", ns=(stamp, stamp))  # the same tick
    grown, _ = follow_catalogue(ctx, runs.series_choices, False, True, "00003-series", seen)
    assert grown["choices"][0][0].startswith("00003 · params · 2 cells: 2 points × 1 tasks")


# ---------------------------------------------------------------- the app's CSS (seen in tests/output/ screenshots)
@pytest.mark.unit
def test_the_sticky_bar_is_opaque_above_labels_and_a_dropdown_text_stops_before_its_arrow():
    import re

    from ui.messages import CSS

    bar = re.search(r"\.lab-submit-bar \{([^}]*)\}", CSS)[1]
    assert "background: var(--background-fill-primary, #fff) !important" in bar
    assert int(re.search(r"z-index: (\d+)", bar)[1]) >= 1000  # gradio's labels sat above 20
    combobox = re.search(r'\.secondary-wrap input\[role="combobox"\] \{([^}]*)\}', CSS)[1]
    assert "padding-right" in combobox and "text-overflow: ellipsis" in combobox
