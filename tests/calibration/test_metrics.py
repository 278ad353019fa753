"""Tests for lab.calibration.metrics: independent references (torchmetrics, sklearn, torch, loops written here)
over parameter grids, and closed-form cases computed by hand."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import brier_score_loss, log_loss

from lab.calibration import metrics as M
from tests.helpers import imported_by

pytestmark = pytest.mark.unit


def dirichlet(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random float64 probabilities (n, K), strictly below 1.0, and labels drawn from them."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(k, 0.7), size=n)
    labels = np.array([rng.choice(k, p=row) for row in probs])
    assert probs.max() < 1.0
    return probs, labels


def conf_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return probs.max(axis=1), probs.argmax(axis=1) == labels


def torchmetrics_ce(probs: np.ndarray, labels: np.ndarray, n_bins: int, norm: str) -> float:
    """torchmetrics' ECE or MCE. Imported here, not with the module: its text metrics bring transformers'
    BERT with it (2.2 s), which every test process paid while collecting the suite."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    return multiclass_calibration_error(
        torch.from_numpy(probs), torch.from_numpy(labels),
        num_classes=probs.shape[1], n_bins=n_bins, norm=norm,
    ).item()


def classwise_ece_loops(probs, labels, n_bins, mask=None, edges="left") -> float:
    """Kull et al.'s cw-ECE with explicit loops; a class term is normalised by the number of
    questions offering that class, and classes never offered are skipped. ``edges``: which end of
    a bin is closed (the random inputs of most tests never sit on an edge)."""
    n, k = probs.shape
    if mask is None:
        mask = np.ones((n, k), dtype=bool)
    terms = []
    for c in range(k):
        offered = [i for i in range(n) if mask[i, c]]
        if not offered:
            continue
        term = 0.0
        for m in range(n_bins):
            lo, hi = m / n_bins, (m + 1) / n_bins
            if edges == "left":
                members = [i for i in offered if lo <= probs[i, c] < hi or (m == n_bins - 1 and probs[i, c] == 1.0)]
            else:
                members = [i for i in offered if lo < probs[i, c] <= hi or (m == 0 and probs[i, c] == 0.0)]
            if members:
                mean_p = sum(probs[i, c] for i in members) / len(members)
                freq = sum(1 for i in members if labels[i] == c) / len(members)
                term += len(members) / len(offered) * abs(freq - mean_p)
        terms.append(term)
    return sum(terms) / len(terms)


# ------------------------------------------------------------ ECE / MCE vs torchmetrics
@pytest.mark.parametrize("n", [1, 7, 500])
@pytest.mark.parametrize("k", [2, 4, 5])
@pytest.mark.parametrize("n_bins", [5, 10, 15])
def test_ece_mce_match_torchmetrics(n, k, n_bins):
    probs, labels = dirichlet(n, k, seed=1000 * n + 10 * k + n_bins)
    conf, correct = conf_correct(probs, labels)
    # torchmetrics casts confidences to float32, hence the tolerance
    assert M.ece(conf, correct, n_bins) == pytest.approx(
        torchmetrics_ce(probs, labels, n_bins, "l1"), abs=1e-6)
    assert M.mce(conf, correct, n_bins) == pytest.approx(
        torchmetrics_ce(probs, labels, n_bins, "max"), abs=1e-6)


def test_confidence_one_goes_to_last_bin_unlike_torchmetrics():
    # row 0: conf 1.0, wrong; row 1: conf 0.75, right; 4 bins, edges 0, .25, .5, .75, 1
    probs = np.array([[1.0, 0.0], [0.75, 0.25]])
    labels = np.array([1, 0])
    conf, correct = conf_correct(probs, labels)
    assert M.bin_indices(conf, 4, edges="left").tolist() == [3, 3]
    # left-closed, ours: one bin [.75, 1], conf 0.875, acc 0.5 -> 0.375
    assert M.ece(conf, correct, 4, edges="left") == pytest.approx(0.375)
    # torchmetrics: bin 3 {0.75 right} |1 - .75|/2 = .125, extra bin {1.0 wrong} |0 - 1|/2 = .5
    assert torchmetrics_ce(probs, labels, 4, "l1") == pytest.approx(0.625)
    assert torchmetrics_ce(probs, labels, 4, "l1") - M.ece(conf, correct, 4, edges="left") == pytest.approx(0.25)
    # Guo (right-closed): 0.75 closes bin 2 (.5, .75], 1.0 closes bin 3: |1-.75|/2 + |0-1|/2
    assert M.bin_indices(conf, 4).tolist() == [3, 2]
    assert M.ece(conf, correct, 4) == pytest.approx(0.625)


