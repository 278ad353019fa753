"""lab.core.files: a folder made once, however many processes ask for it first at the same time; the stamp a cache of
files is keyed by."""
import os
import threading
import time
from pathlib import Path

import pytest

from lab.core.files import files_stamp, make_folder_once

pytestmark = pytest.mark.unit


def test_first_uses_at_once_make_the_folder_once_and_all_get_it(tmp_path):
    """The bundled model's conversion (30 s) ran once per parallel test worker on a fresh machine."""
    calls = []

    def make(folder: Path) -> None:
        calls.append(folder)
        time.sleep(0.3)  # the others ask while this one makes it
        (folder / "config.json").write_text("{}")

    got = []
    askers = [threading.Thread(target=lambda: got.append(make_folder_once(tmp_path / "model", make))) for _ in range(3)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert len(calls) == 1 and got == [tmp_path / "model"] * 3
    assert (tmp_path / "model" / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.lock", "model"]  # no half-made copy left


def test_a_failed_first_use_leaves_nothing_and_the_next_makes_it(tmp_path):
    def broken(folder: Path) -> None:
        (folder / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        make_folder_once(tmp_path / "model", broken)
    assert not (tmp_path / "model").exists()
    made = make_folder_once(tmp_path / "model", lambda folder: (folder / "config.json").write_text("{}"))
    assert (made / "config.json").is_file() and not (made / "half").exists()


def test_a_files_stamp_changes_with_an_edit_an_added_or_a_removed_file_and_skips_one_gone(tmp_path):
    """What lm-eval's index and the include folders' tasks are keyed by: an edit that keeps the time (a copy with its
    times) still changes the size; the same names in another folder are another stamp."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("x: 1")
    b.write_text("y: 2")
    os.utime(a, ns=(10**18, 10**18))
    first = files_stamp([a, b, tmp_path / "gone.yaml"])
    assert first == ((str(a), 4, 10**18), (str(b), 4, b.stat().st_mtime_ns))
    a.write_text("x: 10")
    os.utime(a, ns=(10**18, 10**18))
    assert files_stamp([a, b]) != first and files_stamp([a, b])[0] == (str(a), 5, 10**18)
    assert files_stamp([a]) != files_stamp([a, b]) and files_stamp([b, a]) == files_stamp([a, b])[::-1]
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.yaml").write_text("x: 10")
    assert files_stamp([other / "a.yaml"])[0][0] != files_stamp([a])[0][0]
