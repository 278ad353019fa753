"""The server's handle on the inference lane: one worker process beside the training queue.

Interactive model calls (a compare on the user's questions) go to a long-lived worker
(:mod:`lab.kinds.compare.lane`) that keeps models loaded, instead of queueing as jobs behind training for the
only slot and loading their models every time. The web server stays free of torch: it starts the
worker on the first request, talks to it over pipes (JSON lines, requests told apart by id, so
two tabs asking at once each get their own answer), and lets it exit when idle. If the worker
dies (killed, out of memory), the requests it was answering fail with the reason and the next one
starts a new worker and says so.

A cold compare pays for the worker's start (torch imported), the models' load and their first
forward pass, seconds each; a warm one only for its questions. :meth:`Lane.preload` pays the cold
part in the background, when the Compare page opens, so that the user's first compare is a warm
one; the page reads the pre-load's progress (:class:`Warmup`) to say it is still warming.

On a machine with GPUs the operator picks the lane's device (``--lane-device cuda:1`` gives it
GPU 1 alone; ``cpu`` keeps it off the GPUs) and its memory budget (``--lane-memory`` GiB).
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Optional

from lab.core.files import write_atomic

STARTUP_S = 120.0  # importing torch and transformers on a loaded machine
REQUEST_S = 3600.0  # a hundred questions on four large models on a CPU
LOG_NAME = "lane.log"
WARMUPS_NAME = "warmups.json"  # how long the last pre-load of each set of models took: the page's "about N s"


class LaneError(RuntimeError):
    """A request the lane could not answer; ``reason`` is ``user``, ``memory``, ``internal`` or ``died``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Reply:
    """A request's result, and what the user should know about the lane (it was restarted)."""

    result: dict[str, Any]
    notice: Optional[str] = None


@dataclass
class Warmup:
    """A pre-load of the lane (:meth:`Lane.preload`): its worker started and ``models`` loaded before
    anyone asked. Its thread fills it in as it goes; readers only read."""

    models: tuple[str, ...]  # as the page names them: "bundled", "base + adapter"
    started: float  # time.time()
    expected_s: Optional[float]  # how long the last pre-load of these models took here; None: never measured
    stage: str = "starting the lane"  # the latest news: "loading bundled"
    error: Optional[str] = None  # why it failed, if it did
    pid: Optional[int] = None  # the worker it warmed, once it has
    seconds: Optional[float] = None  # how long it took, once it is over (failed or not)

    @property
    def done(self) -> bool:
        return self.seconds is not None


def model_name(entry: dict[str, Any]) -> str:
    """A compare config's model entry as the page names it: the model, with its adapter's folder name."""
    adapter = entry.get("adapter")
    return f"{entry['model']} + {Path(adapter).name}" if adapter else str(entry["model"])


def describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class Lane:
    """Starts, feeds and restarts the lane's worker. Thread-safe: every page handler may call."""

    def __init__(self, home: Path, device: str = "auto", memory_gb: Optional[float] = None,
                 idle_s: float = 600.0, python: str = sys.executable) -> None:
        self.home = Path(home)
        self.device, self.memory_gb, self.idle_s, self.python = device, memory_gb, idle_s, python
        self._lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None
        self._waiting: dict[str, tuple[queue.Queue, subprocess.Popen]] = {}  # by request id
        self._ids = itertools.count(1)
        self._ready: Optional[dict[str, Any]] = None
        self._lost: Optional[str] = None  # why the last worker ended, if it died: told with the next answer
        # Starting a worker takes seconds (torch imports): one start at a time, under its own lock,
        # so that pid, last_status and preload never wait for it.
        self._start_lock = threading.Lock()
        self._seen: Optional[dict[str, Any]] = None  # the worker's last answer to "held"
        self._warmup: Optional[Warmup] = None

    @property
    def log_path(self) -> Path:
        return self.home / LOG_NAME

    # ------------------------------------------------------------ the worker process
    def _command(self) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        # The lane runs beside training jobs on the same cores. OpenMP's threads spin while they wait
        # for each other, and a spinning thread whose partner was descheduled burns its time slice.
        # A warm compare of the bundled model (one question) on this project's 2-core machine took
        # 0.24-0.30 s spinning and 0.35-0.48 s waiting passively with nothing else running, but
        # 0.3-6.5 s spinning and 0.42-0.59 s passively beside other busy processes: passive, for an
        # answer that does not depend on what else runs. An operator's own setting is kept.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        device = self.device
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"], device = device.partition(":")[2], "cuda"
        command = [self.python, "-m", "lab.kinds.compare.lane", "--device", device, "--idle", str(self.idle_s)]
        if self.memory_gb is not None:
            command += ["--budget", str(self.memory_gb)]
        return command, env

    def _start(self) -> subprocess.Popen:
        self.home.mkdir(parents=True, exist_ok=True)
        command, env = self._command()
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                    cwd=Path(__file__).resolve().parent.parent, start_new_session=True)
        ready: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(proc, ready), daemon=True, name="lane-reader").start()
        try:
            message = ready.get(timeout=STARTUP_S)
        except queue.Empty:
            proc.kill()
            raise LaneError(f"The inference lane did not start within {STARTUP_S:.0f} s; see {self.log_path}.",
                            "died") from None
        if "ready" not in message:
            proc.wait(timeout=10)
            raise LaneError(f"The inference lane could not start: {message.get('error') or describe_exit(proc.returncode)}"
                            f" (log: {self.log_path}).", message.get("reason", "died"))
        self._ready = message["ready"]
        return proc

    def _read(self, proc: subprocess.Popen, ready: queue.Queue) -> None:
        """Route each line the worker writes to the request it answers, until the worker ends."""
        stream: IO[bytes] = proc.stdout
        for line in stream:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            rid = message.get("id")
            if rid is None:
                ready.put(message)
                continue
            with self._lock:
                waiting = self._waiting.get(rid)
            if waiting is not None:
                waiting[0].put(message)
        code = proc.wait()
        ready.put({"error": describe_exit(code)})
        with self._lock:
            if self._proc is proc:
                self._proc = None
                if code != 0:
                    self._lost = f"The inference lane {describe_exit(code)}"
            orphans = [inbox for inbox, asked in self._waiting.values() if asked is proc]
        for inbox in orphans:
            inbox.put({"died": describe_exit(code)})

    def _ensure(self) -> Optional[str]:
        """A running worker; returns the notice to give when this had to replace a dead one."""
        with self._start_lock:
            with self._lock:
                proc = self._proc
                if proc is not None and proc.poll() is None:
                    return None
                lost, self._lost = self._lost, None
                if proc is not None and proc.returncode != 0:  # dead before its reader noticed
                    lost = f"The inference lane {describe_exit(proc.returncode)}"
            started = self._start()
            with self._lock:
                self._proc = started
        return f"{lost}; a new one was started, so its models were loaded again." if lost else None

    # ------------------------------------------------------------ requests
    def call(self, op: str, args: dict[str, Any], progress: Optional[Callable[[str], None]] = None,
             timeout: float = REQUEST_S) -> Reply:
        """Send one request and wait for its answer; ``progress(text)`` hears the lane's news meanwhile."""
        notice = self._ensure()
        rid = f"{os.getpid()}-{next(self._ids)}"
        inbox: queue.Queue = queue.Queue()
        try:
            with self._lock:
                proc = self._proc
                self._waiting[rid] = (inbox, proc)
                try:
                    proc.stdin.write(json.dumps({"id": rid, "op": op, "args": args}).encode() + b"\n")
                    proc.stdin.flush()
                except (BrokenPipeError, OSError, AttributeError):
                    proc = None
            if proc is None:
                raise LaneError("The inference lane ended as the request was sent; try again (a new one will start).",
                                "died")
            deadline = time.monotonic() + timeout
            while True:
                try:
                    message = inbox.get(timeout=max(deadline - time.monotonic(), 0.001))
                except queue.Empty:
                    raise LaneError(f"The inference lane gave no answer within {timeout:.0f} s; see {self.log_path}.",
                                    "died") from None
                if "progress" in message and progress is not None:
                    progress(message["progress"])
                elif "result" in message:
                    return Reply(message["result"], notice)
                elif "error" in message:
                    raise LaneError(message["error"], message.get("reason", "internal"))
                elif "died" in message:
                    with self._lock:
                        self._lost = None  # told now, with this failure
                    raise LaneError(f"The inference lane {message['died']} while answering; nothing was lost but "
                                    f"this answer. Try again: a new lane starts (log: {self.log_path}).", "died")
        finally:
            with self._lock:
                self._waiting.pop(rid, None)

    def status(self) -> dict[str, Any]:
        """Whether the worker runs, and (when it does) what it holds; never starts one. Asking is a
        request, which the worker's idle timeout counts: a poll must read :meth:`last_status`."""
        with self._lock:
            running = self._proc is not None and self._proc.poll() is None
        if not running:
            return {"running": False}
        try:
            held = self.call("held", {}, timeout=10).result
        except LaneError:
            return {"running": False}
        self._seen = held
        return {"running": True, **held}

    def last_status(self) -> dict[str, Any]:
        """:meth:`status` without asking the worker: whether it runs, and what it last said it holds
        (no ``held`` when that was another worker, or nothing was asked yet)."""
        with self._lock:
            proc, ready, seen = self._proc, self._ready, self._seen
        if proc is None or proc.poll() is not None:
            return {"running": False}
        if seen is not None and seen.get("pid") == proc.pid:
            return {"running": True, **seen}
        return {"running": True, **(ready or {}), "pid": proc.pid}

    # ------------------------------------------------------------ pre-load
    @property
    def warmup(self) -> Optional[Warmup]:
        """The last pre-load, under way or over; None if there was none."""
        return self._warmup

    def preload(self, models: list[dict[str, Any]]) -> Optional[Warmup]:
        """Start the worker and load ``models`` (compare entries: ``model``, ``adapter``) in the
        background, and return at once: the pre-load started, or None when there is nothing to warm
        (a worker runs, or is starting: it is warm, and holds what was last compared) or one is under
        way. The worker loads them within its budget, as a compare would, and its idle timeout counts
        from the pre-load's end as from any request's: a pre-load nobody uses is given back."""
        names = tuple(model_name(m) for m in models)
        expected = self._warmups().get(", ".join(names))
        with self._lock:
            if not names or (self._warmup is not None and not self._warmup.done) or self._start_lock.locked() \
                    or (self._proc is not None and self._proc.poll() is None):
                return None
            warmup = self._warmup = Warmup(names, time.time(), expected)
        threading.Thread(target=self._preload, args=(warmup, models), daemon=True, name="lane-preload").start()
        return warmup

    def _preload(self, warmup: Warmup, models: list[dict[str, Any]]) -> None:
        start = time.monotonic()
        try:
            held = self.call("preload", {"models": models}, progress=lambda text: setattr(warmup, "stage", text)).result
        except LaneError as e:
            warmup.error = str(e)
        else:
            self._seen, warmup.pid = held, held["pid"]
            self._remember(", ".join(warmup.models), time.monotonic() - start)
        warmup.seconds = time.monotonic() - start  # last: it marks the pre-load as over

    def _warmups(self) -> dict[str, float]:
        """Seconds the last pre-load of each set of models took, by their names (kept across restarts)."""
        try:
            found = json.loads((self.home / WARMUPS_NAME).read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _remember(self, key: str, seconds: float) -> None:
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            write_atomic(self.home / WARMUPS_NAME, json.dumps({**self._warmups(), key: round(seconds, 1)}, indent=1))
        except OSError:  # only the next estimate is lost
            pass

    @property
    def pid(self) -> Optional[int]:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def stop(self, grace: float = 10.0) -> None:
        """End the worker: closing its stdin asks it to exit; a kill follows after ``grace`` seconds.
        A worker being started (a pre-load's) is waited for, then ended, never left behind."""
        with self._start_lock, self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=grace)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
