"""``python -m jobs``: submit, list, show, cancel, follow logs, and serve the queue, headless.

It works on the same store as the app (``--root``, default ``$CALIBRATION_LAB_RUNS`` or
``runs``), so scripts and servers without a browser see and steer the same jobs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Optional, Sequence

from jobs import failures
from jobs.preflight import GIB, check_devices, check_lora_targets, dry_run, submit_notes
from jobs.rebuild import check_gpus
from jobs.scheduler import Scheduler, cancel, start_in_background
from jobs.sharding import check_sharding
from jobs.store import JobStore, StoreError
from jobs.submit_checks import check_processes
from lab.core.config import ConfigError
from lab.core.events import read_events_checked
from lab.core.layout import EVENTS_FILE
from lab.core.yamlio import load_yaml
from lab.jobkit.kinds import parse_config
from lab.jobkit.pipeline import is_pipeline, parse_pipeline
from lab.models.placement import check_job_gpus
from lab.versions import exit_if_unsupported

DEFAULT_ROOT = Path(os.environ.get("CALIBRATION_LAB_RUNS", "runs"))


def _when(t: Optional[float]) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _seconds(elapsed: Optional[float]) -> str:
    return "-" if elapsed is None else f"{elapsed:.0f}s"


def _dry_run(store: JobStore, args, data) -> dict:
    """The plan of a job config (or of each stage of a pipeline file) for ``--gpus`` GPUs, checked as
    submit checks it but for this machine's GPU count and free disk (reported, not refused): nothing queued."""
    gpus = check_gpus(args.gpus)
    if args.gpu_memory is None or not 0 < args.gpu_memory <= 1e6:
        raise ConfigError(f"--gpu-memory: GiB of one GPU, a positive number, got {args.gpu_memory}")
    memory = args.gpu_memory * GIB
    if is_pipeline(data):
        stages = parse_pipeline(data, None, runs=store.root)
        return {"pipeline": [{"stage": stage.name, **dry_run(stage.kind, stage.config, gpus, memory)}
                             for stage in stages]}
    kind, parsed = parse_config(data, None, runs=store.root)
    check_processes(args.processes, gpus, kind)
    values = parsed.to_dict()
    check_devices(kind.name, values, gpus, here=False)
    check_sharding(kind.name, values, gpus)
    check_job_gpus(kind.config, values, gpus)
    check_lora_targets(kind.name, values)
    report = dry_run(kind.name, values, gpus, memory)
    free = shutil.disk_usage(store.root if store.root.exists() else Path(".")).free
    return {**report, "disk_free_gib": round(free / GIB, 2), "disk_fits": report["disk_gib"] * GIB <= free}


def cmd_submit(store: JobStore, args) -> int:
    try:
        data = load_yaml(Path(args.config).read_bytes(), args.config)
        if args.dry_run:
            print(json.dumps(_dry_run(store, args, data), indent=2, ensure_ascii=False))
            return 0
        options = {k: v for k, v in (("partition", args.partition), ("nodes", args.nodes),
                                     ("gpus_per_node", args.gpus_per_node), ("minutes", args.time),
                                     ("account", args.account), ("extra", args.sbatch)) if v is not None}
        submit = store.submit_pipeline if is_pipeline(data) else store.submit
        queued = submit(data, gpus=args.gpus, processes=args.processes, executor=args.executor, slurm=options or None)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot read {args.config}: {e.strerror or e}", file=sys.stderr)
        return 2
    for job in queued if isinstance(queued, list) else [queued]:  # a pipeline: one id a line, in stage order
        print(job.id)
        # What it will take, on stderr: stdout stays the job ids alone, for scripts that read them.
        for line in submit_notes(job.kind, job.config_dict, job.gpus):
            print(line, file=sys.stderr)
        if job.waits_for:
            print(f"job {job.id} ({job.kind}) starts once job(s) {', '.join(map(str, job.waits_for))} succeeded",
                  file=sys.stderr)
    return 0


def cmd_list(store: JobStore, args) -> int:
    print(f"{'id':>5}  {'kind':<10} {'status':<12} {'devices':<8} {'elapsed':>8}  {'created':<19}  error")
    for job in store.list(tuple(args.status) if args.status else None):
        print(f"{job.id:>5}  {job.kind:<10} {job.status:<12} {job.devices or '-':<8} {_seconds(job.elapsed()):>8}  "
              f"{_when(job.created):<19}  {job.error or ''}")
    strays = store.strays()
    if strays:  # on stderr: stdout stays the table
        print(f"{len(strays)} numbered folder(s) in {args.root} are no job of this store and never run (no record "
              f"of a submission, or several folders of one id): {', '.join(strays)}", file=sys.stderr)
    return 0


def cmd_show(store: JobStore, args) -> int:
    job = store.get(args.id)
    for key in ("id", "kind", "status", "gpus", "processes", "executor", "slurm", "slurm_id", "devices", "pid",
                "run_dir", "waits_on", "error"):
        print(f"{key:>10}: {getattr(job, key)}")
    for key in ("created", "started", "finished"):
        print(f"{key:>10}: {_when(getattr(job, key))}")
    print("config:\n" + "\n".join("  " + line for line in job.config.splitlines()))
    read = read_events_checked(Path(job.run_dir) / EVENTS_FILE)
    print("last events:")
    for event in read.events[-5:]:
        print(f"  {event}")
    if read.skipped:
        print(f"  ({len(read.skipped)} line(s) of {EVENTS_FILE} are no event and were skipped: "
              f"{'; '.join(read.skipped[:3])}{'; …' if len(read.skipped) > 3 else ''})")
    if job.status == "failed":
        print("log tail:\n" + failures.log_tail(Path(job.run_dir), 15))
    return 0


