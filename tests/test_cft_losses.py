"""RCFT's E-step, rank-preserving mapping and regulariser, and option-level label smoothing,
against hand-computed cases and independent implementations."""
import math

import numpy as np
import pytest
import torch

from lab import metrics
from lab.cft.losses import (bin_accuracy, ece_regulariser, option_probs, option_smoothing_loss,
                            rank_preserving_targets, smoothed_targets)


def _targets(p, acc, mask=None):
    p = torch.tensor(p, dtype=torch.float64)
    mask = torch.ones_like(p, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return rank_preserving_targets(p, mask, torch.tensor(acc, dtype=torch.float64))


def test_mapping_matches_the_paper_formula_by_hand():
    p, acc = [0.6, 0.25, 0.1, 0.05], 0.5
    gamma = math.log(3) / (0.25 * (1 - acc))
    squashed = [math.tanh(gamma * x) for x in (0.25, 0.1, 0.05)]
    a = (1 - acc) / sum(squashed)  # b = 0: the paper's simplified solution
    expected = [acc] + [a * s for s in squashed]
    torch.testing.assert_close(_targets([p], [acc])[0], torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("k", [2, 3, 4, 5, 7])
def test_mapping_preserves_order_and_sums_to_one_for_any_number_of_options(k):
    rng = np.random.default_rng(k)
    p = rng.dirichlet(np.ones(k), size=50)
    acc = rng.uniform(0.3, 0.95, size=50)
    t = _targets(p, acc).numpy()
    np.testing.assert_allclose(t.sum(axis=1), 1.0, atol=1e-12)
    top = p.argmax(axis=1)
    np.testing.assert_allclose(t[np.arange(50), top], acc)
    for row_p, row_t, j in zip(p, t, top):
        others = [i for i in range(k) if i != j]
        order = sorted(others, key=lambda i: -row_p[i])
        assert all(row_t[a] >= row_t[b] - 1e-15 for a, b in zip(order, order[1:]))  # same ranking, non-increasing
        assert (row_t[others] >= 0).all()


def test_mapping_handles_padding_edge_probabilities_and_an_unsorted_row():
    t = _targets([[0.1, 0.7, 0.2, 0.0]], [0.6], mask=[[True, True, True, False]])[0]
    assert t[1] == pytest.approx(0.6) and t[3] == 0 and t[2] > t[0] and t[:3].sum() == pytest.approx(1.0)
    t = _targets([[1.0, 0.0, 0.0]], [0.8])[0]  # all non-top mass is 0: the remainder is shared equally
    torch.testing.assert_close(t, torch.tensor([0.8, 0.1, 0.1], dtype=torch.float64))
    t = _targets([[0.7, 0.3]], [1.0])[0]
    torch.testing.assert_close(t, torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_bin_accuracy_agrees_with_the_reliability_table():
    rng = np.random.default_rng(0)
    conf = rng.uniform(0, 1, 300)
    conf[:3] = [0.0, 1.0, 0.5]  # edges: the first bin's start, the closed last bin, a boundary
    correct = rng.uniform(0, 1, 300) < conf
    acc, counts = bin_accuracy(torch.tensor(conf), torch.tensor(correct), n_bins=10)
    table = metrics.reliability_table(conf, correct, n_bins=10)
    np.testing.assert_array_equal(counts.numpy(), np.asarray(table["count"]))
    filled = counts.numpy() > 0
    np.testing.assert_allclose(acc.numpy()[filled], np.asarray(table["acc"], dtype=float)[filled])
    acc, _ = bin_accuracy(torch.tensor([0.95, 0.97]), torch.tensor([True, False]), n_bins=10)
    assert torch.isnan(acc[:9]).all() and acc[9] == 0.5


def test_regulariser_is_zero_on_a_calibrated_batch_and_positive_otherwise():
    # Five questions at confidence 0.6, three answered right: bin accuracy 0.6 = confidence, and
    # the other options are equal, which is what the mapping gives them.
    p = torch.tensor([[0.6, 0.4 / 3, 0.4 / 3, 0.4 / 3]] * 5, dtype=torch.float64)
    mask = torch.ones_like(p, dtype=torch.bool)
    acc, _ = bin_accuracy(p.max(-1).values, torch.tensor([1, 1, 1, 0, 0]), n_bins=10)
    assert float(ece_regulariser(p, mask, acc)) == pytest.approx(0.0, abs=1e-15)
    over = torch.tensor([[0.9, 0.1]], dtype=torch.float64, requires_grad=True)  # bin accuracy 0.6: over-confident
    reg = ece_regulariser(over, torch.ones(1, 2, dtype=torch.bool), torch.tensor([0.6] * 10, dtype=torch.float64))
    assert float(reg.detach()) == pytest.approx(0.3 ** 2 + 0.3 ** 2)  # targets (0.6, 0.4)
    reg.backward()
    assert over.grad[0, 0] > 0 > over.grad[0, 1]  # descent lowers the top probability and raises the other


def test_regulariser_ignores_rows_whose_bin_was_empty_at_the_e_step():
    p = torch.tensor([[0.95, 0.05], [0.55, 0.45]], dtype=torch.float64)
    acc = torch.full((10,), float("nan"), dtype=torch.float64)
    acc[5] = 0.5
    reg = ece_regulariser(p, torch.ones_like(p, dtype=torch.bool), acc)
    assert float(reg) == pytest.approx(((0.55 - 0.5) ** 2 + (0.45 - 0.5) ** 2) / 2)


def test_option_probs_renormalise_over_real_options():
    logits = torch.tensor([[2.0, 1.0, 0.0, 5.0]])
    mask = torch.tensor([[True, True, True, False]])
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.0]), 0)
    torch.testing.assert_close(option_probs(logits, mask)[0, :3], expected)
    assert option_probs(logits, mask)[0, 3] == 0


def test_option_smoothing_loss_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(2, 20)
    option_ids = torch.tensor([[3, 4, 5], [7, 8, -1]])
    mask = option_ids >= 0
    answer = torch.tensor([1, 0])
    eps = 0.3
    loss = option_smoothing_loss(logits, option_ids, mask, answer, eps)
    log_p = torch.log_softmax(logits, -1)
    row0 = -((eps / 3) * (log_p[0, 3] + log_p[0, 5]) + (1 - eps + eps / 3) * log_p[0, 4])
    row1 = -((1 - eps + eps / 2) * log_p[1, 7] + (eps / 2) * log_p[1, 8])
    torch.testing.assert_close(loss, torch.stack([row0, row1]))
    plain = torch.nn.functional.cross_entropy(logits, torch.tensor([4, 7]), reduction="none")
    torch.testing.assert_close(option_smoothing_loss(logits, option_ids, mask, answer, 0.0), plain)
    assert smoothed_targets(answer, mask, eps).sum(-1).tolist() == pytest.approx([1.0, 1.0])
