"""Tests for lab.training.kd_losses: the vectorised loss against a loop over positions written here
(in float64, probabilities rather than log-probabilities), closed-form cases and gradients."""
from __future__ import annotations

import math

import pytest
import torch

from lab.training.kd_losses import topk_kl_loss

pytestmark = pytest.mark.unit

B, T, V, K = 2, 3, 7, 3
MODES = [(False, False), (True, False), (False, True)]  # (renormalise, tail)


def batch(seed: int, dtype: torch.dtype = torch.float64):
    """Random logits (B, T, V), distinct teacher ids, teacher log-probs holding 0.3-1 of the mass
    with one exact 0 (log-prob -inf), a mask with padding, and garbage teacher rows at the pads."""
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(B, T, V, generator=g)).to(dtype)
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(B * T)]).view(B, T, K)
    probs = torch.distributions.Dirichlet(torch.ones(K + 1)).sample((B, T))[..., :K]
    probs[0, 0, 2] = 0.0
    mask = torch.tensor([[True, True, False], [False, True, True]])
    ids[~mask] = 0  # padding rows: repeated ids, log-probs summing above 1, both ignored
    logprobs = probs.log().to(dtype)
    logprobs[~mask] = 0.0
    return logits, ids, logprobs, mask


def loop_loss(logits, ids, logprobs, mask, renormalise=False, tail=False) -> torch.Tensor:
    """KL(P_T || P_S) per supervised position, written out entry by entry, then averaged."""
    total, count = 0.0, 0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if not mask[b, t]:
                continue
            s_full = torch.softmax(logits[b, t].double(), dim=0)
            p_s = [s_full[int(i)] for i in ids[b, t]]
            p_t = [math.exp(float(x)) for x in logprobs[b, t]]
            if renormalise:
                p_s = [x / sum(p_s) for x in p_s]
                p_t = [x / sum(p_t) for x in p_t]
            if tail:
                p_s.append(1 - sum(p_s))
                p_t.append(max(0.0, 1 - sum(p_t)))
            terms = [pt * (math.log(pt) - torch.log(ps)) for pt, ps in zip(p_t, p_s) if pt > 0]
            total = total + sum(terms)
            count += 1
    return total / count


