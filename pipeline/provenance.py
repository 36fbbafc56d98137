"""Which code built a cache entry: the checkout's git commit and a hash of the stage's source files.

`cache.run_stage` records `code(stage)` in every commit's manifest (`_SUCCESS.json`, its "code"), and
`python -m pipeline status` (`make status`) compares it with the code of now (`compare`): an entry built by
other code under the same VERSION is marked on its line, one built before manifests recorded code says
"code unknown".

    from pipeline import provenance
    provenance.code("clean")   # {"commit": "a603a9b…", "dirty": False, "source": "3f2a…", "files": {...}}
    provenance.compare(done.manifest, "clean")   # "" when the code is the same, else what differs
    provenance.source_files("score")              # the files whose hash is score's source

None of this is in the cache key, which code reaches only through the hand-bumped VERSION: a key names what
is computed, and a refactor that changes no output must not rebuild anything. The record says which code
did build an entry, so an output that changed without a bump can be found (tests/test_stage_digests.py
guards that for the tiny run; this marks the entries a cache already holds).

The checkout: `git rev-parse HEAD` and whether `git status` shows a tracked file changed, in the directory
that holds `pipeline/` and `stages/`, once per process, with git's optional locks off and no network. Not a
git checkout (an installed sdist or wheel), no git, or a checkout that is some other repository's (a
virtualenv inside another project): commit and dirty are None. Never an error: provenance is a record.

A stage's source is the code of this repository that computes its output, as files:
- every file of the stage's own package (stages/clean/**: its modules and the word lists in data/), or its
  module when the stage is one (stages/tokenizer.py);
- every module under stages/ that those import by name, followed to the end (import statements anywhere in
  a file, a lazy one inside a function too, read as text, never executed), and the data files of each
  package such a module belongs to (stages/yardstick_data/data/, which clean's contamination index reads).
So the code a stage shares with another counts as far as it uses it: score and clean count the score
table, clean's filters and the contamination index (pipeline/dag.py SHARES_CODE), the classifier counts
download's readers, shard counts io's llm.c format and split rule, evaluate counts train's model and loop.
Why imports count: they are code that runs to make the output, and a fix there (the split rule) changes the
bytes as surely as one in the stage's own package. Why only what is imported, by name: a module of io the
stage never imports cannot change its output, nor can a package's `__init__` when only one of its modules
is imported (stages/train/__init__.py holds train's `run` and imports its planner; evaluate imports train's
model, not that); counting them would mark every entry of every stage at each edit of the storage layer or
the planner, and a mark that is always on is read by no one.
Left out: pipeline/ (it decides keys and places, never an output's content; stages never import it), and
third-party libraries, whose versions the manifest records apart ("libraries").
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Mapping
from typing import Any

# The directory that holds pipeline/ and stages/: a checkout's root, or site-packages for an installed copy.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYER = "stages"           # the package whose modules count as a stage's source (pipeline/ never does)
FILE_HASH_CHARS = 16        # per file in the manifest: enough to tell two versions of a file apart
GIT_TIMEOUT_S = 10


def code(stage: str) -> dict[str, Any]:
    """What a manifest records of the code that built `stage` (its "code"): the checkout's commit and
    dirtiness (None when not a git checkout), the stage's source hash and each source file's hash. A name
    that is no stage of pipeline/dag.py (a test's) has no source: None and {}."""
    out: dict[str, Any] = dict(checkout())
    files = file_hashes(stage)
    out["source"] = source_hash(files) if files else None
    out["files"] = files
    return out


def compare(manifest: Mapping[str, Any], stage: str) -> str:
    """"" when `manifest` (a committed entry's) records the source `stage` has now; "code unknown" when it
    records none (committed before manifests recorded code); else one line saying what differs:

        built by other code: stages/clean source 3f2a1b2c then, 9c1d0e4f now (changed:
        stages/clean/quality.py); commit a603a9b (dirty)

    (changed: the files whose hash differs, or that only one side has).
    """
    recorded = manifest.get("code")
    if not isinstance(recorded, Mapping) or not recorded.get("source"):
        return "code unknown"
    now = file_hashes(stage)
    if not now or recorded["source"] == source_hash(now):
        return ""
    then = recorded.get("files") if isinstance(recorded.get("files"), Mapping) else {}
    changed = sorted(p for p in set(then) | set(now) if then.get(p) != now.get(p))
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    commit = recorded.get("commit")
    built = (f"; commit {commit[:7]}{' (dirty)' if recorded.get('dirty') else ''}" if commit
             else "; not built from a git checkout")
    return (f"built by other code: {source_root(stage)} source {recorded['source'][:8]} then, "
            f"{source_hash(now)[:8]} now{f' (changed: {shown})' if changed else ''}{built}")


@functools.cache
def checkout() -> dict[str, Any]:
    """{"commit": HEAD's sha, "dirty": whether a tracked file differs from it}, both None when ROOT is not
    the top of a git checkout (or git is missing or fails)."""
    unknown = {"commit": None, "dirty": None}
    top = _git("rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top.strip()) != os.path.realpath(ROOT):
        return unknown
    head, status = _git("rev-parse", "HEAD"), _git("status", "--porcelain", "--untracked-files=no")
    if head is None or status is None:
        return unknown
    return {"commit": head.strip(), "dirty": bool(status.strip())}


def _git(*args: str) -> str | None:
    """git's stdout in ROOT, or None when it fails. GIT_DIR and the like are dropped from the environment,
    so the answer is about ROOT's checkout, not one a calling hook points at."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        out = subprocess.run(["git", "--no-optional-locks", "-C", ROOT, *args], capture_output=True,
                             text=True, stdin=subprocess.DEVNULL, env=env, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def source_hash(files: Mapping[str, str]) -> str:
    """The hash of a {path: hash} map, sha256 of its canonical JSON: a stage's source (its files' hashes
    here), and an output's digest in tests/stage_digests.py."""
    return hashlib.sha256(json.dumps(dict(sorted(files.items())), separators=(",", ":")).encode()).hexdigest()


def file_hashes(stage: str) -> dict[str, str]:
    """Each of `stage`'s source files (`source_files`), relative to ROOT -> its content's sha256, shortened;
    {} for a name that is no stage."""
    return {rel: _file_hash(rel) for rel in source_files(stage)}


@functools.cache
def _file_hash(rel: str) -> str:
    with open(os.path.join(ROOT, rel), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:FILE_HASH_CHARS]


def source_root(stage: str) -> str:
    """The stage's own package or module, relative to ROOT: "stages/clean", "stages/tokenizer.py"."""
    rel = _module_file(_stage_module(stage))
    return os.path.dirname(rel) if rel.endswith("__init__.py") else rel


def source_files(stage: str) -> tuple[str, ...]:
    """The files of `stage`'s source (see the module docstring), relative to ROOT, sorted; () for a name that
    is no stage of pipeline/dag.py. The stage's module is looked up each call (a test may swap
    dag.STAGES) and its files cached by module."""
    from pipeline import dag

    return _module_source_files(_stage_module(stage)) if stage in dag.STAGES else ()


@functools.cache
def _module_source_files(name: str) -> tuple[str, ...]:
    """The files of the source of the stage whose module is `name` (a package or a module)."""
    rel = _module_file(name)
    if not rel:
        return ()
    files: set[str] = set()
    todo = [name]
    if rel.endswith("__init__.py"):            # the stage's own package: every file in it
        own = os.path.dirname(rel)
        for folder, dirs, names in os.walk(os.path.join(ROOT, own)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for n in names:
                if not n.startswith(".") and not n.endswith((".pyc", ".pyo")):
                    path = os.path.relpath(os.path.join(folder, n), ROOT)
                    files.add(path)
                    if n.endswith(".py"):
                        todo.append(_module_name(path))
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen or not (path := _module_file(module)):
            continue
        seen.add(module)
        files.add(path)
        todo += _imports(path)
        files.update(_package_data(os.path.dirname(path)))
    return tuple(sorted(files))


def _stage_module(stage: str) -> str:
    from pipeline import dag

    return dag.STAGES[stage][0]


def _module_file(dotted: str) -> str:
    """`stages.io.llmc` -> "stages/io/llmc.py", a package -> its __init__.py; "" when neither exists."""
    base = dotted.replace(".", "/")
    for rel in (f"{base}.py", f"{base}/__init__.py"):
        if os.path.isfile(os.path.join(ROOT, rel)):
            return rel
    return ""


def _module_name(rel: str) -> str:
    base = rel[:-len("/__init__.py")] if rel.endswith("/__init__.py") else rel[:-len(".py")]
    return base.replace("/", ".")


# Read as text, not parsed: an import statement at the start of a line (indented too: a lazy import inside a
# function), `from M import a, b` or `from M import (a,\n b)` or `import M`, once triple-quoted strings are
# removed so a docstring's example is not taken for an import. Parsing with `ast` finds the same modules
# (tests/pipeline/test_provenance.py) in about eight times the time (0.4 s against 0.05 s for the 118 files
# under stages/, measured on the 2-core dev machine), which `make status` would pay.
_STRINGS = re.compile(r'("""|\'\'\')[\s\S]*?\1')
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)"
                     r"|import[ \t]+([^\n#;]+))", re.M)


