"""The inference lane's worker: ``python -m lab.kinds.compare.lane`` answers interactive model calls, models kept warm.

A compare on the user's questions must not wait behind a fine-tuning job, nor load its models
again for every question; and the web server never imports torch. So one long-lived process,
started by the server on demand (:class:`jobs.lane.Lane`), keeps recently used models loaded
(:class:`lab.models.cache.ModelCache`) and answers one request after another.

Protocol: one JSON object per line. A request on stdin is ``{"id", "op", "args"}``; the answers
go out on the stdout the process started with, as ``{"id", "progress": text}`` any number of
times, then ``{"id", "result": {...}}`` or ``{"id", "error": text, "reason": "user" | "memory" |
"internal"}``. Whatever the libraries print goes to stderr (the lane's log), never into the
protocol. The worker exits when stdin closes (its server is gone), or with status 0 after
``--idle`` seconds without a request, freeing the memory its models held.

An operation is a function ``(args, cache, progress) -> result`` in :data:`OPS`: the lane serves
any interactive model call a page needs by adding one.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import select
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional, Sequence

from lab.core.errors import USER_ERRORS

IDLE_S = 600.0  # a lane nobody asked for ten minutes gives its memory back
# What a pre-load asks each model once: the Compare page's example, a few tokens (decoding included)
WARMUP = {"options": ["Oslo", "Helsinki", "Stockholm", "Copenhagen"], "max_new_tokens": 4}
READ_BYTES = 1 << 16

log = logging.getLogger("lab.kinds.compare.lane")
Progress = Callable[[str], None]


def _compare(args: dict[str, Any], cache, progress: Progress) -> dict[str, Any]:
    """``args``: ``config`` (a compare config, already validated by the server) and ``out`` (its folder)."""
    from lab.kinds.compare.config import CompareConfig
    from lab.kinds.compare.run import compare

    cfg = CompareConfig.from_dict(args["config"])
    return compare(cfg, Path(args["out"]), log=progress, cache=cache)


def _held(args: dict[str, Any], cache, progress: Progress) -> dict[str, Any]:
    """What is loaded, least recently used first, and the budget: the page's lane status."""
    return {"device": str(cache.device), "budget": cache.budget, "used": cache.used, "pid": os.getpid(),
            "held": [{"model": e.base, "adapter": e.adapter, "bytes": e.size, "last_used": e.last_used}
                     for e in cache.held()]}


def _preload(args: dict[str, Any], cache, progress: Progress) -> dict[str, Any]:
    """``args``: ``models`` ([{model, adapter}], validated by the server). Loads each within the
    budget, as a compare would, and asks it one throwaway question: a model's first forward pass costs
    seconds more than the next ones (its weights paged in, the CPU kernels set up), which the first
    compare should not pay either. Returns what is held, as ``held`` does."""
    from lab.kinds.compare.config import CompareConfig
    from lab.kinds.compare.run import compare

    with tempfile.TemporaryDirectory(prefix="lane-preload-") as out:
        for n, entry in enumerate(args["models"]):
            name = entry["model"] + (f" + {Path(entry['adapter']).name}" if entry.get("adapter") else "")
            progress(f"loading {name}")
            cfg = CompareConfig.from_dict({**WARMUP, "models": [entry]})
            compare(cfg, Path(out) / str(n), log=lambda text: None, cache=cache)
    return _held(args, cache, progress)


OPS: dict[str, Callable[[dict[str, Any], Any, Progress], dict[str, Any]]] = {
    "compare": _compare, "held": _held, "preload": _preload}


def _reason(error: BaseException) -> str:
    import torch

    from lab.models.cache import DoesNotFit

    if isinstance(error, (DoesNotFit, MemoryError, torch.OutOfMemoryError)):
        return "memory"
    return "user" if isinstance(error, USER_ERRORS) else "internal"


class Channel:
    """The protocol's end in the worker: its own copy of the stdout it started with."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out

    def send(self, message: dict[str, Any]) -> None:
        self._out.write(json.dumps(message).encode() + b"\n")
        self._out.flush()


def handle(line: bytes, cache, channel: Channel) -> None:
    """Answer one request line; nothing a request does stops the worker."""
    try:
        request = json.loads(line)
        rid, op, args = request["id"], request["op"], request.get("args") or {}
    except (ValueError, KeyError, TypeError):
        log.error("unreadable request %r", line[:200])
        return
    if op not in OPS:
        channel.send({"id": rid, "error": f"unknown operation {op!r}", "reason": "internal"})
        return
    start = time.time()
    try:
        result = OPS[op](args, cache, lambda text: channel.send({"id": rid, "progress": text}))
    except Exception as e:  # noqa: BLE001 -- one request's failure, reported to it; the lane goes on
        reason = _reason(e)
        if reason == "internal":
            log.error("request %s (%s) failed:\n%s", rid, op, traceback.format_exc())
            text = f"internal error ({type(e).__name__}: {e}); the traceback is in the lane's log"
        else:
            text = str(e)
        channel.send({"id": rid, "error": text, "reason": reason})
        return
    log.info("request %s (%s) answered in %.2f s", rid, op, time.time() - start)
    channel.send({"id": rid, "result": result})


def serve(cache, channel: Channel, stdin_fd: int, idle_s: float) -> int:
    """Answer requests until stdin closes (0) or none came for ``idle_s`` seconds (0)."""
    buffer = b""
    while True:
        while b"\n" not in buffer:
            ready, _, _ = select.select([stdin_fd], [], [], idle_s)
            if not ready:
                log.info("idle for %.0f s: exiting", idle_s)
                return 0
            chunk = os.read(stdin_fd, READ_BYTES)
            if not chunk:
                log.info("the server closed the lane: exiting")
                return 0
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        if line.strip():
            handle(line, cache, channel)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kinds.compare.lane", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--budget", type=float, default=None, help="GiB of models to keep loaded (default: "
                        "a quarter of the RAM on the CPU, half the GPU)")
    parser.add_argument("--idle", type=float, default=IDLE_S, help="exit after this many seconds without a request")
    args = parser.parse_args(argv)
    # The protocol keeps the stdout we were given; fd 1 becomes stderr, so that what torch,
    # transformers or a print() writes lands in the log and never in the middle of an answer.
    channel = Channel(os.fdopen(os.dup(sys.stdout.fileno()), "wb"))
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    import transformers

    from lab.models.cache import ModelCache
    from lab.models.weights import GIB

    transformers.utils.logging.disable_progress_bar()
    try:
        cache = ModelCache(args.device, args.dtype, None if args.budget is None else int(args.budget * GIB))
    except USER_ERRORS as e:
        channel.send({"id": None, "error": str(e), "reason": "user"})
        return 2
    log.info("lane ready on %s (pid %d), budget %.2f GiB", cache.device, os.getpid(), cache.budget / GIB)
    channel.send({"id": None, "ready": {"device": str(cache.device), "budget": cache.budget, "pid": os.getpid()}})
    return serve(cache, channel, sys.stdin.fileno(), args.idle)


if __name__ == "__main__":
    sys.exit(main())
