"""The lab's shape: layers that import downwards only, no import cycle, few loose modules, and the
package graph in docs/architecture.md drawn from the code (scripts/import_graph.py)."""
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
MAX_LOOSE_MODULES = 12  # modules directly in lab/, __init__ and __main__ included


def _script():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


graph_tool = _script()


def test_no_import_cycle_and_nothing_imports_a_higher_layer():
    assert graph_tool.problems(graph_tool.module_graph()) == []


def test_few_modules_loose_in_lab():
    loose = sorted(p.name for p in (ROOT / "lab").glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose


def test_every_package_is_in_a_layer():
    for module in graph_tool.project_modules():
        graph_tool.layer_of(module)  # raises for a package the layers do not name


def test_the_architecture_page_shows_the_graph_the_code_has():
    drawn = graph_tool.render(graph_tool.package_graph(graph_tool.module_graph()))
    assert f"```\n{drawn}\n```" in (ROOT / "docs" / "architecture.md").read_text(), (
        "docs/architecture.md's import graph is out of date: paste `python scripts/import_graph.py`'s output")


def test_imports_inside_functions_count_and_type_checking_ones_do_not(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from pkg import c\n"
                              "def f():\n    from pkg.b import g\n    return g\n")
    (pkg / "b.py").write_text("import pkg.a\ndef g():\n    from . import c\n")
    (pkg / "c.py").write_text("from .a import f\n")
    modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py", "pkg.c": pkg / "c.py"}
    graph = {name: graph_tool.imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg.c"}, "pkg.c": {"pkg.a"}}
    assert graph_tool.cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_cycles_are_found_by_hand():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert graph_tool.cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert graph_tool.cycles({"a": {"b"}, "b": set()}) == []


def test_an_upward_import_is_named():
    graph = {"lab.core.files": {"lab.kinds.evaluate.run"}, "lab.kinds.evaluate.run": {"lab.core.files"}}
    assert graph_tool.upward_imports(graph) == [("lab.core.files", "lab.kinds.evaluate.run")]