# ----------------------------------------------------------------------- binning
def guo_ece_loops(conf, correct, n_bins: int) -> float:
    """Guo et al. 2017 as printed, with loops: bin m holds (m-1)/M < c <= m/M, m = 1..M; a
    confidence of exactly 0 joins bin 1 (it belongs to no half-open bin)."""
    total = 0.0
    for m in range(1, n_bins + 1):
        lo, hi = (m - 1) / n_bins, m / n_bins
        members = [i for i, c in enumerate(conf) if lo < c <= hi or (m == 1 and c == 0.0)]
        if members:
            gap = sum(correct[i] for i in members) / len(members) - sum(conf[i] for i in members) / len(members)
            total += len(members) / len(conf) * abs(gap)
    return total


EDGE_VALUES = [0.0, 0.1, 0.2, 0.25, 0.3, 0.4, 0.45, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0]


@pytest.mark.parametrize("n_bins", [2, 4, 10, 14, 15])
def test_right_edges_match_guo_loops_on_edges_and_random(n_bins):
    rng = np.random.default_rng(n_bins)
    conf = np.concatenate([rng.uniform(size=300), np.arange(n_bins + 1) / n_bins, EDGE_VALUES])
    correct = rng.uniform(size=conf.size) < conf
    assert M.ece(conf, correct, n_bins) == pytest.approx(guo_ece_loops(conf.tolist(), correct.tolist(), n_bins),
                                                         abs=1e-12)


@pytest.mark.parametrize("n_bins", [2, 4, 5, 10])
def test_left_edges_match_torchmetrics_on_edges(n_bins):
    """torchmetrics bins ``[m/M, (m+1)/M)`` in float32, where 0.3 and the edge 3/10 are the same
    float32, so a confidence on an edge is on it for both. (1.0 is left out: torchmetrics opens an
    extra bin for it, see above. M = 15 is left out too: its float32 ``linspace`` puts some edges
    m/15 one float32 step away from the fraction, so its own edge values are not on its edges.)"""
    values = np.array([v for v in EDGE_VALUES if v < 1.0] + (np.arange(n_bins) / n_bins).tolist())
    conf = np.repeat(values, 2)
    correct = np.tile([True, False], values.size) ^ (np.arange(conf.size) % 3 == 0)
    probs = np.zeros((conf.size, 10))
    probs[:, 0] = conf
    probs[:, 1:] = ((1 - conf) / 9)[:, None]  # every other option below the top, even at conf 0.1
    keep = conf > 0.1
    probs, conf, correct = probs[keep], conf[keep], correct[keep]
    labels = np.where(correct, 0, 1)
    assert M.ece(conf, correct, n_bins, edges="left") == pytest.approx(torchmetrics_ce(probs, labels, n_bins, "l1"),
                                                                       abs=1e-6)
    assert M.mce(conf, correct, n_bins, edges="left") == pytest.approx(torchmetrics_ce(probs, labels, n_bins, "max"),
                                                                       abs=1e-6)


def test_edges_issue_example():
    """Confidences (0.5, 0.45), correctness (1, 0): Guo puts both in (0.4, 0.5] (conf .475, acc .5),
    torchmetrics' convention splits them (0.5 alone in [0.5, 0.6), wrong by 0.5 at weight 1/2)."""
    assert M.ece([0.5, 0.45], [1, 0]) == pytest.approx(0.025)
    assert M.ece([0.5, 0.45], [1, 0], edges="left") == pytest.approx(0.475)
    assert M.mce([0.5, 0.45], [1, 0]) == pytest.approx(0.025)
    assert M.mce([0.5, 0.45], [1, 0], edges="left") == pytest.approx(0.5)


