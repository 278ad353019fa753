"""How parallel workers (`pytest -n 3 --dist loadgroup`) share the suite (tests/conftest.py): a module that builds a
fixture once for its tests, and the Slurm folder, are each one unit of work; every other test is its own; the units
are handed out longest first. The markers that need a folder are checked where tests are run."""
import re
from pathlib import Path

import pytest

from tests.conftest import EXPECTED_S, KIND_FOLDERS, longest_first, work_unit

pytestmark = pytest.mark.unit

TESTS = Path(__file__).parent


def test_the_slurm_folder_is_one_unit_and_other_tests_their_own():
    assert work_unit("tests/browser/test_pages.py::test_a[600.0]") == "tests/browser/test_pages.py::test_a[600.0]"
    assert work_unit("tests/slurm/test_slurm.py::test_c") == work_unit("tests/slurm/test_other.py::test_d") \
        == "tests/slurm/"
    assert work_unit("tests/ui/test_app.py::test_e[x::y]") == "tests/ui/test_app.py::test_e[x::y]"


def test_a_module_that_builds_a_fixture_once_keeps_its_tests_on_one_worker():
    """Else each worker that ran one of its tests would build the module's model, run or page again."""
    assert 'scope="module"' in (TESTS / "calibration" / "test_token_temperature.py").read_text(encoding="utf-8")
    module = "tests/calibration/test_token_temperature.py"
    assert work_unit(f"{module}::test_f") == module
    assert work_unit("tests/calibration/test_metrics.py::test_g") == "tests/calibration/test_metrics.py::test_g"


def test_every_module_that_marks_a_one_worker_kind_is_in_its_folder():
    """The scheduler knows a test's kind only from its path; conftest fails a misplaced one when it runs, and
    this finds it without running it."""
    misplaced = [f"{path.relative_to(TESTS.parent)}: {kind}" for path in sorted(TESTS.rglob("test_*.py"))
                 for kind, folder in KIND_FOLDERS.items()
                 if re.search(rf"pytest\.mark\.{kind}\b", path.read_text(encoding="utf-8"))
                 and not str(path.relative_to(TESTS.parent)).startswith(folder) and path != Path(__file__)]
    assert misplaced == []


class _Item:
    def __init__(self, nodeid: str, *marks: str):
        self.nodeid, self.marks = nodeid, [pytest.Mark(name, (), {}) for name in marks]

    def iter_markers(self):
        return iter(self.marks)


def test_units_start_longest_first_and_keep_their_tests_in_order():
    """The Slurm folder's two slow tests (they wait on Slurm) before a slow browser test, before a slow test alone,
    before a module of 30 quick tests with a module fixture, before a quick test alone; the Slurm tests in their own
    order."""
    module = "tests/calibration/test_token_temperature.py"  # builds a fixture once (scope="module")
    quick = [_Item(f"{module}::test_{i}", "unit") for i in range(30)]
    items = [_Item("tests/ui/test_app.py::test_alone", "unit"), *quick,
             _Item("tests/slurm/test_b.py::test_x", "slurm", "slow"),
             _Item("tests/slurm/test_a.py::test_y", "slurm", "slow"),
             _Item("tests/browser/test_pages.py::test_z", "browser", "slow"),
             _Item("tests/kinds/test_first.py::test_slow", "model", "slow")]
    assert EXPECTED_S["browser"] < 2 * EXPECTED_S["slurm"] and 30 * EXPECTED_S["other"] < EXPECTED_S["slow"]
    ordered = [item.nodeid for item in longest_first(items)]
    assert ordered == ["tests/slurm/test_b.py::test_x", "tests/slurm/test_a.py::test_y",
                       "tests/browser/test_pages.py::test_z", "tests/kinds/test_first.py::test_slow",
                       *[item.nodeid for item in quick], "tests/ui/test_app.py::test_alone"]
