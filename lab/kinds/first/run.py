"""The FIRST pipeline (REFERENCE.md §2), one stage after another in one run directory.

Each stage writes ``done.json`` in its own sub-directory when it finishes; a rerun of the same
config in the same directory skips finished stages, so an interrupted pipeline resumes where it
stopped (training stages also resume from their last epoch checkpoint).

    teacher/          fine-tuned teacher (or none: an existing teacher is used as is)
    topk/             teacher top-k over the training sequences (manifest.json: coverage, storage)
    topk_oracle/      the same with the true answer distribution at the answer positions (``oracle`` student)
    topk_val/         teacher top-k at the answer position of the validation questions
    sweep.json        the temperature sweep
    students/<name>/  one per student method
    eval/<model>-<set>/       metrics.json and predictions.jsonl per model and evaluation set (the dataset,
                              or dataset-split for a second split of the same dataset)
    report.json, report.md
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from lab.calibration.teacher import direct, label_smooth
from lab.calibration.first_sweep import TRANSFORMS, sweep_teacher_temperature
from lab.core.errors import ModelLoadError
from lab.core.events import EventWriter
from lab.core.layout import EVAL_DIR, TOPK_DIR
from lab.data import DataError
from lab.data.templates import get_template
from lab.jobkit.stages import stage
from lab.jobkit.worker import JobContext
from lab.kinds.evaluate.run import evaluate
from lab.kinds.extract.run import extract_records, tokenizer_name
from lab.kinds.extract.store import TopKStore, extract_topk, misalignment
from lab.kinds.first.config import ORACLE, FirstConfig
from lab.kinds.first.oracle import missing_truth, write_oracle_store
from lab.kinds.first.report import sweep_summary, write_report
from lab.models.loading import load_model, resolve_model_path
from lab.models.batching import split_pairs
from lab.models.tokenizers import load_tokenizer
from lab.training.data import build_examples, pad_batch
from lab.training.distill import DistillTrainer
from lab.training.kd_losses import topk_kl_loss
from lab.training.trainer import finetune, load_split_records, prepare_model, run_training


def _teacher(cfg: FirstConfig, out: Path, events: EventWriter, should_stop) -> dict[str, Any]:
    if not cfg.finetune_teacher:
        return {"model": cfg.teacher, "adapter": cfg.teacher_adapter, "history": []}
    tcfg = cfg.train_config(cfg.teacher, cfg.teacher_method, epochs=cfg.teacher_epochs)
    return finetune(tcfg, out, events, should_stop, stage="teacher")


def _extract(cfg: FirstConfig, teacher: dict[str, Any], out: Path, events: EventWriter, should_stop) -> dict[str, Any]:
    """Teacher top-k over the training sequences, and at the answer position of the validation questions."""
    loaded = load_model(teacher["model"], adapter=teacher["adapter"], device=cfg.device, dtype=cfg.dtype)
    tok = loaded.tokenizer
    tcfg = cfg.train_config(cfg.student, cfg.student_method)  # the sequences as the students will train on them
    train = load_split_records(tcfg, cfg.train_split, [], cfg.train_limit)
    meta = {"model": teacher, "dataset": cfg.dataset, "split": cfg.train_split, "template": cfg.template,
            "tokenizer": tokenizer_name(tok)}
    manifest = extract_records(loaded, train, cfg.template, out / "train", k=cfg.k, logprob_dtype=cfg.logprob_dtype,
                               completion_only=tcfg.completion_only, max_length=tcfg.max_length, meta=meta,
                               events=events, should_stop=should_stop)
    val = load_split_records(tcfg, cfg.val_split, [], cfg.val_limit)
    render = get_template(cfg.template).render
    contexts, answers = [], []
    for record in val:
        context, continuations = split_pairs(tok, render(record, tok), strict=True)
        contexts.append(context)
        answers.append(continuations[record.answer][0])
    extract_topk(loaded.model, contexts, out / "val", k=cfg.k, logprob_dtype="float32", pad_id=tok.pad_token_id,
                 meta={**meta, "split": cfg.val_split, "answer_token_ids": answers})
    return {"coverage": manifest.get("coverage"), "storage": manifest.get("storage"),
            "n_sequences": manifest["n_sequences"], "n_val": len(val)}


def _sweep(cfg: FirstConfig, topk_dir: Path, events: EventWriter) -> dict[str, Any]:
    """Grid-search the temperature on the teacher's top-k at the validation answer positions."""
    store = TopKStore(topk_dir / "val")
    answers = store.manifest["meta"]["answer_token_ids"]
    probs, ranks = [], []
    for i, answer in enumerate(answers):
        ids, logprobs = store[i]
        probs.append(np.exp(logprobs[-1]))  # last row: the distribution of the answer token
        hits = np.flatnonzero(ids[-1] == answer)
        ranks.append(int(hits[0]) if hits.size else -1)
    result = sweep_teacher_temperature(np.array(probs), np.array(ranks), form=cfg.ts_form, objective=cfg.ts_objective,
                                       grid=cfg.ts_grid, n_bins=cfg.bins, bin_edges=cfg.bin_edges)
    for record in result["records"]:  # its own "stage" is the pass (coarse / widen / fine)
        events.emit("sweep", grid=record["stage"], **{k: v for k, v in record.items() if k != "stage"})
    if result["widened"] or result["on_edge"]:
        events.emit("warning", message=f"temperature sweep: {sweep_summary(result)}", widened=result["widened"],
                    on_edge=result["on_edge"])
    return result


