"""Stored evaluations analysed again (lab.results.analysis: loading predictions, recalibrating, summaries,
tables) and case studies (lab.results.cases). Finding them is lab.results.runs: tests/results/test_runs.py."""
import io
import json

import numpy as np
import pandas as pd
import pytest

from lab.calibration import metrics
from lab.calibration.temperature import LAB_SWEEP_GRIDS, temperature_paper
from lab.results.analysis import calibration_summary, recalibrate, temperature_sweep
from lab.results.predictions import load_predictions
from lab.results.tables import positionwise_topk, results_csv, results_table
from lab.results.cases import case_table, filter_cases, same_question
from tests.helpers import row as _row
from tests.helpers import write_eval

pytestmark = pytest.mark.unit


# four 2-option questions whose numbers are worked out by hand below
HAND_PROBS = [[0.95, 0.05], [0.85, 0.15], [0.25, 0.75], [0.35, 0.65]]
HAND_LABELS = [0, 1, 1, 0]


@pytest.fixture
def hand(tmp_path):
    return load_predictions(write_eval(tmp_path / "hand", [_row(i, p, a) for i, (p, a) in
                                                           enumerate(zip(HAND_PROBS, HAND_LABELS))]))


@pytest.fixture
def mixed(tmp_path):
    """3- and 5-option questions; the first was temperature-scaled, so it keeps raw_probs."""
    rows = [
        _row(0, [0.5, 0.3, 0.2], 0, raw_probs=[0.6, 0.3, 0.1], temperature=2.0),
        _row(1, [0.1, 0.2, 0.3, 0.15, 0.25], 4, meta={"dataset": "csqa"}),
        _row(2, [0.7, 0.2, 0.1], 1),
    ]
    return load_predictions(write_eval(tmp_path / "mixed", rows, dataset="pooled"))


# ---------------------------------------------------------------- load_predictions
def test_load_predictions_pads_masks_and_prefers_raw_probs(mixed, tmp_path):
    np.testing.assert_array_equal(mixed.probs, [[0.6, 0.3, 0.1, 0, 0], [0.1, 0.2, 0.3, 0.15, 0.25],
                                                [0.7, 0.2, 0.1, 0, 0]])
    np.testing.assert_array_equal(mixed.mask.sum(axis=1), [3, 5, 3])
    np.testing.assert_array_equal(mixed.labels, [0, 4, 1])
    assert mixed.probs.dtype == np.float64 and mixed.mask.dtype == bool
    assert [r["id"] for r in mixed.rows] == ["q0", "q1", "q2"] and mixed.dataset == "pooled"
    same = load_predictions(tmp_path / "mixed" / "predictions.jsonl")  # the file itself works too
    np.testing.assert_array_equal(same.probs, mixed.probs)


@pytest.mark.parametrize("content, where, what", [
    ("", "", "empty"),
    ("\n  \n", "", "empty"),
    ('{"answer": 0, "probs": [1.0]}\n{"answer": 0, "pro\n', ":2:", "not valid JSON"),
    ('{"answer": 2, "probs": [0.5, 0.5]}\n', ":1:", "'answer'"),
    ('{"answer": 0}\n', ":1:", "'probs'"),
    ('{"answer": 0, "probs": [0.5, "x"]}\n', ":1:", "'probs'"),
    ('{"answer": 0, "probs": [0.5, 0.5], "raw_probs": [1.0]}\n', ":1:", "'raw_probs'"),
    ('[0.5, 0.5]\n', ":1:", "JSON object"),
])
def test_load_predictions_names_the_file_and_line_of_bad_input(tmp_path, content, where, what):
    path = tmp_path / "predictions.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=what) as error:
        load_predictions(path)
    assert f"{tmp_path.name}/{path.name}{where}" in str(error.value)  # the run's folder, not the server's path
    assert str(tmp_path.parent) not in str(error.value)


def test_load_predictions_reads_the_bin_edges_the_run_was_evaluated_with(tmp_path):
    row = [_row(0, [0.6, 0.4], 0)]
    assert load_predictions(write_eval(tmp_path / "new", row, bin_edges="right")).bin_edges == "right"
    assert load_predictions(write_eval(tmp_path / "old", row)).bin_edges == "left"  # before the choice: torchmetrics'
    with pytest.raises(ValueError, match=r"bad.*metrics.json.*edges"):
        load_predictions(write_eval(tmp_path / "bad", row, bin_edges="both"))


