"""lab.calibration.spread's paired comparison of two rows fed by the same seeds, and Holm's adjustment
over a table of such claims: against scipy.stats and against figures worked by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from lab.calibration.spread import holm_adjust, paired_difference, t_difference

pytestmark = pytest.mark.unit


def test_paired_difference_is_the_t_interval_of_the_per_seed_differences():
    a, b = [3.0, 5.0, 4.0, 6.0], [1.0, 2.0, 2.0, 3.0]  # differences 2, 3, 2, 3: mean 2.5, s = 1/√3
    found = paired_difference(a, b)
    half = 3.182446305284263 * (1 / math.sqrt(3)) / 2  # t(0.975, 3 df) × s / √4
    assert found.mean == pytest.approx(2.5, rel=1e-12)
    assert (found.low, found.high) == pytest.approx((2.5 - half, 2.5 + half), rel=1e-12)
    test = stats.ttest_rel(a, b)
    assert found.p == pytest.approx(test.pvalue, rel=1e-9)
    assert (found.low, found.high) == pytest.approx(tuple(test.confidence_interval(0.95)), rel=1e-9)


def test_paired_difference_separates_rows_whose_own_intervals_overlap():
    """What pairing buys: a seed that lifts both rows lifts their difference not at all."""
    low = [5.0, 9.0, 13.0, 7.0, 11.0]
    high = [v + 2.0 + e for v, e in zip(low, [0.1, -0.1, 0.2, 0.0, -0.2])]
    t = stats.t.ppf(0.975, 4)
    half_low = t * np.std(low, ddof=1) / math.sqrt(5)
    assert np.mean(high) - np.mean(low) < 2 * half_low  # the rows' own intervals overlap
    found = paired_difference(high, low)
    assert found.low > 0 and found.p < 1e-4
    assert found.p == pytest.approx(stats.ttest_rel(high, low).pvalue, rel=1e-9)


def test_paired_difference_at_another_level_and_a_constant_difference():
    a, b = [0.31, 0.12, 0.25, 0.4, 0.2], [0.2, 0.1, 0.3, 0.22, 0.15]
    found = paired_difference(a, b, level=0.9)
    assert (found.low, found.high) == pytest.approx(tuple(stats.ttest_rel(a, b).confidence_interval(0.9)), rel=1e-9)
    same = paired_difference([2.0, 3.0], [1.0, 2.0])  # every seed differs by exactly 1
    assert (same.mean, same.low, same.high, same.p) == (1.0, 1.0, 1.0, 0.0)
    assert paired_difference([1.0, 2.0], [1.0, 2.0]).p == 1.0


def test_t_difference_with_a_wider_sd_is_wider_and_its_p_larger():
    """The bound used where a row's per-seed figures are not kept: sd(a − b) ≤ sd(a) + sd(b)."""
    a, b = np.array([7.1, 9.0, 8.2, 6.5, 10.1]), np.array([5.0, 7.7, 6.1, 6.0, 7.2])
    exact = paired_difference(a, b)
    bound = t_difference(float((a - b).mean()), float(a.std(ddof=1) + b.std(ddof=1)), 5)
    assert bound.low < exact.low and bound.high > exact.high and bound.p > exact.p


@pytest.mark.parametrize("a, b", [([1.0], [2.0]), ([1.0, 2.0], [1.0, 2.0, 3.0]), ([1.0, float("nan")], [1.0, 2.0]),
                                  ([[1.0, 2.0]], [[1.0, 2.0]])])
def test_paired_difference_refuses_unpaired_or_too_few_runs(a, b):
    with pytest.raises(ValueError, match="one per run and at least two runs"):
        paired_difference(a, b)


def test_holm_adjust_against_a_hand_computed_case():
    # sorted: 0.005 × 4 = 0.02, 0.01 × 3 = 0.03, 0.03 × 2 = 0.06, 0.04 × 1 = 0.04 → kept non-decreasing: 0.06
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    assert holm_adjust([0.5, 0.6]) == [1.0, 1.0]  # 0.5 × 2 capped at 1; 0.6 may not fall below it
    assert holm_adjust([0.02]) == [0.02]
    assert holm_adjust([]) == []


def test_holm_adjust_rejects_at_least_what_bonferroni_rejects():
    p = [0.001, 0.012, 0.013, 0.04, 0.2]
    holm = holm_adjust(p)
    assert all(h <= min(1.0, v * len(p)) for h, v in zip(holm, p))
    assert sum(h < 0.05 for h in holm) == 3 and sum(v * len(p) < 0.05 for v in p) == 1


@pytest.mark.parametrize("p", [[0.1, 1.2], [-0.1], [float("nan")]])
def test_holm_adjust_refuses_what_is_not_a_p_value(p):
    with pytest.raises(ValueError, match="p-values in"):
        holm_adjust(p)


# ---------------------------------------------------------------- bench/claims.py: the claims tables built on them

