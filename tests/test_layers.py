"""The layering rules of docs/ARCHITECTURE.md, checked: imports point one way (pipeline -> stages.<stage>
-> stages.io), a stage reaches no stage but those it reads and imports of them only the modules
pipeline/dag.py's IMPORTS names, heavy libraries stay where they are used, storage is the only module that
spells a URL scheme, and the CLI's plan/status/cached-run path imports neither JAX nor Beam, and no numpy or
Luigi.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_layers.py

The import contracts live in setup.cfg ([importlinter], what `make lint` runs): two per stage (what it may
reach; which modules of the stages it reads it may import) and one per shared layer. They are derived from
pipeline/dag.py (STAGES, RUNS_ON, SHARES_CODE, IMPORTS), and a test here fails, printing the sections to
paste, when setup.cfg or docs/ARCHITECTURE.md's table says otherwise; another fails when the code imports a
module of another stage that IMPORTS does not name, or no longer imports one it names. setup.cfg's sections
are what this prints (run from the repo root with PYTHONPATH=$PWD):

    from tests import test_layers as t; print(t.render(t.derived_contracts()))
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
# Import contracts, derived from the DAG

JAX = ("jax", "flax", "optax", "orbax")
BEAM = ("apache_beam",)
# The modules directly under stages/ that are no stage: the shared layers below every stage. Each may import
# the shared layers named here (io is the bottom) and the heavy library it runs on, as dag.RUNS_ON says of a
# stage.
SHARED = {"io": ((), "python"), "beam_runner": (("io",), "beam"),
          # the fixed texts every variant is measured on: clean checks them, yardsticks tokenizes them
          "yardstick_data": (("io",), "python")}


def _heavy(runs_on: str) -> tuple[str, ...]:
    """The heavy libraries a module that runs on `runs_on` must never import."""
    return (() if runs_on == "jax" else JAX) + (() if runs_on == "beam" else BEAM)


def _libraries(modules: tuple[str, ...]) -> str:
    names = {JAX: "no JAX, Flax, Optax or Orbax", BEAM: "no Apache Beam", JAX + BEAM: "neither JAX nor Beam"}
    return names[modules]


def _allows(prefix: str, module: str) -> bool:
    """Whether a dag.IMPORTS entry allows importing `module`: an entry naming a stage's package is that
    package's own module (its public face) only; one naming a module covers it and anything under it."""
    return module == prefix or (prefix.count(".") > 1 and module.startswith(prefix + "."))


def derived_contracts() -> dict[str, dict]:
    """{contract id: its fields in setup.cfg}, as pipeline/dag.py implies them. Per stage:

    - `stage-<name>`: it never reaches, even through other modules, a stage but those it reads
      (`dag.upstream`) and those it shares code with (`dag.SHARES_CODE`: score measures with clean's
      filters), never pipeline, and only the heavy library it runs on (`dag.RUNS_ON`): no stage downstream of
      it or beside it, and no JAX in a data stage, whichever module the import hides in.
    - `stage-<name>-modules` (a stage that reads another): of the stages it reads, it imports itself only
      the modules `dag.IMPORTS` names for it (the model restored, the packed scorer, a table's reader), each
      for a reason written there: evaluate reads clean's, shard's and tokenizer's output through their
      manifests and imports none of their code. Its own imports only (`allow_indirect_imports`): what a
      named module imports is its stage's business, held by that stage's contracts; its imports of the
      named modules are ignored (`stages.evaluate.** -> stages.train.scoring`, and what is under it).

    A shared layer imports no stage, only the shared layers below it."""
    stages = list(dag.STAGES)
    out = {"stages-below-pipeline": {
        "name": "stages never import pipeline (stage code knows nothing of Luigi, gin or the cache)",
        "source_modules": ["stages"], "forbidden_modules": ["pipeline"]}}
    for stage in stages:
        reads, heavy = dag.upstream(stage), _heavy(dag.RUNS_ON[stage])
        shares = dag.SHARES_CODE.get(stage, ())
        out[f"stage-{stage}"] = {
            "name": (f"stages.{stage} reaches, even through other modules, no stage but those it reads "
                     f"({', '.join(reads)})" if reads else
                     f"stages.{stage} imports no other stage (it reads none)")
                    + (f" and {', '.join(shares)}, whose code it shares" if shares else "")
                    + f"; {_libraries(heavy)}; no pipeline",
            "source_modules": [f"stages.{stage}"],
            "forbidden_modules": [f"stages.{s}" for s in stages if s != stage and s not in (*reads, *shares)]
                                 + ["pipeline", *heavy]}
        if read := [s for s in reads if s not in shares]:
            prefixes = list(dag.IMPORTS.get(stage, {}))
            ignored = [f"{importer} -> {imported}" for p in prefixes
                       for importer in (f"stages.{stage}", f"stages.{stage}.**")
                       for imported in ([p, f"{p}.**"] if p.count(".") > 1 else [p])]
            out[f"stage-{stage}-modules"] = {
                "name": f"stages.{stage} imports of the stages it reads ({', '.join(read)}) "
                        + (f"only {', '.join(prefixes)} (dag.IMPORTS)" if prefixes else "no module"),
                "source_modules": [f"stages.{stage}"],
                "forbidden_modules": [f"stages.{s}" for s in read],
                **({"ignore_imports": ignored} if ignored else {}),
                "allow_indirect_imports": "true",
                # a named module that is no package has nothing under it to ignore
                **({"unmatched_ignore_imports_alerting": "none"} if ignored else {})}
    for layer, (below, runs_on) in SHARED.items():
        heavy = _heavy(runs_on)
        others = [f"stages.{s}" for s in SHARED if s != layer and s not in below]
        out[f"layer-{layer}"] = {
            "name": f"stages.{layer} (a shared layer) imports no stage"
                    f"{', only the shared ' + ', '.join(below) if below else ', no other shared layer'}; "
                    f"{_libraries(heavy)}; no pipeline",
            "source_modules": [f"stages.{layer}"],
            "forbidden_modules": [f"stages.{s}" for s in stages] + others + ["pipeline", *heavy]}
    return out