@functools.cache
def _imports(rel: str) -> tuple[str, ...]:
    """The modules under LAYER that the file imports, anywhere in it (a lazy import inside a function
    counts): `from stages.io import llmc` names stages.io.llmc when that is a module, else stages.io."""
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        text = _STRINGS.sub("", f.read())
    out = []
    for m in _IMPORT.finditer(text):
        if m[3]:                                                   # import a.b, c as d
            out += [part.split()[0] for part in m[3].split(",") if part.strip()]
        elif not m[1].startswith("."):                             # from a.b import c, d as e
            names = [part.split()[0] for part in m[2].strip("()").split(",") if part.strip()]
            out += [f"{m[1]}.{n}" if _module_file(f"{m[1]}.{n}") else m[1] for n in names]
    return tuple(m for m in out if m == LAYER or m.startswith(LAYER + "."))


@functools.cache
def _package_data(package_dir: str) -> tuple[str, ...]:
    """The files of a package that are not Python and not in a subpackage: data it ships (word lists)."""
    if not os.path.isfile(os.path.join(ROOT, package_dir, "__init__.py")):
        return ()
    out = []
    for folder, dirs, names in os.walk(os.path.join(ROOT, package_dir)):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")
                   and not os.path.isfile(os.path.join(folder, d, "__init__.py"))]
        out += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names
                if not n.startswith(".") and not n.endswith((".py", ".pyc", ".pyo"))]
    return tuple(out)
