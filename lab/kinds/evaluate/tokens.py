"""The token tasks of an evaluation (the alignment-calibration paper's §4): ``clm``, the token at
``positions`` random places of each text (after ``min_context`` tokens), and ``facts``, the first
token of each entity of an entity-annotated text. The model predicts each target from everything
before it; confidence is its top probability over the whole vocabulary, correct that the top token
is the text's.

``predictions.jsonl`` holds one row per target — ``doc`` (index of the document in file order),
``position`` (index of the target in the document's tokens as the model saw them, prompt prefix
included), ``target_id``, ``pred_id``, ``confidence``, ``correct``, ``target_prob``, the top-k ids,
tokens and probabilities and ``rest`` (the mass outside them), ``sum_sq`` (Σ_v p_v² over the whole
vocabulary, for the exact Brier score), the ``context`` text before the target
(for case studies) and, for facts, ``entity`` (its index in the row's list); ``meta``, the document's
other fields, on its first row only (a clm document has hundreds). For any other
temperature later (:class:`lab.calibration.token_temperature.TokenLogits`), the raw logits of the top
tokens (``top_logits``) and of the target (``target_logit``), and ``log_z``, the log-partition over
the vocabulary at each temperature of ``metrics.json``'s ``temperature_grid``; and ``key``, the
target's identity across runs (its document's text hashed, and where in it the target starts),
which a calibrator keeps to recognise the targets it was fitted on. ``metrics.json`` has the
multiple-choice keys (:func:`lab.calibration.summary.token_metrics`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from lab.calibration.oracle import oracle_report
from lab.calibration.summary import token_metrics
from lab.calibration.temperature_files import load_temperature
from lab.calibration.token_temperature import TOKEN_GRID
from lab.core.errors import DataError
from lab.core.files import write_atomic
from lab.core.layout import METRICS_FILE, PREDICTIONS_FILE
from lab.data import synthetic
from lab.data.loading import log_skipped
from lab.data.templates import get_template
from lab.data import load
from lab.data.texts import TextRecord
from lab.jobkit.kinds import write_config
from lab.kinds.evaluate.calibrated import apply_calibrator
from lab.kinds.evaluate.config import CONFIDENCE, EvalConfig
from lab.models.token_targets import NO_SPAN, TokenDoc, clm_positions, encode, facts_positions, with_bos

TOP_K = 5  # the top tokens each row keeps (their probabilities, for Brier and the case studies)
CONTEXT_CHARS = 400  # of text before a target, kept in its row for the case studies
SHOWN_CHARS = 40  # of an entity left out, quoted where it is named
LISTED = 100  # entities left out that metrics.json names (all are counted)
# predictions.jsonl's cap: a row is about 2 KB (its log_z grid), so 1 GiB is half a million targets.
MAX_PREDICTIONS_BYTES = 2**30
# log_z is kept to this many decimals (5e-7): finer than the forward pass's own float32 noise in it (1e-5 / T,
# bench/token_tasks.py --accuracy), if coarser than log_partition's (2e-7), and a third shorter.
# The logits are kept whole: a top logit off by 1e-6 moves log Z(T) - z_top / T by 1e-4 at T = 0.01.
LOG_Z_DECIMALS = 6


def _where(record: TextRecord) -> str:
    return f"{record.origin[0]}:{record.origin[1]}" if record.origin else record.id


class Plan(NamedTuple):
    """What :func:`_documents` plans: the documents to score, the index of each one's record, the
    character span of each one's every token, the documents left out and, for facts, the entities
    left out (each named by file and line, and why)."""

    docs: list[TokenDoc]
    kept: list[int]
    spans: list[list[tuple[int, int]]]
    skipped: list[str]
    skipped_entities: list[str]


def _documents(cfg: EvalConfig, tokenizer, records: list[TextRecord], prefix: str, context: Optional[int]) -> Plan:
    """Each record's tokens and targets (a document is left out when it is too short for ``min_context``,
    or has no entity the tokenizer could place); for facts, every entity without a target is named.

    ``min_context`` counts the text's own tokens: the template's prefix and special tokens come on
    top. A clm target is drawn among the first ``context`` tokens (the model's window), so that no
    document is refused for its length; a facts entity past the window is left out. facts reads a text
    from the model's BOS token when nothing else precedes it (:func:`with_bos`), so that an entity
    opening the text is predicted from that; a tokenizer without one leaves such an entity out."""
    plan = Plan([], [], [], [], [])
    for i, record in enumerate(records):
        ids, offsets = encode(tokenizer, record.text, prefix)
        if cfg.task == "clm":
            rng = np.random.default_rng([cfg.seed, i])  # one stream per document: a limit keeps the others' draws
            lead = next((j for j, span in enumerate(offsets) if span != NO_SPAN), len(ids))
            n = len(ids) if context is None else min(len(ids), context + 1)
            positions = clm_positions(n, cfg.positions, lead + cfg.min_context, rng)
            entities: list[Optional[int]] = [None] * len(positions)
            why = f"{len(ids)} tokens, not more than min_context {cfg.min_context}"
        else:
            ids, offsets = with_bos(ids, offsets, tokenizer.bos_token_id)
            placed, left_out = facts_positions(offsets, record.entities)
            if context is not None:
                left_out += [(e, f"past the model's window of {context:,} tokens") for e, p in placed if p > context]
                placed = [(e, p) for e, p in placed if p <= context]
            entities, positions = [e for e, _ in placed], [p for _, p in placed]
            why = "no entity has a token to predict it from"
            plan.skipped_entities.extend(_entity_named(record, e, reason) for e, reason in sorted(left_out))
        if not positions:
            plan.skipped.append(f"{_where(record)}: {why}")
            continue
        plan.docs.append(TokenDoc(ids=ids, positions=positions, entities=entities))
        plan.kept.append(i)
        plan.spans.append(offsets)
    return plan


def _entity_named(record: TextRecord, entity: int, reason: str) -> str:
    """An entity left out, as the log and ``metrics.json`` name it: file:line, its index, text and why."""
    start, end = record.entities[entity]
    return f"{_where(record)}: entity {entity} {record.text[start:end][:SHOWN_CHARS]!r}: {reason}"


def _row(record: TextRecord, index: int, offsets: list[tuple[int, int]], scored: dict[str, Any],
         entity: Optional[int], decode: Callable[[int], str], first: bool) -> dict[str, Any]:
    start = offsets[scored["position"]][0]
    row: dict[str, Any] = {
        "id": f"{record.id}@{scored['position']}", "doc": index, "position": scored["position"],
        "target_id": scored["target_id"], "target": decode(scored["target_id"]),
        "pred_id": scored["pred_id"], "pred": decode(scored["pred_id"]),
        "confidence": scored["confidence"], "correct": scored["pred_id"] == scored["target_id"],
        "target_prob": scored["target_prob"], "top_ids": scored["top_ids"],
        "top_tokens": [decode(t) for t in scored["top_ids"]], "top_probs": scored["top_probs"],
        "rest": scored["rest"], "sum_sq": scored["sum_sq"], "context": record.text[max(0, start - CONTEXT_CHARS):max(start, 0)],
        "top_logits": scored["top_logits"], "target_logit": scored["target_logit"],
        "log_z": [round(v, LOG_Z_DECIMALS) for v in scored["log_z"]],
        "key": f"{hashlib.blake2b(record.text.encode('utf-8'), digest_size=8).hexdigest()}@{start}",
    }
    if entity is not None:
        row["entity"] = entity
    if record.meta and first:  # once per document: a clm document's hundreds of targets would each copy it
        row["meta"] = record.meta
    return row


def _predictions_text(rows: list[dict[str, Any]], cap: int = MAX_PREDICTIONS_BYTES) -> str:
    """``predictions.jsonl``'s text, one JSON row a line; a DataError as soon as it passes ``cap`` bytes
    (UTF-8), before it fills the memory or the disk."""
    lines, size = [], 0
    for n, row in enumerate(rows, 1):
        line = json.dumps(row, ensure_ascii=False) + "\n"
        size += len(line.encode("utf-8"))
        if size > cap:
            raise DataError(f"predictions.jsonl would pass {cap / 2**20:,.0f} MiB, the most one token run writes, "
                            f"at its row {n:,} of {len(rows):,} (about {size / n:,.0f} bytes a row): score fewer "
                            "documents (limit) or positions, or leave out the extra fields of large rows")
        lines.append(line)
    return "".join(lines)


def oracle_block(records: list[TextRecord], rows: list[dict[str, Any]], n_bins: int,
                 edges: str) -> Optional[dict[str, Any]]:
    """The Bayes predictor's figures when every target's document is a statement of the controlled task
    (:func:`lab.data.synthetic.statement_truth`: its true distribution over the colours and the stated
    one); None for any other data, whatever fields its rows carry."""
    found = [synthetic.statement_truth(records[r["doc"]]) for r in rows]
    if not rows or any(f is None for f in found):
        return None
    return oracle_report([f[0] for f in found], [f[1] for f in found], n_bins, edges)


def load_placed(cfg: EvalConfig, out: Path, announce: Callable[[str], None],
                placed_for: Optional[contextlib.ExitStack]) -> Any:
    """``cfg.model`` loaded for scoring (torch is imported here: after the stage that explains the wait), whole on
    ``cfg.device`` or, with ``device_map: auto``, spread out, its offload folder in ``out`` kept until
    ``placed_for`` closes (the scores are written)."""
    from lab.models.loading import load_model
    from lab.models.placement import placed

    announce(f"loading model {cfg.model}")
    if placed_for is None and cfg.device_map != "none":
        raise ValueError("device_map: auto needs the run's offload folder kept open while it scores (placed_for)")
    placing = placed_for.enter_context(placed(out, cfg)) if placed_for is not None else {}
    return load_model(cfg.model, adapter=cfg.adapter, device=cfg.device, dtype=cfg.dtype, announce=announce, **placing)


def evaluate_tokens(cfg: EvalConfig, out: Path, progress_factory=None, log: Callable[[str], None] = print,
                    announce: Optional[Callable[[str], None]] = None, loaded: Any = None,
                    placed_for: Optional[contextlib.ExitStack] = None, **info: Any) -> dict[str, Any]:
    """Run a clm or facts evaluation end to end and write the run directory ``out``; with ``loaded``
    (a model already in memory) rather than loading ``cfg.model`` (its offload folder held by ``placed_for``)."""
    announce = announce or (lambda name: None)
    announce(f"loading data {cfg.dataset}")
    data = load(cfg.dataset, cfg.split, cfg.data_files or None, task=cfg.task, on_bad_rows=cfg.on_bad_rows,
                limit=cfg.limit, seed=cfg.seed)
    log_skipped(data.problems, log)
    from lab.models.batching import context_limit
    from lab.models.token_scoring import score_documents

    if loaded is None:
        loaded = load_placed(cfg, out, announce, placed_for)
    tokenizer = loaded.tokenizer
    limit = context_limit(loaded.model, tokenizer)
    context = None if limit is None else limit[0]
    plan = _documents(cfg, tokenizer, data.records, get_template(cfg.template).text_prefix(tokenizer), context)
    docs, kept, spans, short = plan.docs, plan.kept, plan.spans, plan.skipped
    for reason in short[:5]:
        log(f"skipped {reason}")
    if plan.skipped_entities:
        log(f"skipped {len(plan.skipped_entities)} entities with no target: " + "; ".join(plan.skipped_entities[:5])
            + ("; …" if len(plan.skipped_entities) > 5 else ""))
    if not docs:
        raise DataError(f"no document of {data.source} has a target to predict ({len(short)} skipped: "
                        f"{short[0] if short else 'none read'})")
    n_targets = sum(len(d.positions) for d in docs)
    log(f"scoring {n_targets} targets in {len(docs)} documents from {data.source} with {cfg.model} "
        f"(task {cfg.task}, template {cfg.template})")
    progress = progress_factory(n_targets) if progress_factory else None
    temperature = load_temperature(cfg.temperature)
    start = time.perf_counter()
    scored = score_documents(loaded.model, docs, tokenizer.pad_token_id, batch_size=cfg.batch_size, top_k=TOP_K,
                             progress=progress, temperature=temperature or 1.0, grid=TOKEN_GRID)
    elapsed = time.perf_counter() - start
    decode = lambda token: tokenizer.decode([token])  # noqa: E731
    rows, undefined = [], []
    for doc, index, offsets, targets in zip(docs, kept, spans, scored):
        for target in targets:
            if target["problem"]:
                undefined.append(f"{_where(data.records[index])} at token {target['position']}: {target['problem']}")
            else:
                first = not rows or rows[-1]["doc"] != index
                rows.append(_row(data.records[index], index, offsets, target, target["entity"], decode, first))
    if undefined:
        log(f"skipped {len(undefined)} targets whose probabilities are not finite, e.g. {undefined[0]}")
    if not rows:
        raise DataError(f"no target of {data.source} has finite probabilities: {undefined[0]}")
    write_config(out, "evaluate", cfg)
    result = {
        "task": cfg.task, "confidence": CONFIDENCE[cfg.task], "template": cfg.template, "dataset": cfg.dataset,
        "split": cfg.split, "model": cfg.model, "adapter": cfg.adapter, "data_source": data.source,
        "n_documents": len(docs), "n_skipped_rows": len(data.problems) + len(short),
        "n_skipped_targets": len(undefined),
        **({"n_skipped_entities": len(plan.skipped_entities), "skipped_entities": plan.skipped_entities[:LISTED]}
           if cfg.task == "facts" else {}),
        "device": str(loaded.device), "dtype": str(loaded.dtype).removeprefix("torch."), "temperature": temperature,
        "seconds": round(elapsed, 3), "targets_per_second": round(len(rows) / elapsed, 3) if elapsed else None,
        **info, **token_metrics(rows, cfg.bins, cfg.bootstrap, cfg.seed, cfg.bin_edges),
        "temperature_grid": TOKEN_GRID.tolist(),
    }
    truth = oracle_block(data.records, rows, cfg.bins, cfg.bin_edges)
    if truth is not None:
        result.update(oracle=truth, ece_gap_to_oracle=result["ece"] - truth["ece"])
    if cfg.calibrator is not None:
        rows, result["calibrated"] = apply_calibrator(rows, cfg)
    write_atomic(out / PREDICTIONS_FILE, _predictions_text(rows))
    write_atomic(out / METRICS_FILE, json.dumps(result, indent=2, allow_nan=False) + "\n")
    return result
