"""What a job kind is, in one description, and the registry of them (lm-evaluation-harness's tasks).

A kind is a package of :mod:`lab.kinds`: its ``config`` module declares the config dataclass (whose
fields declare what they are, :mod:`lab.core.config`) and registers a :class:`JobKind` naming its
runner as a dotted path (``"lab.kinds.evaluate.run:run_job"``), so that neither the registry nor a
config imports the code that runs it (torch and transformers, in the worker only). Everything else
derives from the description — nothing keeps a list of kinds or of their fields:

- ``python -m lab run`` / the job store: :func:`parse_config` validates and resolves a config;
- the worker (:mod:`lab.jobkit.worker`) calls ``kind.run``, which imports the runner then;
- the Launch form: one tab per kind in registration order, ``key_fields`` first, widgets from types;
- the path and model checks (:mod:`lab.jobkit.paths`): the fields' roles;
- chained stages (:mod:`lab.jobkit.chain`): ``run:<id>`` names a job of a kind that leaves a model;
- pre-flight (:mod:`jobs.preflight`): every ``model`` field, trained or only loaded;
- the command line (``python -m lab KIND --field …``) and the README's table (``python -m lab kinds``).

Adding a kind is one package plus its line in :data:`KIND_PACKAGES`.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from lab.core.config import ConfigError
from lab.core.files import write_atomic
from lab.core.layout import CONFIG_FILE, MODEL_DIR
from lab.core.registry import Registry
from lab.core.yamlio import dump_yaml, load_yaml
from lab.jobkit.chain import Runs
from lab.jobkit.context import RunContext
from lab.jobkit.paths import checked_config

# The packages that define the kinds, in the order a user meets them (the Launch page's tabs); each
# one's ``config`` module registers its kind. Named, not imported: the kinds sit above this layer.
KIND_PACKAGES = ("lab.kinds.evaluate", "lab.kinds.finetune", "lab.kinds.sft", "lab.kinds.dpo", "lab.kinds.first",
                 "lab.kinds.cft", "lab.kinds.extract", "lab.kinds.compare", "lab.kinds.series")


@dataclass(frozen=True)
class JobKind:
    """One job kind: what it does, its config, how it runs and what it leaves in its run directory."""

    name: str
    description: str
    config: type  # a ConfigMixin dataclass
    runner: str  # "package.module:function", called with (config, RunContext) in the worker only
    outputs: tuple[str, ...]  # what the run directory holds (lab.core.layout names), for the docs
    key_fields: tuple[str, ...] = ()  # the fields a user changes most: shown first on the form
    # Its work splits across the ranks of a multi-process launch (training, extraction); a kind
    # without it would only repeat its work on every rank, so it is refused more than one process.
    data_parallel: bool = False

    @property
    def leaves_model(self) -> bool:
        """Its run directory ends with trained weights (``model/`` or ``adapter/``), which a later
        stage may start from (``run:<id>``, :mod:`lab.jobkit.chain`)."""
        return f"{MODEL_DIR}/" in self.outputs

    def run(self, cfg: Any, ctx: RunContext) -> dict[str, Any]:
        """Import the runner (torch, transformers: seconds) and run ``cfg``; its result is the job's summary."""
        module, _, function = self.runner.partition(":")
        return getattr(importlib.import_module(module), function)(cfg, ctx)


KINDS: Registry[JobKind] = Registry("job kind")
_loaded = False  # KIND_PACKAGES imported (each registers its kind)


def register(kind: JobKind) -> JobKind:
    """Called by the module that defines ``kind``; refuses a runner not named by its dotted path, or a key
    field its config lacks."""
    if not (isinstance(kind.runner, str) and re.fullmatch(r"[\w.]+:\w+", kind.runner)):
        raise ValueError(f"job kind {kind.name!r}: runner must be 'package.module:function', got {kind.runner!r}")
    names = {f for f in kind.config.__dataclass_fields__}
    missing = [f for f in kind.key_fields if f not in names]
    if missing:
        raise ValueError(f"job kind {kind.name!r}: key fields {missing} are not fields of {kind.config.__name__}")
    KINDS.add(kind.name, kind)
    return kind


def _position(kind: JobKind) -> int:
    package = kind.runner.partition(":")[0].rpartition(".")[0]
    return KIND_PACKAGES.index(package) if package in KIND_PACKAGES else len(KIND_PACKAGES)


def _load() -> Registry[JobKind]:
    global _loaded
    if not _loaded:
        for package in KIND_PACKAGES:
            importlib.import_module(f"{package}.config")
        _loaded = True
    return KINDS


def all_kinds() -> list[JobKind]:
    """Every registered kind in :data:`KIND_PACKAGES` order (whichever was imported first), then
    any registered from elsewhere in the order they came."""
    return sorted((KINDS.get(name) for name in _load().in_order()), key=_position)


def get(name: str) -> JobKind:
    return _load().get(name)


def names() -> list[str]:
    return [kind.name for kind in all_kinds()]


def runs_in(folder: Path) -> Runs:
    """The job store in ``folder`` as ``run:<id>`` sees it: its run directories, and the kinds that
    leave a model to start from."""
    return Runs(Path(folder), tuple(kind.name for kind in all_kinds() if kind.leaves_model))


def parse_config(values: Any, roots: Optional[Iterable[Path]] = None,
                 runs: Optional[Path] = None) -> tuple[JobKind, Any]:
    """Validate a config mapping and resolve the files it names; refusals name the field.

    ``roots``: the folders those files must lie in (a config from a browser); None: anywhere.
    ``runs``: the folder of the job store whose jobs ``run:<id>`` names; None: it names none.
    """
    if not isinstance(values, dict):
        raise ConfigError(f"config: must be a mapping with a `kind` field (one of: {', '.join(names())})")
    values = dict(values)
    name = values.pop("kind", None)
    if not isinstance(name, str) or name not in _load():
        raise ConfigError(f"kind: must be one of {', '.join(names())}, got {name!r}")
    kind = KINDS.get(name)
    return kind, kind.config.from_checked(checked_config(kind.config, values, roots,
                                                         None if runs is None else runs_in(runs)))


def load_config(path: Path, roots: Optional[Iterable[Path]] = None,
                runs: Optional[Path] = None) -> tuple[JobKind, Any]:
    return parse_config(load_yaml(Path(path).read_bytes(), str(path)), roots, runs)


def config_text(kind: JobKind | str, cfg: Any) -> str:
    """The resolved config as the run directory and the store keep it; ``kind`` or its name."""
    return dump_yaml({"kind": kind if isinstance(kind, str) else kind.name, **cfg.to_dict()})


def write_config(run_dir: Path, kind: JobKind | str, cfg: Any) -> str:
    """Write ``run_dir``'s ``config.yaml`` (:data:`~lab.core.layout.CONFIG_FILE`): the resolved config as
    :func:`config_text` gives it; returns that text. The only writer of a run directory's config —
    the store on submit, the worker, the command line and an evaluation's own directory call it — so
    that every one loads again through :func:`load_config` the same way. Written atomically, and not
    at all when the file already holds this text (its time stays when the job was queued)."""
    text = config_text(kind, cfg)
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    return text
