"""How long a clean clone takes to build both virtualenvs: one after the other, and at once as `.ci/run` builds them.

    python -m bench.setup_time [--out FILE]

Clones this checkout's HEAD twice into a temporary folder and runs, in each, with an empty HOME and no
``CALIBRATION_LAB_CACHE`` (as CI does): ``make setup-test setup-min`` (one after the other), then
``make -j2 setup-test setup-min`` (both at once, `.ci/run`'s first step). pip installs and byte-compiles on one core
each, so on two cores the two virtualenvs overlap. Wall seconds of each, and their ratio. Needs what the Makefile
needs (python3, make, PyPI or pip's configured wheels); each build takes a minute or more.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from bench._harness import REPO, RESULTS, Timer, Transcript, parser, write_result

MODES = {"one after the other": ["make", "setup-test", "setup-min"],
         "at once (.ci/run)": ["make", "-j2", "setup-test", "setup-min"]}


def build(command: list[str], folder: Path) -> float:
    """Seconds ``command`` takes in a fresh clone of HEAD under ``folder``, with an empty HOME."""
    clone, home = folder / "clone", folder / "home"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "CALIBRATION_LAB_CACHE"}
    timer = Timer()
    done = subprocess.run(command, cwd=clone, env={**env, "HOME": str(home)}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return timer.seconds


def main() -> None:
    args = parser(__doc__, out=RESULTS / "setup_time_cpu.txt").parse_args()
    report = Transcript()
    report.print("both virtualenvs from a clean clone (.venv with the test extras, .venv-min), wall seconds:")
    took = {}
    for name, command in MODES.items():
        with tempfile.TemporaryDirectory(prefix="setup-time-") as folder:
            took[name] = build(command, Path(folder))
        report.print(f"  {name:<22} {' '.join(command):<36} {took[name]:6.1f} s")
    first, last = took.values()
    report.print(f"  at once / one after the other: {last / first:.2f}×")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
