"""The app as the browser benches run it: a checkout's ``app.py`` on a runs directory and a free port, its own
process (what a user starts), stopped after; and the Chromium they open it in."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from bench._harness import Timer

CHROMIUM = "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, server: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    waited = Timer()
    while waited.seconds < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the app exited ({server.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the app did not answer at {url} within {timeout:.0f} s")


@contextmanager
def served(app_dir: Path, runs: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``app_dir``'s ``app.py`` serving ``runs`` (its log in ``runs/server.log``): yields its address once it answers,
    and its process; terminated after."""
    port = _free_port()
    log = (runs / "server.log").open("wb")
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--runs", str(runs)], cwd=app_dir,
                              stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_for(url, server, runs / "server.log")
        yield url, server
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
