"""The job table's schema, and the table made again from the run directories when it is lost.

The run directories are the record and the table their index (:mod:`jobs.store`): each holds what
its job was queued with (``config.yaml``, ``job.json``), what it did (``events.jsonl``) and how it
ended (``result.json``). A folder is a job only when its ``job.json`` is a complete, valid record of
a submission, checked here as a submit checks it: a folder planted in the runs folder, or one whose
record is damaged, is named and left as it is, never queued.
"""
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from jobs.slurm import parse_options
from lab.core.config import ConfigError, check_int
from lab.core.events import QUEUED, START, read_events
from lab.core.layout import CONFIG_FILE, EVENTS_FILE, JOB_FILE, RESULT_FILE, RUN_DIR_NAME, STORE_FILE
from lab.jobkit.chain import ENDINGS, ended_as

DB_FILE = STORE_FILE

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
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    roots TEXT,                           -- JSON list of the folders its files must lie in; NULL: anywhere
    waits_on TEXT                         -- JSON list of the jobs it starts only after they succeed; NULL: none
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
                 "slurm": "TEXT", "slurm_id": "TEXT", "roots": "TEXT", "waits_on": "TEXT"}
EXECUTORS = ("local", "slurm")
MAX_GPUS = 1024
# What a run directory's job.json holds: the record of its submission, without which a folder is no job.
JOB_FILE_KEYS = ("gpus", "processes", "executor", "slurm", "roots", "waits_on")
MAX_PROCESSES = 256


def check_gpus(value: Any) -> int:
    """The number of GPUs a job asks for."""
    return check_int("gpus", value, 0, MAX_GPUS)


def create(db: sqlite3.Connection) -> None:
    """The tables, in WAL mode, with every column a newer lab added."""
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    for name, declaration in ADDED_COLUMNS.items():
        if name not in have:
            db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {declaration}")