def test_width_bins_hand():
    conf = [0.0, 0.05, 0.1, 0.25, 0.3, 0.6, 0.7, 0.999, 1.0]
    assert M.bin_indices(conf, 10).tolist() == [0, 0, 0, 2, 2, 5, 6, 9, 9]
    assert M.bin_indices(conf, 10, edges="left").tolist() == [0, 0, 1, 2, 3, 6, 7, 9, 9]


def test_every_binned_metric_follows_edges():
    """A 2-option tie that is right (conf 0.5) and a 0.55 that is wrong, by hand in each convention:
    right-closed keeps them apart ((.4, .5] and (.5, .6]), left-closed puts both in [.5, .6)."""
    probs = np.array([[0.5, 0.5], [0.55, 0.45]])
    labels = np.array([0, 1])  # both rows predict option 0 (the first wins the tie)
    conf, correct = np.array([0.5, 0.55]), np.array([1, 0])
    expected = {"right": (0.5 * 0.5 + 0.5 * 0.55, [0, 0, 0, 0, 1, 1, 0, 0, 0, 0], 0.55),
                "left": (abs(0.525 - 0.5), [0, 0, 0, 0, 0, 2, 0, 0, 0, 0], 0.025)}
    for edges, (ece, counts, mce) in expected.items():
        assert M.ece(conf, correct, 10, edges=edges) == pytest.approx(ece)
        assert M.mce(conf, correct, 10, edges=edges) == pytest.approx(mce)
        assert M.reliability_table(conf, correct, 10, edges=edges)["count"].tolist() == counts
        summary = M.summarize(probs, labels, 10, n_boot=20, edges=edges)
        assert summary["bin_edges"] == edges and summary["ece"] == pytest.approx(ece)
        assert [row["count"] for row in summary["reliability"]] == counts
        # a replicate holds a share f of row 0 (f = 0, 1/2 or 1): right-closed gives
        # f·0.5 + (1 − f)·0.55, left-closed |f − (0.5 f + 0.55 (1 − f))|, i.e. .55, .025 or .5
        replicates = {"right": (0.5, 0.55), "left": (0.025, 0.55)}[edges]
        assert M.ece_bootstrap(conf, correct, 10, n_boot=200, edges=edges) == pytest.approx(replicates)
    with pytest.raises(ValueError, match="`edges`"):
        M.ece([0.5], [1], edges="middle")


@pytest.mark.parametrize("edges", ["right", "left"])
def test_binned_metrics_match_loops_on_edge_values(edges):
    """cw-ECE and the bootstrap against loops written here, on confidences that sit on edges."""
    rng = np.random.default_rng(11)
    raw = rng.choice(np.arange(1, 10), size=(60, 3)).astype(float)
    probs = np.round(raw / raw.sum(axis=1, keepdims=True) * 10) / 10  # many values exactly k/10
    probs[:, 2] = 1 - probs[:, 0] - probs[:, 1]
    probs = np.clip(probs, 0, 1)
    labels = rng.integers(0, 3, size=60)
    assert M.classwise_ece(probs, labels, 10, edges=edges) == pytest.approx(
        classwise_ece_loops(probs, labels, 10, edges=edges), abs=1e-12)
    conf, correct = conf_correct(probs, labels)
    replicates = []
    draw = np.random.default_rng(5)
    for _ in range(300):
        idx = draw.integers(0, 60, size=60)
        replicates.append(M.ece(conf[idx], correct[idx], 10, edges=edges))
    expected = np.quantile(replicates, [0.025, 0.975])
    assert M.ece_bootstrap(conf, correct, 10, n_boot=300, seed=5, edges=edges) == pytest.approx(tuple(expected),
                                                                                                  abs=1e-12)


def test_mass_bins_hand():
    assert M.bin_indices([0.3, 0.1, 0.2], 5, "mass").tolist() == [2, 0, 1]  # n < M: 3, 4 empty
    assert M.bin_indices([0.5, 0.5, 0.5, 0.5], 2, "mass").tolist() == [0, 0, 0, 0]  # a tie is never split
    # array_split: the first bins take the remainder, {.1, .2, .5} then {.8, .9}
    assert M.bin_indices([0.9, 0.1, 0.5, 0.2, 0.8], 2, "mass").tolist() == [1, 0, 0, 0, 1]


