"""The layering rules of docs/ARCHITECTURE.md, checked: imports point one way (pipeline -> stages.<stage>
-> stages.io), heavy libraries stay where they are used, storage is the only module that spells a URL
scheme, and the CLI's plan/status/cached-run path imports neither JAX nor Beam.

The import contracts themselves live in setup.cfg ([importlinter]); `make lint` runs the same check.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import shutil
import subprocess
import sys

import pytest

from pipeline import cache, config, dag
from tests.conftest import REPO

TINY = f"{REPO}/gin/tiny.gin"
# The console script installed next to this interpreter (the venv's), whatever PATH says.
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint_imports(cwd, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """lint-imports in `cwd` (it reads setup.cfg there). `--no-cache` keeps it from writing an
    `.import_linter_cache/` into the tree; a wide COLUMNS keeps contract names on one line."""
    env = {**os.environ, **(env or {}), "COLUMNS": "250"}
    return subprocess.run([LINT_IMPORTS, "--no-cache", "--no-logo", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------------------------------------
# Import contracts

def test_import_contracts_hold():
    out = _lint_imports(REPO)
    assert out.returncode == 0, f"lint-imports failed:\n{out.stdout}{out.stderr}"


# (file to edit, code appended to it, contract id in setup.cfg, the chain lint-imports must report)
BREAKS = [
    pytest.param("stages/io/llmc.py", "from pipeline import dag  # noqa", "stages-below-pipeline",
                 "stages.io.llmc -> pipeline.dag", id="a-stage-imports-pipeline"),
    pytest.param("stages/io/llmc.py", "from pipeline import dag  # noqa", "io-is-the-bottom-layer",
                 "stages.io.llmc -> pipeline.dag", id="io-imports-pipeline"),
    pytest.param("stages/io/split_rule.py", "from stages import tokenizer  # noqa", "io-is-the-bottom-layer",
                 "stages.io.split_rule -> stages.tokenizer", id="io-imports-a-stage"),
    pytest.param("stages/clean/filters.py", "import jax  # noqa", "data-stages-without-jax",
                 "stages.clean.filters -> jax", id="a-data-stage-imports-jax"),
    # Lazily, inside a function: "never imports" includes the imports that only run when called.
    pytest.param("stages/evaluate/report.py", "def _lazy():\n    import apache_beam  # noqa",
                 "model-stages-without-beam", "stages.evaluate.report -> apache_beam",
                 id="evaluate-imports-beam-lazily"),
    # Indirectly: clean reaching train's modules reaches JAX through them, and that counts too.
    pytest.param("stages/clean/filters.py", "from stages.train import model  # noqa",
                 "data-stages-without-jax", "stages.clean.filters -> stages.train.model",
                 id="a-data-stage-imports-jax-through-train"),
]


@pytest.mark.parametrize("path, code, contract, chain", BREAKS)
def test_a_broken_contract_fails(tmp_path, path, code, contract, chain):
    """The checker catches a violation: break one contract in a copy of the tree and run lint-imports
    on the copy (the real tree is never touched). lint-imports puts its working directory first on
    sys.path, and PYTHONPATH says the same, so grimp reads the copy rather than the installed
    (editable) packages; the reported chain exists only in the copy, which proves it."""
    for package in ("pipeline", "stages"):
        shutil.copytree(os.path.join(REPO, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "setup.cfg"), tmp_path / "setup.cfg")
    with open(tmp_path / path, "a") as f:
        f.write(f"\n\n{code}\n")

    out = _lint_imports(tmp_path, "--contract", contract, env={"PYTHONPATH": str(tmp_path)})
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert chain in text, text
    assert f"{_contract_name(contract)} BROKEN" in " ".join(text.split()), text


def _contract_name(contract: str) -> str:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    return cfg[f"importlinter:contract:{contract}"]["name"]


# ---------------------------------------------------------------------------------------------
# URL schemes

STORAGE = os.path.join("stages", "io", "storage.py")
# Modules that parse the web URLs inside documents (data, not storage paths), and may name a scheme.
WEB_URL_PARSERS = {"stages/clean/urls.py"}
# A scheme as RFC 3986 spells it ("gs://", "hf://", "s3://"), or a bare "://" (an f-string's literal
# part such as f"{scheme}://{bucket}", or `"://" in path`: the test for "is this a URL").
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes: the first statement of a module, class or function body, when it
    is a bare string. Documentation may mention gs:// freely; code may not."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            out.add(id(first.value))
    return out


def _url_literals(path: str) -> list[tuple[int, str]]:
    """(line, value) of every string literal in `path` that holds a URL scheme, docstrings aside."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    docs = _docstrings(tree)
    # ast.walk reaches the literal parts of f-strings too (Constant nodes inside JoinedStr).
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                  and (SCHEME.search(node.value) or "://" in node.value))


