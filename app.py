"""Calibration Lab web app.

Until the full UI lands this page shows the job queue and the finished evaluation runs (from
``runs/``), what the lab can evaluate, and how to submit work from the command line. The server
runs the job scheduler in a background thread; jobs are processes of their own, so they go on
when the browser closes or the server stops, and the next start reconciles the table with them.

The server listens on 127.0.0.1. Listening on any other address exposes it to a network, so
it then requires a login, given as ``CALIBRATION_LAB_AUTH=user:password``.
"""
from __future__ import annotations

import argparse
import functools
import html
import ipaddress
import json
import os
import sys
import threading
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from jobs.scheduler import Scheduler
from jobs.store import JobStore
from lab.data import dataset_names
from lab.templates import TEMPLATES

RUNS = Path(os.environ.get("CALIBRATION_LAB_RUNS", "runs"))
COLUMNS = ["run", "model", "dataset", "scoring", "n", "accuracy", "ece", "cw_ece", "brier", "nll", "trust"]
JOB_COLUMNS = ["id", "kind", "status", "devices", "elapsed (s)", "error"]
POLL_S = 2.0


def runs_table(root: Path = RUNS) -> pd.DataFrame:
    """One row per run directory under ``root`` that holds a metrics.json, newest first."""
    rows = []
    for path in sorted(root.glob("*/metrics.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            m = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a run being written or a damaged file must not take the page down
        rows.append({"run": path.parent.name, **{k: m.get(k) for k in COLUMNS[1:]}})
    return pd.DataFrame(rows, columns=COLUMNS).round(4)


@functools.lru_cache(maxsize=None)
def _store(root: Path) -> JobStore:
    """One store per root: opening one creates the schema, which a 2-second poll need not repeat."""
    return JobStore(root)


def jobs_table(root: Path = RUNS) -> pd.DataFrame:
    """The job queue, queued first in queue order, then newest first."""
    now = time.time()
    rows = [[j.id, j.kind, j.status, j.devices or "", round((j.finished or now) - j.started) if j.started else None,
             j.error or ""] for j in _store(root).list()]
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def catalogue() -> str:
    templates = "\n".join(
        f"- `{t}` ({TEMPLATES.get(t).kind}): {html.escape(TEMPLATES.get(t).description)}" for t in TEMPLATES
    )
    return f"**Datasets:** {', '.join(f'`{d}`' for d in dataset_names())}\n\n**Templates:**\n{templates}"


def build() -> gr.Blocks:
    with gr.Blocks(title="Calibration Lab") as demo:
        gr.Markdown("# Calibration Lab\nHow accurate is a model, and how honest is its confidence?")
        gr.Markdown(
            "Start an evaluation from a terminal:\n\n"
            "```\npython -m lab evaluate --model bundled --dataset arc_challenge "
            "--data-files path/to/test.jsonl --limit 200 --scoring cloze --out runs/arc-cloze\n```\n"
            "or queue it as a background job that this server runs: `python -m jobs submit config.yaml`."
        )
        jobs = gr.Dataframe(value=jobs_table, label="Jobs", elem_id="jobs-table", interactive=False)
        table = gr.Dataframe(value=runs_table, label="Evaluation runs (runs/)", elem_id="runs-table", interactive=False)
        gr.Timer(POLL_S).tick(lambda: (jobs_table(), runs_table()), outputs=[jobs, table])
        gr.Markdown(catalogue())
    return demo


def _auth(host: str) -> tuple[str, str] | None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    user, sep, password = os.environ.get("CALIBRATION_LAB_AUTH", "").partition(":")
    if not (sep and user and password):
        sys.exit(f"Refusing to listen on {host} without a login: set CALIBRATION_LAB_AUTH=user:password")
    return user, password


def main() -> None:
    parser = argparse.ArgumentParser(description="Calibration Lab web app")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--cpu-slots", type=int, default=1, help="CPU jobs at once when there is no GPU")
    args = parser.parse_args()
    auth = _auth(args.host)
    stop = threading.Event()
    scheduler = Scheduler(_store(RUNS), cpu_slots=args.cpu_slots)
    threading.Thread(target=scheduler.run_forever, args=(stop,), name="scheduler", daemon=True).start()
    try:
        build().launch(server_name=args.host, server_port=args.port, auth=auth)
    finally:
        stop.set()  # running jobs are left running: they are their own sessions


if __name__ == "__main__":
    main()
