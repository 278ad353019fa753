"""lm-eval's task index kept in the lab's cache (lab.data.task_index): built once, read back equal to what
lm-eval builds, built again when what it was read from changes, and a damaged file costs a rebuild, never a
wrong index. On the lab's shipped tasks (about a second to build), through the same path as the ~14,700
installed ones."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lab.data import harness, task_index

pytestmark = pytest.mark.unit


@pytest.fixture
def builds(tmp_path, monkeypatch) -> list[tuple]:
    """The cache in ``tmp_path``, no index kept in this process, and the TaskManagers lm-eval builds (their
    include paths), counted by wrapping its own constructor."""
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("CALIBRATION_LAB_CACHE", str(tmp_path / "cache"))
    task_index.cached_index.cache_clear()
    made: list[tuple] = []
    build = TaskManager.__init__

    def counted(self, *args, **kwargs):
        made.append(tuple(kwargs.get("include_path") or ()))
        build(self, *args, **kwargs)

    monkeypatch.setattr(TaskManager, "__init__", counted)
    yield made
    task_index.cached_index.cache_clear()


def _index(folder: Path):
    folders = (str(folder),)
    return task_index.cached_index(folders, False, harness._stamp(folders))


def _entries(index) -> dict:
    return {name: (entry.kind, str(entry.yaml_path), entry.cfg) for name, entry in index.task_index.items()}


def test_an_index_is_built_once_and_read_back_equal_to_lm_evals(builds, tmp_path):
    from lm_eval.tasks import TaskManager

    first = _index(harness.SHIPPED)
    assert len(builds) == 1 and len(first.all_tasks) >= 60
    task_index.cached_index.cache_clear()  # as a new process: only the file remains
    again = _index(harness.SHIPPED)
    assert len(builds) == 1 and again is not first
    fresh = TaskManager(include_path=[str(harness.SHIPPED)], include_defaults=False)
    assert again.all_tasks == fresh.all_tasks and _entries(again) == _entries(fresh)
    assert [p.name for p in (tmp_path / "cache" / task_index.INDEX_DIR).iterdir() if not p.name.startswith(".")]


def test_an_edited_task_file_makes_another_index(builds, tmp_path):
    folder = tmp_path / "tasks"
    shutil.copytree(harness.SHIPPED, folder)
    assert "bundled_arc_easy" in _index(folder).all_tasks
    config = folder / "bundled_arc_easy.yaml"
    config.write_text(config.read_text(encoding="utf-8").replace("task: bundled_arc_easy", "task: renamed_arc_easy"),
                      encoding="utf-8")
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    task_index.cached_index.cache_clear()
    edited = _index(folder)
    assert len(builds) == 2 and "renamed_arc_easy" in edited.all_tasks and "bundled_arc_easy" not in edited.all_tasks


def test_a_damaged_index_is_built_again(builds, tmp_path):
    right = _entries(_index(harness.SHIPPED))
    [made] = (tmp_path / "cache" / task_index.INDEX_DIR).glob(f"*/{task_index.INDEX_FILE}")
    made.write_bytes(made.read_bytes()[:1000])  # cut short, as by a full disk
    task_index.cached_index.cache_clear()
    assert _entries(_index(harness.SHIPPED)) == right and len(builds) == 2
    task_index.cached_index.cache_clear()
    assert _entries(_index(harness.SHIPPED)) == right and len(builds) == 3  # the damaged one was removed: made anew
    task_index.cached_index.cache_clear()
    assert _entries(_index(harness.SHIPPED)) == right and len(builds) == 3


def test_only_the_last_used_indexes_are_kept_and_lm_evals_own_are_kept_apart(builds, tmp_path, monkeypatch):
    monkeypatch.setitem(task_index.KEEP, False, 3)
    root = tmp_path / "cache" / task_index.INDEX_DIR
    for age, name in enumerate(["full-a", "full-b", "own-c", "own-d", "own-e"]):
        (root / name).mkdir(parents=True)
        (root / f".{name}.lock").touch()
        os.utime(root / name, (1_000_000 + age, 1_000_000 + age))
    _index(harness.SHIPPED)
    [mine] = {p.name for p in root.glob("own-*")} - {"own-c", "own-d", "own-e"}
    assert {p.name for p in root.glob("own-*")} == {"own-d", "own-e", mine} and not (root / ".own-c.lock").exists()
    assert {p.name for p in root.glob("full-*")} == {"full-a", "full-b"}  # older, but lm-eval's own: kept
    os.utime(root / mine, (999_000, 999_000))  # the oldest of all now
    task_index.cached_index.cache_clear()
    _index(harness.SHIPPED)  # read back: the last used
    other = tmp_path / "tasks"
    shutil.copytree(harness.SHIPPED, other)
    _index(other)  # one more: the least recently used goes
    assert {p.name for p in root.glob("own-*")} - {mine, "own-d", "own-e"} and (root / mine).is_dir()
    assert not (root / "own-d").exists() and (root / "own-e").exists() and len(builds) == 2
