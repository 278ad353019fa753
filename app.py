"""Calibration Lab web app: ``python app.py [--host H] [--port P] [--auth user:pass] [--allow-path DIR]``.

The server runs the job scheduler in a background thread, started anew should it ever end; jobs are processes of their own, so
they go on when the browser closes or the server stops, and the next start reconciles the
table with them. The compare page's models run in the inference lane (:mod:`jobs.lane`), a worker
the server starts on demand and stops with itself. Pages live in ``ui/``; this file only reads the
command line and serves them.

It listens on 127.0.0.1. Any other address exposes it to a network, so it then requires a
login (``--auth user:pass`` or ``CALIBRATION_LAB_AUTH=user:pass``) and refuses to start
without one. Configs submitted from the browser may only name files under the runs directory
(uploads included), the model cache and the folders given with ``--allow-path``; an lm-eval include
folder (task YAMLs, which may run Python) only from those given with ``--trust-tasks``.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import threading
from pathlib import Path
from typing import Optional

from lab.versions import exit_if_unsupported

exit_if_unsupported()  # before gradio and the pages load: an unsupported release refused in one line
from jobs.scheduler import Scheduler, start_in_background
from jobs.store import StoreError
from lab.data.harness import TRUSTED_ENV
from lab.training.config import TRACKERS_ONLINE_ENV
from ui.app import build
from ui.context import LabContext, LaneOptions
from ui.messages import CSS
from ui.uploads import MAX_BYTES

RUNS = Path(os.environ.get("CALIBRATION_LAB_RUNS", "runs"))


def resolve_auth(host: str, auth: Optional[str]) -> tuple[str, str] | None:
    """No login on loopback (unless one is given); a required one anywhere else."""
    text = auth if auth is not None else os.environ.get("CALIBRATION_LAB_AUTH", "")
    user, sep, password = text.partition(":")
    if sep and user and password:
        return user, password
    if text:
        sys.exit("--auth / CALIBRATION_LAB_AUTH must look like user:password")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        sys.exit(f"Refusing to listen on {host} without a login: pass --auth user:password "
                 "(or set CALIBRATION_LAB_AUTH=user:password)")
    return None


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Calibration Lab web app")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--auth", default=None, help="user:password login (required off loopback)")
    parser.add_argument("--allow-path", action="append", default=[], type=Path,
                        help="a folder browser-submitted jobs may read data from (repeatable)")
    parser.add_argument("--trust-tasks", action="append", default=[], type=Path,
                        help="a folder of lm-eval task YAMLs browser-submitted jobs may use as lm_eval_include "
                             "(repeatable; it must also be an --allow-path folder). Such a folder is code: its "
                             "YAMLs' !function runs Python, so name only folders whose files you trust")
    parser.add_argument("--runs", type=Path, default=RUNS, help="where jobs and their results live (default: runs/)")
    parser.add_argument("--cpu-slots", type=int, default=1, help="CPU jobs at once when there is no GPU")
    parser.add_argument("--executor", choices=("local", "slurm"), default="local",
                        help="where the Launch form sends jobs by default: this server's scheduler, or Slurm "
                             "(the scheduler submits them with sbatch; runs/ must be on a file system the nodes share)")
    parser.add_argument("--lane-device", default="auto", help="where the compare page's models run: cpu, cuda:N, "
                        "or auto (the first GPU if there is one, else the CPU)")
    parser.add_argument("--lane-memory", type=float, default=None, help="GiB of models the compare lane keeps "
                        "loaded (default: a quarter of the RAM on the CPU, half of its GPU)")
    parser.add_argument("--lane-idle", type=float, default=600.0, help="seconds without a compare before the lane "
                        "exits and frees its memory")
    # "open" by default: opening the Compare page says a compare is coming, and typing the question
    # takes longer than the lane's warm-up; at the server's start it would hold a model's memory (on
    # a GPU, beside training) for a page nobody may open, and give it back unused after --lane-idle.
    parser.add_argument("--lane-preload", choices=("open", "start", "off"), default="open",
                        help="when the lane loads the Compare form's models before the first compare: when the "
                             "page opens (default), also when the server starts, or never (the first compare "
                             "waits for them)")
    parser.add_argument("--trackers-online", action="store_true",
                        help="let a job's report_to tracker send it online (W&B under the account this server is "
                             "logged in to, the MLflow server of MLFLOW_TRACKING_URI); by default trackers write only "
                             f"into the run's folder, offline, telemetry off (or set {TRACKERS_ONLINE_ENV}=1)")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    auth = resolve_auth(args.host, args.auth)
    if args.trackers_online:  # the scheduler's workers inherit it
        os.environ[TRACKERS_ONLINE_ENV] = "1"
    if args.trust_tasks:  # ... and this
        os.environ[TRUSTED_ENV] = os.pathsep.join(str(p.resolve()) for p in args.trust_tasks)
    lane = LaneOptions(args.lane_device, args.lane_memory, args.lane_idle, args.lane_preload)
    ctx = LabContext(args.runs, tuple(p for p in args.allow_path if p.is_dir()), lane, executor=args.executor)
    ctx.exports.mkdir(parents=True, exist_ok=True)
    try:
        ctx.store  # opened now: a store SQLite cannot read stops the server with what to do, not a traceback
    except StoreError as e:
        sys.exit(f"error: {e}")
    stop = threading.Event()
    start_in_background(Scheduler(ctx.store, cpu_slots=args.cpu_slots), stop)
    try:
        # Gradio serves only its own uploads and what handlers return from allowed_paths: here the
        # CSV/HTML exports the Results and Reliability pages write, and nothing else of runs/.
        build(ctx).launch(server_name=args.host, server_port=args.port, auth=auth, css=CSS,
                          max_file_size=MAX_BYTES, footer_links=["api"], allowed_paths=[str(ctx.exports)])
    finally:
        stop.set()  # running jobs are left running: they are their own sessions
        ctx.lane.stop()  # the compare lane is the server's: its models go with it


if __name__ == "__main__":
    main()