def test_load_predictions_of_a_missing_file_says_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="No predictions"):
        load_predictions(tmp_path)


# ---------------------------------------------------------------- recalibrate
def test_recalibrate_at_one_is_the_renormalised_input(mixed):
    mixed.probs[2, :3] = [0.35, 0.1, 0.05]  # a row that does not sum to 1
    out = recalibrate(mixed, 1.0, "logit")
    np.testing.assert_allclose(out[2], [0.7, 0.2, 0.1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(out[:2], mixed.probs[:2], atol=1e-12)


@pytest.mark.parametrize("t", [0.3, 1.0, 2.5])
def test_recalibrate_logit_is_softmax_of_log_p_over_t_per_row(mixed, t):
    out = recalibrate(mixed, t, "logit")
    for i, row in enumerate(mixed.rows):
        k = len(row["probs"])
        z = np.log(np.asarray(mixed.probs[i, :k])) / t
        expected = np.exp(z) / np.exp(z).sum()
        np.testing.assert_allclose(out[i, :k], expected, rtol=1e-12)
        assert np.all(out[i, k:] == 0)


@pytest.mark.parametrize("c", [0.05, 0.5, 1.0])
def test_recalibrate_paper_is_first_eq4_on_the_present_options(mixed, c):
    out = recalibrate(mixed, c, "paper")
    for i, row in enumerate(mixed.rows):
        k = len(row["probs"])
        np.testing.assert_allclose(out[i, :k], temperature_paper(mixed.probs[i, :k], c), rtol=1e-12)
        assert np.all(out[i, k:] == 0)


@pytest.mark.parametrize("t, form", [(0.0, "logit"), (-1.0, "paper"), (float("nan"), "logit"), (1.0, "cubic")])
def test_recalibrate_refuses_bad_arguments(hand, t, form):
    with pytest.raises(ValueError):
        recalibrate(hand, t, form)


# ---------------------------------------------------------------- calibration_summary
def test_calibration_summary_matches_hand_computed_numbers(hand):
    s = calibration_summary(hand.probs, hand.mask, hand.labels)
    # conf .95 .85 .75 .65, correct 1 0 1 0: each alone in its bin
    assert s["n"] == 4 and s["accuracy"] == 0.5
    assert s["ece"] == pytest.approx((0.05 + 0.85 + 0.25 + 0.65) / 4)
    assert s["trust"] == pytest.approx(0.5 - 0.45)
    assert s["nll"] == pytest.approx(-np.mean(np.log([0.95, 0.15, 0.75, 0.35])))
    assert s["brier"] == pytest.approx((2 * 0.05**2 + 2 * 0.85**2 + 2 * 0.25**2 + 2 * 0.65**2) / 4)
    assert s["cw_ece"] == metrics.classwise_ece(hand.probs, hand.labels, 10, hand.mask)
    assert s["strategy"] == "width" and s["n_bins"] == 10
    gaps = {m: b["gap"] for m, b in enumerate(s["reliability"]) if b["count"]}
    assert gaps == pytest.approx({6: 0.65, 7: -0.25, 8: 0.85, 9: -0.05})
    assert s["reliability"][0] == {"lo": 0.0, "hi": 0.1, "count": 0, "conf": None, "acc": None, "gap": None}
    json.dumps(s, allow_nan=False)  # JSON-ready, like metrics.json


def test_calibration_summary_closes_bins_on_the_side_asked_for(tmp_path):
    # conf 0.7 (right) and 0.65 (wrong). Right-closed (Guo): both in (0.6, 0.7], conf 0.675, acc 0.5
    # → ECE 0.175. Left-closed (torchmetrics): 0.7 opens [0.7, 0.8) → (|0.7 − 1| + |0.65 − 0|) / 2 = 0.475.
    probs, mask, labels = np.array([[0.7, 0.3], [0.65, 0.35]]), np.ones((2, 2), dtype=bool), np.array([0, 1])
    right, left = (calibration_summary(probs, mask, labels, edges=e) for e in ("right", "left"))
    assert right["ece"] == pytest.approx(0.175) and left["ece"] == pytest.approx(0.475)
    assert (right["bin_edges"], left["bin_edges"]) == ("right", "left")
    assert [b["count"] for b in right["reliability"]][5:9] == [0, 2, 0, 0]
    assert [b["count"] for b in left["reliability"]][5:9] == [0, 1, 1, 0]
    assert calibration_summary(probs, mask, labels)["ece"] == right["ece"]  # the papers' convention by default


def test_calibration_summary_equal_mass_bins(hand):
    s = calibration_summary(hand.probs, hand.mask, hand.labels, n_bins=2, strategy="mass")
    # sorted conf .65 .75 | .85 .95 -> (conf .70, acc .5) and (conf .90, acc .5)
    assert s["ece"] == pytest.approx((2 * 0.2 + 2 * 0.4) / 4)
    assert [b["conf"] for b in s["reliability"]] == pytest.approx([0.7, 0.9])
    assert [b["acc"] for b in s["reliability"]] == [0.5, 0.5]


def test_calibration_summary_with_padding_agrees_with_lab_metrics(mixed):
    s = calibration_summary(mixed.probs, mixed.mask, mixed.labels, n_bins=5)
    full = metrics.summarize(mixed.probs, mixed.labels, n_bins=5, mask=mixed.mask, n_boot=0)
    for key in ("accuracy", "ece", "nll", "brier", "cw_ece", "trust"):
        assert s[key] == pytest.approx(full[key], abs=1e-12), key
    assert s["reliability"] == full["reliability"]


# ---------------------------------------------------------------- temperature_sweep
@pytest.mark.parametrize("form", ["logit", "paper"])
def test_temperature_sweep_matches_a_brute_force_loop(mixed, form):
    grid = [0.05, 0.2, 0.5, 1.0, 2.0, 4.0]
    sweep = temperature_sweep(mixed, grid, form, n_bins=5)
    table, best_ece, best_nll = sweep.table, sweep.best_ece, sweep.best_nll
    assert sweep.widened == ""  # both optima inside the grid: nothing added
    eces, nlls = [], []
    for t in grid:
        q = recalibrate(mixed, t, form)
        pred, conf = metrics.predictions(q, mixed.mask)
        eces.append(metrics.ece(conf, pred == mixed.labels, 5))
        nlls.append(metrics.nll(q, mixed.labels))
    assert list(table.columns) == ["temperature", "ece", "nll", "accuracy"]
    np.testing.assert_allclose(table["ece"], eces)
    np.testing.assert_allclose(table["nll"], nlls)
    assert best_ece == grid[int(np.argmin(eces))] and best_nll == grid[int(np.argmin(nlls))]
    assert table["accuracy"].nunique() == 1  # temperature keeps each row's order


def test_temperature_sweep_default_grid_finds_the_nll_optimum_of_an_overconfident_model(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(0, 1.5, size=(300, 4))
    true = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    labels = [int(rng.choice(4, p=p)) for p in true]
    reported = np.exp(3 * z) / np.exp(3 * z).sum(1, keepdims=True)  # three times too sharp
    pred = load_predictions(write_eval(tmp_path / "over", [_row(i, p.tolist(), a) for i, (p, a) in
                                                            enumerate(zip(reported, labels))]))
    sweep = temperature_sweep(pred)
    assert len(sweep.table) == 81 and 2.0 < sweep.best_nll < 4.5 and sweep.widened == ""


def _constant_run(tmp_path, p_top, n, n_correct, **info):
    """n two-option rows reporting (p_top, 1 − p_top), the first n_correct right: one confidence, one
    bin, so ECE(T) = |conf(T) − acc| is 0 at a T found by hand (see each test)."""
    rows = [_row(i, [p_top, 1 - p_top], 0 if i < n_correct else 1) for i in range(n)]
    return load_predictions(write_eval(tmp_path / "constant", rows, **info))


def test_temperature_sweep_widens_past_an_edge_that_holds_the_optimum(tmp_path):
    pred = _constant_run(tmp_path, 0.99, 50, 27)  # acc 0.54
    logit = temperature_sweep(pred)
    # logit: conf(T) = σ(ln 99 / T) = 0.54 at T* = ln 99 / ln(27/23) = 28.66, beyond the grid's 10;
    # stopping at the edge would report T = 10 with ECE σ(ln 99 / 10) − 0.54 = 7.3 points
    step = LAB_SWEEP_GRIDS["logit"][1] / LAB_SWEEP_GRIDS["logit"][0]
    assert 28.66 / step <= logit.best_ece <= 28.66 * step and logit.table["ece"].min() < 0.005
    assert logit.table["temperature"].iloc[-1] == pytest.approx(40.0)  # 10 · 4: far enough, the optimum is inside
    assert logit.widened == "The lowest ECE and lowest NLL lay on the edge of T = 0.1…10, so the sweep went on to T = 0.1…40."
    assert list(logit.table["temperature"]) == sorted(logit.table["temperature"])
    # paper: conf(c) = σ(0.98 / c) = 0.54 at c* = 0.98 / ln(27/23) = 6.11, beyond the grid's 1
    paper = temperature_sweep(pred, form="paper")
    step = LAB_SWEEP_GRIDS["paper"][1] / LAB_SWEEP_GRIDS["paper"][0]
    assert 6.112 / step <= paper.best_ece <= 6.112 * step and "went on to T = 0.01…16" in paper.widened


def test_temperature_sweep_says_when_it_stops_at_the_bound(tmp_path):
    sweep = temperature_sweep(_constant_run(tmp_path, 0.99, 100, 51))  # T* = ln 99 / ln(51/49) = 115 > 100
    assert sweep.best_ece == 100.0 and "stopped at the bound T = 100" in sweep.widened


def test_temperature_sweep_bins_with_the_edges_asked_for(tmp_path):
    # confidences 0.7 (right) and 0.65 (wrong): right-closed, both in (0.6, 0.7]; left-closed, 0.7 opens [0.7, 0.8)
    pred = load_predictions(write_eval(tmp_path / "edge", [_row(0, [0.7, 0.3], 0), _row(1, [0.65, 0.35], 1)]))
    at_one = {edges: temperature_sweep(pred, [0.5, 1.0, 2.0], edges=edges).table.set_index("temperature").loc[1.0, "ece"]
              for edges in ("right", "left")}
    assert at_one == pytest.approx({"right": 0.675 - 0.5, "left": (0.3 + 0.65) / 2})
    with pytest.raises(ValueError, match="edges"):
        temperature_sweep(pred, edges="middle")


def test_temperature_sweep_refuses_an_empty_grid(hand):
    with pytest.raises(ValueError, match="temperatures"):
        temperature_sweep(hand, [])


# ---------------------------------------------------------------- cases
def test_case_table_rows(mixed):
    df = case_table(mixed)
    assert list(df.columns) == ["id", "dataset", "question", "options", "answer", "prediction", "confidence",
                                "correct", "overconfident_wrong"]
    assert df["dataset"].tolist() == ["pooled", "csqa", "pooled"]  # meta names a pooled question's source
    assert df.loc[0, "options"] == "A. choice 0 · B. choice 1 · C. choice 2"
    assert df["answer"].tolist() == ["A", "E", "B"] and df["prediction"].tolist() == ["A", "C", "A"]
    # default: what the run reported (row 0 after its temperature), not raw_probs
    np.testing.assert_allclose(df["confidence"], [0.5, 0.3, 0.7])
    np.testing.assert_allclose(df["overconfident_wrong"], [0.0, 0.3, 0.7])
    scaled = case_table(mixed, recalibrate(mixed, 1.0))
    assert scaled.loc[0, "confidence"] == pytest.approx(0.6)


def test_case_table_refuses_probs_of_another_shape(mixed):
    with pytest.raises(ValueError, match="shape"):
        case_table(mixed, np.ones((3, 2)))


@pytest.fixture
def cases():
    return pd.DataFrame({
        "id": list("abcdef"), "dataset": ["x", "x", "y", "x", "y", "x"],
        "confidence": [0.9, 0.4, 0.8, 0.95, 0.6, 0.3], "correct": [True, False, False, True, False, False],
    }).assign(overconfident_wrong=lambda d: np.where(d["correct"], 0.0, d["confidence"]))


def test_filter_cases_puts_the_surest_wrong_answers_first(cases):
    assert filter_cases(cases)["id"].tolist() == ["c", "e", "b", "f", "d", "a"]
    assert filter_cases(cases, "wrong")["id"].tolist() == ["c", "e", "b", "f"]
    assert filter_cases(cases, "correct")["id"].tolist() == ["d", "a"]
    # accuracy of the table is 2/6: wrong answers surer than that
    assert filter_cases(cases, "overconfident_wrong")["id"].tolist() == ["c", "e", "b"]


def test_filter_cases_by_confidence_and_dataset(cases):
    assert filter_cases(cases, "all", (0.4, 0.9))["id"].tolist() == ["c", "e", "b", "a"]  # inclusive
    assert filter_cases(cases, "all", dataset="y")["id"].tolist() == ["c", "e"]
    # within x, accuracy is 2/4: only b (0.4) and f (0.3) are wrong, neither above 0.5
    assert filter_cases(cases, "overconfident_wrong", dataset="x").empty
    assert filter_cases(cases, "wrong", dataset="x")["id"].tolist() == ["b", "f"]


def test_filter_cases_refuses_an_unknown_kind(cases):
    with pytest.raises(ValueError, match="kind"):
        filter_cases(cases, "lucky")


def test_same_question_across_runs(tmp_path):
    one = write_eval(tmp_path / "one", [_row(0, [0.2, 0.8], 1), _row(7, [0.6, 0.4], 1)])
    two = write_eval(tmp_path / "two", [_row(7, [0.1, 0.9], 1)])
    three = write_eval(tmp_path / "three", [_row(1, [0.5, 0.5], 0)])
    df = same_question([one, two, three], "q7")
    assert list(df.columns) == ["run", "answer", "prediction", "confidence", "correct", "probs"]
    assert df["run"].tolist() == [one.as_posix(), two.as_posix()]
    assert df["prediction"].tolist() == ["A", "B"] and df["correct"].tolist() == [False, True]
    assert df["confidence"].tolist() == [0.6, 0.9] and df["probs"].tolist() == [[0.6, 0.4], [0.1, 0.9]]
    assert same_question([three], "q7").empty


# ---------------------------------------------------------------- tables
def test_results_table_and_csv(tmp_path):
    rows = [_row(0, [0.6, 0.4], 0)]
    write_eval(tmp_path / "1", rows, mtime=1000, ece=0.123456, accuracy=0.654321, trust=0.530865, cw_ece=0.0499999,
               aurc=0.212345, auroc=0.712345)
    write_eval(tmp_path / "2" / "eval" / "first-csqa", rows, mtime=2000, dataset="csqa", n=100, in_domain=True)
    df = results_table(tmp_path)
    # the run, then the numbers a reader came for, then how it was made (issue 30: they were off-screen)
    assert list(df.columns) == ["run", "ECE", "ECE low", "ECE high", "accuracy", "Trust", "AURC", "AUROC", "n",
                                "cw-ECE", "oracle accuracy", "oracle ECE", "model", "dataset", "split", "scoring",
                                "domain", "folder"]
    assert df["domain"].tolist() == ["in", ""]  # a plain evaluation belongs to no pipeline
    assert df["folder"].tolist() == ["2/eval/first-csqa", "1"]
    assert df["run"].str.startswith("2 · eval/first-csqa · ").tolist() == [True, False]  # named for what it is
    assert df["ECE low"].isna().all()  # written without a bootstrap interval
    assert df.iloc[1][["ECE", "accuracy", "Trust", "cw-ECE"]].tolist() == [0.1235, 0.6543, 0.5309, 0.05]
    assert df.iloc[0]["n"] == 100 and df.iloc[0]["dataset"] == "csqa"
    assert df.iloc[1][["AURC", "AUROC"]].tolist() == [0.2123, 0.7123]
    assert df.iloc[0][["AURC", "AUROC"]].isna().all()  # evaluated before selective prediction was recorded
    back = pd.read_csv(io.StringIO(results_csv(df)), dtype={"folder": str})
    assert back.columns.tolist() == df.columns.tolist() and back["folder"].tolist() == df["folder"].tolist()
    assert results_table(tmp_path / "none").empty


def test_positionwise_topk(tmp_path):
    def top(*pairs):
        return [{"token": t, "prob": p} for t, p in pairs]

    rows = [
        _row(0, [0.5, 0.5], 1, top_tokens=top((" A", 0.5), ("b", 0.3), ("C", 0.1))),  # answer B, rank 2
        _row(1, [0.5, 0.5], 0, top_tokens=top(("The", 0.2), (" a", 0.6), ("B", 0.1))),  # answer A, rank 1 once sorted
        _row(2, [0.5, 0.5], 0),  # cloze rows have no top tokens
    ]
    df = positionwise_topk(load_predictions(write_eval(tmp_path / "r", rows)))
    assert df.columns.tolist() == ["rank", "mean_prob", "answer_in_topk"]
    assert df["rank"].tolist() == [1, 2, 3]
    np.testing.assert_allclose(df["mean_prob"], [0.55, 0.25, 0.1])
    np.testing.assert_allclose(df["answer_in_topk"], [0.5, 1.0, 1.0])
    cloze = positionwise_topk(load_predictions(write_eval(tmp_path / "c", rows[2:])))
    assert cloze.empty and cloze.columns.tolist() == ["rank", "mean_prob", "answer_in_topk"]