LISTS = ("source_modules", "forbidden_modules", "ignore_imports")     # the fields that hold one item a line


def render(contracts: dict[str, dict]) -> str:
    """The contracts as setup.cfg spells them (paste this over its contract sections)."""
    blocks = []
    for cid, c in contracts.items():
        lines = [f"[importlinter:contract:{cid}]", f"name = {c['name']}", "type = forbidden"]
        for key, value in c.items():
            if key in LISTS:
                lines += [f"{key} =", *(f"    {m}" for m in value)]
            elif key != "name":
                lines.append(f"{key} = {value}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _setup_cfg_contracts(path: str = os.path.join(REPO, "setup.cfg")) -> dict[str, dict]:
    cfg = configparser.ConfigParser()
    cfg.read(path)
    prefix = "importlinter:contract:"
    return {section.removeprefix(prefix): {
        key: [line.strip() for line in value.splitlines() if line.strip()] if key in LISTS else value
        for key, value in cfg[section].items()}
        for section in cfg.sections() if section.startswith(prefix)}


def test_every_stage_and_shared_layer_has_its_contract_in_setup_cfg():
    """setup.cfg (what `make lint` reads) holds exactly the contracts dag.py implies: a stage added to the
    DAG, an upstream edge changed or a hand-edited contract fails here; the message is the text to paste."""
    modules = {name.removesuffix(".py") for name in os.listdir(os.path.join(REPO, "stages"))
               if name.endswith(".py") or os.path.isfile(os.path.join(REPO, "stages", name, "__init__.py"))}
    assert modules - {"__init__"} == set(dag.STAGES) | set(SHARED), \
        "every module under stages/ is a stage in dag.STAGES or a shared layer in SHARED above"
    assert set(dag.RUNS_ON) == set(dag.STAGES), "dag.RUNS_ON names what each stage of dag.STAGES runs on"
    expected = {cid: {**c, "type": "forbidden"} for cid, c in derived_contracts().items()}
    assert _setup_cfg_contracts() == expected, \
        "setup.cfg's import contracts differ from pipeline/dag.py's; they should read:\n\n" + render(expected)


def test_architecture_lists_every_stage_contract():
    """docs/ARCHITECTURE.md's layer table has one row per stage, in DAG order, with what it reads, what it
    runs on and its contract, as dag.py says; and names every other contract."""
    with open(os.path.join(REPO, "docs", "ARCHITECTURE.md")) as f:
        layers = f.read().split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `stages\.(\w+)` \| (.*?) \| (.*?) \| `stage-(\w+)` \|$", layers, re.M)
    expected = [(s, ", ".join(dag.upstream(s)) or "nothing", dag.RUNS_ON[s], s) for s in dag.STAGES]
    assert rows == expected, "ARCHITECTURE's stage rows should be:\n" + "\n".join(
        f"| `stages.{s}` | {reads} | {runs} | `stage-{s}` |" for s, reads, runs, _ in expected)
    missing = [cid for cid in derived_contracts() if f"`{cid}`" not in layers]
    assert not missing, f"ARCHITECTURE's Layers section does not name the contracts {missing}"
    # The layer diagram's stage layer: from `stages/<stage>/` to the next arrow, the stages in DAG order.
    diagram = layers.split("stages/<stage>/", 1)[1].split("▼", 1)[0]
    named = re.findall(r"\b(" + "|".join(dag.STAGES) + r")\b", diagram)
    assert named == list(dag.STAGES), f"ARCHITECTURE's layer diagram lists the stages {named}"


def test_import_contracts_hold():
    out = _lint_imports(REPO)
    assert out.returncode == 0, f"lint-imports failed:\n{out.stdout}{out.stderr}"


def _stage_imports() -> dict[str, set[tuple[str, str]]]:
    """{stage: {(importer, imported)}}: every direct import, by a module of the stage, of a module of another
    stage whose code it does not share (dag.SHARES_CODE), as grimp (lint-imports' graph) reads this tree."""
    import grimp

    import stages

    assert os.path.dirname(os.path.abspath(stages.__file__)) == os.path.join(REPO, "stages"), stages.__file__
    graph = grimp.build_graph("stages", cache_dir=None)       # no .grimp_cache/ in the tree
    out: dict[str, set[tuple[str, str]]] = {stage: set() for stage in dag.STAGES}
    for importer in graph.modules:
        stage = importer.split(".")[1] if importer.count(".") else ""
        if stage not in dag.STAGES:
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            owner = imported.split(".")[1] if imported.startswith("stages.") else ""
            if owner in dag.STAGES and owner != stage and owner not in dag.SHARES_CODE.get(stage, ()):
                out[stage].add((importer, imported))
    return out


def _imports_problems(imports: dict[str, dict[str, str]], found: dict[str, set[tuple[str, str]]]
                      ) -> tuple[list[str], list[str], list[str]]:
    """(entries naming a stage the importer does not read or giving no reason, imports no entry allows,
    entries no import uses) of an IMPORTS table against the imports `_stage_imports` found."""
    unlisted, unused, astray = [], [], []
    for stage, entries in imports.items():
        for prefix, why in entries.items():
            if prefix.split(".")[1] not in dag.upstream(stage):
                astray.append(f"dag.IMPORTS[{stage!r}] names {prefix}, of a stage {stage} does not read "
                              f"(it reads {', '.join(dag.upstream(stage)) or 'none'})")
            if not why.strip():
                astray.append(f"dag.IMPORTS[{stage!r}][{prefix!r}] gives no reason")
            if not any(_allows(prefix, imported) for _, imported in found[stage]):
                unused.append(f"dag.IMPORTS[{stage!r}] names {prefix}, which no module of stages.{stage} "
                              "imports")
    for stage, pairs in found.items():
        unlisted += [f"{importer} -> {imported}" for importer, imported in sorted(pairs)
                     if not any(_allows(p, imported) for p in imports.get(stage, {}))]
    return astray, unlisted, unused


def test_dag_imports_names_exactly_the_modules_each_stage_imports_of_the_stages_it_reads():
    """pipeline/dag.py's IMPORTS is the list the `-modules` contracts allow: an import it does not name
    fails here, naming the import and where to add it; an entry no code uses any more (a module moved,
    an import dropped) fails too, so the list stays the truth; and an entry may name only a stage the
    importer reads (imports follow the data)."""
    astray, unlisted, unused = _imports_problems(dag.IMPORTS, _stage_imports())
    assert not astray, "\n".join(astray)
    assert not unlisted, ("imports of another stage's module that pipeline/dag.py's IMPORTS does not name "
                          "(add the module with the reason it is needed, or read that stage's output through "
                          "its manifest instead):\n" + "\n".join(unlisted))
    assert not unused, "\n".join(unused) + "\n(remove the entry, or name the module the code imports now)"


def test_the_imports_check_finds_an_unlisted_import_an_unused_entry_and_one_astray():
    """The check above passes only because it finds nothing: an entry dropped, one added that no code uses,
    and one naming a stage the importer does not read are each reported. A face entry (`stages.yardsticks`)
    allows the package's own module, not what is under it."""
    found = _stage_imports()
    imports = {stage: dict(entries) for stage, entries in dag.IMPORTS.items()}
    del imports["evaluate"]["stages.train.step"]
    imports["export"]["stages.train.planner"] = "a module export does not import"
    imports["tokenizer"] = {"stages.shard.config": "shard is downstream of the tokenizer"}
    del imports["evaluate"]["stages.yardsticks.score"]
    astray, unlisted, unused = _imports_problems(imports, found)
    assert astray == ["dag.IMPORTS['tokenizer'] names stages.shard.config, of a stage tokenizer does not "
                      "read (it reads clean)"]
    assert "stages.evaluate.measure -> stages.train.step" in unlisted
    assert "stages.evaluate.measure -> stages.yardsticks.score" in unlisted     # not under stages.yardsticks
    assert "dag.IMPORTS['export'] names stages.train.planner, which no module of stages.export imports" \
        in unused


def _package_file(module: str) -> str:
    """The file of a module under the repo: `stages.train` -> stages/train/__init__.py."""
    path = module.replace(".", "/")
    return path + ("/__init__.py" if os.path.isdir(os.path.join(REPO, path)) else ".py")


def _modules(stage: str) -> list[str]:
    """Every module of a stage's package (or its one module), sorted."""
    root = os.path.join(REPO, "stages", stage)
    if not os.path.isdir(root):
        return [f"stages.{stage}"]
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        package = os.path.relpath(folder, REPO).replace(os.sep, ".")
        out += [package if f == "__init__.py" else f"{package}.{f[:-3]}" for f in files if f.endswith(".py")]
    return sorted(out)


def _violations() -> list:
    """One planted violation per derived contract: (file, code appended, contract, the chains lint-imports
    must report). A stage imports, lazily, the first stage after it in the DAG that it must not import (else
    the last before it: train imports evaluate, the import these contracts were written for) and, eagerly, a
    heavy library it must not (export: `import jax`); for its `-modules` contract, a module of a stage it may
    use that dag.IMPORTS does not name (evaluate imports stages.train.agreed_stop). A shared layer imports a
    stage and a heavy library."""
    stages = list(dag.STAGES)
    out = [pytest.param("stages/io/llmc.py", "from pipeline import dag  # noqa", "stages-below-pipeline",
                        ["stages.io.llmc -> pipeline.dag"], id="stages-below-pipeline")]
    for cid, c in derived_contracts().items():
        if cid == "stages-below-pipeline":
            continue
        name = cid.split("-")[1]
        module = f"stages.{name}"
        path = _package_file(dag.STAGES[name][0] if name in dag.STAGES else module)
        if cid.endswith("-modules"):
            entries = dag.IMPORTS.get(name, {})
            refused = [m for s in c["forbidden_modules"] for m in _modules(s.removeprefix("stages."))
                       if not any(_allows(p, m) for p in entries)]
            # a module beside the named ones (evaluate: stages.train.agreed_stop), else a stage's face
            target = next((m for m in refused if m.count(".") > 1 and m.rsplit(".", 1)[0] in
                           {f"stages.{p.split('.')[1]}" for p in entries}), refused[0])
            parent, _, leaf = target.rpartition(".")
            code = f"def _planted():\n    from {parent} import {leaf}  # noqa"
            out.append(pytest.param(path, code, cid, [f"{module} -> {target}"], id=cid))
            continue
        forbidden = [m.removeprefix("stages.") for m in c["forbidden_modules"] if m.startswith("stages.")]
        if name in dag.STAGES:
            after = [s for s in stages[stages.index(name) + 1:] if s in forbidden]
            target = after[0] if after else [s for s in stages if s in forbidden][-1]
        else:
            target = [s for s in stages if s in forbidden][-1]
        heavy = next(m for m in c["forbidden_modules"] if m in JAX + BEAM)
        code = f"import {heavy}  # noqa\n\n\ndef _planted():\n    from stages import {target}  # noqa"
        out.append(pytest.param(path, code, cid, [f"{module} -> {heavy}", f"{module} -> stages.{target}"],
                                id=cid))
    return out


# Beyond the planted ones: "never imports" includes imports that reach a library through another stage.
INDIRECT = [
    pytest.param("stages/clean/filters.py", "from stages.train import model  # noqa", "stage-clean",
                 ["stages.clean.filters -> stages.train.model"], id="a-data-stage-imports-jax-through-train"),
    pytest.param("stages/export/card.py", "def _lazy():\n    from stages.train import loop  # noqa",
                 "stage-export", ["stages.export.card -> stages.train.loop"],
                 id="export-reaches-jax-through-train"),
]


@pytest.mark.parametrize("path, code, contract, chains", _violations() + INDIRECT)
def test_a_broken_contract_fails(tmp_path, path, code, contract, chains):
    """The checker catches a violation of each contract: break it in a copy of the tree and run lint-imports
    on the copy (the real tree is never touched). lint-imports puts its working directory first on
    sys.path, and PYTHONPATH says the same, so grimp reads the copy rather than the installed
    (editable) packages; the reported chains exist only in the copy, which proves it."""
    for package in ("pipeline", "stages"):
        shutil.copytree(os.path.join(REPO, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "setup.cfg"), tmp_path / "setup.cfg")
    with open(tmp_path / path, "a") as f:
        f.write(f"\n\n{code}\n")

    out = _lint_imports(tmp_path, "--contract", contract, env={"PYTHONPATH": str(tmp_path)})
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    for chain in chains:
        assert chain in text, text
    assert f"{_setup_cfg_contracts()[contract]['name']} BROKEN" in " ".join(text.split()), text


# ---------------------------------------------------------------------------------------------
# URL schemes

STORAGE = os.path.join("stages", "io", "storage.py")
# Modules that parse the web URLs inside documents (data, not storage paths), and may name a scheme.
WEB_URL_PARSERS = {"stages/clean/urls.py",
                   "stages/clean/spacy_rules.py"}    # spaCy's URL match: a URL in the text is one token
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
# Nor does deciding that there is nothing to do need numpy (and pyarrow, which brings it), Luigi or fsspec:
# reading local manifests and the summaries' JSON is all a fully cached run does (`python -m benchmarks
# cached_rerun`; the cache roots here are local, and storage loads fsspec for remote paths and writes).
NOOP = HEAVY + ("numpy", "pyarrow", "luigi", "fsspec")


def _cli(cwd, *argv: str) -> tuple[int, list[str], str]:
    """`python -m pipeline ARGV` in a fresh interpreter: its return code, the heavy libraries it
    imported, and its output. Runs from `cwd` with only the repo on PYTHONPATH, like a user would."""
    code = ("import sys; from pipeline.__main__ import main; "
            f"rc = main({list(argv)!r}); "
            f"print('RC', rc); print('HEAVY', sorted(m for m in {NOOP!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    rc = re.search(r"^RC (-?\d+)$", out.stdout, re.M)
    heavy = re.search(r"^HEAVY (\[.*\])$", out.stdout, re.M)
    assert rc and heavy, text
    return int(rc.group(1)), ast.literal_eval(heavy.group(1)), text


def test_a_noop_cli_invocation_imports_no_heavy_library_numpy_or_luigi(tmp_path):
    """`plan` (no cache yet) loads gin and every stage's Config, and nothing heavy, no numpy, no Luigi."""
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
def test_status_and_a_fully_cached_run_import_no_heavy_library_numpy_or_luigi(tmp_path, cached_root, command):
    """A rerun with nothing to do must stay fast: it reads manifests and prints summaries, and the
    stage modules it touches for that (Config, VERSION, summary) import no heavy library, no numpy and no
    Luigi (with nothing to schedule, the run does not start it)."""
    rc, heavy, text = _cli(tmp_path, command, "--gin", TINY,
                           "--gin-param", f'pipeline.Settings.cache_root="{cached_root}"')
    assert rc == 0, text
    assert heavy == [], f"{command} imported {heavy}:\n{text}"
    # The status table: one row per stage, `name  key[:12]  status  size  wall  path`.
    rows = re.findall(r"^(\w+)\s+[0-9a-f]{12}\s+(\w+)\s", text, re.M)
    assert rows == [(name, "cached") for name in dag.tree().nodes], text
    if command == "run":
        assert "0 stage(s) ran" in text, text