def _transform(cfg: FirstConfig, method: str, sweep: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    """How each distillation student re-calibrates the stored teacher probabilities (k per row).

    Label smoothing keeps each row's mass (Eq. 3 on the raw top-k) unless ``ls_renormalise``; the
    rows reach :func:`topk_kl_loss` as they are, which renormalises them only with ``kd_renormalise``.
    """
    if method in ("distill", ORACLE):
        return lambda p: direct(p, cfg.direct_delta)
    if method == "distill_ls":
        return lambda p: label_smooth(p, cfg.ls_delta, renormalise=cfg.ls_renormalise)
    return lambda p: TRANSFORMS[cfg.ts_form](p, sweep["best"])


def _train_truths(cfg: FirstConfig) -> list[Optional[list[float]]]:
    """Each training question's true answer distribution, or None where it has none."""
    tcfg = cfg.train_config(cfg.student, cfg.student_method)
    return [r.meta.get("true_probs") for r in load_split_records(tcfg, tcfg.split, [], tcfg.limit)]


def _oracle_store(cfg: FirstConfig, topk: Path, out: Path) -> dict[str, Any]:
    """The teacher's training store with its answer rows set to the questions' true distributions."""
    tcfg = cfg.train_config(cfg.student, cfg.student_method)
    tok = load_tokenizer(resolve_model_path(cfg.student), cfg.student)
    records = load_split_records(tcfg, tcfg.split, [], tcfg.limit)
    examples = build_examples(records, tcfg.template, tok, tcfg.completion_only, tcfg.max_length)
    manifest = write_oracle_store(topk / "train", out / "train", examples, [r.meta["true_probs"] for r in records])
    return {"n_sequences": manifest["n_sequences"]}


def _distill(cfg: FirstConfig, method: str, sweep: dict[str, Any], topk_dir: Path, out: Path, events: EventWriter,
             should_stop) -> dict[str, Any]:
    tcfg = cfg.train_config(cfg.student, cfg.student_method)
    model, tok, device = prepare_model(tcfg)
    train = load_split_records(tcfg, tcfg.split, [], tcfg.limit)
    examples = build_examples(train, tcfg.template, tok, tcfg.completion_only, tcfg.max_length)
    store = TopKStore(topk_dir / "train")
    problem = misalignment(store.manifest, [e["input_ids"] for e in examples], tokenizer_name(tok))
    if problem:
        raise ModelLoadError(f"{problem} (store: {store.out_dir})")
    for i, example in enumerate(examples):
        example["topk"] = i
    transform = _transform(cfg, method, sweep)
    pad_id = tok.pad_token_id

    def collate(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        padded = pad_batch(batch, pad_id)
        shape = (*padded["input_ids"].shape, cfg.k)
        ids = torch.zeros(shape, dtype=torch.long)
        logprobs = torch.full(shape, -1e4)  # padding rows: masked out by the labels anyway
        for row, example in enumerate(batch):
            t_ids, t_lp = store[example["topk"]]
            p = transform(np.exp(t_lp.astype(np.float64)))  # (T, k) re-calibrated teacher
            ids[row, : len(t_ids)] = torch.from_numpy(t_ids.astype(np.int64))
            logprobs[row, : len(t_ids)] = torch.from_numpy(np.log(np.clip(p, 1e-30, None))).float()
        return {**padded, "teacher_ids": ids, "teacher_logprobs": logprobs}

    val = load_split_records(tcfg, tcfg.val_split, [], tcfg.val_limit)

    def kd_loss(logits, ids, logprobs, mask):
        return topk_kl_loss(logits, ids, logprobs, mask, renormalise=cfg.kd_renormalise, tail=cfg.kd_tail)

    return run_training(DistillTrainer, tcfg, out, examples, model, tok, device, events, f"student:{method}",
                        should_stop, val, collate, kd_loss=kd_loss)


def _evaluations(cfg: FirstConfig) -> list[tuple[str, dict[str, Any]]]:
    """(set name, spec): the in-domain test first, then each out-of-domain set, named by its dataset
    or, where that name is taken (the controlled task's shifted split of the same dataset), dataset/split."""
    specs = [{"dataset": cfg.dataset, "data_files": cfg.data_files, "subject": cfg.subject, "split": cfg.test_split,
              "limit": cfg.test_limit}, *({"split": "test", **entry} for entry in cfg.ood)]  # an ood set's split: test
    named: list[tuple[str, dict[str, Any]]] = []
    for spec in specs:
        name = spec["dataset"]
        if any(name == taken for taken, _ in named):
            name = f"{spec['dataset']}/{spec.get('split')}"
        if any(name == taken for taken, _ in named):
            name = f"{name}#{len(named)}"
        named.append((name, spec))
    return named


def _folder_name(set_name: str) -> str:
    """A set's name as part of a folder name: ``lm-eval:arc_easy``, ``obqa/test`` and ``obqa#2`` without the
    characters a path or another system reads otherwise."""
    return set_name.replace("/", "-").replace("#", "-").replace(":", "-")


def run_first(cfg: FirstConfig, out: Path, events: EventWriter, should_stop: Callable[[], bool]) -> dict[str, Any]:
    if ORACLE in cfg.students and (problem := missing_truth(_train_truths(cfg))):
        raise DataError(problem)  # before an hour of teacher training, not after
    teacher = stage(out / "teacher", events, "teacher", lambda: _teacher(cfg, out / "teacher", events, should_stop),
                    collective=True)
    topk = out / TOPK_DIR
    stage(topk, events, "extract", lambda: _extract(cfg, teacher, topk, events, should_stop), collective=True)
    sweep = stage(out / "sweep", events, "sweep", lambda: _sweep(cfg, topk, events))
    models = {"teacher": teacher}
    for method in cfg.students:
        target = out / "students" / method
        if method == "finetune":
            work = lambda t=target: finetune(cfg.train_config(cfg.student, cfg.student_method), t, events, should_stop,
                                             stage="student:finetune")
        elif method == ORACLE:
            oracle_topk = out / f"{TOPK_DIR}_{ORACLE}"
            stage(oracle_topk, events, "oracle store", lambda: _oracle_store(cfg, topk, oracle_topk))
            work = lambda t=target, d=oracle_topk: _distill(cfg, ORACLE, sweep, d, t, events, should_stop)
        else:
            work = lambda m=method, t=target: _distill(cfg, m, sweep, topk, t, events, should_stop)
        models[method] = stage(target, events, f"student:{method}", work, collective=True)
    rows = [row for name, trained in models.items() for row in evaluate_model(cfg, name, trained, out, events, sweep)]
    return write_report(out, cfg, rows, sweep)


def evaluate_model(cfg: FirstConfig, name: str, trained: dict[str, Any], out: Path, events: EventWriter,
                   sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """One trained model (``name``: the teacher or a student) on the in-domain test and every out-of-domain set,
    each a resumable stage; its report rows."""
    rows = []
    for index, (set_name, spec) in enumerate(_evaluations(cfg)):
        ecfg = cfg.eval_config(spec, trained["model"], trained["adapter"])
        directory = out / EVAL_DIR / f"{name}-{_folder_name(set_name)}"
        metrics = stage(directory, events, f"evaluate {name} on {set_name}",
                        lambda e=ecfg, d=directory, i=index == 0:
                        evaluate(e, d, log=lambda m: events.emit("log", message=m), in_domain=i))
        rows.append({**metrics, "method": name, "set": set_name, "in_domain": index == 0,
                     "temperature": sweep["best"] if name == "first" else None})
    return rows


def run_job(cfg: FirstConfig, ctx: JobContext) -> dict[str, Any]:
    report = run_first(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    return {"models": len({r["method"] for r in report["rows"]}), "temperature": report["sweep"]["best"]}
