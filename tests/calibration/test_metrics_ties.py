"""Equal-mass bins under tied confidences (issue 30, item 12): a tie group is never split, so the
equal-mass ECE is a function of the (confidence, correct) pairs as a multiset, not of their order.

References written here: a plain argsort + ``np.array_split`` for data without ties (today's
binning, which must not change), and a loop that gives every tie group the bin that split gives
its first member, for data with ties."""
from __future__ import annotations

import numpy as np
import pytest

from lab.calibration import metrics as M
from lab.results.analysis import ece_robustness

pytestmark = pytest.mark.unit


def split_bins(conf: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-mass bins as first written: sort, then ``np.array_split`` into n_bins groups."""
    bins = np.empty(conf.size, dtype=int)
    for m, group in enumerate(np.array_split(np.argsort(conf, kind="stable"), n_bins)):
        bins[group] = m
    return bins


def tie_bins(conf: np.ndarray, n_bins: int) -> np.ndarray:
    """The documented rule, one value at a time: each confidence goes where ``np.array_split`` of
    the sorted list puts the first (lowest-ranked) copy of it."""
    ordered = sorted(conf.tolist())
    split_of_rank = split_bins(np.arange(conf.size, dtype=float), n_bins)  # rank r -> its bin
    return np.array([split_of_rank[ordered.index(c)] for c in conf.tolist()])


def ece_of(bins: np.ndarray, conf: np.ndarray, correct: np.ndarray) -> float:
    """``Σ_m |B_m|/n · |acc_m − conf_m|`` with a loop over the non-empty bins."""
    total = 0.0
    for m in np.unique(bins):
        inside = bins == m
        total += inside.sum() / conf.size * abs(correct[inside].mean() - conf[inside].mean())
    return total


def test_tied_confidences_share_one_bin_whatever_the_order():
    conf, correct = np.full(10, 0.6), np.array([1] * 6 + [0] * 4)
    # all ten in one bin: conf 0.6, accuracy 6/10 -> |0.6 − 0.6| = 0 (the old split gave 0.48 here)
    assert M.ece(conf, correct, 5, "mass") == pytest.approx(0.0, abs=1e-12)
    assert M.ece(conf, np.array([1, 0] * 4 + [1, 1]), 5, "mass") == pytest.approx(0.0, abs=1e-12)  # was 0.16
    rng = np.random.default_rng(0)
    for _ in range(8):
        assert M.ece(conf, rng.permutation(correct), 5, "mass") == pytest.approx(0.0, abs=1e-12)
    assert M.bin_indices(conf, 5, "mass").tolist() == [0] * 10


def test_tie_groups_hand():
    # sorted: .1 .5 | .5 .5 | .9 .9 -> the .5s start in bin 0 and all go there; bin 1 is left empty
    conf, correct = [0.9, 0.5, 0.1, 0.5, 0.9, 0.5], [1, 1, 0, 0, 0, 1]
    assert M.bin_indices(conf, 3, "mass").tolist() == [2, 0, 0, 0, 2, 0]
    table = M.reliability_table(conf, correct, 3, "mass")
    assert table["count"].tolist() == [4, 0, 2]
    assert table["lo"][[0, 2]].tolist() == [0.1, 0.9] and table["hi"][[0, 2]].tolist() == [0.5, 0.9]
    # bin 0: conf (.1 + 3·.5)/4 = .4, acc 2/4; bin 2: conf .9, acc 1/2 -> 4/6·.1 + 2/6·.4
    assert M.ece(conf, correct, 3, "mass") == pytest.approx(4 / 6 * 0.1 + 2 / 6 * 0.4)
    assert M.bin_indices([0.5, 0.5, 0.5, 0.5], 2, "mass").tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("n, n_bins", [(120, 8), (101, 10), (37, 5), (7, 3), (3, 5), (1, 4)])
def test_without_ties_bins_and_ece_are_unchanged(n, n_bins):
    rng = np.random.default_rng(n)
    conf = rng.uniform(size=n)
    assert np.unique(conf).size == n
    correct = rng.uniform(size=n) < conf**2
    expected = split_bins(conf, n_bins)
    assert M.bin_indices(conf, n_bins, "mass").tolist() == expected.tolist()
    assert M.ece(conf, correct, n_bins, "mass") == pytest.approx(ece_of(expected, conf, correct), abs=1e-12)


@pytest.mark.parametrize("seed, n, n_bins", [(0, 200, 10), (1, 57, 7), (2, 500, 15), (3, 30, 30)])
def test_many_ties_follow_the_rule_and_ignore_the_order(seed, n, n_bins):
    rng = np.random.default_rng(seed)
    conf = np.round(rng.beta(4, 1.5, size=n), 1)  # 11 distinct values at most: every bin edge is a tie
    correct = rng.uniform(size=n) < conf
    expected = tie_bins(conf, n_bins)
    assert M.bin_indices(conf, n_bins, "mass").tolist() == expected.tolist()
    reference = ece_of(expected, conf, correct)
    assert M.ece(conf, correct, n_bins, "mass") == pytest.approx(reference, abs=1e-12)
    assert reference != pytest.approx(ece_of(split_bins(conf, n_bins), conf, correct))  # the ties matter here
    for _ in range(5):
        order = rng.permutation(n)
        assert M.ece(conf[order], correct[order], n_bins, "mass") == pytest.approx(reference, abs=1e-12)
        table = M.reliability_table(conf[order], correct[order], n_bins, "mass")
        assert table["count"].tolist() == np.bincount(expected, minlength=n_bins).tolist()


def test_summary_and_robustness_figures_ignore_the_order_of_tied_questions():
    rng = np.random.default_rng(4)
    conf = np.round(rng.uniform(0.5, 1.0, size=300), 1)  # two options: a tie at 0.5 is common
    probs = np.column_stack([conf, 1 - conf])
    labels = (rng.uniform(size=300) > conf).astype(int)
    order = rng.permutation(300)
    first = M.summarize(probs, labels, n_boot=0)
    again = M.summarize(probs[order], labels[order], n_boot=0)
    assert first["ece_equal_mass"] == pytest.approx(again["ece_equal_mass"], abs=1e-12)
    correct = labels == 0
    table, _ = ece_robustness(conf, correct, bin_counts=(5, 10, 20), n_boot=10)
    shuffled, _ = ece_robustness(conf[order], correct[order], bin_counts=(5, 10, 20), n_boot=10)
    np.testing.assert_allclose(table["mass"], shuffled["mass"], atol=1e-12)
    np.testing.assert_allclose(table["mass"], [ece_of(tie_bins(conf, m), conf, correct) for m in (5, 10, 20)],
                               atol=1e-12)