def test_no_url_scheme_literal_outside_storage():
    """Only stages/io/storage.py knows URL schemes (local, gs://, hf://): everything else hands paths
    to it and asks it (join, parent, is_local, ...). Comments and docstrings may mention schemes."""
    found = []
    for package in ("pipeline", "stages"):
        for root, dirs, files in os.walk(os.path.join(REPO, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, REPO)
                if name.endswith(".py") and rel != STORAGE and rel not in WEB_URL_PARSERS:
                    found += [f"{rel}:{line}: {value!r}" for line, value in _url_literals(path)]
    assert not found, "URL scheme literals outside stages/io/storage.py:\n" + "\n".join(found)


def test_the_url_literal_check_sees_code_and_skips_documentation(tmp_path):
    """The check above passes only because it finds nothing: show it finds what it should."""
    path = tmp_path / "example.py"
    path.write_text('''"""Module docstring: gs://bucket is fine here."""
# a comment: hf://org/repo is fine here
class A:
    """Class docstring: s3://x."""
    def f(self, bucket, path):
        """Function docstring: gs://y."""
        "gs://not-a-docstring"
        root = "gs://bucket/prefix"
        url = f"{bucket}://{path}"
        return "://" in path, f"{bucket}/{path}", "a/b"
''')
    assert _url_literals(str(path)) == [(7, "gs://not-a-docstring"), (8, "gs://bucket/prefix"),
                                        (9, "://"), (10, "://")]


# ---------------------------------------------------------------------------------------------
# What the CLI imports when there is nothing to run

HEAVY = ("jax", "flax", "optax", "orbax", "apache_beam", "tensorflow", "tensorflow_datasets")


def _cli(cwd, *argv: str) -> tuple[int, list[str], str]:
    """`python -m pipeline ARGV` in a fresh interpreter: its return code, the heavy libraries it
    imported, and its output. Runs from `cwd` with only the repo on PYTHONPATH, like a user would."""
    code = ("import sys; from pipeline.__main__ import main; "
            f"rc = main({list(argv)!r}); "
            f"print('RC', rc); print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    rc = re.search(r"^RC (-?\d+)$", out.stdout, re.M)
    heavy = re.search(r"^HEAVY (\[.*\])$", out.stdout, re.M)
    assert rc and heavy, text
    return int(rc.group(1)), ast.literal_eval(heavy.group(1)), text


def test_a_noop_cli_invocation_imports_neither_jax_nor_beam(tmp_path):
    """`plan` (no cache yet) loads gin and every stage's Config, and nothing heavy."""
    rc, heavy, text = _cli(tmp_path, "plan", "--gin", TINY)
    assert rc == 0, text
    assert heavy == [], f"plan imported {heavy}:\n{text}"


@pytest.fixture
def cached_root(tmp_path):
    """A cache in which every stage of the tiny plan is committed under its real key, each holding a
    few small files: built through `cache.run_stage` with a stand-in for the stage (the real ones take
    minutes)."""
    root = str(tmp_path / "cache")
    plan = config.load([TINY], [f'pipeline.Settings.cache_root="{root}"'])

    def fake(cfg, upstream, out_dir, work_dir=None):   # work_dir optional: old and new run_stage alike
        # The files the stages' `summary` reads, empty: the CLI's summaries then get as far as
        # reading them through storage and fail on a missing field (printed as "(no summary: ...)"),
        # so the whole read path runs without this test knowing each stage's schema.
        for name in ("stats.json", "manifest.json", "summary.json", "eval.json"):
            with open(os.path.join(out_dir, name), "w") as f:
                f.write("{}")

    committed = {}
    for name, sp in plan.stages.items():
        committed[name] = cache.run_stage(cache_root=plan.cache_root, stage=name, key=sp.key,
                                          config=sp.config, upstream={u: committed[u] for u in sp.upstream},
                                          fn=fake)
    return root


@pytest.mark.parametrize("command", ["status", "run"])
def test_status_and_a_fully_cached_run_import_neither_jax_nor_beam(tmp_path, cached_root, command):
    """A rerun with nothing to do must stay fast: it reads manifests and prints summaries, and the
    stage modules it touches for that (Config, VERSION, summary) import no heavy library at import time."""
    rc, heavy, text = _cli(tmp_path, command, "--gin", TINY,
                           "--gin-param", f'pipeline.Settings.cache_root="{cached_root}"')
    assert rc == 0, text
    assert heavy == [], f"{command} imported {heavy}:\n{text}"
    # The status table: one row per stage, `name  key[:12]  status  size  wall  path`.
    rows = re.findall(r"^(\w+)\s+[0-9a-f]{12}\s+(\w+)\s", text, re.M)
    assert rows == [(name, "cached") for name in dag.STAGES], text
    if command == "run":
        assert "0 stage(s) ran" in text, text
