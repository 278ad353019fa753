"""Evaluate a model on a dataset: accuracy and calibration, written to a run dir (multiple choice here;
the token tasks clm and facts in :mod:`lab.kinds.evaluate.tokens`).

A run directory holds ``config.yaml`` (the resolved config: rerunning it reproduces the run),
``metrics.json`` and ``predictions.jsonl`` (one question per line, with every probability the
metrics were computed from, so any number can be recomputed without the model).

With a ``temperature`` (a number, a ``temperature.json`` or a directory holding one) the metrics
are those of the temperature-scaled probabilities; each row keeps the unscaled ones in
``raw_probs``. With a ``calibrator`` (a ``calibrator.json`` the recalibration workbench saved, fitted
on another run) each row also gets its ``calibrated_confidence`` and ``metrics.json`` a ``calibrated``
block scoring it, beside the uncalibrated metrics, with how many of these questions it was fitted on.

With ``num_fewshot`` K on a lab dataset, K solved questions drawn from ``fewshot_split`` go before every
question (:mod:`lab.kinds.evaluate.fewshot` says how they are drawn), and ``metrics.json``'s ``fewshot``
names them; an lm-eval task's prompts hold its own examples (:mod:`lab.data.harness`).

A question whose option scores are not finite (NaN, +inf, or −inf on every option: mostly a float16
overflow) has no probabilities: it is left out like a malformed row, named in the log and in
``metrics.json``'s ``nonfinite_questions`` and counted in ``n_skipped_rows``, and the rest are
evaluated. Only when no question is left is the evaluation refused.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

import numpy as np
from scipy.special import softmax

from lab.calibration import confidence, metrics
from lab.calibration.summary import SELECTIVE_BOOT, compute_metrics, oracle_metrics, selective_metrics
from lab.calibration.temperature import scale
from lab.calibration.temperature_files import load_temperature
from lab.core.errors import ScoringError
from lab.core.files import write_atomic
from lab.core.layout import METRICS_FILE, PREDICTIONS_FILE
from lab.data import Load, harness, load
from lab.data.loading import log_skipped
from lab.data.record import MCQRecord
from lab.data.fewshot_prompts import with_shots
from lab.data.templates import get_template
from lab.jobkit.kinds import write_config
from lab.kinds.evaluate.calibrated import apply_calibrator
from lab.kinds.evaluate import fewshot
from lab.kinds.evaluate.config import CONFIDENCE, EvalConfig
from lab.kinds.evaluate.tokens import evaluate_tokens, load_placed

LISTED_NONFINITE = 5  # questions with non-finite scores named in the log or in an error
NONFINITE_REMEDY = ("In float16 a logit past 65,504 overflows to inf (and a softmax over it gives NaN): evaluate "
                    "with dtype float32 or bfloat16. Scores that stay non-finite come from the model or adapter "
                    "itself (NaN or inf weights).")


def _prediction_row(record: MCQRecord, probs: np.ndarray) -> dict[str, Any]:
    pred = int(np.argmax(probs))
    row: dict[str, Any] = {
        "id": record.id, "source": record.source, "question": record.question, "choices": list(record.choices),
        "answer": record.answer, "probs": [float(p) for p in probs], "pred": pred,
        "confidence": float(probs[pred]), "correct": pred == record.answer,
    }
    if record.labels:
        row["labels"] = list(record.labels)
    if record.meta:
        row["meta"] = record.meta
    if record.requests:  # an lm-eval document: its id there, and the context lm-eval built (shots included)
        row.update(task=record.meta["task"], doc_id=record.meta["doc_id"], context=record.requests[0][0])
    return row


def score_records(cfg: EvalConfig, loaded, records: list[MCQRecord], progress: Optional[Callable[[int], None]] = None,
                  shots: Optional[fewshot.Shots] = None):
    """Score ``records`` with an already-loaded model, each after its ``shots`` (:func:`fewshot.draw`, None: no
    examples); returns (prediction rows, extra metrics,
    skipped), ``skipped`` naming each question left out for non-finite scores (``id, where, cause``:
    :func:`lab.models.scoring.nonfinite_cause`), so that one float16 overflow does not cost the evaluation
    of all the others. A :class:`ScoringError` when no question is finite.

    Every question's length is checked against the model's context before the first forward pass:
    one question past it would otherwise hold the whole job at 0 done for minutes, then mean nothing.
    ``progress(n)`` after each batch of n questions; a job's counter is told more (:func:`_reporting`).
    """
    from lab.models.batching import batch_tokens, check_context, encode_prompts, scored_length
    from lab.models.scoring import regroup_cloze, score_cloze, score_letter
    from lab.models.shared_opening import plan_shared

    prompts, owners, named = _prompts(cfg, records, loaded.tokenizer, shots)
    encoded = encode_prompts(loaded.tokenizer, prompts, cfg.scoring)
    lengths = [scored_length(e, cfg.scoring) for e in encoded]
    check_context(loaded.model, loaded.tokenizer,
                  [(f"{r.id!r} at {r.where}" if r.where else repr(r.id), n) for r, n in zip(named, lengths)],
                  remedy="Shorten or remove these questions (their passage and options count too, and so do the "
                         "few-shot examples before them: lower num_fewshot), or evaluate a model with a longer context.")
    # Questions opening alike (few-shot examples, a description) run that opening once.
    batches, shared = plan_shared(encoded, cfg.scoring, cfg.batch_size, batch_tokens(loaded.device))
    weights = [(len(b), len(b) * max(lengths[i] - shared.get(i, 0) for i in b)) for b in batches]
    scorer = score_letter if cfg.scoring == "letter" else score_cloze
    with _reporting(progress, loaded.model, weights):
        scores = scorer(loaded.model, loaded.tokenizer, prompts, batch_size=cfg.batch_size, progress=progress,
                        encoded=encoded, batches=batches, shared=shared)
    if owners is not None:
        scores = regroup_cloze(scores, owners, [r.choices for r in records])
    skipped = [{"id": r.id, "where": r.where, "cause": s.problem} for r, s in zip(records, scores) if s.problem]
    if skipped and len(skipped) == len(records):
        raise ScoringError(f"All {len(records)} questions scored non-finite, so there is nothing to evaluate: "
                           f"{_listed(skipped)}. {NONFINITE_REMEDY}")
    kept = [(r, s) for r, s in zip(records, scores) if s.problem is None]
    rows, scores = [_prediction_row(r, s.probs) for r, s in kept], [s for _, s in kept]
    return rows, (_letter_extra if cfg.scoring == "letter" else _cloze_extra)(cfg, rows, scores), skipped


def _prompts(cfg: EvalConfig, records: list[MCQRecord], tokenizer,
             shots: Optional[fewshot.Shots] = None) -> tuple[list, Optional[list], list[MCQRecord]]:
    """What the scorer runs: one prompt a record from its template, after its ``shots``; for an lm-eval task's
    records, the prompts of their requests (:func:`lab.data.harness.prompts_of`, the task's shots in them) and
    where each option's score goes back to. The third list names the record each prompt belongs to (for a
    too-long message)."""
    if records and records[0].requests:
        prompts, owners = harness.prompts_of(records)
        owner_of = {p: i for i, spots in enumerate(owners) for p, _ in spots}
        return prompts, owners, [records[owner_of[p]] for p in range(len(prompts))]
    template = get_template(cfg.template)
    prompts = [template.render(r, tokenizer) for r in records]
    if shots is None:
        return prompts, None, records
    solved = {subject: [(template.render(s, tokenizer), s.answer) for s in examples]
              for subject, examples in shots.by_subject.items()}
    return [with_shots(p, solved[fewshot.subject_of(r)], cfg.template) for p, r in zip(prompts, records)], None, records


def scored_units(records: list[MCQRecord]) -> int:
    """Prompts a scorer's progress counts for ``records``: one a question, or an lm-eval task's contexts."""
    return len(harness.prompts_of(records)[0]) if records and records[0].requests else len(records)


def _listed(skipped: list[dict[str, str]]) -> str:
    """The first :data:`LISTED_NONFINITE` questions with non-finite scores, where and why, for a message."""
    named = "; ".join(f"{q['id']!r}{' at ' + q['where'] if q['where'] else ''}: {q['cause']}"
                      for q in skipped[:LISTED_NONFINITE])
    more = len(skipped) - LISTED_NONFINITE
    return named + (f"; and {more} more" if more > 0 else "")


def _reporting(progress: Any, model, batches: list[tuple[int, int]]) -> ContextManager[None]:
    """Tell a job's counter (:class:`lab.jobkit.worker.Counter`: one with ``weigh`` and ``within``) the work
    ahead, each batch's questions and padded tokens, and how far each forward pass is, block by
    block: so it has news every second or two, and an ETA that holds although the longest come first.
    A plain ``progress(n)`` (a progress bar, a list) is only advanced after each batch.
    """
    from lab.models.batching import layer_progress

    if not (hasattr(progress, "weigh") and hasattr(progress, "within")):
        return contextlib.nullcontext()
    progress.weigh(batches)
    return layer_progress(model, progress.within)


def _letter_extra(cfg: EvalConfig, rows: list[dict[str, Any]], scores: list) -> dict[str, Any]:
    """Full-vocabulary probabilities and top tokens on each row; the FIRST authors' ECE."""
    for row, s in zip(rows, scores):
        row["option_vocab_probs"] = [float(p) for p in s.vocab_probs]
        row["top_tokens"] = [{"token": t, "prob": p} for t, p in s.top_tokens]
    # The FIRST authors' definition: confidence = full-vocabulary probability of the answer token.
    vocab, _ = metrics.padded([s.vocab_probs for s in scores])
    conf = vocab[np.arange(len(rows)), [r["pred"] for r in rows]]
    correct = np.array([r["correct"] for r in rows])
    return {"option_mass_mean": float(vocab.sum(axis=1).mean()),
            "ece_full_vocab": metrics.ece(conf, correct, n_bins=cfg.bins, edges=cfg.bin_edges)}


