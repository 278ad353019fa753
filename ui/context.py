"""What every page needs from the server: where runs live, the job store, the folders it may read,
and the caches of this server (two servers in one process share none of them)."""
from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from jobs.lane import Lane
from jobs.store import Job, JobStore
from lab.core.files import cache_dir
from lab.core.layout import LANE_DIR, PREDICTIONS_FILE
from lab.results.analysis import Sweep, temperature_sweep
from lab.results.predictions import Predictions, load_predictions
from lab.results.runs import EvalRun
from ui.progress import EventCache

CACHED_RUNS = 32  # predictions (and sweeps) kept in memory; a run of 10,000 questions is a few MB


def _version(run: EvalRun) -> tuple[int, int]:
    """What changes when a run's predictions are rewritten: a rerun in place must not be served stale."""
    stat = (run.path / PREDICTIONS_FILE).stat()
    return stat.st_mtime_ns, stat.st_size


class ResultCache:
    """A run's predictions, read once per version of the file, and what the pages compute from them
    that does not depend on a slider — temperature sweeps (per form and binning), selective
    summaries with their bootstrap intervals (per signal) — computed once, not on every move."""

    def __init__(self, size: int = CACHED_RUNS) -> None:
        self._load = functools.lru_cache(maxsize=size)(self._read)
        self._sweep = functools.lru_cache(maxsize=size)(self._compute_sweep)
        self._summaries: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
        self._size = size

    @staticmethod
    def _read(path: Path, name: str, version: tuple[int, int]) -> Predictions:
        return load_predictions(path, name)

    def _compute_sweep(self, path: Path, name: str, version: tuple[int, int], form: str, n_bins: int,
                       edges: str) -> Sweep:
        return temperature_sweep(self._load(path, name, version), form=form, n_bins=n_bins, edges=edges)

    def predictions(self, run: EvalRun) -> Predictions:
        """Raises OSError or ValueError (naming the run's file and line, never its absolute path) as
        :func:`lab.results.predictions.load_predictions`."""
        return self._load(run.path, run.name, _version(run))

    def sweep(self, run: EvalRun, form: str, n_bins: int, edges: str) -> Sweep:
        return self._sweep(run.path, run.name, _version(run), form, n_bins, edges)

    def selective_summary(self, run: EvalRun, signal: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``compute()`` (the run's selective summary under ``signal``), once per version of its predictions."""
        key = (run.path, _version(run), signal)
        if key in self._summaries:
            self._summaries.move_to_end(key)
        else:
            self._summaries[key] = compute()
            while len(self._summaries) > self._size:
                self._summaries.popitem(last=False)
        return self._summaries[key]


@dataclass(frozen=True)
class LaneOptions:
    """The inference lane's settings (``app.py --lane-device/--lane-memory/--lane-idle/--lane-preload``)."""

    device: str = "auto"  # cpu, cuda:N or auto (the first GPU if there is one)
    memory_gb: Optional[float] = None  # None: a quarter of the RAM on the CPU, half the GPU
    idle_s: float = 600.0
    # when the lane loads the Compare form's models before the first compare: "open" (the page opens),
    # "start" (the server starts, and the page opens) or "off". Off here, so that a context built in
    # a test or a script starts no process; app.py's --lane-preload default is "open".
    preload: str = "off"


@dataclass(frozen=True)
class LabContext:
    runs: Path
    allowed: tuple[Path, ...] = field(default=())  # extra folders the operator allowed (--allow-path)
    lane_options: LaneOptions = field(default_factory=LaneOptions)
    executor: str = "local"  # where the Launch form sends jobs unless told otherwise (--executor)

    @functools.cached_property
    def store(self) -> JobStore:
        """One store per server: opening one creates the schema, which a 2-second poll need not repeat.
        Its scheduler's workers read inside :attr:`roots`, whatever a run folder claims."""
        return JobStore(self.runs, roots=self.roots)

    @functools.cached_property
    def events(self) -> EventCache:
        """The jobs' events, each file read from where this server's last poll stopped."""
        return EventCache()

    @functools.cached_property
    def lane(self) -> Lane:
        """The inference lane this server's pages call (compare); its worker starts on the first call."""
        o = self.lane_options
        return Lane(self.runs / LANE_DIR, device=o.device, memory_gb=o.memory_gb, idle_s=o.idle_s)

    @functools.cached_property
    def results(self) -> ResultCache:
        return ResultCache()

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

    def submit(self, config: Any, gpus: Any = 0, processes: Any = 1, executor: Any = "local", slurm: Any = None) -> Job:
        """Queue a config from the browser: validated, every file it names resolved inside :attr:`roots`."""
        return self.store.submit(config, gpus=gpus, roots=self.roots, processes=processes, executor=executor,
                                 slurm=slurm)

    def submit_pipeline(self, data: Any, gpus: Any = 0) -> list[Job]:
        """Queue every stage of a pipeline file from the browser, each checked as :meth:`submit` checks one."""
        return self.store.submit_pipeline(data, gpus=gpus, roots=self.roots, executor=self.executor)