@pytest.mark.parametrize("renormalise, tail", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_formula(seed, renormalise, tail):
    logits, ids, logprobs, mask = batch(seed)
    got = topk_kl_loss(logits, ids, logprobs, mask, renormalise=renormalise, tail=tail)
    want = loop_loss(logits, ids, logprobs, mask, renormalise, tail)
    assert got.dtype == torch.float64 and got.ndim == 0
    assert got.item() == pytest.approx(want.item(), rel=1e-10, abs=1e-12)
    if renormalise or tail:
        assert got.item() >= 0


@pytest.mark.parametrize("renormalise, tail", MODES)
def test_masked_out_positions_do_not_matter(renormalise, tail):
    logits, ids, logprobs, mask = batch(3, torch.float32)
    before = topk_kl_loss(logits, ids, logprobs, mask, renormalise, tail)
    logits[~mask] = 100 * torch.randn_like(logits[~mask])
    assert torch.equal(topk_kl_loss(logits, ids, logprobs, mask, renormalise, tail), before)


@pytest.mark.parametrize("renormalise, tail", MODES)
def test_non_negative_with_normalised_teacher(renormalise, tail):
    for seed in range(5):
        logits, ids, logprobs, mask = batch(seed, torch.float32)
        logprobs = logprobs.log_softmax(dim=-1)  # as the temperature forms return: sums to 1 over k
        assert topk_kl_loss(logits, ids, logprobs, mask, renormalise, tail).item() >= 0


def self_teacher(logits: torch.Tensor):
    """The student's own top-k ids and full-vocabulary log-probs."""
    logprobs, ids = logits.float().log_softmax(dim=-1).topk(K, dim=-1)
    return ids, logprobs


@pytest.mark.parametrize("renormalise, tail", [(True, False), (False, True)])
def test_zero_when_teacher_is_the_student(renormalise, tail):
    logits, _, _, mask = batch(4, torch.float32)
    ids, logprobs = self_teacher(logits)
    loss = topk_kl_loss(logits, ids, logprobs, mask, renormalise=renormalise, tail=tail)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_plain_mode_closed_form():
    """Full-vocab mode, teacher = the student's top-k renormalised over k:
    Σ_j (q_j/Q)(log(q_j/Q) − log q_j) = −log Q, with Q = Σ_k p_S."""
    logits, _, _, mask = batch(5, torch.float32)
    ids, logprobs = self_teacher(logits)
    loss = topk_kl_loss(logits, ids, logprobs.log_softmax(dim=-1), mask)
    mass = logprobs.exp().sum(dim=-1)[mask]  # (N,)
    assert loss.item() == pytest.approx((-mass.log()).mean().item(), abs=1e-6)
    assert loss.item() > 0.01  # not trivially 0: the student spreads mass beyond its top-3


@pytest.mark.parametrize("renormalise, tail", MODES)
def test_gradient_matches_loop_autograd(renormalise, tail):
    logits, ids, logprobs, mask = batch(6)
    ours = logits.clone().requires_grad_()
    ref = logits.clone().requires_grad_()
    topk_kl_loss(ours, ids, logprobs, mask, renormalise, tail).backward()
    loop_loss(ref, ids, logprobs, mask, renormalise, tail).backward()
    assert torch.allclose(ours.grad, ref.grad, rtol=1e-9, atol=1e-12)
    assert torch.all(ours.grad[~mask] == 0)

    def loss(z: torch.Tensor) -> torch.Tensor:
        return topk_kl_loss(z, ids, logprobs, mask, renormalise, tail)

    assert torch.autograd.gradcheck(loss, (logits.clone().requires_grad_(),))


def test_tail_exact_for_a_tiny_student_tail():
    """An fp32 student whose tail (≈ 1e-12) is far below fp32's resolution of 1 − Σ_k p_S:
    the tail term is still exact and still pushes the tail logits up."""
    logits = torch.zeros(1, 1, V)
    logits[0, 0, :K] = torch.tensor([30.0, 29.0, 28.0])
    ids = torch.arange(K).view(1, 1, K)
    logprobs = torch.tensor([0.6, 0.25, 0.1]).log().view(1, 1, K)
    mask = torch.ones(1, 1, dtype=torch.bool)
    z = logits.clone().requires_grad_()
    loss = topk_kl_loss(z, ids, logprobs, mask, tail=True)
    loss.backward()
    lse = math.log(math.exp(30) + math.exp(29) + math.exp(28) + (V - K))
    s_lp = [30 - lse, 29 - lse, 28 - lse, math.log(V - K) - lse]  # tail ≈ 2.6e-13
    want = sum(p * (math.log(p) - s) for p, s in zip([0.6, 0.25, 0.1, 0.05], s_lp))
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert torch.all(z.grad[0, 0, K:] < 0)  # descending the loss raises the tail logits


@pytest.mark.parametrize("renormalise, tail", MODES)
def test_bf16_logits_computed_in_fp32(renormalise, tail):
    logits, ids, logprobs, mask = batch(7, torch.float32)
    logprobs = logprobs.float()
    low = logits.bfloat16()
    loss = topk_kl_loss(low, ids, logprobs, mask, renormalise, tail)
    assert loss.dtype == torch.float32
    same_values = topk_kl_loss(low.float(), ids, logprobs, mask, renormalise, tail)
    assert loss.item() == pytest.approx(same_values.item(), rel=1e-6, abs=1e-6)
    full = topk_kl_loss(logits, ids, logprobs, mask, renormalise, tail)
    assert loss.item() == pytest.approx(full.item(), rel=2e-2, abs=2e-2)  # bf16 rounding only


def test_empty_mask_gives_zero_and_backward_works():
    logits, ids, logprobs, _ = batch(8, torch.float32)
    logits.requires_grad_()
    loss = topk_kl_loss(logits, ids, logprobs, torch.zeros(B, T, dtype=torch.bool))
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert logits.grad is not None and torch.all(logits.grad == 0)


def test_normalised_per_token_not_per_batch():
    logits, ids, logprobs, mask = batch(9, torch.float32)
    one = topk_kl_loss(logits, ids, logprobs, mask)
    twice = topk_kl_loss(*(x.repeat(1, 2, 1) for x in (logits, ids, logprobs)), mask.repeat(1, 2))
    assert twice.item() == pytest.approx(one.item(), rel=1e-6)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda z, i, lp, m: (z[0], i, lp, m), r"`student_logits` to be a float tensor"),
        (lambda z, i, lp, m: (z, i.int(), lp, m), "`teacher_ids` to be int64"),
        (lambda z, i, lp, m: (z, i[..., :2], lp, m), r"`teacher_logprobs` to be .* \(2, 3, 2\)"),
        (lambda z, i, lp, m: (z, i, lp, m.long()), "`mask` to be a bool tensor"),
        (lambda z, i, lp, m: (z, i + V, lp, m), r"`teacher_ids` in \[0, 6\]"),
        (lambda z, i, lp, m: (z, i.clamp(max=0), lp, m), "distinct `teacher_ids`"),
        (lambda z, i, lp, m: (z, i, lp.exp(), m), "Pass log\\(p\\), not p or logits"),
        (lambda z, i, lp, m: (z[..., :K], i, lp, m), "Expected k < V"),
    ],
)
def test_validation_errors(change, match):
    with pytest.raises(ValueError, match=match):
        topk_kl_loss(*change(*batch(10, torch.float32)))


