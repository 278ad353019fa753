"""Chained stages: a model field that names another job's result, ``run:<id>``.

base → SFT → DPO → CFT is four jobs, each starting from the weights the one before left. A field
declared a model (``role="model"``, :mod:`lab.core.config`) takes ``run:<id>``: the final weights of job
``<id>`` of the same job store, a job of a kind that leaves ``model/`` or ``adapter/`` (``finetune``,
``sft``, ``dpo``). The reference is kept as written in the stored config, as ``bundled`` is, and is
checked twice, since the earlier job changes between the two:

- at submit (:meth:`Runs.check`): a whole number, the run directory of that job in this store's
  folder (never a link, never elsewhere), a kind that leaves a model, and not a job that ended
  without succeeding (resume that one first);
- when the job starts (:func:`resolve_start`, in the worker): the earlier job must have succeeded
  *then*, and its weights are read from its directory *then*.

At start a full run's ``model/`` takes the field's place. A LoRA run's adapter goes into the field's
``adapter_field`` (an evaluation loads base + adapter, merged); a field without one (a training job's
model) gets the adapter merged into its base once, saved in ``start/<field>/`` of this run.
``start.json`` records what each reference named, so that an adapter this run trains in turn is known
to belong to those weights (:mod:`lab.core.trained`). The job store derives from the references which
jobs a job waits for (``jobs.store``); the scheduler starts it only once they have succeeded.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from lab.core.config import ConfigError, model_fields
from lab.core.events import EventWriter
from lab.core.files import write_atomic
from lab.core.layout import ADAPTER_DIR, MODEL_DIR, RESULT_FILE, RUN_DIR_NAME, START_DIR, START_FILE, run_dir_name
from lab.core.stored import read_object
from lab.core.trained import base_model, saved_weights
from lab.jobkit.stages import stage
from lab.models import distributed

PREFIX = "run:"
REFERENCE = re.compile(r"run:([1-9][0-9]{0,8})")  # a job's number as the store gives it: no sign, no 0, no exponent


def job_of(field: str, value: str) -> Optional[int]:
    """The job a ``run:<id>`` value names; None for a value that is no reference at all."""
    if not value.startswith(PREFIX):
        return None
    match = REFERENCE.fullmatch(value)
    if match is None:
        raise ConfigError(f"{field}: {value!r} is not a job reference: write run:<id> with a job's number, "
                          "e.g. run:12 (python -m jobs list shows the jobs)")
    return int(match[1])


def a_kind(kind: str) -> str:
    """``an evaluate``, ``a dpo``: a kind's name with its article, for messages."""
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


ENDINGS = ("succeeded", "failed", "cancelled", "interrupted")  # every final status a job records


def write_result(run_dir: Path, status: str, error: Optional[str] = None) -> None:
    """Record how a job ended in its run directory (``result.json``, atomically), as the worker does
    and, for an ending no worker wrote (cancelled while queued, failed before it started, a worker
    that died), the scheduler does before its row says so: the run directories alone rebuild a lost
    store, so every ending must be in them."""
    if status not in ENDINGS:
        raise ValueError(f"Expected a status among {', '.join(ENDINGS)}, but got {status!r}")
    write_atomic(run_dir / RESULT_FILE, json.dumps({"status": status, "error": error}) + "\n")


def ended_as(run_dir: Path) -> Optional[dict[str, Any]]:
    """How a job's worker ended (``result.json``); None while it has not."""
    try:
        return read_object(run_dir / RESULT_FILE)
    except (OSError, ValueError):  # StoredFileError too: torn, not an object, or nested past any result
        return None


