"""The project's import graph, read from the source: cycles, upward imports and the package picture.

Every ``import`` counts, at module level or inside a function (an import moved into a function to
dodge a cycle is still a cycle), except those under ``if TYPE_CHECKING:`` (never executed).
Importing ``a.b.c`` counts as an edge to ``a.b.c`` only, as import-linter and pydeps count it.

    python scripts/import_graph.py            # the package graph docs/architecture.md shows
    python scripts/import_graph.py --check    # exit 1 on a cycle or an upward import, listing them

``docs/architecture.md`` carries the printed graph; ``tests/test_layout.py`` checks that it still
matches, that there is no cycle and that no package imports a higher layer.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_PACKAGES = ("lab", "jobs", "ui")

# Lowest first: a package may import its own layer and those listed before it, never one after.
# lab's top-level modules (cli, versions, __main__) are entry points and sit above lab's packages.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("lab.core",),
    ("lab.data",),
    ("lab.models",),
    ("lab.calibration",),
    ("lab.results",),
    ("lab.jobkit",),
    ("lab.training",),
    ("lab.kinds",),
    ("lab",),
    ("jobs",),
    ("ui",),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for top in TOP_PACKAGES for p in sorted((ROOT / top).rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom]]:
    """Every import statement of a module, at any depth, skipping ``if TYPE_CHECKING:`` bodies."""
    found: list = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` the module.
            candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in candidates:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def module_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:  # the limit is the process's: json's parser, in the same test run, counts on the default
        sys.setrecursionlimit(limit)
    return sorted(found)


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the most specific package holding ``module``."""
    best, best_len = -1, -1
    for i, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and len(package) > best_len:
                best, best_len = i, len(package)
    if best < 0:
        raise ValueError(f"{module} is in no layer of scripts/import_graph.py's LAYERS")
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a))


def package_of(module: str) -> str:
    """``lab.kinds.cft.run`` → ``lab.kinds``: the layer package a module belongs to."""
    return LAYERS[layer_of(module)][0] if module.count(".") >= 1 or module in TOP_PACKAGES else module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for a, targets in graph.items():
        pa = package_of(a)
        edges.setdefault(pa, set())
        edges[pa].update(pb for pb in map(package_of, targets) if pb != pa)
    return edges


def render(edges: dict[str, set[str]]) -> str:
    """One line per package, highest layer first: what it imports."""
    order = sorted(edges, key=lambda p: (-layer_of(p), p))
    width = max(map(len, order))
    return "\n".join(f"{p:<{width}}  -> {', '.join(sorted(edges[p], key=lambda q: (-layer_of(q), q))) or '(nothing)'}"
                     for p in order)


def problems(graph: dict[str, set[str]]) -> list[str]:
    out = [f"cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    out += [f"upward: {a} imports {b}" for a, b in upward_imports(graph)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list cycles and upward imports; exit 1 if any")
    args = parser.parse_args(argv)
    graph = module_graph()
    if args.check:
        found = problems(graph)
        print("\n".join(found) or "no cycle, no upward import")
        return 1 if found else 0
    print(render(package_graph(graph)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
