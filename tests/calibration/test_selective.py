"""Selective prediction (lab.calibration.selective) and confidence signals (lab.calibration.confidence) against hand
computations and brute force (AUROC is scikit-learn's own, so it is checked by hand and by counting pairs)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from lab.calibration import confidence, metrics, selective
from lab.results import analysis
from tests.helpers import imported_by

pytestmark = pytest.mark.unit

# Five questions by falling confidence: right, wrong, right, right, wrong.
CONF5 = [0.9, 0.8, 0.7, 0.6, 0.5]
RIGHT5 = [1, 0, 1, 1, 0]


def test_aurc_and_e_aurc_of_five_questions_by_hand():
    # risk after answering the k most confident: 0/1, 1/2, 1/3, 1/4, 2/5
    assert selective.aurc(CONF5, RIGHT5) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 4 + 2 / 5) / 5)
    # the oracle answers the three right ones first: 0, 0, 0, 1/4, 2/5
    assert selective.oracle_aurc(RIGHT5) == pytest.approx((1 / 4 + 2 / 5) / 5)
    assert selective.e_aurc(CONF5, RIGHT5) == pytest.approx((1 / 2 + 1 / 3) / 5)
    coverage, risk = selective.risk_coverage(CONF5, RIGHT5)
    np.testing.assert_allclose(coverage, [0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_allclose(risk, [0, 1 / 2, 1 / 3, 1 / 4, 2 / 5])
    s = selective.summary(CONF5, RIGHT5)
    assert s["acc_at_50"] == pytest.approx(2 / 3)  # ⌈2.5⌉ = 3 answered
    assert s["acc_at_80"] == pytest.approx(3 / 4)
    assert s["aurc"] == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 4 + 2 / 5) / 5)
    assert s["e_aurc"] == pytest.approx((1 / 2 + 1 / 3) / 5)


def test_the_input_order_does_not_matter_and_ties_are_the_mean_over_their_orders():
    conf = np.array([0.9, 0.6, 0.6, 0.6, 0.3, 0.3])
    right = np.array([1, 1, 0, 0, 1, 0])
    # brute force: every order of the tied blocks, the plain sorted AURC of each, averaged
    blocks = [np.flatnonzero(conf == c) for c in sorted(set(conf), reverse=True)]
    areas = []
    for orders in itertools.product(*(itertools.permutations(b) for b in blocks)):
        ranked = right[np.concatenate(orders)]
        areas.append(np.mean([1 - ranked[:k].mean() for k in range(1, 7)]))
    assert selective.aurc(conf, right) == pytest.approx(np.mean(areas))
    shuffled = np.random.default_rng(0).permutation(6)
    assert selective.aurc(conf[shuffled], right[shuffled]) == pytest.approx(selective.aurc(conf, right))


def test_oracle_aurc_tends_to_geifmans_closed_form():
    r = 0.3  # error rate
    right = np.arange(100_000) >= 30_000
    assert selective.oracle_aurc(right) == pytest.approx(r + (1 - r) * math.log(1 - r), abs=1e-4)


def test_auroc_of_five_questions_by_hand():
    # right answers at 0.9, 0.7, 0.6, wrong ones at 0.8, 0.5: of the 3 × 2 pairs the right answer is
    # more confident in 4 (0.9 > 0.8, 0.9 > 0.5, 0.7 > 0.5, 0.6 > 0.5)
    assert selective.auroc(CONF5, RIGHT5) == pytest.approx(4 / 6)
    assert selective.summary(CONF5, RIGHT5)["auroc"] == pytest.approx(4 / 6)
    # a tie counts one half: right at 0.6 and 0.3, wrong at 0.6 → (½ + 0) / 2
    assert selective.auroc([0.6, 0.6, 0.3], [1, 0, 1]) == pytest.approx(0.25)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_counts_pairs_with_ties_as_one_half(seed):
    rng = np.random.default_rng(seed)
    conf = rng.integers(0, 7, 300) / 6  # seven values: many ties
    right = rng.random(300) < conf
    diff = conf[right][:, None] - conf[~right][None, :]  # every (right, wrong) pair
    assert selective.auroc(conf, right) == pytest.approx(np.mean((diff > 0) + 0.5 * (diff == 0)), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("levels", [None, 2, 11])
def test_auroc_equals_scikit_learns(seed, levels):
    """Continuous scores, and scores on 2 or 11 levels (ties everywhere), negative and above 1 too."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    conf = rng.normal(size=500) if levels is None else rng.integers(0, levels, 500) / (levels - 1) * 3 - 1
    right = rng.random(500) < 1 / (1 + np.exp(-conf))
    assert selective.auroc(conf, right) == pytest.approx(roc_auc_score(right, conf), rel=1e-12)


