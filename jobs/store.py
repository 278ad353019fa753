"""The job table: SQLite (stdlib) in WAL mode, one row per job, one directory per run.

Every call opens its own connection, so threads and processes (the app, ``python -m jobs`` in
a terminal, a scheduler) share the file safely; writes that must not interleave — claiming
devices for a job, reordering the queue — run inside ``BEGIN IMMEDIATE`` transactions, which
SQLite serialises across processes.

A job may wait for others (``waits_on``): those its ``run:<id>`` model fields name and a pipeline
stage's ``after`` (:meth:`JobStore.submit_pipeline`); :meth:`JobStore.dependencies` says whether it
may start, and the scheduler starts it only once they have succeeded.

The run directories are the record; the table is their index. Each directory holds what its job
was queued with (``config.yaml``, ``job.json``: resources, the folders it may read, the jobs it
waits for), what it did (``events.jsonl``) and how it ended (``result.json``, written before or with
the row whoever ends it: :meth:`JobStore.end`), so a store that is lost is rebuilt from them on the
next open, with every job under its own id (:func:`jobs.rebuild.rebuild`), and a new job never reuses the id, or
the directory, of one that exists. A folder without a valid ``job.json`` is no job: never queued. A store that SQLite cannot
read stops whoever opens it with a message saying what to do (:class:`StoreError`): it is never
silently started afresh.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from jobs.rebuild import DB_FILE, create, rebuild
from jobs.submit_checks import Queued, checked
from lab.core.config import ConfigError
from lab.core.events import QUEUED, EventWriter
from lab.core.files import write_atomic
from lab.core.layout import EVENTS_FILE, JOB_FILE, RESULT_FILE, RUN_DIR_NAME, STOP_FILE, run_dir_name
from lab.core.yamlio import load_yaml
from lab.jobkit.chain import ENDINGS, write_result
from lab.jobkit.kinds import JobKind, parse_config, write_config
from lab.jobkit.pipeline import Stage, bind, parse_pipeline

# A scheduler beats every tick (1 s by default); this long without one, none is serving the queue.
HEARTBEAT_STALE_S = 30.0

RESUMABLE = ("failed", "cancelled", "interrupted")  # ended without finishing: its run directory can continue
STATUSES = ("queued", "running", *ENDINGS)


class StoreError(RuntimeError):
    """The job store cannot be opened as it is; the message says what to do."""


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
    roots: Optional[str]
    waits_on: Optional[str]

    @property
    def config_dict(self) -> dict[str, Any]:
        return load_yaml(self.config)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def allowed(self) -> Optional[list[Path]]:
        """The folders its files must lie in (those it was submitted under); None: anywhere."""
        return None if self.roots is None else [Path(r) for r in json.loads(self.roots)]

    @property
    def waits_for(self) -> list[int]:
        """The jobs it starts only after they have succeeded: those its ``run:<id>`` fields name, and
        a pipeline stage's ``after``."""
        return [] if self.waits_on is None else json.loads(self.waits_on)

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
    def __init__(self, root: Path, roots: Optional[Iterable[Path]] = None) -> None:
        """``root`` holds ``jobs.db`` and one run directory per job. Raises :class:`StoreError` when
        ``jobs.db`` is not a database SQLite can read.

        ``roots``: the folders the server using this store allows (the app's runs folder, model cache
        and ``--allow-path``): every worker a scheduler starts on it reads inside them, whatever its
        run directory claims (:func:`lab.jobkit.worker.allowed_folders`). None (the command line):
        a worker reads inside the folders its job was submitted under."""
        self.root = Path(root)
        self.roots = None if roots is None else [os.path.realpath(os.path.expanduser(r)) for r in roots]
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / DB_FILE
        try:
            db = self._connect()
            try:
                create(db)
            finally:
                db.close()
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                raise
            raise StoreError(f"the job store {self.path} cannot be read ({e}). Move it aside "
                             f"(mv {self.path} {self.path}.broken) and start again: the lab rebuilds the job list "
                             f"from the run folders in {self.root}") from None

    def _connect(self) -> sqlite3.Connection:
        """A connection to the store, rebuilt first from the run directories if the file is gone.

        ``mode=rw``: SQLite would otherwise create an empty file in its place, and every call after
        would fail on tables that are not there while new jobs took the ids of old ones."""
        if not self.path.exists():
            try:
                rebuild(self.root, self.path)
            except (sqlite3.Error, OSError) as e:  # no jobs.db to move aside: the folder itself is the trouble
                raise StoreError(f"the job store could not be rebuilt from the run folders in {self.root} "
                                 f"({type(e).__name__}: {e}); make the folder writable (or free space on its disk) "
                                 "and open it again") from None
        db = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, timeout=30, isolation_level=None)
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

    def strays(self) -> list[str]:
        """The numbered folders beside the store's run directories that are no job of it (a rebuild
        left them out: no record of a submission, or several folders of one id): never queued, and
        listed so that whoever keeps the store can look at them."""
        known = {Path(job.run_dir).name for job in self.list()}
        return sorted(e for e in os.listdir(self.root) if RUN_DIR_NAME.fullmatch(e) and e not in known)

    # ------------------------------------------------------------------ writing
    def submit(self, config: Any, gpus: Any = 0, roots: Optional[Iterable[Path]] = None, processes: Any = 1,
               executor: Any = "local", slurm: Any = None, after: Iterable[int] = ()) -> Job:
        """Validate ``config``, resolve the files it names (inside ``roots`` when given) and queue it
        as resolved; a bad config changes nothing and raises :class:`ConfigError` naming the field.

        A config from a browser (``roots`` given) runs on the scheduler of the server it came through,
        on this machine, so it may ask for no more GPUs than this machine has. The command line may
        queue for a scheduler elsewhere that shares the store, which refuses what it cannot run.

        It waits for the jobs its ``run:<id>`` fields name and those in ``after`` (:meth:`dependencies`)."""
        kind, parsed = parse_config(config, roots, runs=self.root)
        queued = self._checked(kind, parsed, gpus, roots, processes, executor, slurm, after)
        with self._inserting() as (db, made):
            job_id = self._insert(db, queued, made)
        return self.get(job_id)

    def submit_pipeline(self, data: Any, gpus: Any = 0, roots: Optional[Iterable[Path]] = None, processes: Any = 1,
                        executor: Any = "local", slurm: Any = None) -> list[Job]:
        """Queue every stage of a pipeline file (:mod:`lab.jobkit.pipeline`), each on the resources
        given, each waiting for the stages it starts from or lists in ``after``: all of them or none.

        The whole file is checked first (:func:`parse_pipeline`); then, in one transaction, each stage
        gets its id and is checked in full as :meth:`submit` checks a job (its ``run:<id>`` now naming
        the stage before, its devices, disk and LoRA targets). A refusal names the stage, rolls the
        transaction back and removes the run directories it made, so no scheduler ever sees, let
        alone starts, a stage of a pipeline that was refused."""
        stages = parse_pipeline(data, roots, runs=self.root)
        with self._inserting() as (db, made):
            ids: dict[str, int] = {}
            for i, stage in enumerate(stages):
                ids[stage.name] = self._insert(db, self._stage(i, stage, ids, gpus, roots, processes, executor,
                                                               slurm, db), made)
        return [self.get(job_id) for job_id in ids.values()]

    def _stage(self, i: int, stage: Stage, ids: dict[str, int], gpus: Any, roots: Optional[Iterable[Path]],
               processes: Any, executor: Any, slurm: Any, db: sqlite3.Connection) -> Queued:
        """Pipeline stage ``i`` checked in full, its ``stage:<name>`` bound to the ids of the stages
        before it (made in ``db``'s transaction, their run directories on disk for ``run:<id>`` to find)."""
        try:
            kind, parsed = parse_config(bind(stage, ids), roots, runs=self.root)
            return self._checked(kind, parsed, gpus, roots, processes, executor, slurm,
                                 [ids[name] for name in stage.after], db)
        except ConfigError as e:
            raise ConfigError(f"pipeline[{i}] ({stage.name}).{e}") from None

    def _checked(self, kind: JobKind, parsed: Any, gpus: Any, roots: Optional[Iterable[Path]], processes: Any,
                 executor: Any, slurm: Any, after: Iterable[int],
                 db: Optional[sqlite3.Connection] = None) -> Queued:
        """Everything :meth:`submit` checks beyond the config itself (:func:`jobs.submit_checks.checked`),
        then that the jobs it waits for are in this store (read in ``db`` when given)."""
        queued = checked(kind, parsed, gpus, roots, processes, executor, slurm, after, self.root)
        own = db is None
        db = self._connect() if own else db
        try:
            for earlier in queued.waits or ():
                if db.execute("SELECT 1 FROM jobs WHERE id = ?", (earlier,)).fetchone() is None:
                    raise ConfigError(f"after: there is no job {earlier} in this store")
        finally:
            if own:
                db.close()
        return queued

    @contextmanager
    def _inserting(self) -> Iterator[tuple[sqlite3.Connection, list[Path]]]:
        """A write transaction that inserts jobs; should it fail, the run directories it made (listed
        in the second item) go too, so a refused or failed submit leaves no folder that a rebuilt
        store would take for a queued job."""
        made: list[Path] = []
        try:
            with self.transaction() as db:
                yield db, made
        except BaseException:
            for run_dir in made:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise

    def _insert(self, db: sqlite3.Connection, queued: Queued, made: list[Path]) -> int:
        """Queue a checked job in ``db``'s transaction: its run directory with ``config.yaml`` and
        ``job.json`` (the record a lost store is rebuilt from), then its row. Returns its id."""
        last = db.execute("SELECT MAX(position) FROM jobs").fetchone()[0]
        job_id = self._next_id(db)
        run_dir = self.root / run_dir_name(job_id, queued.kind.name)
        run_dir.mkdir(parents=True)  # new, never an old job's: _next_id is past every directory
        made.append(run_dir)
        text = write_config(run_dir, queued.kind, queued.parsed)
        write_atomic(run_dir / JOB_FILE, json.dumps(queued.job_file()) + "\n")
        db.execute(
            "INSERT INTO jobs (id, kind, config, status, gpus, processes, executor, slurm, position, created, "
            "run_dir, roots, waits_on) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job_id, queued.kind.name, text, queued.gpus, queued.processes, queued.executor,
             queued.options.to_json() if queued.options else None, (last or 0) + 1, time.time(), str(run_dir),
             None if queued.folders is None else json.dumps(queued.folders),
             None if queued.waits is None else json.dumps(queued.waits)),
        )
        return job_id

    def end(self, job_id: int, status: str, error: Optional[str],
            only_if_status: Optional[tuple[str, ...]] = None) -> bool:
        """Record that a job ended: in its run directory (``result.json``), then in its row, in one
        transaction, so the folders alone rebuild every ending a lost store knew (a job cancelled
        while queued is never run again by a rebuilt store). With ``only_if_status``, only while the
        job is in one of those states; returns whether it was recorded."""
        with self.transaction() as db:
            return end_in(db, job_id, status, error, only_if_status)

    def dependencies(self, job: Job, db: Optional[sqlite3.Connection] = None) -> tuple[bool, Optional[str]]:
        """Whether ``job`` may start (every job it waits for succeeded), and, when it never will (one
        failed, was cancelled or interrupted, or is gone), why and what to do. Read in ``db`` (a
        transaction that is claiming jobs) when given."""
        if not job.waits_for:
            return True, None
        own = db is None
        db = self._connect() if own else db
        try:
            rows = {row["id"]: row for row in db.execute(
                f"SELECT id, kind, status, error FROM jobs WHERE id IN ({','.join('?' * len(job.waits_for))})",
                job.waits_for)}
        finally:
            if own:
                db.close()
        for earlier in job.waits_for:
            row = rows.get(earlier)
            if earlier >= job.id:  # only a rebuilt store's job.json can say so: a job waits for jobs queued before it
                return False, (f"it waits for job {earlier}, which was not queued before it, so it would wait forever: "
                               "this job did not start; clone it")
            if row is None:
                return False, (f"job {earlier}, which this one starts from, is no longer in the store: this job did "
                               "not start; clone it with another model")
            if row["status"] in RESUMABLE:
                why = f" ({row['error']})" if row["error"] else ""
                return False, (f"stage {earlier} ({row['kind']}) {row['status']}{why}, so this job did not start. "
                               f"Resume job {earlier} (python -m jobs resume {earlier}, or Resume on the Jobs page), "
                               "then resume this one: it waits for that one again")
            if row["status"] not in STATUSES:
                return False, (f"job {earlier}, which this one starts from, is {row['status']!r}, no status the lab "
                               "records: this job did not start; clone it with another model")
        return all(rows[earlier]["status"] == "succeeded" for earlier in job.waits_for), None

    def _next_id(self, db: sqlite3.Connection) -> int:
        """An id past every job the table has had and every run directory there is: a directory the
        table does not know (a store rebuilt, copied runs) is never taken over by a new job."""
        used = [row[0] or 0 for row in db.execute("SELECT MAX(id) FROM jobs UNION ALL "
                                                   "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'")]
        used += [int(m[1]) for m in map(RUN_DIR_NAME.fullmatch, os.listdir(self.root)) if m]
        return max(used, default=0) + 1

    def clone(self, job_id: int, roots: Optional[Iterable[Path]] = None) -> Job:
        """Run again with the same config and resources, as a new submit: its files are checked
        again, inside ``roots`` (a browser's clone) or else the folders the job was submitted under,
        so a file swapped for a link since then is refused as a fresh submit would refuse it."""
        job = self.get(job_id)
        return self.submit(job.config_dict, gpus=job.gpus, roots=roots if roots is not None else job.allowed,
                           processes=job.processes, executor=job.executor,
                           slurm=json.loads(job.slurm) if job.slurm else None)

    def resume(self, job_id: int, roots: Optional[Iterable[Path]] = None) -> Job:
        """Queue a job that did not finish again, in its own run directory, at the back of the queue.

        The worker then continues from what the directory holds: a training run from its last
        checkpoint with optimizer, scheduler and RNG state, a pipeline from its last finished stage,
        an extraction from its last complete shard. A clone, by contrast, starts over elsewhere.
        Its files are checked again first, as :meth:`clone` checks them (and the worker checks them
        once more when it opens them)."""
        job = self.get(job_id)
        for allowed in (roots, job.allowed):
            if allowed is not None:
                parse_config(job.config_dict, allowed, runs=self.root)
        with self.transaction() as db:
            row = db.execute("SELECT status, run_dir FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise KeyError(f"No job {job_id} in {self.path}")
            if row["status"] not in RESUMABLE:
                raise ValueError(f"Job {job_id} is {row['status']}; only a {', '.join(RESUMABLE)} job can be resumed")
            for name in (RESULT_FILE, STOP_FILE):  # the last attempt's ending, and its stop request
                (Path(row["run_dir"]) / name).unlink(missing_ok=True)
            # the folder says it waits again: a rebuild must not read the last attempt's start as this one's
            EventWriter(Path(row["run_dir"]) / EVENTS_FILE).emit(QUEUED)
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


def end_in(db: sqlite3.Connection, job_id: int, status: str, error: Optional[str],
           only_if_status: Optional[tuple[str, ...]] = None) -> bool:
    """:meth:`JobStore.end` in ``db``'s transaction (the scheduler's claim ends jobs that never will
    start as it goes). A run directory that cannot be written (the job's very failure, often) is
    said on stderr and the row recorded all the same: a job must not stay running or queued forever."""
    row = db.execute("SELECT status, run_dir FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None or (only_if_status and row["status"] not in only_if_status):
        return False
    try:
        write_result(Path(row["run_dir"]), status, error)
    except OSError as e:
        print(f"job store: job {job_id} {status}, but its run folder could not record it ({e.strerror or e}); "
              "a store rebuilt from the folders would not know", file=sys.stderr, flush=True)
    db.execute("UPDATE jobs SET status = ?, error = ?, finished = ? WHERE id = ?", (status, error, time.time(), job_id))
    return True
