"""A pipeline file: several jobs in one go, a later stage starting from an earlier stage's result.

```yaml
pipeline:
  - {name: sft, kind: sft, model: bundled, method: full}
  - {name: dpo, kind: dpo, model: "stage:sft"}
  - {name: cft, kind: cft, model: "stage:dpo", after: [sft]}
```

Each entry is a job config with a ``name`` of its own and, optionally, ``after``: earlier stages it
waits for besides those it starts from. ``stage:<name>`` in a model field (any takes ``run:<id>``,
:mod:`lab.jobkit.chain`) names an earlier stage's trained weights; once that stage has a job id it
becomes ``run:<id>`` (:func:`bind`), so a queued stage is an ordinary job and waits for the one before
as any job naming ``run:<id>`` does. The whole file is checked before anything is queued or run
(:func:`parse_pipeline`): names, references, and every stage's config with its references standing
for a model that exists.

The job store queues the stages (``python -m jobs submit``, the Launch page); ``python -m lab run``
runs them here, one after the other (:func:`run_here`).
"""
from __future__ import annotations

import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from lab.core.config import ConfigError, model_fields, validate
from lab.core.layout import CONFIG_FILE, run_dir_name
from lab.jobkit import kinds
from lab.jobkit.chain import a_kind, ended_as
from lab.jobkit.sections import DEFAULT_MODEL
from lab.jobkit.worker import run

PIPELINE = "pipeline"  # the one key of a pipeline file
PREFIX = "stage:"
NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
MAX_STAGES = 32


@dataclass(frozen=True)
class Stage:
    """One job of a pipeline: its config as written (``kind`` included, ``stage:<name>`` unbound) and
    the earlier stages it waits for."""

    name: str
    kind: str
    config: dict[str, Any]
    after: tuple[str, ...]


def is_pipeline(data: Any) -> bool:
    """A pipeline file's contents rather than one job's config."""
    return isinstance(data, dict) and PIPELINE in data


def _stage_refs(kind: str, values: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any], str]]:
    """(field, holder, key) of every ``stage:<name>`` in a validated config's model fields."""
    for field, _, holder, key, _ in model_fields(kinds.get(kind).config, values):
        if holder[key].startswith(PREFIX):
            yield field, holder, key


def _names(entry: dict[str, Any], where: str, earlier: list[Stage]) -> tuple[str, list[str]]:
    """An entry's ``name`` and ``after``, checked: a new name, earlier stages only."""
    name, after = entry.pop("name", None), entry.pop("after", [])
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{where}.name: each stage needs a name of lowercase letters, digits, - and _ "
                          f"(up to 40, a letter first), got {name!r}")
    if name in [s.name for s in earlier]:
        raise ConfigError(f"{where}.name: {name!r} names an earlier stage too; each stage has its own name")
    after = [after] if isinstance(after, str) else after
    if not isinstance(after, list) or any(a not in [s.name for s in earlier] for a in after):
        raise ConfigError(f"{where}.after: must list earlier stages ({', '.join(s.name for s in earlier) or 'none'}), "
                          f"got {after!r}")
    return name, after


def parse_pipeline(data: Any, roots: Optional[Iterable[Path]] = None, runs: Optional[Path] = None) -> list[Stage]:
    """The stages of a pipeline file, every one checked as a submit would check it (``roots``, ``runs``:
    as :func:`lab.jobkit.kinds.parse_config`); a refusal names the stage and the field."""
    if not isinstance(data, dict) or set(data) != {PIPELINE}:
        keys = sorted(map(str, data)) if isinstance(data, dict) else data
        raise ConfigError(f"{PIPELINE}: a pipeline file holds one key, {PIPELINE}: a list of job configs each with a "
                          f"name; got {keys!r}")
    entries = data[PIPELINE]
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_STAGES:
        raise ConfigError(f"{PIPELINE}: must list 1 to {MAX_STAGES} job configs, got {entries!r:.80}")
    stages: list[Stage] = []
    for i, entry in enumerate(entries):
        where = f"{PIPELINE}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be a job config (kind, name and the kind's fields), got {entry!r:.80}")
        entry = dict(entry)
        name, after = _names(entry, where, stages)
        kind = entry.get("kind")
        if not isinstance(kind, str) or kind not in kinds.names():
            raise ConfigError(f"{where}.kind: must be one of {', '.join(kinds.names())}, got {kind!r}")
        try:
            values = validate(kinds.get(kind).config, {k: v for k, v in entry.items() if k != "kind"})
            needs = []
            for field, holder, key in _stage_refs(kind, values):
                source = next((s for s in stages if PREFIX + s.name == holder[key]), None)
                if source is None:
                    raise ConfigError(f"{field}: {holder[key]!r} names no earlier stage (earlier: "
                                      f"{', '.join(s.name for s in stages) or 'none'})")
                if not kinds.get(source.kind).leaves_model:
                    raise ConfigError(f"{field}: stage {source.name} is {a_kind(source.kind)} job, which leaves no "
                                      "trained model to start from")
                needs.append(source.name)
                holder[key] = DEFAULT_MODEL  # stands for the weights it will be: the rest is checked now
            kinds.parse_config({"kind": kind, **values}, roots, runs)
        except ConfigError as e:
            raise ConfigError(f"{where} ({name}).{e}") from None
        stages.append(Stage(name, kind, entry, tuple(dict.fromkeys([*needs, *after]))))
    return stages


def bind(stage: Stage, ids: dict[str, int]) -> dict[str, Any]:
    """The stage's job config with each ``stage:<name>`` as ``run:<id>`` of that stage's job (``ids``)."""
    values = validate(kinds.get(stage.kind).config, copy.deepcopy({k: v for k, v in stage.config.items()
                                                                    if k != "kind"}))
    for _, holder, key in _stage_refs(stage.kind, values):
        holder[key] = f"run:{ids[holder[key][len(PREFIX):]]}"
    return {"kind": stage.kind, **values}


def run_here(stages: list[Stage], out: Path) -> int:
    """Run the stages in this process, in order, each in ``out/<n>-<kind>/``: numbered as the job
    store numbers its jobs, so that ``run:<n>`` finds stage n there. A stage that succeeded before is
    skipped, so running the file again after a failure resumes at the stage that failed; the first
    that fails stops the rest. Returns the worker's exit code (0: every stage succeeded)."""
    ids: dict[str, int] = {}
    for n, stage in enumerate(stages, 1):
        run_dir, ids[stage.name] = out / run_dir_name(n, stage.kind), n
        if (ended_as(run_dir) or {}).get("status") == "succeeded":
            print(f"stage {n}/{len(stages)} {stage.name}: succeeded before, in {run_dir}", file=sys.stderr)
            continue
        try:
            kind, cfg = kinds.parse_config(bind(stage, ids), runs=out)
        except ConfigError as e:
            print(f"error: {PIPELINE} stage {stage.name}: {e}", file=sys.stderr)
            return 2
        kinds.write_config(run_dir, kind, cfg)
        print(f"stage {n}/{len(stages)} {stage.name}: {stage.kind} in {run_dir}", file=sys.stderr)
        code = run(run_dir / CONFIG_FILE, run_dir)
        if code != 0:
            rest = ", and the stages after it did not start" if n < len(stages) else ""
            print(f"error: stage {stage.name} did not succeed ({run_dir}/result.json says why){rest}. Run the same "
                  "command again: the stages that succeeded are skipped and this one resumes", file=sys.stderr)
            return code
    return 0