def _cloze_extra(cfg: EvalConfig, rows: list[dict[str, Any]], scores: list) -> dict[str, Any]:
    """Log-likelihoods (summed and per character) on each row; ``acc_norm``."""
    norm_conf = []
    for row, s in zip(rows, scores):
        row["logliks"] = [float(x) for x in s.logliks]
        row["norm_logliks"] = [float(x) for x in s.norm_logliks]
        row["pred_norm"] = int(np.argmax(s.norm_logliks))
        norm_conf.append(float(np.max(softmax(np.asarray(s.norm_logliks, dtype=np.float64)))))
    correct_norm = np.array([r["pred_norm"] == r["answer"] for r in rows])
    # acc_norm's own confidence: the softmax over the length-normalised log-likelihoods it ranks by.
    return {"accuracy_norm": float(correct_norm.mean()),
            "ece_norm": metrics.ece(np.array(norm_conf), correct_norm, n_bins=cfg.bins, edges=cfg.bin_edges)}


def apply_temperature(rows: list[dict[str, Any]], temperature: float) -> list[dict[str, Any]]:
    """Copies of prediction rows with temperature-scaled ``probs`` (the originals in ``raw_probs``)."""
    out = []
    for row in rows:
        raw = np.asarray(row.get("raw_probs", row["probs"]), dtype=np.float64)
        probs = scale(raw[None], temperature)[0]
        pred = int(np.argmax(probs))
        out.append({**row, "raw_probs": [float(p) for p in raw], "probs": [float(p) for p in probs],
                    "temperature": temperature, "pred": pred, "confidence": float(probs[pred]),
                    "correct": pred == row["answer"]})
    return out