# ------------------------------------------------------------------- hand ECE cases
def test_ece_conf_exactly_zero_and_one():
    conf, correct = [0.0, 0.0, 1.0, 1.0], [0, 1, 1, 1]
    # bin 0: conf 0, acc .5, weight 2/4 -> .25; bin 9: conf 1, acc 1 -> 0
    assert M.ece(conf, correct) == pytest.approx(0.25)
    assert M.mce(conf, correct) == pytest.approx(0.5)


def test_ece_with_empty_bins():
    conf, correct = [0.15, 0.15, 0.85], [1, 0, 1]
    # bin 1: |.5 - .15| * 2/3; bin 8: |1 - .85| * 1/3; the 8 other bins are empty
    assert M.ece(conf, correct) == pytest.approx((0.35 * 2 + 0.15) / 3)
    assert M.mce(conf, correct) == pytest.approx(0.35)


def test_single_sample():
    assert M.ece([0.6], [0]) == pytest.approx(0.6)
    assert M.ece([0.6], [1]) == pytest.approx(0.4)
    assert M.mce([0.6], [1]) == pytest.approx(0.4)
    assert M.ece([0.6], [1], strategy="mass") == pytest.approx(0.4)


def test_perfectly_calibrated_is_exactly_zero():
    conf = [0.75] * 4 + [0.25] * 4  # exactly representable: the bin sums are exact
    correct = [1, 1, 1, 0] + [1, 0, 0, 0]
    assert M.ece(conf, correct) == 0.0
    assert M.mce(conf, correct) == 0.0
    assert M.ece([0.7] * 10, [1] * 7 + [0] * 3) == pytest.approx(0.0, abs=1e-12)


def test_all_wrong_at_full_confidence():
    assert M.ece([1.0] * 5, [0] * 5) == 1.0
    assert M.mce([1.0] * 5, [False] * 5) == 1.0


def test_equal_mass_ece_hand():
    conf, correct = [0.6, 0.7, 0.8, 0.9], [0, 1, 1, 1]
    # equal width, 2 bins: all in [.5, 1], conf .75 = acc .75 -> 0
    assert M.ece(conf, correct, 2) == pytest.approx(0.0, abs=1e-12)
    # equal mass: {.6, .7} conf .65 acc .5 and {.8, .9} conf .85 acc 1, each weight 1/2
    assert M.ece(conf, correct, 2, "mass") == pytest.approx(0.15)


def test_equal_mass_ece_matches_sorted_reshape():
    rng = np.random.default_rng(5)
    conf = rng.uniform(size=120)
    correct = rng.uniform(size=120) < conf**2
    order = np.argsort(conf)
    groups_conf = conf[order].reshape(8, 15)
    groups_acc = correct[order].reshape(8, 15)
    expected = np.mean(np.abs(groups_conf.mean(axis=1) - groups_acc.mean(axis=1)))
    assert M.ece(conf, correct, 8, "mass") == pytest.approx(expected)


def test_reliability_table_hand():
    conf = [0.15, 0.15, 0.85, 0.85, 0.85, 0.85]
    correct = [1, 0, 1, 1, 0, 0]
    table = M.reliability_table(conf, correct, 10)
    assert table["count"].tolist() == [0, 2, 0, 0, 0, 0, 0, 0, 4, 0]
    assert table["lo"][8] == pytest.approx(0.8) and table["hi"][8] == pytest.approx(0.9)
    assert table["conf"][[1, 8]] == pytest.approx([0.15, 0.85])
    assert table["acc"][[1, 8]] == pytest.approx([0.5, 0.5])
    assert table["gap"][1] == pytest.approx(-0.35)  # under-confident
    assert table["gap"][8] == pytest.approx(0.35)  # over-confident
    empty = table["count"] == 0
    for key in ("conf", "acc", "gap"):
        assert np.isnan(table[key][empty]).all()
    weights = table["count"][~empty] / 6
    assert M.ece(conf, correct) == pytest.approx(np.sum(weights * np.abs(table["gap"][~empty])))