def test_renormalise_and_tail_exclude_each_other():
    with pytest.raises(ValueError, match="at most one of `renormalise` and `tail`"):
        topk_kl_loss(*batch(11), renormalise=True, tail=True)


@pytest.mark.parametrize("renormalise, tail", MODES)
def test_zero_teacher_entry_at_a_minus_inf_student_logit(renormalise, tail):
    """A teacher entry with p = 0 where the student's logit is −inf (a masked vocabulary entry):
    0·(−inf) was NaN; xlogy-style it adds exactly 0, and the gradients stay finite."""
    logits = torch.tensor([[[2.0, 1.0, float("-inf"), 0.0, 0.0, 0.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[[0, 1, 2]]])
    logprobs = torch.tensor([[[0.7, 0.3, 0.0]]], dtype=torch.float64).log()  # log 0 = −inf
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss = topk_kl_loss(logits, ids, logprobs, mask, renormalise=renormalise, tail=tail)
    # student log-probs at ids 0, 1: over the vocabulary, Z = e² + e + 4 (the −inf adds 0), or
    # over the top-k only with renormalise, Z = e² + e; the teacher's tail is 0 (it sums to 1)
    log_z = math.log(math.e ** 2 + math.e + (0 if renormalise else 4))
    want = 0.7 * (math.log(0.7) - (2 - log_z)) + 0.3 * (math.log(0.3) - (1 - log_z))
    assert loss.item() == pytest.approx(want, rel=1e-12)
    loss.backward()
    assert torch.all(torch.isfinite(logits.grad)) and logits.grad[0, 0, 2] == 0


@pytest.mark.parametrize("renormalise, tail", MODES)
def test_label_smoothed_rows_keep_their_mass_through_the_loss(renormalise, tail):
    """FIRST Eq. 3 on a raw top-3 holding 0.9: (0.6, 0.2, 0.1) → (0.5, 0.25, 0.15), still 0.9. The
    default and the tail bucket take it as it is (the tail is the 0.1 it leaves out); only
    renormalise rescales it, which equals smoothing the normalised row by δ / 0.9."""
    from lab.calibration.teacher import label_smooth

    smoothed = label_smooth([0.6, 0.2, 0.1], 0.1)
    assert smoothed == pytest.approx([0.5, 0.25, 0.15], abs=1e-12)
    logits = torch.tensor([[[1.0, 0.5, 0.0, -1.0, -1.0]]], dtype=torch.float64)
    ids = torch.tensor([[[0, 1, 2]]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss = topk_kl_loss(logits, ids, torch.tensor(smoothed).log().view(1, 1, 3), mask, renormalise, tail)
    s = torch.softmax(logits[0, 0], 0).tolist()
    if renormalise:
        p_t = label_smooth([0.6, 0.2, 0.1], 0.1 / 0.9, renormalise=True)  # (0.5556, 0.2778, 0.1667)
        assert p_t == pytest.approx([0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9], abs=1e-12)
        p_s = [x / sum(s[:3]) for x in s[:3]]
    else:
        p_t, p_s = [0.5, 0.25, 0.15], s[:3]
        if tail:
            p_t, p_s = p_t + [0.1], p_s + [s[3] + s[4]]
    want = sum(t * (math.log(t) - math.log(q)) for t, q in zip(p_t, p_s))
    assert loss.item() == pytest.approx(want, rel=1e-12)
