"""RCFT's E-step, rank-preserving mapping and regulariser, λ's two scales, and option-level label
smoothing, against hand-computed cases and independent implementations (issue #14, items 1, 4, 5)."""
import math

import numpy as np
import pytest
import torch

from lab.calibration import metrics
from lab.training.cft_losses import (bin_accuracy, bin_index, ece_regulariser, option_probs, option_smoothing_loss,
                                     rank_preserving_targets, rcft_loss, smoothed_targets)

pytestmark = pytest.mark.unit

LN3 = math.log(3)


def _targets(p, acc, mask=None):
    p = torch.tensor(p, dtype=torch.float64)
    mask = torch.ones_like(p, dtype=torch.bool) if mask is None else torch.tensor(mask)
    with np.errstate(divide="ignore"):
        return rank_preserving_targets(torch.log(p), mask, torch.tensor(acc, dtype=torch.float64))


def released_targets(p: np.ndarray, acc: float) -> np.ndarray:
    """The authors' ``not_max_target_confidence``, re-written in numpy from its formula: the K − 1
    non-top probabilities sorted descending, γ = ln 3 / p₂ / (1 − acc), a = b = (1 − acc) / (Σ tanh + K − 1).
    Returns the full target row in the original option order."""
    top = int(np.argmax(p))
    others = [i for i in range(len(p)) if i != top]
    q = p[others]
    out = np.zeros_like(p)
    out[top] = acc
    if acc == 1.0:
        return out
    squashed = np.tanh(LN3 / q.max() / (1 - acc) * q)
    a = (1 - acc) / (squashed.sum() + len(others))
    out[others] = a * squashed + a
    return out


# ------------------------------------------------------------- item 1: the mapping
def test_mapping_is_a4_simplified_solution_a_equals_b_by_hand():
    p, acc = [0.6, 0.25, 0.1, 0.05], 0.5
    gamma = LN3 / (0.25 * (1 - acc))
    squashed = [math.tanh(gamma * x) for x in (0.25, 0.1, 0.05)]
    a = (1 - acc) / (sum(squashed) + 3)  # a = b over the K − 1 = 3 non-top options
    expected = [acc] + [a * s + a for s in squashed]
    targets, keeps = _targets([p], [acc])
    torch.testing.assert_close(targets[0], torch.tensor(expected, dtype=torch.float64))
    assert keeps.tolist() == [True]


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_mapping_matches_the_released_code_on_random_rows(k):
    rng = np.random.default_rng(k)
    p = rng.dirichlet(np.full(k, 0.5), size=200)
    acc = rng.uniform(0.0, 1.0, size=200)
    acc[:5] = 1.0
    targets, _ = _targets(p, acc)
    expected = np.stack([released_targets(row, a) for row, a in zip(p, acc)])
    np.testing.assert_allclose(targets.numpy(), expected, atol=1e-12)


def test_issue_example_the_top_option_is_overtaken_and_flagged():
    """p = (0.9, 0.08, 0.01, 0.01), acc = 0.3. The old b = 0 mapping gave (0.3, 0.492, 0.104, 0.104);
    a = b gives 0.3118 to option 2, still above acc: A.4's condition fails (acc < 0.3081 here) and
    the row is reported."""
    targets, keeps = _targets([[0.9, 0.08, 0.01, 0.01]], [0.3])
    tau2, tau3 = math.tanh(LN3 / 0.7), math.tanh(LN3 / 0.7 * 0.125)
    a = 0.7 / (tau2 + 2 * tau3 + 3)
    torch.testing.assert_close(targets[0], torch.tensor([0.3, a * (tau2 + 1), a * (tau3 + 1), a * (tau3 + 1)],
                                                        dtype=torch.float64))
    assert targets[0, 1] == pytest.approx(0.31175, abs=1e-5)
    assert keeps.tolist() == [False]
    bound = (1 + tau2) / (tau2 + 2 * tau3 + 4 + tau2)  # acc ≥ (1 + τ₂)/(S + K + τ₂) keeps the rank
    assert bound == pytest.approx(0.30813, abs=1e-5)
    assert _targets([[0.9, 0.08, 0.01, 0.01]], [0.35])[1].tolist() == [True]