def test_reliability_table_mass_bounds():
    table = M.reliability_table([0.9, 0.1, 0.5, 0.2, 0.8], [1, 0, 1, 0, 0], 3, "mass")
    assert table["count"].tolist() == [2, 2, 1]
    assert table["lo"].tolist() == [0.1, 0.5, 0.9]
    assert table["hi"].tolist() == [0.2, 0.8, 0.9]
    assert table["acc"] == pytest.approx([0.0, 0.5, 1.0])
    empty = M.reliability_table([0.4], [1], 3, "mass")
    assert empty["count"].tolist() == [1, 0, 0] and np.isnan(empty["lo"][1:]).all()


# ------------------------------------------------------------------------ cw-ECE
def test_classwise_ece_hand_k2():
    probs = np.array([[0.8, 0.2], [0.8, 0.2], [0.4, 0.6]])
    labels = np.array([0, 1, 1])
    # class 0: bin {.8, .8} freq .5 -> .3 * 2/3; {.4} freq 0 -> .4 / 3; class 1 mirrors it
    assert M.classwise_ece(probs, labels, 10) == pytest.approx(0.2 + 0.4 / 3)


def test_classwise_ece_hand_k3():
    probs = np.array([[0.7, 0.2, 0.1], [0.7, 0.2, 0.1], [0.1, 0.2, 0.7], [0.2, 0.7, 0.1]])
    labels = np.array([0, 1, 2, 1])
    # 5 bins. class 0: {.7,.7} |.5-.7|*2/4 + {.1} .1/4 + {.2} .2/4 = .175
    # class 1: {.2,.2,.2} |1/3-.2|*3/4 + {.7} .3/4 = .175; class 2: {.1 x3} .1*3/4 + {.7} .3/4 = .15
    assert M.classwise_ece(probs, labels, 5) == pytest.approx((0.175 + 0.175 + 0.15) / 3)


@pytest.mark.parametrize("n, k, n_bins", [(1, 2, 10), (40, 3, 5), (300, 5, 15)])
def test_classwise_ece_matches_loops_and_textbook(n, k, n_bins):
    probs, labels = dirichlet(n, k, seed=n + k)
    ours = M.classwise_ece(probs, labels, n_bins)
    assert ours == pytest.approx(classwise_ece_loops(probs, labels, n_bins), abs=1e-12)
    # textbook, all options present: sum over classes with weight |B_cm|/n, then / K
    textbook = 0.0
    for c in range(k):
        bins = M.bin_indices(probs[:, c], n_bins)
        for m in np.unique(bins):
            sel = bins == m
            textbook += sel.sum() / n * abs(np.mean(labels[sel] == c) - probs[sel, c].mean())
    assert ours == pytest.approx(textbook / k, abs=1e-12)


def test_classwise_ece_masked_hand():
    probs = np.array([[0.8, 0.2, 0.0], [0.3, 0.3, 0.4]])
    mask = np.array([[True, True, False], [True, True, True]])
    labels = np.array([0, 2])
    # class 0: (|1-.8| + |0-.3|)/2 = .25; class 1: (.2 + .3)/2 = .25; class 2 offered once: |1-.4|
    assert M.classwise_ece(probs, labels, 10, mask) == pytest.approx((0.25 + 0.25 + 0.6) / 3)
    padded = probs.copy()
    padded[0, 2] = 0.5  # a padded entry is ignored, whatever it holds
    assert M.classwise_ece(padded, labels, 10, mask) == M.classwise_ece(probs, labels, 10, mask)


def test_classwise_ece_skips_classes_never_offered():
    probs, labels = dirichlet(50, 3, seed=12)
    padded = np.concatenate([probs, np.zeros((50, 1))], axis=1)  # option D never offered
    mask = np.concatenate([np.ones((50, 3), bool), np.zeros((50, 1), bool)], axis=1)
    assert M.classwise_ece(padded, labels, 10, mask) == pytest.approx(
        M.classwise_ece(probs, labels, 10), abs=1e-12)


