"""The start-up version check (lab/versions.py) and the lowest-versions pins it is tested against."""
import runpy
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from lab import versions

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMERS_NEEDED = "transformers>=5.21,<6"


def _installed(**fake: str):
    """importlib.metadata.version with some packages' versions replaced ("" = not installed)."""
    def lookup(name: str) -> str:
        if name not in fake:
            return version(name)
        if not fake[name]:
            raise PackageNotFoundError(name)
        return fake[name]
    return lookup


def test_this_environment_meets_every_requirement():
    assert versions.problems() == []


def test_an_old_transformers_is_named_with_the_version_needed(monkeypatch):
    """Issue 31: transformers 5.17 ended every cloze evaluation in an IndexError mid-job."""
    monkeypatch.setattr(versions, "version", _installed(transformers="5.17.0"))
    assert versions.problems() == [f"transformers 5.17.0 is installed; the lab needs {TRANSFORMERS_NEEDED} "
                                   f"(pip install -U '{TRANSFORMERS_NEEDED}')"]


def test_too_new_missing_and_prerelease(monkeypatch):
    monkeypatch.setattr(versions, "version", _installed(transformers="6.0.0", peft="", accelerate="1.16.0.dev0"))
    assert versions.problems() == [
        f"transformers 6.0.0 is installed; the lab needs {TRANSFORMERS_NEEDED} (pip install -U '{TRANSFORMERS_NEEDED}')",
        "peft is not installed; the lab needs peft>=0.18 (pip install -U 'peft>=0.18')",
    ]  # a source build of a newer accelerate passes


def test_entry_points_refuse_with_one_line_and_exit_2(monkeypatch, capsys):
    """``python -m lab`` (every job's worker), ``python -m jobs`` and ``app.py`` exit 2 with one line."""
    from jobs.cli import main as jobs_main

    monkeypatch.setattr(versions, "version", _installed(transformers="5.17.0"))
    monkeypatch.setattr(sys, "argv", ["lab", "kinds"])
    for start in (lambda: runpy.run_module("lab", run_name="__main__"), lambda: jobs_main(["list"]),
                  lambda: runpy.run_path(str(ROOT / "app.py"), run_name="not_main")):
        with pytest.raises(SystemExit) as stop:
            start()
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err == f"error: transformers 5.17.0 is installed; the lab needs {TRANSFORMERS_NEEDED} " \
                      f"(pip install -U '{TRANSFORMERS_NEEDED}')\n"


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for req, text in versions.requirements(path):
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", f"{path.name}: {text} is not one exact pin"
        pins[req.name.lower()] = Version(spec[0].version)
    return pins


def test_requirements_min_pins_every_lower_bound():
    """requirements-min.txt is what CI's lowest-versions check installs (``make test-min``): it must pin
    each runtime and test requirement at exactly its declared lower bound, so that every lower bound
    is one the scoring and training tests have passed with."""
    pins = _pins(ROOT / "requirements-min.txt")
    wanted = {}
    for name in ("requirements.txt", "requirements-test.txt"):
        for req, text in versions.requirements(ROOT / name):
            lower = [s.version for s in req.specifier if s.operator == ">="]
            assert len(lower) == 1, f"{name}: {text} declares no single lower bound (>=)"
            wanted[req.name.lower()] = Version(lower[0])
    assert pins == wanted


def test_requirement_lines_are_read_as_written(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("# a comment\n\ntransformers>=5.21,<6  # why\nnumpy>=2.0\n", encoding="utf-8")
    assert [(str(r), t) for r, t in versions.requirements(path)] == [
        (str(Requirement("transformers>=5.21,<6")), "transformers>=5.21,<6"), ("numpy>=2.0", "numpy>=2.0")]
    assert versions.problems(tmp_path / "absent.txt") == []


def test_the_worker_does_not_ask_for_the_web_pages_requirements(tmp_path):
    """``python -m lab`` (every job's worker) imports nothing of the UI: a GPU node without gradio or plotly runs
    jobs; the app and ``python -m jobs`` still refuse them."""
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("gradio>=999\nplotly>=999\npackaging>=1\n")
    assert versions.problems(reqs, ui=False) == []
    assert [line.split()[0] for line in versions.problems(reqs)] == ["gradio", "plotly"]
    main = Path(versions.__file__).with_name("__main__.py").read_text()
    assert "exit_if_unsupported(ui=False)" in main