def evaluate(cfg: EvalConfig, out: Path, progress_factory=None, log: Callable[[str], None] = print,
             announce: Optional[Callable[[str], None]] = None, loaded: Any = None, **info: Any) -> dict[str, Any]:
    """Run one evaluation end to end and write the run directory ``out``.

    ``progress_factory(total)`` returns a callable advanced by the number of questions scored;
    ``announce(name)`` is told of each stage that has no count ("loading data …", "loading model …")
    as it begins, so a watcher sees what the job does from its first second: torch is imported only
    inside "loading model", seconds after the data stage was announced. ``loaded``: the model
    already in memory (a series evaluates one model on several tasks), else ``cfg.model`` is loaded.
    ``info`` goes into ``metrics.json`` as well (a pipeline's ``in_domain``). With ``device_map: auto``, the
    offload folder the load makes in ``out`` is deleted once the scores are written, or the run failed.
    """
    with contextlib.ExitStack() as placed_for:
        if cfg.task != "mcq":
            return evaluate_tokens(cfg, out, progress_factory, log, announce, loaded, placed_for, **info)
        return _evaluate_mcq(cfg, out, progress_factory, log, announce, loaded, placed_for, **info)


def _evaluate_mcq(cfg: EvalConfig, out: Path, progress_factory, log: Callable[[str], None],
                  announce: Optional[Callable[[str], None]], loaded: Any, placed_for: contextlib.ExitStack,
                  **info: Any) -> dict[str, Any]:
    """:func:`evaluate` of a multiple-choice task."""
    announce = announce or (lambda name: None)
    announce(f"loading data {cfg.dataset}")
    data = load(cfg.dataset, cfg.split, cfg.data_files or None, subject=cfg.subject, on_bad_rows=cfg.on_bad_rows,
                seed=cfg.seed, limit=cfg.limit, include=cfg.lm_eval_include, num_fewshot=cfg.num_fewshot)
    if harness.is_task(cfg.dataset):
        info = {**info, "lm_eval": lm_eval_info(data)}
    log_skipped(data.problems, log)
    shots = None if harness.is_task(cfg.dataset) else fewshot.draw(cfg, data.records, log)
    if shots is not None:
        info = {**info, "fewshot": shots.info}
    if loaded is None:
        loaded = load_placed(cfg, out, announce, placed_for)
    log(f"scoring {len(data.records)} questions from {data.source} with {cfg.model} ({cfg.scoring}, template {cfg.template})")
    progress = progress_factory(scored_units(data.records)) if progress_factory else None
    return evaluate_records(cfg, loaded, data.records, out, data.source, len(data.problems), progress, log=log,
                            shots=shots, **info)