def test_classwise_ece_masked_variable_options_matches_loops():
    rng = np.random.default_rng(11)
    n, k = 90, 5
    n_options = rng.integers(2, k + 1, size=n)
    mask = np.arange(k)[None, :] < n_options[:, None]
    probs = np.zeros((n, k))
    labels = np.zeros(n, dtype=int)
    for i, width in enumerate(n_options):
        probs[i, :width] = rng.dirichlet(np.ones(width))
        labels[i] = rng.choice(width, p=probs[i, :width])
    ours = M.classwise_ece(probs, labels, 10, mask)
    assert ours == pytest.approx(classwise_ece_loops(probs, labels, 10, mask), abs=1e-12)
    # dividing by n instead of n_c would give a different number: the convention is visible
    assert ours != pytest.approx(M.classwise_ece(probs, labels, 10), abs=1e-3)


# ------------------------------------------------------------ Brier, NLL, accuracy
def test_brier_k2_is_twice_sklearn_binary():
    probs, labels = dirichlet(200, 2, seed=4)
    assert M.brier(probs, labels) == pytest.approx(2 * brier_score_loss(labels, probs[:, 1]))


def test_brier_hand_and_mask():
    probs = np.array([[0.5, 0.25, 0.25], [0.0, 1.0, 0.0]])
    labels = np.array([0, 0])
    # (.25 + .0625 + .0625) and (1 + 1): mean 1.1875; certain and wrong scores the maximum, 2
    assert M.brier(probs, labels) == pytest.approx(1.1875)
    assert M.brier(probs[1:], labels[1:]) == pytest.approx(2.0)
    padded = np.array([[0.5, 0.5, 0.7]])
    mask = np.array([[True, True, False]])
    assert M.brier(padded, np.array([1]), mask) == pytest.approx(0.5)


@pytest.mark.parametrize("k", [2, 5])
def test_nll_matches_torch_and_sklearn(k):
    probs, labels = dirichlet(300, k, seed=k)
    ours = M.nll(probs, labels)
    p, y = torch.from_numpy(probs), torch.from_numpy(labels)
    assert ours == pytest.approx(torch.nn.functional.nll_loss(torch.log(p), y).item(), rel=1e-12)
    assert ours == pytest.approx(log_loss(labels, probs, labels=list(range(k))), rel=1e-9)


def test_nll_zero_probability_is_clipped():
    probs, labels = np.array([[1.0, 0.0]]), np.array([1])
    assert M.nll(probs, labels) == pytest.approx(-np.log(1e-12))
    assert M.nll(probs, labels, eps=1e-6) == pytest.approx(-np.log(1e-6))


def test_predictions_and_accuracy():
    probs = np.array([[0.4, 0.4, 0.2], [0.1, 0.2, 0.7], [0.3, 0.0, 0.7]])
    mask = np.array([[True, True, True], [True, True, True], [True, True, False]])
    pred, conf = M.predictions(probs, mask)
    assert pred.tolist() == [0, 2, 0]  # tie -> first index; padded 0.7 is not an option
    assert conf.tolist() == [0.4, 0.7, 0.3]
    # every present option at 0 (e.g. underflow): still a present option is predicted
    pred, _ = M.predictions(np.array([[0.0, 0.0]]), np.array([[False, True]]))
    assert pred.tolist() == [1]
    assert M.accuracy(probs, np.array([0, 1, 0]), mask) == pytest.approx(2 / 3)
    assert M.trust(0.8, 0.1) == pytest.approx(0.7)


# ------------------------------------------------------------------------ smECE
def test_smooth_ece_calibrated_sample_is_small():
    rng = np.random.default_rng(0)
    conf = rng.uniform(size=5000)
    correct = rng.uniform(size=5000) < conf
    assert M.smooth_ece(conf, correct) < 0.03
    assert M.smooth_ece(conf, correct) > 0.0


def test_smooth_ece_all_wrong():
    assert M.smooth_ece([0.9] * 200, [0] * 200) == pytest.approx(0.9, abs=0.01)


def test_smooth_ece_is_relplots_own_without_its_plotting_imports():
    """The metric module loaded apart from relplot's package gives the package's value exactly, and a
    fresh process that computes it imports none of relplot's plotting stack."""
    import relplot

    rng = np.random.default_rng(1)
    conf = rng.uniform(size=700)
    correct = rng.uniform(size=700) < conf ** 2
    assert M.smooth_ece(conf, correct) == float(relplot.smECE(conf, correct.astype(float)))
    code = "from lab.calibration.metrics import smooth_ece; smooth_ece([0.2, 0.9], [0, 1])"
    assert imported_by(code, {"relplot", "matplotlib", "seaborn", "sklearn"}) == set()