def cmd_cancel(store: JobStore, args) -> int:
    job = cancel(store, args.id, grace=args.grace)
    print(f"job {job.id}: {job.status}")
    return 0


def cmd_logs(store: JobStore, args) -> int:
    path = Path(store.get(args.id).run_dir) / failures.LOG_FILE
    offset = 0
    while True:
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            sys.stdout.write(chunk.decode("utf-8", errors="replace"))
            sys.stdout.flush()
        if not args.follow or store.get(args.id).status not in ("queued", "running"):
            return 0
        time.sleep(0.5)


def cmd_clone(store: JobStore, args) -> int:
    print(store.clone(args.id).id)
    return 0


def cmd_resume(store: JobStore, args) -> int:
    print(store.resume(args.id).id)
    return 0


def cmd_move(store: JobStore, args) -> int:
    store.move(args.id, args.offset)
    return 0


def cmd_serve(store: JobStore, args) -> int:
    gpus = [int(g) for g in args.gpus.split(",") if g] if args.gpus is not None else None
    scheduler = Scheduler(store, gpus=gpus, cpu_slots=args.cpu_slots)
    stop = threading.Event()
    # Stopping the server leaves running jobs alone: they are their own sessions and keep going.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"serving {store.path}: GPUs {scheduler.gpus or 'none'}, {args.cpu_slots} CPU slot(s)", flush=True)
    start_in_background(scheduler, stop, interval=args.interval).join()  # a signal sets `stop`, which ends it
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jobs", description="Calibration Lab job queue")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="store and run directories (%(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", help="queue a job config (YAML with `kind`), or every stage of a pipeline file")
    p.add_argument("config")
    p.add_argument("--gpus", type=int, default=0, help="GPUs the job needs (0: a CPU job)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config and print, as JSON, what each model would take per GPU, in host memory "
                        "and on disk, and whether it fits (models not yet downloaded sized from their config.json); "
                        "queue nothing")
    p.add_argument("--gpu-memory", type=float, default=80.0,
                   help="with --dry-run: GiB of one GPU to check the fit against (%(default)s)")
    p.add_argument("--processes", type=int, default=1,
                   help="a CPU training job's data-parallel processes (gloo); a GPU job runs one per GPU")
    p.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="where it runs: this server's scheduler, or a Slurm job that the scheduler submits")
    slurm = p.add_argument_group("Slurm (--executor slurm)")
    slurm.add_argument("--partition")
    slurm.add_argument("--nodes", type=int)
    slurm.add_argument("--gpus-per-node", type=int)
    slurm.add_argument("--time", type=int, help="time limit in minutes")
    slurm.add_argument("--account")
    slurm.add_argument("--sbatch", action="append", help="one more #SBATCH option, as --sbatch=--mem=16G (repeatable)")
    p.set_defaults(fn=cmd_submit)
    p = sub.add_parser("list", help="all jobs, queued first")
    p.add_argument("--status", nargs="+", default=None)
    p.set_defaults(fn=cmd_list)
    for name, fn, text in (("show", cmd_show, "one job: fields, config, last events"),
                           ("clone", cmd_clone, "queue the same config again, in a new run directory"),
                           ("resume", cmd_resume, "queue a failed, cancelled or interrupted job again in its own "
                                                  "run directory: it continues from its last checkpoint")):
        p = sub.add_parser(name, help=text)
        p.add_argument("id", type=int)
        p.set_defaults(fn=fn)
    p = sub.add_parser("cancel", help="stop a job (cooperatively, then its whole process tree)")
    p.add_argument("id", type=int)
    p.add_argument("--grace", type=float, default=10.0, help="seconds per step before escalating")
    p.set_defaults(fn=cmd_cancel)
    p = sub.add_parser("logs", help="a job's log (stdout and stderr)")
    p.add_argument("id", type=int)
    p.add_argument("--follow", "-f", action="store_true")
    p.set_defaults(fn=cmd_logs)
    p = sub.add_parser("move", help="move a queued job OFFSET places towards the front")
    p.add_argument("id", type=int)
    p.add_argument("offset", type=int)
    p.set_defaults(fn=cmd_move)
    p = sub.add_parser("serve", help="run the scheduler until interrupted")
    p.add_argument("--gpus", default=None, help="GPU indices to use, e.g. 0,1 (default: all visible)")
    p.add_argument("--cpu-slots", type=int, default=1)
    p.add_argument("--interval", type=float, default=1.0)
    p.set_defaults(fn=cmd_serve)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    exit_if_unsupported()  # the jobs it submits or serves would fail in the worker otherwise
    args = build_parser().parse_args(argv)
    try:
        store = JobStore(args.root)
    except StoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return args.fn(store, args)
    except (KeyError, ValueError) as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