DOC = """# a bench

## Claims, over seeds

stale

## 1. Runs

| model | ECE % [t 95 %] | seed 0 bootstrap | per seed | accuracy % [t] |
|---|---|---|---|---|
| A | 5.0 [3.0, 7.0] | [1.0, 9.0] | 4.0 / 6.0 / 5.0 | 70.0 [60.0, 80.0] |
| B | 8.0 [2.0, 14.0] | [4.0, 12.0] | 7.0 / 10.0 / 7.0 | 60.0 [58.0, 62.0] |
"""


def _claims_row(text: str, claim: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {claim} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_claims_rewrite_pairs_rows_by_seed_and_bounds_rows_without_per_seed_figures():
    from bench.claims import Ref, rewrite

    a, b = Ref("1. Runs", "A", "ECE % [t 95 %]"), Ref("1. Runs", "B", "ECE % [t 95 %]")
    acc_a, acc_b = Ref("1. Runs", "A", "accuracy % [t]"), Ref("1. Runs", "B", "accuracy % [t]")
    text = rewrite(DOC, [("B above A", "ECE %", a, b), ("A more accurate", "accuracy %", acc_b, acc_a),
                         ("A above 0", "ECE %", None, a)])
    assert "stale" not in text and text.endswith(DOC[DOC.index("## 1. Runs"):])
    paired = paired_difference([7.0, 10.0, 7.0], [4.0, 6.0, 5.0])  # per seed 3 / 4 / 2
    t = stats.t.ppf(0.975, 2)
    sd = lambda half: half * math.sqrt(3) / t  # noqa: E731  (a row's sd from its t-interval's half-width)
    bound = t_difference(10.0, sd(10.0) + sd(2.0), 3)
    alone = paired_difference([4.0, 6.0, 5.0], [0.0, 0.0, 0.0])
    holm = holm_adjust([paired.p, bound.p, alone.p])
    row = _claims_row(text, "B above A")
    assert row[4] == "3.0 / 4.0 / 2.0" and row[5] == f"{paired.mean:.1f} [{paired.low:.1f}, {paired.high:.1f}]"
    assert row[6] == f"{paired.p:.3f}" and row[7] == f"{holm[0]:.3f}"
    row = _claims_row(text, "A more accurate")
    assert row[4] == "–" and row[5] == f"{bound.mean:.1f} [{bound.low:.1f}, {bound.high:.1f}] *bound*"
    assert row[7] == f"{holm[1]:.3f}"
    row = _claims_row(text, "A above 0")
    assert row[2] == "0" and row[4] == "4.0 / 6.0 / 5.0" and "*bound*" not in row[5]
    assert rewrite(text, [("B above A", "ECE %", a, b), ("A more accurate", "accuracy %", acc_b, acc_a),
                          ("A above 0", "ECE %", None, a)]) == text  # read back: the same table


def test_claims_verdicts_follow_holm_and_the_sign():
    from bench.claims import Claim, Row, claims_section

    up, down = Row.of([1.0, 2.0, 3.0, 4.0, 5.0]), Row.of([11.0, 12.2, 12.9, 14.1, 15.0])
    flat = Row.of([2.0, 2.5, 1.0, 4.0, 5.5])
    lines = claims_section([Claim("up", "ECE %", up, down), Claim("down", "ECE %", down, up),
                            Claim("flat", "ECE %", up, flat)], 5)
    verdicts = {claim: _claims_row("\n".join(lines), claim)[-1] for claim in ("up", "down", "flat")}
    assert verdicts == {"up": "**holds**", "down": "**reversed**", "flat": "not shown"}


def test_claims_refuses_a_claim_text_twice_and_a_row_it_cannot_find():
    from bench.claims import Ref, rewrite

    a = Ref("1. Runs", "A", "ECE % [t 95 %]")
    with pytest.raises(ValueError, match="each claim's text once"):
        rewrite(DOC, [("x", "ECE %", a, None), ("x", "ECE %", None, a)])
    with pytest.raises(ValueError, match="a row 'C'"):
        rewrite(DOC, [("x", "ECE %", Ref("1. Runs", "C", "ECE % [t 95 %]"), a)])


def test_the_results_files_claims_tables_are_those_their_figures_give():
    """The README quotes these tables: a figure edited without rerunning `python -m bench.claims` fails here."""
    from bench.claims import FILES, RESULTS, rewrite

    for name, specs in FILES.items():
        text = (RESULTS / name).read_text()
        assert rewrite(text, specs()) == text, f"{name}: run .venv/bin/python -m bench.claims"


def test_the_controlled_bench_and_claims_py_name_the_same_claims():
    """A claim the bench writes and bench/claims.py cannot find again would be dropped from the table it rewrites."""
    from bench.claims import controlled_specs
    from bench.controlled import CLAIMS

    assert [claim[0] for claim in CLAIMS] == [spec[0] for spec in controlled_specs()]
