"""Score next-token predictions inside texts: the ``clm`` and ``facts`` tasks of the alignment-calibration
paper (../shared/seeds/calibration_of_llms_and_alignment.txt, §4).

``clm``: at a random position p of a document the model predicts token p from tokens [0, p); the
prediction is its argmax over the whole vocabulary, the confidence that argmax's probability, and it
is correct when it is the text's own token. ``facts``: the same, at the first token of each entity.

A document is a :class:`~lab.models.token_targets.TokenDoc`: its tokens as the model sees them and
the positions to read (:mod:`lab.models.token_targets`, which needs no torch). :func:`score_documents` reads every position of
a document in ONE forward pass: a causal model's output at p-1 depends on tokens [0, p) only, so all
of a document's targets come from the same pass, and the pass stops at the last target (the tokens
after it change nothing that is read). The LM head is applied only at the rows read — a boolean
``logits_to_keep`` (B, T), transformers' own slicing, so each model's forward keeps whatever it does
after its head (Gemma's soft-capping) — and the float32 log-softmax runs over those rows only, never
over (batch × length × vocabulary). Documents are batched longest first (:func:`plan_batches`, with
its padded-token budget on a CPU), right-padded, and come back in the input order.

A temperature rescales the whole vocabulary, which a row cannot keep, so each target also gets its
log-partition ``log Z(T) = logsumexp(z / T)`` over the vocabulary at every temperature of a grid
(:data:`GRID`), from the same kept rows (:func:`log_partition`): with the raw logits of the top tokens
and of the target, that gives any temperature's confidence and target probability later, without the
model (:mod:`lab.calibration.token_temperature`). One exact logsumexp per grid temperature would read the
rows 121 times: 30 s per 1,000 targets of a 49 k vocabulary on two CPU cores, twice the bundled
model's forward pass. The binned expansion reads them a fixed dozen times, whatever the grid: 0.5 s
there, and bench/token_tasks.py's ratio of a bare forward to the scorer drops by 2 to 5 % (on an
H200, 0.8 ms per 64 targets against 8 ms).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from lab.core.errors import DataError, ScoringError
from lab.models.loading import input_device
from lab.models.batching import batch_tokens, context_limit, index_device, plan_batches, right_padded
from lab.models.token_targets import TokenDoc

Progress = Optional[Callable[[int], None]]
TOP_K = 5
# The temperatures each target's log-partition is kept at: lab.calibration.token_temperature.TOKEN_GRID, which
# says why these (this layer cannot import it; the evaluation passes it, and a test checks they agree).
GRID = np.geomspace(0.01, 100.0, 121)

# ---------------------------------------------------------------- the binned expansion of log Z (log_partition)
FLOOR = 2.0**-7  # the bins are log-spaced in s + FLOOR, s = top logit - z >= 0: the top token's bin is finite.
# A power of two, so that top + FLOOR is exact in float32 and the top token's s is exactly 0; the expansion
# holds for beta * FLOOR <= 1, i.e. down to T = 2**-7 = 0.0078 (GRID starts at 0.01).
BIN_BITS = 6  # 2**6 = 64 bins per octave of s + FLOOR: the mantissa's top 6 bits (width <= 1/64 of the value)
SHIFT = 23 - BIN_BITS  # float32 bits >> SHIFT: exponent and those 6 bits, i.e. the bin, monotone in the value
HALF = 1 << (SHIFT - 1)  # ... and the low bits of the bin's centre
MOMENTS = 4  # the sums of d^0 .. d^3 per bin: the expansion's dropped term is (beta d)^4 / 24
NEGLIGIBLE = -200.0  # a bin's log weight below which it counts 0 (times 49,152 tokens: still below 1e-80)
FAR = 2.0**12  # s + FLOOR is capped here (a -inf logit, an absurd range): exp(-4096 / 100) ~ 1e-18 is nothing
CHUNK = 1 << 23  # logits (or bin sums, for a small vocabulary) per chunk of rows: 128 MiB a float32 temporary


def _check(docs: Sequence[TokenDoc], top_k: int, temperature: float, grid: np.ndarray) -> None:
    if top_k < 1:
        raise ValueError(f"Expected `top_k` to be an integer larger than 0, but got {top_k}")
    if not (temperature > 0 and np.isfinite(temperature)):
        raise ValueError(f"Expected `temperature` to be a finite number larger than 0, but got {temperature}")
    if grid.ndim != 1 or not grid.size or not np.all(np.isfinite(grid)) or grid.min() < FLOOR:
        raise ValueError(f"Expected `grid` to be a non-empty 1-D sequence of temperatures of at least {FLOOR} "
                         f"(log_partition's expansion holds down to there), but got {grid!r}")
    for i, doc in enumerate(docs):
        bad = [p for p in doc.positions if not 1 <= p < len(doc.ids)]
        if bad:
            raise ValueError(f"Expected document {i}'s positions in [1, {len(doc.ids)}), but got {bad[:5]}")
        if doc.entities is not None and len(doc.entities) != len(doc.positions):
            raise ValueError(f"Expected document {i} to have one entity per position, but got "
                             f"{len(doc.entities)} entities for {len(doc.positions)} positions")


def _check_context(model: torch.nn.Module, fed: Sequence[int]) -> None:
    """Refuse a document whose last target lies past the model's context (it would be fed that many
    tokens): a RoPE model would read positions it never trained on, a learned-position one fail mid-run."""
    found = context_limit(model, None)
    if found is None:
        return
    limit, source = found
    over = [(i, n) for i, n in enumerate(fed) if n > limit]
    if over:
        listed = "; ".join(f"document {i}: last target at position {n:,}" for i, n in over[:5])
        more = f"; and {len(over) - 5} more" if len(over) > 5 else ""
        raise DataError(f"{len(over)} of {len(fed)} documents have targets past the model's context of "
                        f"{limit:,} tokens ({source}): {listed}{more}. Draw positions below the limit "
                        f"(clm_positions(min(n_tokens, {limit + 1}), …)) or leave out the entities past it")


def _bits(value: float) -> int:
    """The float32 bit pattern of ``value``, as an integer: for a positive float, monotone in the value."""
    return int(torch.tensor([value], dtype=torch.float32).view(torch.int32))


BASE = _bits(FLOOR) >> SHIFT  # the first bin's number: s = 0 (the top token)
MAX_BINS = (_bits(FAR) >> SHIFT) - BASE + 1  # bins per row at most (19 octaves)


def _coefficients(n_bins: int, betas: torch.Tensor) -> torch.Tensor:
    """(MOMENTS · n_bins, G) float64: what bin k's sum of d^j (j major, k minor) is multiplied by for
    its share of ``Σ exp(−β s)``: ``exp(−β (c_k − FLOOR)) (−β)^j / j!``, c_k its centre in s + FLOOR."""
    numbers = torch.arange(BASE, BASE + n_bins, dtype=torch.int32, device=betas.device)
    centres = ((numbers << SHIFT) | HALF).view(torch.float32).double()  # (K,)
    exponent = -betas[None, :] * (centres[:, None] - FLOOR)  # (K, G)
    # exp(-745) underflows through subnormal numbers, which x86 computes with a hundred times slower: a bin
    # weighing less than exp(NEGLIGIBLE) against the top token's 1 gets 0 instead.
    weight = torch.where(exponent > NEGLIGIBLE, torch.exp(exponent.clamp(min=NEGLIGIBLE)), 0.0)
    return torch.cat([weight * (-betas) ** j / math.factorial(j) for j in range(MOMENTS)])


def log_partition(logits: torch.Tensor, top: torch.Tensor, betas: torch.Tensor) -> torch.Tensor:
    """``log Σ_v exp(β z_v)`` (R, G) float64 for each row of ``logits`` (R, V) float32 and each β of
    ``betas`` (G,) float64, given each row's largest logit ``top`` (R,), finite.

    With s_v = top − z_v ≥ 0 the sum is ``exp(β·top) Σ_v exp(−β s_v)``. The s_v are binned by their
    float32 bit pattern (:data:`BIN_BITS`: 64 log-spaced bins per octave of s + :data:`FLOOR`), and a
    bin with centre c contributes ``exp(−β c) Σ exp(−β d)``, d = s − c, whose Taylor expansion
    ``1 − β d + β² d² / 2 − β³ d³ / 6`` needs only the bin's sums of d⁰ … d³ (:data:`MOMENTS`): four
    ``index_add_`` over the rows give every β of the grid at once, by one matrix product with
    :func:`_coefficients`. A bin is at most 1/64 of its s + FLOOR wide, so |β d| ≤ β (s + FLOOR) / 128,
    small wherever the bin weighs (exp(−β s) against the top token's 1: |β d| ≤ 0.1 while β s ≤ log V);
    the dropped ``(β d)⁴ / 24`` then moves log Z by less than 1e-5 even when every token of a bin sits
    at one edge of it. Against an exact float64 logsumexp of the same float32 logits, the largest error
    in log Z over the rows at any temperature of :data:`GRID` (``bench/token_tasks.py --accuracy``): 5e-8
    on the bundled model's logits (2e-8 at T = 1, 1e-10 at T = 0.01), 3e-8 on random normal ones (sd 3)
    and 2.3e-7 on Student t ones (3 degrees of freedom, scale 2); 2e-6 on thousands of tokens all at one
    gap from the top (tests/calibration/test_token_temperature.py). Half the bins per octave make that 3 to 16 times
    larger, one moment fewer 2 to 16 times (3e-5 on those clusters). What a run stores is as good as
    its forward pass: the float32 logits of a batched, padded pass differ from one unpadded pass by about
    1e-5, which log Z(T) carries divided by T — against one unpadded forward per target, the stored
    ``log_z`` is off by 1e-5 at T = 1 and 2e-3 at T = 0.01 on the bundled model (the top logit moves with
    it, so a confidence moves far less). About twelve float32 passes over the rows in all, in chunks of
    :data:`CHUNK` logits.
    """
    out = []
    step = max(1, CHUNK // max(logits.shape[1], MOMENTS * MAX_BINS))
    for start in range(0, logits.shape[0], step):
        z, m = logits[start:start + step], top[start:start + step, None]
        shifted = torch.sub(m + FLOOR, z)  # (c, V): s + FLOOR, exactly FLOOR at the top (m + FLOOR is exact)
        far = float(shifted.max())
        if far > FAR:
            shifted.clamp_(max=FAR)
            far = FAR
        bits = shifted.view(torch.int32)
        n_bins = (_bits(far) >> SHIFT) - BASE + 1
        index = torch.bitwise_right_shift(bits, SHIFT)  # (c, V): the bin, then a flat (row, bin) number
        index += (torch.arange(len(z), dtype=torch.int32, device=z.device) * n_bins - BASE)[:, None]
        centre = torch.bitwise_and(bits, -(1 << SHIFT)).bitwise_or_(HALF).view(torch.float32)
        offset = torch.sub(shifted, centre, out=centre).view(-1)  # d, exact: both lie in the same octave
        index = index.view(-1)
        sums = torch.zeros(MOMENTS, len(z) * n_bins, dtype=torch.float32, device=z.device)
        power = torch.ones(1, device=z.device).expand(len(offset))  # d^0, then d^1, d^2, d^3
        for j in range(MOMENTS):
            sums[j].index_add_(0, index, power)
            if j + 1 < MOMENTS:
                power = offset if j == 0 else power * offset
        moments = sums.view(MOMENTS, len(z), n_bins).permute(1, 0, 2).reshape(len(z), MOMENTS * n_bins).double()
        out.append(torch.log(moments @ _coefficients(n_bins, betas)) + betas * m.double())
    return torch.cat(out)


def _rows(logits: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, top_k: int, temperature: float,
          betas: torch.Tensor) -> list[tuple]:
    """Per target: (target log-prob, top ids, top log-probs, problem, top logits, target logit, log Z
    at each of ``betas``, Σ_v p_v²) from the kept rows' raw ``logits`` (R, V) and each target's row ``rows``
    (N,); the log-probs and Σ_v p_v² at ``temperature``, the logits and log Z unscaled."""
    x = logits.float()  # (R, V) fp32: the kept rows only
    top_z, top_ids = x.topk(top_k, dim=-1)  # (R, k): the order of every temperature
    # NaN or +inf anywhere in a row leaves its log-softmax undefined (lab.models.scoring.letter_problem); topk
    # puts either first. Such a row is zeroed for the log-partition, which needs finite numbers, and skipped.
    broken = ~torch.isfinite(top_z[:, 0])  # (R,)
    if bool(broken.any()):
        x = torch.where(broken[:, None], 0.0, x)
    logp = torch.log_softmax(x if temperature == 1 else x / temperature, dim=-1)  # (R, V)
    top_lp, target_lp = logp.gather(1, top_ids), logp[rows, targets]
    # Σ_v p_v², the exact Brier's one term over the whole vocabulary (Σ_v (p_v − 1[v = t])² = Σ p² − 2 p_t + 1):
    # in logs, as logsumexp(2 log p), so that no p² underflows to a zero that a sum of them would lose.
    sum_sq = torch.logsumexp(2 * logp, dim=-1).exp()  # (R,)
    log_z = log_partition(x, torch.where(broken, 0.0, top_z[:, 0]), betas)  # (R, G)
    return list(zip(target_lp.tolist(), top_ids[rows].tolist(), top_lp[rows].tolist(), broken[rows].tolist(),
                    top_z[rows].tolist(), x[rows, targets].tolist(), log_z[rows].tolist(), sum_sq[rows].tolist()))


@torch.inference_mode()
def score_documents(model: torch.nn.Module, docs: Sequence[TokenDoc], pad_id: int, batch_size: int = 8,
                    top_k: int = TOP_K, progress: Progress = None, temperature: float = 1.0,
                    grid: Sequence[float] = GRID) -> list[list[dict]]:
    """Per document, per target position (in ``doc.positions``' order), the model's prediction there:

    ``{"position", "entity", "target_id", "pred_id", "confidence", "target_prob", "top_ids",
    "top_probs", "rest", "sum_sq", "problem", "top_logits", "target_logit", "log_z"}`` with
    ``confidence = max_v P(v | ids[:p])`` over the whole vocabulary (= ``top_probs[0]``),
    ``pred_id = top_ids[0]`` (correct: ``pred_id == target_id``), ``target_prob = P(ids[p] | ids[:p])``,
    ``rest = 1 - sum(top_probs)`` (clamped at 0: float error), ``sum_sq = Σ_v P(v | ids[:p])²`` over the
    whole vocabulary (the exact Brier score is ``sum_sq − 2 target_prob + 1``) and ``problem`` None, or why the row's
    probabilities are undefined (NaN there then; the caller skips and counts it). ``entity`` is the
    doc's entity index for that position, None for clm.
    ``temperature`` T scales the logits before the softmax over the whole vocabulary, ``softmax(z / T)``
    (the logit form of :func:`lab.calibration.temperature.scale`, which top-k rows alone could not give).
    Whatever ``temperature``, ``top_logits`` (the top tokens' raw logits, in ``top_ids`` order),
    ``target_logit`` and ``log_z``, ``log Σ_v exp(z_v / T)`` at each T of ``grid`` (:func:`log_partition`),
    are the unscaled model's: any other temperature's probabilities follow from them.

    One forward pass per batch of at most ``batch_size`` documents (and, on a CPU, the padded-token
    budget of :data:`lab.models.batching.BATCH_TOKENS`), each document fed up to its last target only.
    A document whose last target lies past the model's context is refused (:class:`DataError`, naming
    it) before any pass; a document with no positions gets [] without one. ``progress(n)`` after each
    batch, n the targets it scored (a document's positions; one per document for clm's default).
    """
    grid = np.asarray(grid, dtype=np.float64)
    _check(docs, top_k, temperature, grid)
    fed = [max(doc.positions) if doc.positions else 0 for doc in docs]  # tokens fed: ids[:last target]
    _check_context(model, fed)
    results: list[list[dict]] = [[] for _ in docs]
    todo = [i for i, n in enumerate(fed) if n]
    device, index = input_device(model), index_device(model)
    betas = torch.tensor(1.0 / grid, dtype=torch.float64, device=device)  # (G,)
    for batch in plan_batches([fed[i] for i in todo], batch_size, batch_tokens(device)):
        chosen = [todo[j] for j in batch]
        ids, mask = right_padded([docs[i].ids[: fed[i]] for i in chosen], pad_id)  # (B, T)
        keep = torch.zeros(ids.shape, dtype=torch.bool)  # (B, T): True at p-1 for every target p
        cells = [(b, p - 1) for b, i in enumerate(chosen) for p in docs[i].positions]
        b_idx, t_idx = torch.tensor(cells, dtype=torch.long).T  # (N,), (N,)
        keep[b_idx, t_idx] = True
        # The kept rows come back flattened row-major over `keep`: a cell's row is its rank among them.
        row_of = keep.flatten().cumsum(0) - 1  # (B*T,)
        rows = row_of[b_idx * ids.shape[1] + t_idx]  # (N,)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), logits_to_keep=keep.to(index),
                       use_cache=False).logits  # (R, V), R distinct kept cells: beside the LM head, wherever that is
        if logits.ndim != 2 or logits.shape[0] != int(keep.sum()):
            raise ScoringError(f"Expected the model to return logits of shape ({int(keep.sum())}, vocabulary) for a "
                               f"boolean logits_to_keep, but got {tuple(logits.shape)}; this model's forward does "
                               "not slice with transformers' slice_logits_to_keep")
        if top_k > logits.shape[-1]:
            raise ValueError(f"Expected `top_k` at most the vocabulary ({logits.shape[-1]}), but got {top_k}")
        targets = torch.tensor([docs[i].ids[p] for i in chosen for p in docs[i].positions])  # (N,)
        out = logits.device
        scored = iter(_rows(logits, rows.to(out), targets.to(out), top_k, temperature, betas.to(out)))
        for i in chosen:
            doc = docs[i]
            for n, p in enumerate(doc.positions):
                target_lp, top_ids, top_lp, broken, top_z, target_z, log_z, sum_sq = next(scored)
                top_probs = [float(np.exp(v)) for v in top_lp]
                results[i].append({
                    "position": p, "entity": doc.entities[n] if doc.entities is not None else None,
                    "target_id": doc.ids[p], "pred_id": top_ids[0], "confidence": top_probs[0],
                    "target_prob": float(np.exp(target_lp)), "top_ids": top_ids, "top_probs": top_probs,
                    "rest": max(0.0, 1.0 - sum(top_probs)), "sum_sq": min(1.0, sum_sq),
                    "problem": "NaN or +inf logit (probabilities undefined)" if broken else None,
                    "top_logits": top_z, "target_logit": target_z, "log_z": log_z,
                })
        if progress:
            progress(len(cells))
    return results
