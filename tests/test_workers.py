"""How parallel workers (`pytest -n 3 --dist loadgroup`) share the suite (tests/conftest.py): a browser module, a module that builds a
fixture once for its tests, and the Slurm folder, are each one unit of work; every other test is its own. The markers
that need a folder are checked where tests are run."""
import re
from pathlib import Path

import pytest

from tests.conftest import ONE_WORKER, work_unit

pytestmark = pytest.mark.unit

TESTS = Path(__file__).parent


def test_a_browser_module_and_the_slurm_folder_are_each_one_unit_and_other_tests_their_own():
    assert work_unit("tests/browser/test_pages.py::test_a[600.0]") == "tests/browser/test_pages.py"
    assert work_unit("tests/browser/test_pages.py::test_b") == "tests/browser/test_pages.py"
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
                 for kind, folder in ONE_WORKER.items()
                 if re.search(rf"pytest\.mark\.{kind}\b", path.read_text(encoding="utf-8"))
                 and not str(path.relative_to(TESTS.parent)).startswith(folder) and path != Path(__file__)]
    assert misplaced == []
