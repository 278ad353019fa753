"""The job table: SQLite (stdlib) in WAL mode, one row per job, one directory per run.

Every call opens its own connection, so threads and processes (the app, ``python -m jobs`` in
a terminal, a scheduler) share the file safely; writes that must not interleave — claiming
devices for a job, reordering the queue — run inside ``BEGIN IMMEDIATE`` transactions, which
SQLite serialises across processes.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from jobs.preflight import check_gpu_request
from jobs.slurm import parse_options
from lab.config import ConfigError, check_int
from lab.kinds import JobKind, parse_config
from lab.layout import CONFIG_FILE, RESULT_FILE, STOP_FILE
from lab.yamlio import dump_yaml, load_yaml

DB_FILE = "jobs.db"
# A scheduler beats every tick (1 s by default); this long without one, none is serving the queue.
HEARTBEAT_STALE_S = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    config TEXT NOT NULL,                 -- the YAML that `python -m lab run` takes
    status TEXT NOT NULL,
    gpus INTEGER NOT NULL DEFAULT 0,      -- GPUs asked for; 0 = a CPU job
    processes INTEGER NOT NULL DEFAULT 1, -- a CPU job's data-parallel processes (a GPU job: one per GPU)
    executor TEXT NOT NULL DEFAULT 'local', -- local (this server's scheduler) or slurm
    slurm TEXT,                           -- a Slurm job's options (JSON, jobs.slurm.SlurmOptions)
    slurm_id TEXT,                        -- its Slurm job id, once submitted
    devices TEXT,                         -- assigned at start: "0,1" or "cpu"
    position REAL NOT NULL,               -- queue order, smallest first
    pid INTEGER,
    pid_started REAL,                     -- the process's create time: a reused pid is not ours
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    run_dir TEXT,
    error TEXT,                           -- one-line summary when it failed
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status, position);
CREATE TABLE IF NOT EXISTS heartbeats (   -- one row per scheduler process: when its last tick ended
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (host, pid)
);
"""


# Columns added after the first release, with their declaration: an older jobs.db gains them on open.
ADDED_COLUMNS = {"processes": "INTEGER NOT NULL DEFAULT 1", "executor": "TEXT NOT NULL DEFAULT 'local'",
                 "slurm": "TEXT", "slurm_id": "TEXT"}
EXECUTORS = ("local", "slurm")
MAX_GPUS = 1024
RESUMABLE = ("failed", "cancelled", "interrupted")  # ended without finishing: its run directory can continue
MAX_PROCESSES = 256


def check_gpus(value: Any) -> int:
    """The number of GPUs a job asks for."""
    return check_int("gpus", value, 0, MAX_GPUS)


def check_processes(value: Any, gpus: int, kind: JobKind) -> int:
    """A CPU job's number of data-parallel processes: 1 unless the kind splits its work across ranks,
    and 1 with GPUs, where a job runs one process per GPU."""
    value = check_int("processes", value, 1, MAX_PROCESSES)
    if value > 1 and gpus:
        raise ConfigError(f"processes: a GPU job runs one process per GPU; set processes to 1 (it asked for {gpus} GPUs)")
    if value > 1 and not kind.data_parallel:
        raise ConfigError(f"processes: a {kind.name} job does not split its work across processes; set processes to 1")
    return value


@dataclass(frozen=True)
class Job:
    id: int
    kind: str
    config: str
    status: str
    gpus: int
    processes: int
    executor: str
    slurm: Optional[str]
    slurm_id: Optional[str]
    devices: Optional[str]
    position: float
    pid: Optional[int]
    pid_started: Optional[float]
    created: float
    started: Optional[float]
    finished: Optional[float]
    run_dir: Optional[str]
    error: Optional[str]
    cancel_requested: int

    @property
    def config_dict(self) -> dict[str, Any]:
        return load_yaml(self.config)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def elapsed(self) -> Optional[float]:
        """Seconds it has run: to its end when finished, else to now; None when it has not started."""
        return ((self.finished or time.time()) - self.started) if self.started else None


