"""Refuse to start on dependency releases outside the range the lab is tested with.

An environment the lab did not set up (a GPU image, a cluster module, an older venv) may hold a
release that imports fine and then fails deep inside a job: with transformers 5.17, cloze
evaluations, FIRST and CFT ended in an ``IndexError`` after the model had loaded (issue 31). So
the entry points (``python -m lab``, which every job's worker is, ``python -m jobs`` and
``app.py``) call :func:`exit_if_unsupported` before importing anything heavy, and stop with one
line per package: the release found and the range needed, with the pip command that fixes it, and
exit code 2.

The ranges are read from ``requirements.txt`` beside the lab, the file ``make setup`` installs, so
they are declared in one place; ``requirements-min.txt`` pins every lower bound, and CI runs the
model-facing tests against it (``make test-min``), so each lower bound is one they passed with.
Only the standard library and ``packaging`` (which transformers itself depends on) are imported
here: the check must run where the packages it checks would fail to import.
"""
from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"
USAGE_ERROR = 2  # the exit code of every refusal at start (see lab.cli)
# What only the web pages import (ui/, app.py): ``python -m lab``, the command line and every job's worker, needs
# none of it, so a GPU node or image with the training stack alone runs jobs without installing a web framework.
UI_ONLY = frozenset({"gradio", "plotly"})


def requirements(path: Path = REQUIREMENTS) -> list[tuple[Requirement, str]]:
    """Each requirement in ``path`` with its text as written (``transformers>=5.0,<6``): packaging
    reorders specifiers when printing one, and the message should quote the file."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            found.append((Requirement(text), text))
    return found


def problems(path: Path = REQUIREMENTS, ui: bool = True) -> list[str]:
    """One line per requirement the environment does not meet; none when all hold. ``ui``: the web pages'
    own requirements (:data:`UI_ONLY`) count too.

    Pre-releases count by their number (a ``5.25.0.dev0`` meets ``>=5.0``): a source build of a
    newer release is what a user testing a fix would have. A lab copied without its
    ``requirements.txt`` has nothing to check against, and checks nothing.
    """
    if not path.is_file():
        return []
    lines = []
    for req, text in requirements(path):
        if not ui and req.name in UI_ONLY:
            continue
        fix = f"pip install -U '{text}'"
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            lines.append(f"{req.name} is not installed; the lab needs {text} ({fix})")
            continue
        if not req.specifier.contains(Version(installed), prereleases=True):
            lines.append(f"{req.name} {installed} is installed; the lab needs {text} ({fix})")
    return lines


def exit_if_unsupported(ui: bool = True) -> None:
    """Print each unmet requirement on stderr and exit 2; return quietly when every one holds. ``ui``: as
    :func:`problems` takes it (``python -m lab`` passes False: it imports nothing of the web pages)."""
    lines = problems(ui=ui)
    if lines:
        print("\n".join(f"error: {line}" for line in lines), file=sys.stderr)
        sys.exit(USAGE_ERROR)