def rebuild(root: Path, path: Path) -> None:
    """Make a lost store again from the run directories in ``root``, each job under its own id.

    Built in a temporary file and renamed into place, so no one opens it half-filled; under a lock,
    so two processes that find it gone build it once. What a directory says is what the row says:
    its config and resources; its status from ``result.json``, or ``running`` while the worker its
    events name is alive, ``interrupted`` when it started and died unrecorded, ``queued`` when it
    never started. A folder that is no complete record of a submission (:func:`_job_record`), or one
    of several folders with the same id, is left out, said on stderr and left as it is: it is never
    queued, and a new job's id is past it all the same (:meth:`JobStore._next_id`)."""
    with open(root / f"{DB_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return  # another process rebuilt it while this one waited
        for stale in (f"{DB_FILE}-wal", f"{DB_FILE}-shm"):  # the lost file's journal would be replayed onto the new
            (root / stale).unlink(missing_ok=True)
        rows, left_out = _rows_from_run_dirs(root)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{DB_FILE}-")
        os.close(fd)
        try:
            db = sqlite3.connect(tmp, isolation_level=None)
            try:
                create(db)
                db.execute("BEGIN")
                for row in rows:
                    db.execute(f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                               tuple(row.values()))
                db.execute("COMMIT")
            finally:
                db.close()
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    if left_out:
        print(f"job store: rebuilt {len(rows)} job(s) from the run folders in {root}; left out, as no job of this "
              f"store (never queued, files untouched): {'; '.join(left_out)}", file=sys.stderr, flush=True)


def _rows_from_run_dirs(root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of the run directories in ``root``, and each numbered folder left out with why. Of
    several folders with one id (a ``python -m lab run --out`` into the store wrote its own
    ``00001-<kind>``), the one that is a job's record is that job; should several be, none is."""
    named: dict[int, list[str]] = {}
    for entry in sorted(os.listdir(root)):
        match = RUN_DIR_NAME.fullmatch(entry)
        if match:
            named.setdefault(int(match[1]), []).append(entry)
    rows, left_out = [], []
    for job_id, entries in sorted(named.items()):
        found = []
        for entry in entries:
            try:
                found.append(_row_of(root / entry, job_id, RUN_DIR_NAME.fullmatch(entry)[2]))
            except ValueError as e:
                left_out.append(f"{entry} ({e})")
        if len(found) == 1:
            rows += found
        elif found:
            left_out.append(f"{', '.join(Path(row['run_dir']).name for row in found)} (each records job {job_id}: "
                            "neither is listed: move the one that is not that job out of the store's folder, then delete "
                            f"{DB_FILE} so that the list is rebuilt)")
    return rows, left_out


def _job_record(run_dir: Path) -> dict[str, Any]:
    """A run directory's ``job.json``, checked: every key a submit writes (:data:`JOB_FILE_KEYS`),
    each as a submit checks it. Raises ValueError saying what is wrong: a folder planted in the
    runs folder, or one whose record is damaged, is no job to run."""
    try:
        record = json.loads((run_dir / JOB_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {JOB_FILE}: it was not queued through this store") from None
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{JOB_FILE} cannot be read: {type(e).__name__}") from None
    if not isinstance(record, dict) or set(record) != set(JOB_FILE_KEYS):
        keys = sorted(map(str, record)) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{JOB_FILE} holds {keys}, not the record of a submission ({', '.join(JOB_FILE_KEYS)})")
    roots, waits = record["roots"], record["waits_on"]
    try:
        gpus = check_gpus(record["gpus"])
        if record["executor"] not in EXECUTORS:
            raise ConfigError(f"executor: must be one of {', '.join(EXECUTORS)}, got {record['executor']!r:.40}")
        slurm = None if record["slurm"] is None else parse_options(record["slurm"]).to_json()
        processes = check_int("processes", record["processes"], 1, MAX_PROCESSES)
    except ConfigError as e:
        raise ValueError(f"{JOB_FILE}: {e}") from None
    if roots is not None and not (isinstance(roots, list) and all(isinstance(r, str) for r in roots)):
        raise ValueError(f"{JOB_FILE}: roots must be a list of folders or null, got {roots!r:.40}")
    if waits is not None and not (isinstance(waits, list) and all(
            isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in waits)):
        raise ValueError(f"{JOB_FILE}: waits_on must be a list of job ids or null, got {waits!r:.40}")
    return {"gpus": gpus, "processes": processes, "executor": record["executor"], "slurm": slurm,
            "roots": None if roots is None else json.dumps(roots), "waits_on": None if waits is None else json.dumps(waits)}


def _row_of(run_dir: Path, job_id: int, kind: str) -> dict[str, Any]:
    """The row of one run directory; ValueError when it is no job of this store."""
    if run_dir.is_symlink() or not run_dir.is_dir():
        raise ValueError("a link or not a folder")
    try:
        config = (run_dir / CONFIG_FILE).read_text(encoding="utf-8")
        created = (run_dir / CONFIG_FILE).stat().st_mtime
    except (OSError, ValueError):
        raise ValueError(f"no readable {CONFIG_FILE}") from None
    row = {"id": job_id, "kind": kind, "config": config, "position": float(job_id), "created": created,
           "run_dir": str(run_dir), **_job_record(run_dir)}
    row |= _state_of(run_dir)
    if row["status"] == "running" and not row["gpus"]:
        row["devices"] = "cpu" if row["processes"] == 1 else f"cpu x{row['processes']}"
    return row


def _state_of(run_dir: Path) -> dict[str, Any]:
    """A run directory's status, from its result or, without one, from its worker's life."""
    try:
        finished = (run_dir / RESULT_FILE).stat().st_mtime
    except OSError:
        finished = None  # no result.json: it has not ended, or its worker died unrecorded
    if finished is not None:
        result = ended_as(run_dir) or {}
        status = result.get("status")
        if status not in ENDINGS:  # a job that waits for this one must not wait for a status that never comes
            return {"status": "failed", "finished": finished,
                    "error": f"its {RESULT_FILE} says no status the lab records ({status!r:.40})"}
        error = result.get("error")
        return {"status": status, "error": error if isinstance(error, str) else None, "finished": finished}
    events = read_events(run_dir / EVENTS_FILE)[0]
    queued = max((i for i, e in enumerate(events) if e["stage"] == QUEUED), default=-1)  # resumed: read from there
    starts = [e for e in events[queued + 1:] if e["stage"] == START]
    if not starts:
        return {"status": "queued"}
    start = starts[-1]
    try:
        process = psutil.Process(int(start["pid"]))
        if process.create_time() <= start["time"] + 1 and str(run_dir) in " ".join(process.cmdline()):
            return {"status": "running", "pid": process.pid, "pid_started": process.create_time(),
                    "started": start["time"]}
    except (psutil.Error, KeyError, ValueError, TypeError, OverflowError):
        pass
    return {"status": "interrupted", "started": start["time"], "finished": time.time(),
            "error": "the job store was rebuilt after it was lost, and this job's worker was gone"}
