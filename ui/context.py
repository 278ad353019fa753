"""What every page needs from the server: where runs live, the job store, the folders it may read."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.store import ConfigError, Job, JobStore
from lab.files import cache_dir
from lab.hub import hub_reachable
from ui.paths import MODEL_KEYS, check_paths


def _model_names(config: Any) -> list[str]:
    """Every model a config names (top level, a compare job's list, nested sections)."""
    if isinstance(config, dict):
        return [v for k, v in config.items() if k in MODEL_KEYS and isinstance(v, str)] + \
               [m for k, v in config.items() if k not in MODEL_KEYS for m in _model_names(v)]
    if isinstance(config, list):
        return [m for item in config for m in _model_names(item)]
    return []


def check_models(config: dict[str, Any]) -> None:
    """Refuse, at submit time, a model this machine cannot load: not ``bundled``, not a local
    directory, not in the Hugging Face cache, and the hub unreachable (otherwise the job would
    fail a few seconds after it starts, on the Jobs page instead of here)."""
    from huggingface_hub import try_to_load_from_cache

    for name in _model_names(config):
        if name == "bundled" or Path(name).expanduser().is_dir():
            continue
        if Path(name).expanduser().exists() or name.startswith(("/", ".", "~")):
            raise ConfigError(f"Model {name!r} is not a model directory on this machine")
        cached = try_to_load_from_cache(name, "config.json")
        if isinstance(cached, str) or hub_reachable():
            continue
        raise ConfigError(f"Unknown model {name!r}: not a local directory, not in the Hugging Face cache, and the hub "
                          "cannot be reached from this machine. Use 'bundled', a directory under the runs folder, "
                          "or a hub id once online.")


@dataclass(frozen=True)
class LabContext:
    runs: Path
    allowed: tuple[Path, ...] = field(default=())  # extra folders the operator allowed (--allow-path)

    @functools.cached_property
    def store(self) -> JobStore:
        """One store per server: opening one creates the schema, which a 2-second poll need not repeat."""
        return JobStore(self.runs)

    @property
    def uploads(self) -> Path:
        return self.runs / "uploads"

    @property
    def exports(self) -> Path:
        """Where the pages write CSV / HTML exports for the browser to download."""
        return self.runs / "exports"

    @property
    def roots(self) -> tuple[Path, ...]:
        """Folders a browser-submitted config may name files in."""
        return (self.runs, cache_dir(), *self.allowed)

    def submit(self, config: dict[str, Any], gpus: int = 0) -> Job:
        """Queue a config from the browser: its paths checked, then the store's own validation."""
        try:
            check_paths(config, self.roots)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check_models(config)
        return self.store.submit(config, gpus=gpus)