def test_a_summary_imports_no_scikit_learn():
    """Every evaluation job ends with this summary: a fresh process computing it loads numpy alone."""
    code = "from lab.calibration.selective import summary; summary([0.2, 0.9, 0.5], [0, 1, 1])"
    assert imported_by(code, {"sklearn", "pandas"}) == set()


def test_auroc_is_none_without_both_right_and_wrong_answers():
    assert selective.auroc([0.2, 0.9], [1, 1]) is None
    assert selective.summary([0.2, 0.9], [0, 0])["auroc"] is None


def test_a_threshold_keeps_the_confident_and_says_what_it_dropped():
    picked = selective.select(CONF5, RIGHT5, 0.65)
    assert picked["kept"].tolist() == [True, True, True, False, False]
    assert picked["coverage"] == 0.6 and picked["accuracy"] == pytest.approx(2 / 3)
    assert (picked["dropped_right"], picked["dropped_wrong"]) == (1, 1)
    assert selective.select(CONF5, RIGHT5, 0.95)["accuracy"] is None


def test_bootstrap_interval_brackets_the_estimate_and_is_seeded():
    rng = np.random.default_rng(3)
    conf = rng.random(400)
    right = rng.random(400) < conf
    low, high = selective.bootstrap(selective.aurc, conf, right, n_boot=300)
    assert low < selective.aurc(conf, right) < high
    assert selective.bootstrap(selective.aurc, conf, right, n_boot=300) == (low, high)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="shape"):
        selective.aurc([0.5, 0.4], [1])
    with pytest.raises(ValueError, match="finite"):
        selective.aurc([float("nan")], [1])
    with pytest.raises(ValueError, match="0/1"):
        selective.aurc([0.5], [2])
    with pytest.raises(ValueError, match="coverage"):
        selective.summary(CONF5, RIGHT5, coverages=[0])


# ---------------------------------------------------------------- confidence signals
PROBS = np.array([[0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]])
MASK = np.array([[True, True, True, False], [True, True, True, True]])


def test_signals_by_hand():
    np.testing.assert_allclose(confidence.values("max_prob", PROBS, MASK, [{}, {}]), [0.7, 0.25])
    np.testing.assert_allclose(confidence.values("margin", PROBS, MASK, [{}, {}]), [0.5, 0.0])
    h = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    np.testing.assert_allclose(confidence.values("certainty", PROBS, MASK, [{}, {}]), [1 - h / math.log(3), 0.0],
                               atol=1e-12)


def test_full_vocabulary_signal_needs_letter_scoring_rows():
    rows = [{"option_vocab_probs": [0.5, 0.1, 0.05]}, {"option_vocab_probs": [0.1, 0.2, 0.3, 0.2]}]
    np.testing.assert_allclose(confidence.values("full_vocab", PROBS, MASK, rows), [0.5, 0.1])
    with pytest.raises(ValueError, match="letter scoring"):
        confidence.values("full_vocab", PROBS, MASK, [{}, {}])
    assert confidence.available(PROBS, MASK, [{}, {}]) == ["max_prob", "margin", "certainty"]
    assert confidence.row_signals([0.5, 0.1, 0.05], rows[0])["full_vocab"] == 0.5


def test_a_signal_no_probability_gives_is_read_from_the_rows():
    confidence.SIGNALS.add("test_verbalized", confidence.Signal(
        "test_verbalized", "verbalized", "the model's stated confidence", True, lambda p, m, r: None, needs="a stated one"))
    try:
        rows = [{"signals": {"test_verbalized": 0.8}}, {"signals": {"test_verbalized": 0.3}}]
        np.testing.assert_allclose(confidence.values("test_verbalized", PROBS, MASK, rows), [0.8, 0.3])
        with pytest.raises(ValueError, match="a stated one"):
            confidence.values("test_verbalized", PROBS, MASK, [{}, {}])
    finally:
        confidence.SIGNALS._items.pop("test_verbalized")


# ---------------------------------------------------------------- how robust is an ECE
def test_ece_robustness_table_is_the_ece_at_each_bin_count():
    rng = np.random.default_rng(4)
    conf = rng.random(350)
    right = rng.random(350) < conf ** 2
    table, smooth = analysis.ece_robustness(conf, right, bin_counts=(5, 15, 30), n_boot=50)
    assert table["bins"].tolist() == [5, 15, 30]
    for row in table.itertuples():
        assert row.width == pytest.approx(metrics.ece(conf, right, row.bins))
        assert row.mass == pytest.approx(metrics.ece(conf, right, row.bins, "mass"))
        assert row.width_low <= row.width_high
    assert smooth == pytest.approx(metrics.smooth_ece(conf, right))
    assert analysis.small_sample_warning(299).startswith("Only 299")
    assert analysis.small_sample_warning(300) == ""
