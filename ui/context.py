"""What every page needs from the server: where runs live, the job store, the folders it may read."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.store import Job, JobStore
from lab.files import cache_dir


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

    def submit(self, config: Any, gpus: Any = 0) -> Job:
        """Queue a config from the browser: validated, every file it names resolved inside :attr:`roots`."""
        return self.store.submit(config, gpus=gpus, roots=self.roots)