@dataclass(frozen=True)
class Runs:
    """Where ``run:<id>`` is looked up: the job store's folder, whose run directories are named
    ``<id>-<kind>``, and the kinds whose jobs leave a model to start from."""

    folder: Path
    trainers: tuple[str, ...]

    def find(self, field: str, job: int) -> tuple[Path, str]:
        """Job ``job``'s run directory in the store's folder, and its kind. Messages name the folder by
        its own name, a run by its directory's: a page or the API shows them, never the server's paths."""
        folder = Path(os.path.realpath(self.folder))
        store = f"the job store {Path(os.path.abspath(self.folder)).name}/"
        found = [p for p in folder.glob(run_dir_name(job, "*")) if RUN_DIR_NAME.fullmatch(p.name)]
        if not found:
            raise ConfigError(f"{field}: there is no job {job} in {store} (the Jobs page, or python -m jobs list, "
                              "shows the jobs)")
        if len(found) > 1:
            raise ConfigError(f"{field}: job {job} has several run directories in {store} "
                              f"({', '.join(sorted(p.name for p in found))}); name the one meant by its model/ folder")
        path = found[0]
        if path.is_symlink() or not path.is_dir():
            raise ConfigError(f"{field}: {path.name} in {store} is a link or not a folder; run:<id> names only a "
                              "run directory the job store made")
        kind = RUN_DIR_NAME.fullmatch(path.name)[2]
        if kind not in self.trainers:
            raise ConfigError(f"{field}: job {job} is {a_kind(kind)} job, which leaves no trained model; run:<id> "
                              f"names a {', '.join(self.trainers)} job")
        return path, kind

    def check(self, field: str, value: str) -> Path:
        """At submit: ``value`` names a job of this store that leaves a model and has not ended
        without it; returns its run directory. It may still be queued or running."""
        job = job_of(field, value)
        path, kind = self.find(field, job)
        ended = ended_as(path)
        if ended is not None and ended.get("status") != "succeeded":
            why = f": {ended['error']}" if ended.get("error") else ""
            raise ConfigError(f"{field}: job {job} ({kind}) {ended.get('status')}{why}. Resume it first "
                              f"(python -m jobs resume {job}, or Resume on the Jobs page), then this one")
        return path

    def weights(self, field: str, value: str) -> tuple[str, Optional[str]]:
        """When the job starts: (model, adapter) that job ``value`` left, as ``load_model`` takes
        them; refused unless that job has succeeded by now."""
        job = job_of(field, value)
        path, kind = self.find(field, job)
        status = (ended_as(path) or {}).get("status")
        if status != "succeeded":
            raise ConfigError(f"{field}: job {job} ({kind}) has not succeeded (it is {status or 'not finished'}); a "
                              "stage starts only from one that has")
        weights = saved_weights(path, base_model(path))
        if weights is None:
            raise ConfigError(f"{field}: job {job} ({kind}) succeeded but left no trained weights ({MODEL_DIR}/ or "
                              f"{ADAPTER_DIR}/) in {path.name}")
        return weights


def _referring(cls: type, values: dict[str, Any]) -> Iterator[tuple[str, Any, dict[str, Any], str, int]]:
    """Each model field of a config whose value is ``run:<id>``: (field path, spec, holder, key, job). The
    fields are listed before the first is given, so a caller may replace the values as it goes."""
    for field, spec, holder, key, _ in model_fields(cls, values):
        job = job_of(field, holder[key])
        if job is not None:
            yield field, spec, holder, key, job


def references(cls: type, values: dict[str, Any]) -> list[int]:
    """The jobs a validated config's ``run:<id>`` fields name, in field order: those it waits for."""
    return list(dict.fromkeys(job for *_, job in _referring(cls, values)))


def _slug(field: str) -> str:
    """A field path as a folder name: ``models[0].train.model`` → ``models-0-train-model``."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", field).strip("-")


def _merged(base: str, adapter: str, folder: Path, events: EventWriter, device: str, dtype: str) -> str:
    """``adapter`` merged into ``base`` and saved as a full model in ``folder``, once: a stage, so a
    resumed run reuses it and the other ranks of a multi-process launch wait for rank 0's."""

    def merge() -> dict[str, Any]:
        from lab.models.loading import load_model  # torch: in the worker, and only when a LoRA run feeds a trainer

        loaded = load_model(base, adapter=adapter, device=device, dtype=dtype)
        loaded.model.save_pretrained(folder)
        loaded.tokenizer.save_pretrained(folder)
        return {"base": base, "adapter": adapter}

    stage(folder, events, f"merging the adapter {adapter} into {base}", merge)
    return str(folder)


def resolve_start(cls: type, values: dict[str, Any], runs: Runs, run_dir: Path, events: EventWriter) -> bool:
    """Put in ``values`` (a stored config, in place) the weights each ``run:<id>`` names now, and record
    them in ``start.json``; returns whether there was any. The caller checks the result again as a
    config, so the weights must lie in the folders the job may read."""
    record: dict[str, Any] = {}
    for field, spec, holder, key, job in _referring(cls, values):
        value = holder[key]
        model, adapter = runs.weights(field, value)
        if adapter is not None and spec.adapter_field is None:  # a trainer's model: one set of weights
            model = _merged(model, adapter, run_dir / START_DIR / _slug(field), events,
                            values.get("device", "auto"), values.get("dtype", "auto"))
            adapter = None
        holder[key] = model
        if spec.adapter_field is not None:
            holder[spec.adapter_field] = adapter
        record[field] = {"given": value, "job": job, "model": model, "adapter": adapter}
        events.emit("log", message=f"{field}: {value} is {model}" + (f" with the adapter {adapter}" if adapter else ""))
    if record and distributed.is_main():
        write_atomic(run_dir / START_FILE, json.dumps(record, indent=2) + "\n")
    return bool(record)
