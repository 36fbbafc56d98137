"""No import cycle among the training stage's modules: an AST scan of every explicit import, at module
level or inside a function, between `stages.train` and its submodules.

    .venv/bin/python -m pytest -q tests/train/test_import_cycles.py

A submodule that imports its own package (`from stages.train import Config`) is a cycle, since the package
`__init__` imports submodules; the implicit import of a package's `__init__` that `import a.b` performs is
not counted. The stop signal (`stop.py`) and the stage's Config (`stage_config.py`) are leaf modules so that
the loop, the launchers, the worker and the worker spec can share them.
"""

from __future__ import annotations

import ast
import os

import pytest

from tests.conftest import REPO


def import_graph(package_dir: str, package: str) -> dict[str, set[str]]:
    """{module: the modules of `package` it imports explicitly} for every .py file in `package_dir`."""
    modules = {package if name == "__init__.py" else f"{package}.{name[:-3]}": os.path.join(package_dir, name)
               for name in os.listdir(package_dir) if name.endswith(".py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        here = module if path.endswith("__init__.py") else module.rpartition(".")[0]   # for relative imports
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:                  # from . import x (level 1), from ..a import x (level 2)
                    parts = here.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                # `from package import name`: the submodule `name` when there is one, else the package.
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_training_stage_has_no_import_cycle():
    graph = import_graph(os.path.join(REPO, "stages", "train"), "stages.train")
    assert graph.keys() >= {f"stages.train{m}" for m in ("", ".loop", ".stop", ".stage_config", ".worker")}
    assert cycles(graph) == []
    importers_of_the_package = sorted(m for m, targets in graph.items() if "stages.train" in targets)
    assert importers_of_the_package == []
    assert graph["stages.train.stop"] == set()        # the leaf every part of training may import


@pytest.mark.parametrize("files, expected", [
    ({"__init__.py": "from pkg.a import Config\n", "a.py": "import os\n"}, []),
    # a submodule importing its package: a cycle through __init__
    ({"__init__.py": "from pkg.a import Config\n", "a.py": "from pkg import b\n",
      "b.py": "from pkg import C\n"}, [["pkg", "pkg.a", "pkg.b"]]),
    # a cycle through an import inside a function (the lazy kind still counts), and a relative import
    ({"__init__.py": "", "a.py": "def f():\n    from pkg import b\n", "b.py": "from .a import f\n"},
     [["pkg.a", "pkg.b"]]),
])
def test_the_scan_finds_the_cycles_it_should(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert cycles(import_graph(str(tmp_path), "pkg")) == expected
