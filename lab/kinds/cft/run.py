"""The CFT/RCFT protocol (REFERENCE.md §3) as resumable stages in one run directory.

    eval/<row>-<set>/      config.yaml, metrics.json, predictions.jsonl per row and evaluation set
                           (sets: in_domain, each out-of-domain dataset; the base model also on validation)
    ts/temperature.json    the temperature the TS row uses, fitted on the base model's validation predictions
                           (by ``ts_objective``; done.json holds the fits by ECE and by NLL alike)
    models/<row>/          each trained row's weights or adapter, epoch checkpoints, done.json
    winrate/<row>/         done.json: win rate on the preference pairs, per pair log-probabilities
    report.json, report.md

The temperature-scaling row re-uses the base model's stored predictions (``softmax(log p / T)``
is exact temperature scaling of the option logits), so it costs no model call. Every evaluation
bins its ECE as the config says (``bins``, ``bin_edges``), and so does the temperature fit.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

from lab.calibration.temperature import FitObjective, fit_temperature
from lab.calibration.temperature_files import save_temperature
from lab.core.errors import Stopped
from lab.core.events import EventWriter
from lab.core.layout import EVAL_DIR, FITTED_TEMPERATURE_DIR, METRICS_FILE, PREDICTIONS_FILE
from lab.data import DataError, MCQRecord, harness, load, preferences
from lab.jobkit.stages import stage
from lab.jobkit.worker import JobContext
from lab.kinds.cft.config import CftConfig
from lab.kinds.cft.report import write_report
from lab.kinds.evaluate.run import apply_temperature, evaluate_records, lm_eval_info, write_evaluation
from lab.results.predictions import load_predictions
from lab.training.config import TrainConfig

IN_DOMAIN = "in_domain"
VALIDATION = "validation"
TS_OBJECTIVES: tuple[FitObjective, ...] = ("ece", "nll")  # both fitted and reported; cfg.ts_objective picks the row's


class EvalSet(NamedTuple):
    """One set every model is evaluated on: where it came from, its questions, and what its metrics.json says
    of it besides (an lm-eval task's tasks, shots and version; questions its loader left out)."""

    source: dict[str, Any]  # its ood entry, or {"dataset": ...} for a part of the in-domain pool
    records: list[MCQRecord]
    info: dict[str, Any]
    n_skipped: int = 0


def _sample(records: list[MCQRecord], n: Optional[int], seed: int) -> list[MCQRecord]:
    """``n`` records drawn without replacement (all of them when ``n`` is None or too large)."""
    if n is None or n >= len(records):
        return list(records)
    return random.Random(seed).sample(records, n)


def _load_source(entry: dict[str, Any], seed: int) -> list[MCQRecord]:
    data = load(entry["dataset"], entry.get("split", "test"), entry.get("data_files") or None,
                subject=entry.get("subject"), seed=seed)
    return _sample(data.records, entry.get("limit"), seed)


def _load_ood(entry: dict[str, Any], seed: int) -> EvalSet:
    """An out-of-domain set: a lab dataset's questions drawn as the pool's are; an lm-eval task's first ``limit``
    documents per task (as ``lm_eval --limit``), with lm-eval's requests (its shots in them) to score."""
    if not harness.is_task(entry["dataset"]):
        return EvalSet(entry, _load_source(entry, seed), {})
    data = load(entry["dataset"], include=entry.get("lm_eval_include"), num_fewshot=entry.get("num_fewshot"),
                limit=entry.get("limit"))
    return EvalSet(entry, data.records, {"lm_eval": lm_eval_info(data)}, len(data.problems))


def _eval_dir(out: Path, row: str, set_name: str) -> Path:
    """Where one row's evaluation on one set goes (an lm-eval task's ``:`` left out of the folder's name)."""
    return out / EVAL_DIR / f"{row}-{set_name.replace(':', '-')}"


def load_pool(cfg: CftConfig) -> dict[str, list[MCQRecord]]:
    """The in-domain pool: each source sampled, pooled, shuffled and cut into train/validation/test."""
    pool = [r for i, entry in enumerate(cfg.in_domain) for r in _load_source(entry, cfg.seed + i)]
    random.Random(cfg.seed).shuffle(pool)
    need = cfg.train_size + cfg.val_size + cfg.test_size
    if len(pool) < need:
        raise DataError(f"The in-domain sources hold {len(pool)} questions, but train_size + val_size + test_size = "
                        f"{need}; lower the sizes or add data")
    a, b = cfg.train_size, cfg.train_size + cfg.val_size
    return {"train": pool[:a], VALIDATION: pool[a:b], "test": pool[b:need]}


def _count(records: Sequence[MCQRecord]) -> dict[str, int]:
    return dict(Counter(r.source for r in records))


class _Protocol:
    """Holds what every stage needs: the config, the run directory, the data, the event stream."""

    def __init__(self, cfg: CftConfig, out: Path, events: EventWriter, should_stop: Callable[[], bool]) -> None:
        self.cfg, self.out, self.events, self.should_stop = cfg, out, events, should_stop
        self.pool = load_pool(cfg)
        self.pooled = {"dataset": cfg.in_domain[0]["dataset"]}  # how the pool's parts are scored: its first source's
        self.sets: dict[str, EvalSet] = {IN_DOMAIN: EvalSet(self.pooled, self.pool["test"], {})}
        for i, entry in enumerate(cfg.ood):
            self.sets[entry["dataset"]] = _load_ood(entry, cfg.seed + 100 + i)
        self.pool_label = "+".join(e["dataset"] for e in cfg.in_domain)
        for name, evaluation in self.sets.items():
            events.emit("log", message=f"{name}: {len(evaluation.records)} questions {_count(evaluation.records)}")
        events.emit("log", message=f"train: {len(self.pool['train'])} {_count(self.pool['train'])}, "
                                   f"validation: {len(self.pool[VALIDATION])}")

    def check_stop(self) -> None:
        if self.should_stop():
            raise Stopped("CFT protocol stopped between stages; rerun the same config in the same directory to resume")

    def _load(self, trained: dict[str, Any]):
        from lab.models.loading import load_model

        return load_model(trained["model"], adapter=trained["adapter"], device=self.cfg.device, dtype=self.cfg.dtype)

    def evaluate(self, name: str, trained: dict[str, Any], with_validation: bool = False) -> dict[str, dict[str, Any]]:
        """Evaluate one model on every set (loading it once, only if some set is not done yet)."""
        loaded = None
        sets = dict(self.sets)
        if with_validation:
            sets[VALIDATION] = EvalSet(self.pooled, self.pool[VALIDATION], {})
        results = {}
        for set_name, evaluation in sets.items():
            self.check_stop()
            directory = _eval_dir(self.out, name, set_name)

            def work(d: Path = directory, evaluation: EvalSet = evaluation, set_name: str = set_name):
                nonlocal loaded
                loaded = loaded or self._load(trained)
                pooled = set_name in (IN_DOMAIN, VALIDATION)
                ecfg = self.cfg.eval_config(trained["model"], trained["adapter"], evaluation.source)
                return evaluate_records(ecfg, loaded, evaluation.records, d, set_name, evaluation.n_skipped,
                                        **evaluation.info, dataset=self.pool_label if pooled else ecfg.dataset,
                                        split=set_name, in_domain=pooled)

            results[set_name] = stage(directory, self.events, f"evaluate {name} on {set_name}", work)
        self.check_stop()
        results["winrate"] = stage(self.out / "winrate" / name, self.events, f"win rate of {name}",
                                   lambda: self._win_rate(trained, loaded))
        return results

    def _win_rate(self, trained: dict[str, Any], loaded) -> dict[str, Any]:
        from lab.kinds.cft.winrate import score_pairs

        data = load(preferences.DATASET, files=self.cfg.preferences or None, task=preferences.TASK,
                    limit=self.cfg.preference_limit)
        pairs, problems = data.records, data.problems
        if problems:
            self.events.emit("log", message=f"preferences: skipped {len(problems)} bad rows, e.g. {problems[0]}")
        loaded = loaded or self._load(trained)
        return score_pairs(loaded.model, loaded.tokenizer, pairs, self.cfg.max_response_tokens,
                           batch_size=max(1, self.cfg.eval_batch_size // 4))

    def temperature(self) -> dict[str, Any]:
        """Fit T on the base model's validation predictions by ECE (the paper's search) and by NLL
        (the usual fit), so the report shows what the choice costs; apply ``ts_objective``'s fit to
        the base model's other sets."""
        val = load_predictions(self.out / EVAL_DIR / f"base-{VALIDATION}")
        fits = {objective: fit_temperature(val.probs, val.labels, val.mask, objective=objective, n_bins=self.cfg.bins,
                                           bin_edges=self.cfg.bin_edges)
                for objective in TS_OBJECTIVES}
        fit = fits[self.cfg.ts_objective]
        path = save_temperature(self.out / FITTED_TEMPERATURE_DIR, fit, model=self.cfg.model, fitted_on="validation part of the in-domain pool",
                                predictions=str(self.out / EVAL_DIR / f"base-{VALIDATION}" / PREDICTIONS_FILE))
        self.events.emit("temperature", temperature=fit.temperature, nll_before=fit.nll_before, nll_after=fit.nll_after,
                         ece_before=fit.ece_before, ece_after=fit.ece_after)
        results: dict[str, Any] = {"fit": {**fit.__dict__, "path": str(path)},
                                   "fits": {objective: f.__dict__ for objective, f in fits.items()}}
        for set_name, evaluation in self.sets.items():
            base_dir = _eval_dir(self.out, "base", set_name)
            rows = apply_temperature(load_predictions(base_dir).rows, fit.temperature)
            base_metrics = json.loads((base_dir / METRICS_FILE).read_text())
            info = {k: base_metrics.get(k) for k in PROVENANCE} | {"temperature": fit.temperature, "temperature_file": str(path)}
            if "lm_eval" in base_metrics:  # an lm-eval task's tasks and shots, for its subtask rows and its label
                info["lm_eval"] = base_metrics["lm_eval"]
            ecfg = self.cfg.eval_config(self.cfg.model, None, evaluation.source)
            results[set_name] = write_evaluation(_eval_dir(self.out, "ts", set_name), rows, ecfg, info)
        return results

    def train(self, name: str, tcfg: TrainConfig) -> dict[str, Any]:
        from lab.training.trainer import finetune

        self.check_stop()
        directory = self.out / "models" / name
        return stage(directory, self.events, f"train {name}",
                     lambda: finetune(tcfg, directory, self.events, self.should_stop, stage=f"train:{name}",
                                      records=self.pool["train"], val=self.pool[VALIDATION]), collective=True)


PROVENANCE = ("model", "adapter", "dataset", "split", "data_source", "device", "dtype", "in_domain")  # what TS rows inherit from base


def run_cft(cfg: CftConfig, out: Path, events: EventWriter, should_stop: Callable[[], bool]) -> dict[str, Any]:
    protocol = _Protocol(cfg, out, events, should_stop)
    base = {"model": cfg.model, "adapter": None}
    results: dict[str, dict[str, Any]] = {"base": protocol.evaluate("base", base, with_validation=True)}
    histories: dict[str, list] = {}
    esteps: dict[str, list] = {}
    temperature = None
    for name, tcfg in cfg.rows()[1:]:
        if name == "ts":
            ts = stage(out / FITTED_TEMPERATURE_DIR, events, "temperature scaling", protocol.temperature)
            temperature = {**ts.pop("fit"), "fits": ts.pop("fits", {})}
            results["ts"] = {**ts, "winrate": results["base"]["winrate"]}  # T does not change sequence probabilities
            continue
        trained = protocol.train(name, tcfg)
        histories[name] = trained.get("history", [])
        if trained.get("esteps"):
            esteps[name] = trained["esteps"]
        results[name] = protocol.evaluate(name, trained)
    return write_report(out, cfg, results, temperature, histories, esteps)


def run_job(cfg: CftConfig, ctx: JobContext) -> dict[str, Any]:
    report = run_cft(cfg, ctx.run_dir, ctx.events, ctx.should_stop)
    t = report.get("temperature") or {}
    return {"rows": len(report["win_rate"]), "temperature": t.get("temperature")}