@pytest.mark.parametrize("k", [3, 4, 5])
def test_keeps_top_is_exactly_the_a4_condition(k):
    rng = np.random.default_rng(10 + k)
    p = rng.dirichlet(np.full(k, 0.3), size=400)
    acc = rng.uniform(0.05, 0.95, size=400)
    _, keeps = _targets(p, acc)
    for row, a, kept in zip(p, acc, keeps.tolist()):
        rest = np.sort(row)[::-1][1:]
        tau = np.tanh(LN3 / rest[0] / (1 - a) * rest)
        assert kept == (a >= (1 + tau[0]) / (tau.sum() + k + tau[0]) - 1e-12)


def test_targets_are_scale_invariant_where_the_clamp_broke_them():
    """p₂ = 1e-8: the old γ clamp (p₂ ≥ 1e-6) changed the result. Rows with the same ratios
    p_j / p₂ = (1, 0.1, 0) get the same targets whatever their scale."""
    tiny, _ = _targets([[1 - 1.1e-8, 1e-8, 1e-9, 0.0]], [0.5])
    large, _ = _targets([[0.89, 0.1, 0.01, 0.0]], [0.5])
    torch.testing.assert_close(tiny, large)
    a = 0.5 / (math.tanh(LN3 / 0.5) + math.tanh(LN3 / 0.5 * 0.1) + 0 + 3)
    assert tiny[0, 1:].tolist() == pytest.approx([a * (math.tanh(LN3 / 0.5) + 1),
                                                 a * (math.tanh(LN3 / 0.5 * 0.1) + 1), a])


def test_targets_sum_to_one_when_the_non_top_mass_underflows():
    """Logits (45, 0, −1, −2): non-top mass ~1e-20. The old clamp left the targets summing to 0.347."""
    logits = torch.tensor([[45.0, 0.0, -1.0, -2.0]], dtype=torch.float64)
    mask = torch.ones_like(logits, dtype=torch.bool)
    targets, _ = rank_preserving_targets(torch.log_softmax(logits, -1), mask, torch.tensor([0.3], dtype=torch.float64))
    assert float(targets.sum()) == pytest.approx(1.0, abs=1e-12)
    expected = released_targets(np.array([0.5, np.exp(-45), np.exp(-46), np.exp(-47)]) / 1.0, 0.3)  # same ratios
    np.testing.assert_allclose(targets[0, 1:].numpy(), expected[1:], atol=1e-12)
    bf16 = torch.tensor([[120.0, 0.0, -1.0, -2.0]])  # float32 softmax underflows the others: log space does not
    targets, _ = rank_preserving_targets(torch.log_softmax(bf16.double(), -1), mask, torch.tensor([0.3]))
    np.testing.assert_allclose(targets[0, 1:].numpy(), expected[1:], atol=1e-12)