# --------------------------------------------------------------------- bootstrap
def miscalibrated(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.5, 1.0, size=n)
    return conf, rng.uniform(size=n) < conf - 0.2  # over-confident by 0.2


def test_bootstrap_contains_point_and_is_deterministic():
    conf, correct = miscalibrated(500, seed=1)
    low, high = M.ece_bootstrap(conf, correct, n_boot=500, seed=7)
    assert low < M.ece(conf, correct) < high
    assert M.ece_bootstrap(conf, correct, n_boot=500, seed=7) == (low, high)
    assert M.ece_bootstrap(conf, correct, n_boot=500, seed=8) != (low, high)


def test_bootstrap_matches_replicate_loop():
    conf, correct = miscalibrated(80, seed=4)
    rng = np.random.default_rng(5)
    replicates = []
    for _ in range(400):
        idx = rng.integers(0, 80, size=80)  # same stream as the vectorised (400, 80) draw
        replicates.append(M.ece(conf[idx], correct[idx], 10))
    for level in (0.95, 0.5):
        expected = np.quantile(replicates, [(1 - level) / 2, (1 + level) / 2])
        ours = M.ece_bootstrap(conf, correct, 10, n_boot=400, level=level, seed=5)
        assert ours == pytest.approx(tuple(expected), abs=1e-12)


def test_bootstrap_narrows_with_n():
    widths = []
    for n in (200, 5000):
        low, high = M.ece_bootstrap(*miscalibrated(n, seed=2), n_boot=300)
        widths.append(high - low)
    assert widths[1] < widths[0] / 2


def test_bootstrap_chunks_do_not_change_result(monkeypatch):
    conf, correct = miscalibrated(100, seed=3)
    whole = M.ece_bootstrap(conf, correct, n_boot=50)
    monkeypatch.setattr(M, "_BOOT_CHUNK", 300)  # 3 replicates per chunk
    assert M.ece_bootstrap(conf, correct, n_boot=50) == whole


# -------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: M.ece([0.5], [1], n_bins=0),
         r"Expected `n_bins` to be an integer larger than 0, but got 0\."),
        (lambda: M.mce([0.5], [1], n_bins=2.5), r"`n_bins` to be an integer"),
        (lambda: M.ece([0.5], [1], strategy="quantile"), r"`strategy` to be one of"),
        (lambda: M.ece([[0.5, 0.5]], [1]), r"`conf` to have shape \(n,\)"),
        (lambda: M.ece([], []), r"`conf` to have shape \(n,\) with n >= 1"),
        (lambda: M.ece([0.5, 0.6], [1]), r"`correct` to have the shape of `conf`"),
        (lambda: M.ece([0.5], [2]), r"`correct` to hold booleans or 0/1"),
        (lambda: M.ece([1.5], [1]), r"`conf` to be probabilities in \[0, 1\]"),
        (lambda: M.ece([np.nan], [1]), r"`conf` to contain only finite values"),
        (lambda: M.brier([[1.2, -0.2]], [0]), r"`probs` to be probabilities in \[0, 1\]"),
        (lambda: M.brier([0.5, 0.5], [0]), r"`probs` to have shape \(n, K\)"),
        (lambda: M.nll([[0.5, 0.5]], [2]), r"`labels` in \[0, 1\], but got 2"),
        (lambda: M.accuracy([[0.5, 0.5]], [-1]), r"`labels` in \[0, 1\]"),
        (lambda: M.accuracy([[0.5, 0.5]], [0.0]), r"`labels` to be integers of shape \(1,\)"),
        (lambda: M.brier([[0.5, 0.5], [0.5, 0.5]], [0]),
         r"`labels` to be integers of shape \(2,\)"),
        (lambda: M.classwise_ece([[1.0, 0.0]], [1], mask=np.array([[True, False]])),
         r"`labels` to point at present options"),
        (lambda: M.classwise_ece([[1.0, 0.0]], [0], mask=np.array([[True]])),
         r"`mask` to be a bool array of shape \(1, 2\)"),
        (lambda: M.predictions([[1.0, 0.0]], np.array([[False, False]])),
         r"every question to have a present option"),
        (lambda: M.nll([[1.0, 0.0]], [0], eps=0), r"`eps` to be a float in \(0, 1\)"),
        (lambda: M.ece_bootstrap([0.5], [1], n_boot=0), r"`n_boot` to be an integer of at least 1"),
        (lambda: M.ece_bootstrap([0.5], [1], level=95), r"`level` to be a float in \(0, 1\)"),
        (lambda: M.summarize([[1.0, 0.0]], [0], n_bins=0), r"`n_bins`"),
    ],
)
def test_invalid_inputs_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_tiny_float_error_is_tolerated_and_clipped():
    assert M.ece([1.0 + 1e-9, -1e-9], [1, 0]) == pytest.approx(0.0)
    assert M.bin_indices([1.0 + 1e-9, -1e-9], 10).tolist() == [9, 0]
    assert M.brier([[1.0 + 1e-9, -1e-9]], [0]) == pytest.approx(0.0)


