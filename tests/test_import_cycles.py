"""No import cycles in the product: the modules of `pipeline/` and `stages/` form a graph without loops.

    .venv/bin/python -m pytest -q tests/test_import_cycles.py

A cycle makes the import order matter (which module is half-initialized when the other reads it) and
hides which module owns what. The graph is read from the source with `ast`, not by importing: every
`import` and `from ... import` counts, at module level or inside a function (a lazy import closes a
loop as surely as an eager one, only later), and a submodule that imports its own package counts too
(`stages/clean/graph.py` importing `stages.clean` for its `Config` is a loop with the package's
`run`, which imports `graph`). The implicit step "importing `a.b` first runs `a/__init__.py`" is not an
edge: every submodule would be in a loop with its package.

The usual way out: a `Config` that a package's submodules need lives in a module of its own (the
package re-exports it), and a signal shared by two modules (training's stop request) in a leaf module.
"""

from __future__ import annotations

import ast
import os

from tests.conftest import REPO

PACKAGES = ("pipeline", "stages")


def modules(root: str, packages=PACKAGES) -> dict[str, str]:
    """{dotted module name: path} for every .py file under `packages` (a package is its `__init__`)."""
    out = {}
    for package in packages:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    out[dotted.removesuffix(".__init__")] = path
    return out


def import_graph(root: str, packages=PACKAGES) -> dict[str, set[str]]:
    """{module: the project's modules it imports}, from every import statement anywhere in its source."""
    mods = modules(root, packages)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                graph[name].update(_project_module(a.name, mods) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:      # relative: `from . import x`, `from ..io import storage`
                    parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    graph[name].add(submodule if submodule in mods else _project_module(base, mods))
        graph[name].discard(None)
        graph[name].discard(name)
    return graph


def _project_module(dotted: str, mods: dict) -> str | None:
    """The longest prefix of `dotted` that is one of the project's modules (None for a library)."""
    while dotted and dotted not in mods:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively),
    each sorted, as loops a reader can follow."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    edges = [f"{m} -> {d}" for m in component for d in sorted(graph[m] & members)]
    return "{" + ", ".join(component) + "}: " + "; ".join(edges)


def test_the_product_has_no_import_cycle():
    graph = import_graph(REPO)
    assert "stages.clean.graph" in graph and "pipeline.cache" in graph      # it read the tree
    found = cycles(graph)
    assert not found, "import cycles (move the shared definition into a module both can import):\n" + \
        "\n".join(_describe(graph, c) for c in found)


def test_the_cycle_check_finds_lazy_package_and_relative_loops(tmp_path):
    def write(path, text):
        full = tmp_path / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)

    write("stages/__init__.py", "")
    write("stages/a/__init__.py", "from stages.a.config import Config\n"
                                  "def run():\n    from stages.a import graph  # lazy\n")
    write("stages/a/config.py", "import dataclasses\n")
    write("stages/a/graph.py", "from stages import a\n")                 # back to its own package
    write("stages/b/__init__.py", "")
    write("stages/b/x.py", "from . import y\n")                          # relative, both ways
    write("stages/b/y.py", "from .x import thing\n")
    write("stages/c.py", "from stages.a import config\nimport json\n")   # no loop
    graph = import_graph(str(tmp_path), ("stages",))
    assert graph["stages.c"] == {"stages.a.config"}
    assert sorted(cycles(graph)) == [["stages.a", "stages.a.graph"], ["stages.b.x", "stages.b.y"]]