def test_mapping_handles_padding_zero_mass_unsorted_rows_and_acc_one():
    targets, _ = _targets([[0.1, 0.7, 0.2, 0.0]], [0.6], mask=[[True, True, True, False]])
    t = targets[0]
    assert t[1] == pytest.approx(0.6) and t[3] == 0 and t[2] > t[0] and t[:3].sum() == pytest.approx(1.0)
    targets, _ = _targets([[1.0, 0.0, 0.0]], [0.8])  # all non-top mass is 0: the remainder is shared equally
    torch.testing.assert_close(targets[0], torch.tensor([0.8, 0.1, 0.1], dtype=torch.float64))
    targets, keeps = _targets([[0.7, 0.3]], [1.0])
    torch.testing.assert_close(targets[0], torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert keeps.tolist() == [True]


@pytest.mark.parametrize("k", [2, 3, 4, 5, 7])
def test_mapping_keeps_the_non_top_order_and_sums_to_one_for_any_number_of_options(k):
    rng = np.random.default_rng(k)
    p = rng.dirichlet(np.ones(k), size=50)
    acc = rng.uniform(0.3, 0.95, size=50)
    t = _targets(p, acc)[0].numpy()
    np.testing.assert_allclose(t.sum(axis=1), 1.0, atol=1e-12)
    top = p.argmax(axis=1)
    np.testing.assert_allclose(t[np.arange(50), top], acc)
    for row_p, row_t, j in zip(p, t, top):
        others = [i for i in range(k) if i != j]
        order = sorted(others, key=lambda i: -row_p[i])
        assert all(row_t[a] >= row_t[b] - 1e-15 for a, b in zip(order, order[1:]))
        assert (row_t[others] > 0).all()  # b = a > 0: every option keeps some mass


# ---------------------------------------------------------- item 4: E-step bins = ECE bins
@pytest.mark.parametrize("edges", ["right", "left"])
def test_e_step_bins_are_the_metric_bins_on_float_edges(edges):
    conf = np.array([0.0, 0.1, 0.3, 0.5, 0.6, 0.7, 0.9, 1.0, 0.29999999, 0.70000001])
    expected = metrics.bin_indices(conf, 10, edges=edges)
    assert bin_index(torch.tensor(conf), 10, edges).tolist() == expected.tolist()
    # the old floor(c·M) put 0.3, 0.6 and 0.7 one bin above lab.calibration.metrics' right-closed bins
    if edges == "right":
        assert expected[[2, 4, 5]].tolist() == [2, 5, 6]


@pytest.mark.parametrize("edges", ["right", "left"])
def test_bin_accuracy_agrees_with_the_reliability_table(edges):
    rng = np.random.default_rng(0)
    conf = rng.uniform(0, 1, 300)
    conf[:6] = [0.0, 1.0, 0.5, 0.3, 0.6, 0.7]  # edges
    correct = rng.uniform(0, 1, 300) < conf
    acc, counts = bin_accuracy(torch.tensor(conf), torch.tensor(correct), n_bins=10, edges=edges)
    table = metrics.reliability_table(conf, correct, n_bins=10, edges=edges)
    np.testing.assert_array_equal(counts.numpy(), np.asarray(table["count"]))
    filled = counts.numpy() > 0
    np.testing.assert_allclose(acc.numpy()[filled], np.asarray(table["acc"], dtype=float)[filled])
    acc, _ = bin_accuracy(torch.tensor([0.95, 0.97]), torch.tensor([True, False]), n_bins=10)
    assert torch.isnan(acc[:9]).all() and acc[9] == 0.5


# --------------------------------------------------------------- the regulariser and λ
def _logits(p):
    return torch.log(torch.tensor(p, dtype=torch.float64))


def test_regulariser_is_zero_on_a_calibrated_batch_and_positive_otherwise():
    # Five questions at confidence 0.6, three answered right: bin accuracy 0.6 = confidence, and
    # the other options are equal, which is what the mapping gives them.
    logits = _logits([[0.6, 0.4 / 3, 0.4 / 3, 0.4 / 3]] * 5)
    mask = torch.ones_like(logits, dtype=torch.bool)
    acc, _ = bin_accuracy(torch.full((5,), 0.6, dtype=torch.float64), torch.tensor([1, 1, 1, 0, 0]), n_bins=10)
    reg, violations = ece_regulariser(logits, mask, acc)
    assert float(reg) == pytest.approx(0.0, abs=1e-12) and not violations.any()
    over = _logits([[0.9, 0.1]]).requires_grad_()  # bin accuracy 0.6: over-confident
    reg, _ = ece_regulariser(over, torch.ones(1, 2, dtype=torch.bool), torch.tensor([0.6] * 10, dtype=torch.float64))
    assert float(reg.detach()) == pytest.approx(0.3 ** 2 + 0.3 ** 2, rel=1e-6)  # targets (0.6, 0.4)
    reg.backward()
    assert over.grad[0, 0] > 0 > over.grad[0, 1]  # descent lowers the top logit and raises the other


def test_regulariser_ignores_rows_whose_bin_was_empty_at_the_e_step():
    logits = _logits([[0.95, 0.05], [0.55, 0.45]])
    acc = torch.full((10,), float("nan"), dtype=torch.float64)
    acc[5] = 0.5
    reg, _ = ece_regulariser(logits, torch.ones_like(logits, dtype=torch.bool), acc)
    assert float(reg) == pytest.approx(((0.55 - 0.5) ** 2 + (0.45 - 0.5) ** 2) / 2, rel=1e-6)


def test_released_scale_normalises_per_bin_and_weighs_sft_by_one_minus_lambda():
    """Rows at 0.55 (bin 5, E-step count 4) and 0.95 (bin 9, count 2); the released loss divides
    each row's squared error by its bin's count instead of the batch size."""
    logits = _logits([[0.55, 0.45], [0.95, 0.05]])
    mask = torch.ones_like(logits, dtype=torch.bool)
    acc = torch.full((10,), float("nan"), dtype=torch.float64)
    acc[5], acc[9] = 0.5, 0.75
    counts = torch.zeros(10, dtype=torch.float64)
    counts[5], counts[9] = 4, 2
    se = [2 * 0.05 ** 2, 2 * 0.2 ** 2]  # (p − t)² over both options, targets (acc, 1 − acc)
    paper, _ = ece_regulariser(logits, mask, acc)
    released, _ = ece_regulariser(logits, mask, acc, counts)
    assert float(paper) == pytest.approx(sum(se) / 2, rel=1e-6)
    assert float(released) == pytest.approx(se[0] / 4 + se[1] / 2, rel=1e-6)
    sft, reg = torch.tensor(2.0), torch.tensor(0.5)
    assert float(rcft_loss(sft, reg, 0.4, "paper")) == pytest.approx(2.0 + 0.4 * 0.5)
    assert float(rcft_loss(sft, reg, 0.4, "released")) == pytest.approx(0.6 * 2.0 + 0.4 * 1e-3 * 0.5)
    assert float(rcft_loss(sft, reg, 1.0, "released")) == pytest.approx(1e-3 * 0.5)  # "ECE only"


def test_option_probs_renormalise_over_real_options():
    logits = torch.tensor([[2.0, 1.0, 0.0, 5.0]])
    mask = torch.tensor([[True, True, True, False]])
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.0]), 0)
    torch.testing.assert_close(option_probs(logits, mask)[0, :3], expected)
    assert option_probs(logits, mask)[0, 3] == 0