# --------------------------------------------------------------------- summarize
KEYS = {
    "n", "accuracy", "ece", "ece_equal_mass", "mce", "cw_ece", "brier", "nll", "trust", "smece",
    "ece_ci_low", "ece_ci_high", "ece_ci_level", "n_bins", "bin_edges", "reliability",
}


def test_summarize_is_complete_and_json_ready():
    probs, labels = dirichlet(150, 4, seed=9)
    summary = M.summarize(probs, labels, n_bins=15, n_boot=200)
    assert set(summary) == KEYS
    json.dumps(summary, allow_nan=False)
    conf, correct = conf_correct(probs, labels)
    assert summary["n"] == 150 and summary["n_bins"] == 15
    assert summary["ece"] == M.ece(conf, correct, 15)
    assert summary["accuracy"] == M.accuracy(probs, labels)
    assert summary["trust"] == summary["accuracy"] - summary["ece"]
    assert summary["ece_ci_low"] <= summary["ece_ci_high"] and summary["ece_ci_level"] == 0.95
    rows = summary["reliability"]
    assert len(rows) == 15 and sum(row["count"] for row in rows) == 150
    assert any(row["conf"] is None for row in rows)  # 15 bins, K = 4: bins below 1/4 are empty
    assert all(type(row["count"]) is int for row in rows)


def test_summarize_without_bootstrap_and_with_mask():
    probs = np.array([[0.6, 0.4, 0.0], [0.2, 0.3, 0.5], [0.9, 0.1, 0.0]])
    mask = np.array([[True, True, False], [True, True, True], [True, True, False]])
    labels = np.array([0, 1, 1])
    summary = M.summarize(probs, labels, mask=mask, n_boot=0)
    assert summary["ece_ci_low"] is None and summary["ece_ci_high"] is None
    assert summary["ece_ci_level"] is None
    assert summary["accuracy"] == pytest.approx(1 / 3)
    assert summary["cw_ece"] == M.classwise_ece(probs, labels, 10, mask)
    json.dumps(summary, allow_nan=False)


def test_summarize_confidence_is_summarize_without_the_option_metrics():
    """A token run's summary (confidence and correctness only) holds exactly what ``summarize`` computes
    from the same predictions, each key equal to the public metric on the same arrays."""
    probs, labels = dirichlet(120, 5, seed=4)
    conf, correct = conf_correct(probs, labels)
    full = M.summarize(probs, labels, n_bins=12, n_boot=150, seed=3, edges="left")
    part = M.summarize_confidence(conf, correct, n_bins=12, n_boot=150, seed=3, edges="left")
    assert set(part) == KEYS - {"cw_ece", "brier", "nll"}
    assert part == {key: full[key] for key in part}
    assert part["mce"] == M.mce(conf, correct, 12, edges="left")
    assert (part["ece_ci_low"], part["ece_ci_high"]) == M.ece_bootstrap(conf, correct, 12, 150, 0.95, 3, "left")
    with pytest.raises(ValueError, match="`correct`"):
        M.summarize_confidence(conf, correct[:-1])
