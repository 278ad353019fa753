"""What every page needs from the server: where runs live, the job store, the folders it may read."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.store import ConfigError, Job, JobStore
from lab.files import cache_dir
from ui.paths import check_paths


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
    def roots(self) -> tuple[Path, ...]:
        """Folders a browser-submitted config may name files in."""
        return (self.runs, cache_dir(), *self.allowed)

    def submit(self, config: dict[str, Any], gpus: int = 0) -> Job:
        """Queue a config from the browser: its paths checked, then the store's own validation."""
        try:
            check_paths(config, self.roots)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return self.store.submit(config, gpus=gpus)