# ------------------------------------------------ item 5: label smoothing over the other classes
def test_smoothed_targets_give_epsilon_to_the_remaining_classes():
    """The CFT paper (Müller et al.): 1 − ε on the answer, ε over the *remaining* classes."""
    answer = torch.tensor([1, 0, 0])
    mask = torch.tensor([[True] * 4, [True, True, True, False], [True, False, False, False]])
    targets = smoothed_targets(answer, mask, 0.1)
    torch.testing.assert_close(targets, torch.tensor([[0.1 / 3, 0.9, 0.1 / 3, 0.1 / 3], [0.9, 0.05, 0.05, 0.0],
                                                      [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64))


def test_option_smoothing_loss_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(2, 20)
    option_ids = torch.tensor([[3, 4, 5], [7, 8, -1]])
    mask = option_ids >= 0
    answer = torch.tensor([1, 0])
    eps = 0.3
    loss = option_smoothing_loss(logits, option_ids, mask, answer, eps)
    log_p = torch.log_softmax(logits, -1)
    row0 = -((eps / 2) * (log_p[0, 3] + log_p[0, 5]) + (1 - eps) * log_p[0, 4])
    row1 = -((1 - eps) * log_p[1, 7] + eps * log_p[1, 8])
    torch.testing.assert_close(loss, torch.stack([row0, row1]))
    plain = torch.nn.functional.cross_entropy(logits, torch.tensor([4, 7]), reduction="none")
    torch.testing.assert_close(option_smoothing_loss(logits, option_ids, mask, answer, 0.0), plain)
    assert smoothed_targets(answer, mask, eps).sum(-1).tolist() == pytest.approx([1.0, 1.0])
