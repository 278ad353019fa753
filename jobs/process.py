"""Worker processes: is this pid still our job, stopping a whole process tree, and reaping our own.

A job is its own session (process group), so one signal reaches every process it started; we
also walk psutil's child list, because a child may have started a session of its own (as
``accelerate launch`` ranks and data-loader workers can).
"""
from __future__ import annotations

import os
import signal
from typing import Optional

import psutil


def _started_at(proc: psutil.Process, started: Optional[float]) -> bool:
    """Whether ``proc`` is the process created at ``started`` (a pid may be reused by another)."""
    return started is None or abs(proc.create_time() - started) <= 1e-3


def job_process(pid: Optional[int], started: Optional[float]) -> Optional[psutil.Process]:
    """The live process ``pid`` if it is the one we started (same create time), else None."""
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        if not _started_at(proc, started):
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def reap(pid: Optional[int], started: Optional[float]) -> None:
    """Collect the exit status of ``pid`` if it is this process's child and has ended, so it leaves
    no ``<defunct>`` entry behind; a live process, or anyone else's, is left alone. A ``Popen``
    still holding it then reads exit code 0 (``ECHILD``), so reap only once the job's end is being
    recorded without its exit code (as ``cancel`` does)."""
    if pid is None:
        return
    try:
        proc = psutil.Process(pid)
        ours = proc.ppid() == os.getpid() and _started_at(proc, started)
    except psutil.Error:
        return
    if ours:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # reaped meanwhile, by its Popen or by psutil's wait


def process_tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def terminate_tree(proc: psutil.Process, grace: float) -> list[psutil.Process]:
    """SIGTERM the tree, wait ``grace`` seconds, SIGKILL what is left; returns survivors (none, normally)."""
    tree = process_tree(proc)
    _signal_all(tree, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace)
    if alive:
        _signal_all(alive, signal.SIGKILL)
        _, alive = psutil.wait_procs(alive, timeout=grace)
    return alive


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass  # already gone