def lm_eval_info(data: Load) -> dict[str, Any]:
    """What metrics.json says of an lm-eval run: each task's shots, split and metrics, the groups, the
    few-shot seed and lm-eval's version (the prompts are its, so its release is part of the result)."""
    from importlib.metadata import version

    return {"tasks": data.tasks, "groups": data.groups, "fewshot_seed": harness.FEWSHOT_SEED,
            "version": version("lm_eval")}


def evaluate_records(cfg: EvalConfig, loaded, records: list[MCQRecord], out: Path, source: str, n_skipped: int = 0,
                     progress: Optional[Callable[[int], None]] = None, log: Callable[[str], None] = print,
                     shots: Optional[fewshot.Shots] = None, **info: Any) -> dict[str, Any]:
    """Score ``records`` with a loaded model, each after its ``shots`` (none: None), and write ``out`` (config,
    predictions, metrics).

    ``n_skipped``: rows the loader left out; questions with non-finite scores are added to it and
    named in ``log`` (as :func:`evaluate` names bad rows) and in ``nonfinite_questions``. ``info``
    adds to (or overrides, e.g. ``dataset`` for a pooled set) what ``metrics.json`` says.
    """
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, "evaluate", cfg)
    start = time.perf_counter()
    rows, extra, nonfinite = score_records(cfg, loaded, records, progress, shots)
    elapsed = time.perf_counter() - start
    if nonfinite:
        log(f"skipped {len(nonfinite)} of {len(records)} questions whose scores are not finite: {_listed(nonfinite)}. "
            f"{NONFINITE_REMEDY}")
    temperature = load_temperature(cfg.temperature)
    if temperature is not None:
        rows = apply_temperature(rows, temperature)
    return write_evaluation(out, rows, cfg, {
        **extra, "model": cfg.model, "adapter": cfg.adapter, "data_source": source,
        "n_skipped_rows": n_skipped + len(nonfinite), "nonfinite_questions": nonfinite,
        "device": str(loaded.device), "dtype": str(loaded.dtype).removeprefix("torch."), "temperature": temperature,
        "seconds": round(elapsed, 3), "questions_per_second": round(len(rows) / elapsed, 3) if elapsed else None,
        **info,
    })


