"""The benches' shared harness (bench._harness): a results file starts with the command and the machine that
produced it, a bench's printed lines are the lines it writes, and every bench runs as ``python -m bench.NAME``
with its options from the one parser, no ``sys.path`` edit and no other parser of its own."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _harness
from bench._harness import Only, Timer, Transcript, parser, write_result

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
BENCHES = sorted(p for p in (REPO / "bench").glob("*.py") if p.name != "__init__.py")


def test_a_text_results_file_starts_with_the_command_and_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench/kd_step.py", "--repeats", "5", "--out", "a b.txt"])
    path = tmp_path / "kd_step_cpu.txt"
    write_result(path, ["line one", "line two"])
    head, *rest = path.read_text().splitlines()
    assert re.fullmatch(r"# python (-m )?\S+ --repeats 5 --out 'a b\.txt' — \d{4}-\d\d-\d\d \d\d:\d\d; .+, \d+ cores; "
                        r"torch \S+, transformers \S+", head), head
    assert rest == ["line one", "line two"]


def test_a_markdown_results_file_keeps_its_title_after_the_command_in_backticks(tmp_path):
    path = tmp_path / "sub" / "x.md"
    write_result(path, ["# Title", "", "body"])
    lines = path.read_text().splitlines()
    assert lines[0].startswith("`python ") and "` — " in lines[0] and lines[1:] == ["", "# Title", "", "body"]


def test_an_appended_results_file_keeps_what_earlier_sessions_wrote(tmp_path):
    path = tmp_path / "presets_cpu.txt"
    write_result(path, ["first session"])
    earlier = path.read_text()
    write_result(path, ["second session"], kept=earlier)
    lines = path.read_text().splitlines()
    assert lines[:2] == earlier.splitlines() and lines[2].startswith("# python ") and lines[3] == "second session"


def test_a_transcript_prints_what_it_keeps(capsys):
    report = Transcript()
    report.print("a", "b\nc")
    assert capsys.readouterr().out == "a\nb\nc\n" and report.lines == ["a", "b\nc"]


def test_the_shared_options_are_offered_only_where_asked():
    bare = parser("A bench.\n\nMore.").parse_args([])
    assert vars(bare) == {}
    full = parser("A bench.", out=Path("/tmp/x.txt"), seeds=3, only=Only("SEED", "these seeds", int))
    args = full.parse_args(["--only", "1", "2"])
    assert args.out == Path("/tmp/x.txt") and args.seeds == 3 and args.only == [1, 2]
    assert full.description == "A bench."


def test_the_timer_counts_perf_counter_seconds(monkeypatch):
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(_harness.time, "perf_counter", lambda: next(clock))
    assert Timer().seconds == 2.5


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.stem)
def test_a_bench_imports_as_a_package_module_and_builds_no_parser_of_its_own(path):
    text = path.read_text()
    assert "sys.path" not in text, f"{path.name} edits sys.path: run it as python -m bench.{path.stem}"
    if path.name != "_harness.py":
        assert "ArgumentParser(" not in text, f"{path.name} builds its own parser instead of bench._harness.parser"
    assert "python bench/" not in text and "python3 bench/" not in text, f"{path.name} shows an old command"


def test_a_bench_starts_as_a_module_from_the_checkout():
    run = subprocess.run([sys.executable, "-m", "bench.submit_bounds", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("usage: python -m bench.submit_bounds"), run.stderr