@dataclass(frozen=True)
class Heartbeat:
    """A scheduler's sign of life: which process, where, and when its last tick ended (Unix seconds)."""

    host: str
    pid: int
    time: float


class JobStore:
    def __init__(self, root: Path) -> None:
        """``root`` holds ``jobs.db`` and one run directory per job."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / DB_FILE
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
            have = {row["name"] for row in db.execute("PRAGMA table_info(jobs)")}
            for name, declaration in ADDED_COLUMNS.items():
                if name not in have:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declaration}")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        return db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """An exclusive write transaction: nobody else writes until it commits."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    # ------------------------------------------------------------------ reading
    def get(self, job_id: int) -> Job:
        db = self._connect()
        try:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        finally:
            db.close()
        if row is None:
            raise KeyError(f"No job {job_id} in {self.path}")
        return Job(**dict(row))

    def list(self, statuses: Optional[tuple[str, ...]] = None) -> list[Job]:
        """Jobs, queued ones in queue order first, then the rest newest first."""
        query = "SELECT * FROM jobs"
        args: tuple = ()
        if statuses:
            query += f" WHERE status IN ({','.join('?' * len(statuses))})"
            args = statuses
        query += " ORDER BY status != 'queued', CASE WHEN status = 'queued' THEN position ELSE -id END"
        db = self._connect()
        try:
            return [Job(**dict(r)) for r in db.execute(query, args)]
        finally:
            db.close()

    # ------------------------------------------------------------------ writing
    def submit(self, config: Any, gpus: Any = 0, roots: Optional[Iterable[Path]] = None, processes: Any = 1,
               executor: Any = "local", slurm: Any = None) -> Job:
        """Validate ``config``, resolve the files it names (inside ``roots`` when given) and queue it
        as resolved; a bad config changes nothing and raises :class:`ConfigError` naming the field.

        A config from a browser (``roots`` given) runs on the scheduler of the server it came through,
        on this machine, so it may ask for no more GPUs than this machine has. The command line may
        queue for a scheduler elsewhere that shares the store, which refuses what it cannot run."""
        kind, parsed = parse_config(config, roots)
        gpus = check_gpus(gpus)
        if executor not in EXECUTORS:
            raise ConfigError(f"executor: must be one of {', '.join(EXECUTORS)}, got {executor!r}")
        options = None
        if executor == "slurm":
            options = parse_options(slurm)
            if gpus:
                raise ConfigError("gpus: a Slurm job asks for GPUs with slurm.gpus_per_node; set gpus to 0")
            if roots is not None and shutil.which("sbatch") is None:
                raise ConfigError("executor: this server has no Slurm (sbatch not found); pick local")
        elif slurm:
            raise ConfigError("slurm: options are for executor slurm")
        processes = check_processes(processes, options.gpus_per_node if options else gpus, kind)
        if roots is not None and executor == "local":
            check_gpu_request(gpus)
            if processes > (os.cpu_count() or 1):
                raise ConfigError(f"processes: this machine has {os.cpu_count()} CPU cores; ask for that many or fewer")
        text = dump_yaml({"kind": kind.name, **parsed.to_dict()})
        now = time.time()
        with self.transaction() as db:
            last = db.execute("SELECT MAX(position) FROM jobs").fetchone()[0]
            cur = db.execute(
                "INSERT INTO jobs (kind, config, status, gpus, processes, executor, slurm, position, created) "
                "VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?)",
                (kind.name, text, gpus, processes, executor, options.to_json() if options else None, (last or 0) + 1,
                 now),
            )
            job_id = cur.lastrowid
            run_dir = self.root / f"{job_id:05d}-{kind.name}"
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / CONFIG_FILE).write_text(text, encoding="utf-8")
            db.execute("UPDATE jobs SET run_dir = ? WHERE id = ?", (str(run_dir), job_id))
        return self.get(job_id)

    def clone(self, job_id: int) -> Job:
        """Run again with the same config and resources."""
        job = self.get(job_id)
        return self.submit(job.config_dict, gpus=job.gpus, processes=job.processes, executor=job.executor,
                           slurm=json.loads(job.slurm) if job.slurm else None)

    def resume(self, job_id: int) -> Job:
        """Queue a job that did not finish again, in its own run directory, at the back of the queue.

        The worker then continues from what the directory holds: a training run from its last
        checkpoint with optimizer, scheduler and RNG state, a pipeline from its last finished stage,
        an extraction from its last complete shard. A clone, by contrast, starts over elsewhere."""
        with self.transaction() as db:
            row = db.execute("SELECT status, run_dir FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise KeyError(f"No job {job_id} in {self.path}")
            if row["status"] not in RESUMABLE:
                raise ValueError(f"Job {job_id} is {row['status']}; only a {', '.join(RESUMABLE)} job can be resumed")
            for name in (RESULT_FILE, STOP_FILE):  # the last attempt's ending, and its stop request
                (Path(row["run_dir"]) / name).unlink(missing_ok=True)
            last = db.execute("SELECT MAX(position) FROM jobs").fetchone()[0]
            db.execute("UPDATE jobs SET status = 'queued', position = ?, devices = NULL, pid = NULL, pid_started = NULL, "
                       "started = NULL, finished = NULL, error = NULL, cancel_requested = 0, slurm_id = NULL "
                       "WHERE id = ?",
                       ((last or 0) + 1, job_id))
        return self.get(job_id)

    def update(self, job_id: int, only_if_status: Optional[tuple[str, ...]] = None, **values: Any) -> bool:
        """Set columns; with ``only_if_status`` only while the job is in one of those states.

        The guard makes state changes race-free: of two watchers noticing a job ended, one wins.
        """
        unknown = set(values) - {f.name for f in fields(Job)}
        if unknown:
            raise ValueError(f"Unknown job column(s) {sorted(unknown)}")
        sets = ", ".join(f"{k} = ?" for k in values)
        query, args = f"UPDATE jobs SET {sets} WHERE id = ?", [*values.values(), job_id]
        if only_if_status:
            query += f" AND status IN ({','.join('?' * len(only_if_status))})"
            args += list(only_if_status)
        with self.transaction() as db:
            return db.execute(query, args).rowcount == 1

    def move(self, job_id: int, offset: int) -> None:
        """Move a queued job ``offset`` places towards the front (negative: towards the back)."""
        with self.transaction() as db:
            queue = [r[0] for r in db.execute("SELECT id FROM jobs WHERE status = 'queued' ORDER BY position")]
            if job_id not in queue:
                raise ValueError(f"Job {job_id} is not queued; only queued jobs can be reordered")
            old = queue.index(job_id)
            queue.pop(old)
            queue.insert(max(0, min(len(queue), old - offset)), job_id)
            db.executemany("UPDATE jobs SET position = ? WHERE id = ?", [(i + 1.0, j) for i, j in enumerate(queue)])

    # ------------------------------------------------------------------ heartbeat
    def beat(self) -> None:
        """Record that this process's scheduler finished a tick just now."""
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO heartbeats (host, pid, time) VALUES (?, ?, ?)",
                       (socket.gethostname(), os.getpid(), time.time()))

    def last_beat(self) -> Optional[Heartbeat]:
        """The newest heartbeat of any scheduler on this store; None if none ever ran."""
        db = self._connect()
        try:
            row = db.execute("SELECT host, pid, time FROM heartbeats ORDER BY time DESC LIMIT 1").fetchone()
        finally:
            db.close()
        return Heartbeat(**dict(row)) if row is not None else None

    def scheduler_alive(self, max_age_s: float = HEARTBEAT_STALE_S) -> bool:
        """Whether some scheduler finished a tick within ``max_age_s`` seconds: else queued jobs wait forever."""
        beat = self.last_beat()
        return beat is not None and time.time() - beat.time <= max_age_s