def write_evaluation(out: Path, rows: list[dict[str, Any]], cfg: EvalConfig, info: dict[str, Any]) -> dict[str, Any]:
    """Write ``predictions.jsonl`` and ``metrics.json``; the metrics are always recomputed from ``rows``.

    Each row gains ``signals``: every confidence signal it can give (:func:`lab.calibration.confidence.row_signals`);
    with ``cfg.calibrator``, its calibrated confidence too (:func:`apply_calibrator`). Questions with
    a known true distribution add the Bayes predictor's figures (:func:`lab.calibration.summary.oracle_metrics`) and
    ``ece_gap_to_oracle``.
    """
    out.mkdir(parents=True, exist_ok=True)
    rows = [{**r, "signals": confidence.row_signals(r["probs"], r)} for r in rows]
    result = {
        "scoring": cfg.scoring, "confidence": CONFIDENCE[cfg.scoring], "template": cfg.template,
        "dataset": cfg.dataset, "split": cfg.split, **info, **compute_metrics(rows, cfg.bins, cfg.bootstrap, cfg.seed, cfg.bin_edges),
        **selective_metrics(rows, min(cfg.bootstrap, SELECTIVE_BOOT), cfg.seed),
    }
    if len(info.get("lm_eval", {}).get("tasks", {})) > 1:
        result["subtasks"] = subtask_metrics(rows, cfg, info["lm_eval"]["tasks"])
    oracle = oracle_metrics(rows, cfg.bins, cfg.bin_edges)
    if oracle is not None:
        result.update(oracle=oracle, ece_gap_to_oracle=result["ece"] - oracle["ece"])
    if cfg.calibrator is not None:
        rows, result["calibrated"] = apply_calibrator(rows, cfg)
    write_atomic(out / PREDICTIONS_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    write_atomic(out / METRICS_FILE, json.dumps(result, indent=2, allow_nan=False) + "\n")
    return result


SUBTASK_KEYS = ("n", "accuracy", "ece", "brier", "nll")


def subtask_metrics(rows: list[dict[str, Any]], cfg: EvalConfig, tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each task of an lm-eval group on its own (the run's top-level metrics are the group's row: every
    document pooled, which is lm-eval's ``weight_by_size`` mean for accuracy): its accuracies, ECE (no
    bootstrap: dozens of subtasks), Brier, NLL and shots. A subtask whose documents were all skipped is left out."""
    out = {}
    for task, about in tasks.items():
        subset = [r for r in rows if r.get("task") == task]
        if not subset:
            continue
        summary = compute_metrics(subset, cfg.bins, 0, cfg.seed, cfg.bin_edges)
        out[task] = {**{k: summary[k] for k in SUBTASK_KEYS}, "shots": about["shots"],
                     "accuracy_norm": float(np.mean([r["pred_norm"] == r["answer"] for r in subset]))}
    return out


def run_job(cfg: EvalConfig, ctx) -> dict[str, Any]:
    return evaluate(cfg, ctx.run_dir, progress_factory=ctx.progress("scoring"), log=ctx.log, announce=ctx.announce)
