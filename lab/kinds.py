"""What a job kind is, in one description, and the registry of them (lm-evaluation-harness's tasks).

A kind is defined in its own module: its config dataclass (whose fields declare what they are,
:mod:`lab.config`) and a :class:`JobKind` registered there. Everything else derives from the
description — nothing keeps a list of kinds or of their fields:

- ``python -m lab run`` / the job store: :func:`parse_config` validates and resolves a config;
- the worker (:mod:`lab.worker`) calls ``kind.run`` (its heavy imports happen inside, in the worker);
- the Launch form: one tab per kind in registration order, ``key_fields`` first, widgets from types;
- the path and model checks (:mod:`lab.paths`): the fields' roles;
- pre-flight (:mod:`jobs.preflight`): every ``model`` field, trained or only loaded;
- the command line (``python -m lab KIND --field …``) and the README's table (``python -m lab kinds``).

Adding a kind is one module plus its line in :data:`KIND_MODULES`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from lab.config import ConfigError
from lab.paths import checked_config
from lab.registry import Registry
from lab.yamlio import dump_yaml, load_yaml

if TYPE_CHECKING:
    from lab.worker import JobContext

# The modules that define the kinds, in the order a user meets them (the Launch page's tabs).
KIND_MODULES = ("lab.evaluate", "lab.train.config", "lab.first.config", "lab.cft.config", "lab.distill.job",
                "lab.compare")


@dataclass(frozen=True)
class JobKind:
    """One job kind: what it does, its config, how it runs and what it leaves in its run directory."""

    name: str
    description: str
    config: type  # a ConfigMixin dataclass
    run: Callable[[Any, "JobContext"], dict[str, Any]]  # imports torch inside: only the worker calls it
    outputs: tuple[str, ...]  # what the run directory holds (lab.layout names), for the docs
    key_fields: tuple[str, ...] = ()  # the fields a user changes most: shown first on the form
    # Its work splits across the ranks of a multi-process launch (training, extraction); a kind
    # without it would only repeat its work on every rank, so it is refused more than one process.
    data_parallel: bool = False


KINDS: Registry[JobKind] = Registry("job kind")
_loaded = False  # KIND_MODULES imported (each registers its kind)


def register(kind: JobKind) -> JobKind:
    """Called by the module that defines ``kind``; refuses a key field its config lacks."""
    names = {f for f in kind.config.__dataclass_fields__}
    missing = [f for f in kind.key_fields if f not in names]
    if missing:
        raise ValueError(f"job kind {kind.name!r}: key fields {missing} are not fields of {kind.config.__name__}")
    KINDS.add(kind.name, kind)
    return kind


def _position(kind: JobKind) -> int:
    module = kind.config.__module__
    return KIND_MODULES.index(module) if module in KIND_MODULES else len(KIND_MODULES)


def _load() -> Registry[JobKind]:
    global _loaded
    if not _loaded:
        for module in KIND_MODULES:
            importlib.import_module(module)
        _loaded = True
    return KINDS


def all_kinds() -> list[JobKind]:
    """Every registered kind in :data:`KIND_MODULES` order (whichever was imported first), then
    any registered from elsewhere in the order they came."""
    return sorted((KINDS.get(name) for name in _load().in_order()), key=_position)


def get(name: str) -> JobKind:
    return _load().get(name)


def names() -> list[str]:
    return [kind.name for kind in all_kinds()]


def parse_config(values: Any, roots: Optional[Iterable[Path]] = None) -> tuple[JobKind, Any]:
    """Validate a config mapping and resolve the files it names; refusals name the field.

    ``roots``: the folders those files must lie in (a config from a browser); None: anywhere.
    """
    if not isinstance(values, dict):
        raise ConfigError(f"config: must be a mapping with a `kind` field (one of: {', '.join(names())})")
    values = dict(values)
    name = values.pop("kind", None)
    if not isinstance(name, str) or name not in _load():
        raise ConfigError(f"kind: must be one of {', '.join(names())}, got {name!r}")
    kind = KINDS.get(name)
    return kind, kind.config.from_checked(checked_config(kind.config, values, roots))


def load_config(path: Path, roots: Optional[Iterable[Path]] = None) -> tuple[JobKind, Any]:
    return parse_config(load_yaml(Path(path).read_bytes(), str(path)), roots)


def config_text(kind: JobKind, cfg: Any) -> str:
    """The resolved config as the run directory and the store keep it."""
    return dump_yaml({"kind": kind.name, **cfg.to_dict()})
