"""The embedded offline corpus: English prose that ships with every Python, and the code it documents.

One document per docstring (module, class, function) of the standard library's `.py` files, read
with `ast` without importing anything, plus one per pydoc help topic (the `topics` dict literal in
`pydoc_data/topics.py`). On CPython 3.11 that is ~7.7k docstrings (1.6 MB) and 79 topics (0.46 MB).
`read_code` gives the same modules as code instead: one document per `.py` file, its source text (the
prose + code pair of gin/mixtures/prose_code.gin). The corpus is whatever the running interpreter ships,
so a different Python version gives
different (equally valid) text; `version()` names it, and goes into the download key.

Units are batches of paths relative to the stdlib directory, so a worker whose Python lives
elsewhere resolves them against its own stdlib.

    from stages.download import embedded
    for unit in embedded.units(max_files=3, include_topics=False):
        for doc in embedded.read(unit): print(doc["url"], doc["text"][:60])
"""

from __future__ import annotations

import ast
import os
import platform
import sys
import sysconfig
import threading
from collections.abc import Iterator

from stages.download.document import doc_id

SOURCE = "embedded"
CODE_SOURCE = "embedded_code"      # EmbeddedCode: the same modules' source text
TOPICS = "pydoc_data/topics.py"
SKIP_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__"})
FILES_PER_UNIT = 8   # ~75 units for the whole stdlib: enough to spread over shards, few elements
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def units(max_files: int = 0, include_topics: bool = True, skip: int = 0) -> list[tuple[str, ...]]:
    """Sorted batches of stdlib-relative `.py` paths; `max_files` > 0 keeps the first N modules (after the
    first `skip`)."""
    files = [f for f in _stdlib_files() if f != TOPICS][skip:]
    if max_files:
        files = files[:max_files]
    if include_topics:
        files.append(TOPICS)
    return [tuple(files[i:i + FILES_PER_UNIT]) for i in range(0, len(files), FILES_PER_UNIT)]


def size(units: list[tuple[str, ...]]) -> int:
    """The bytes of the modules in `units`, from a listing: each document read from one (a docstring with its
    quotes, a help topic with its key, a module's whole source) is at most the bytes it sits in."""
    root = _stdlib()
    return sum(os.path.getsize(os.path.join(root, rel)) for unit in units for rel in unit)


def version() -> str:
    """What the corpus is: the interpreter and its exact version ("cpython-3.11.9"), whose stdlib it reads.
    Not the stdlib's path or file times, which differ between two installs of the same Python."""
    return f"{sys.implementation.name}-{platform.python_version()}"


# CPython 3.11's `ast.parse` is not safe to call from two threads at once: under Beam's multi-threaded
# runner (`--direct_running_mode=multi_threading`) it failed with "SystemError: AST constructor recursion
# depth mismatch". Parsing is a small part of reading a unit, so threads take turns.
_PARSE_LOCK = threading.Lock()


def read(unit: tuple[str, ...]) -> Iterator[dict]:
    root = _stdlib()
    for rel in unit:
        with open(os.path.join(root, rel), "rb") as f:
            source = f.read()
        try:
            with _PARSE_LOCK:
                tree = ast.parse(source, filename=rel)
        except (SyntaxError, ValueError):
            yield {"id": doc_id(SOURCE, rel), "text": None, "url": rel, "source": SOURCE,
                   "error": "syntax_error"}
            continue
        yield from _topics(tree) if rel == TOPICS else _docstrings(tree, rel)


def read_code(unit: tuple[str, ...]) -> Iterator[dict]:
    """The modules of `unit` as code: one document per `.py` file, its source text as it is (the offline
    corpus's second kind, for mixtures of prose and code)."""
    root = _stdlib()
    for rel in unit:
        with open(os.path.join(root, rel), "rb") as f:
            raw = f.read()
        try:
            text, error = raw.decode("utf-8"), None
        except UnicodeDecodeError:
            text, error = None, "not_utf8"
        yield {"id": doc_id(CODE_SOURCE, rel), "text": text, "url": rel, "source": CODE_SOURCE,
               "error": error}


def _docstrings(tree: ast.Module, rel: str) -> Iterator[dict]:
    nodes = (n for n in ast.walk(tree) if isinstance(n, DOCUMENTED))
    for node in sorted(nodes, key=lambda n: getattr(n, "lineno", 0)):   # source order
        text = ast.get_docstring(node, clean=True)   # clean=True is inspect.cleandoc
        if text:
            line = getattr(node, "lineno", 1)
            yield {"id": doc_id(SOURCE, rel, line), "text": text, "url": f"{rel}:{line}", "source": SOURCE,
                   "error": None}


def _topics(tree: ast.Module) -> Iterator[dict]:
    """The entries of `topics = {...}` in pydoc_data/topics.py, in sorted topic order."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["topics"]:
            topics = ast.literal_eval(node.value)
            for name in sorted(topics):
                yield {"id": doc_id(SOURCE, TOPICS, name), "text": topics[name].strip(),
                       "url": f"{TOPICS}#{name}", "source": SOURCE, "error": None}


def _stdlib() -> str:
    return sysconfig.get_paths()["stdlib"]


def _stdlib_files() -> list[str]:
    root = _stdlib()
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        rel = os.path.relpath(directory, root)
        found += [os.path.normpath(os.path.join(rel, f)).replace(os.sep, "/")
                  for f in files if f.endswith(".py")]
    return sorted(found)
