"""Which code built a cache entry (pipeline/provenance.py): the manifest records the checkout's commit and
the stage's source hash, and `python -m pipeline status` marks an entry built by other code.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/pipeline/test_provenance.py
"""

import ast
import os
import re
import subprocess

import pytest

from pipeline import __main__ as cli
from pipeline import cache, config, dag, provenance
from stages.io import storage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "gin", "tiny.gin")


def _write(cfg, upstream, out_dir, work_dir):
    storage.write_text(storage.join(out_dir, "out.txt"), "x")


def _git(*args, cwd=REPO):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def fresh_checkout(monkeypatch):
    """provenance.checkout, forgotten before and after (it is computed once per process)."""
    provenance.checkout.cache_clear()
    yield
    provenance.checkout.cache_clear()


def test_a_commit_records_the_checkout_and_the_stages_source_outside_the_key(tmp_path):
    key = cache.stage_key("clean", "1", None, {})
    done = cache.run_stage(cache_root=str(tmp_path), stage="clean", key=key, config=None, upstream={},
                           fn=_write)
    code = done.manifest["code"]
    assert code["source"] == provenance.source_hash(provenance.file_hashes("clean"))
    assert "stages/clean/quality.py" in code["files"] and "stages/io/documents.py" in code["files"]
    if os.path.isdir(os.path.join(REPO, ".git")) or os.path.isfile(os.path.join(REPO, ".git")):
        assert code["commit"] == _git("rev-parse", "HEAD")
        assert code["dirty"] == bool(_git("status", "--porcelain", "--untracked-files=no"))
    assert cache.stage_key("clean", "1", None, {}) == key          # nothing of it reaches the key
    # a name that is no stage (a test's) records no source, and commits all the same
    other = cache.run_stage(cache_root=str(tmp_path), stage="a", key="k", config=None, upstream={}, fn=_write)
    assert other.manifest["code"]["source"] is None and other.manifest["code"]["files"] == {}


def test_a_stages_source_is_its_package_and_what_it_imports_from_other_stages():
    clean = provenance.source_files("clean")
    assert "stages/clean/data/banned_words.txt" in clean                 # the stage's own data
    assert "stages/score/table.py" in clean                              # the table it selects over
    assert "stages/yardstick_data/data/aesop_fables.txt" in clean        # read by its contamination index
    assert not any(f.startswith(("pipeline/", "stages/train/")) for f in clean)
    assert "stages/train/tracking.py" not in clean                          # io that clean never imports
    assert "stages/clean/quality.py" in provenance.source_files("score")  # SHARES_CODE: score measures
    shard = provenance.source_files("shard")
    assert {"stages/io/llmc.py", "stages/io/split_rule.py"} <= set(shard)
    assert "stages/tokenizer.py" not in shard                            # it reads the tokenizer's output
    assert provenance.source_root("tokenizer") == "stages/tokenizer.py"
    assert provenance.source_files("tokenizer")[-1] == "stages/tokenizer.py"
    assert "stages/train/model.py" in provenance.source_files("evaluate")
    # train's __init__ imports the planner; evaluate imports train's modules, not that
    assert "stages/train/planning/planner.py" not in provenance.source_files("evaluate")
    assert provenance.source_files("a") == ()


def test_a_stage_table_swapped_and_restored_leaves_no_source_behind(monkeypatch):
    # the pipeline tests run fake stages named "a", "b" under a swapped dag.STAGES: what provenance learns
    # of them then must not outlive the swap (CI ran such a test first on the same worker, and "a" kept a
    # source)
    with monkeypatch.context() as m:
        m.setattr(dag, "STAGES", {"a": ("tests.pipeline.fake_stage", ())})
        assert provenance.source_files("a") == ("stages/io/storage.py", "tests/pipeline/fake_stage.py")
        assert provenance.code("a")["source"]
    assert provenance.source_files("a") == () and provenance.code("a")["source"] is None


def _ast_imports(path: str) -> set[str]:
    """What provenance._imports should find, by parsing: the stages.* modules a file imports anywhere."""
    with open(os.path.join(REPO, path)) as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out |= {f"{node.module}.{a.name}" if provenance._module_file(f"{node.module}.{a.name}")
                    else node.module for a in node.names}
    return {m for m in out if m == "stages" or m.startswith("stages.")}


def test_imports_read_as_text_are_the_ones_ast_finds_in_every_stage_module():
    paths = [os.path.relpath(os.path.join(folder, n), REPO)
             for folder, _, names in os.walk(os.path.join(REPO, "stages")) for n in names
             if n.endswith(".py")]
    assert len(paths) > 100
    differ = {p: (set(provenance._imports(p)), _ast_imports(p)) for p in paths
              if set(provenance._imports(p)) != _ast_imports(p)}
    assert not differ, differ


def test_outside_a_git_checkout_commit_and_dirty_are_none(tmp_path, monkeypatch, fresh_checkout):
    monkeypatch.setattr(provenance, "ROOT", str(tmp_path))                       # no git here
    assert provenance.checkout() == {"commit": None, "dirty": None}
    provenance.checkout.cache_clear()
    _git("init", "-q", str(tmp_path), cwd=tmp_path)
    monkeypatch.setattr(provenance, "ROOT", str(tmp_path / "site-packages"))    # inside another repository
    (tmp_path / "site-packages").mkdir()
    assert provenance.checkout() == {"commit": None, "dirty": None}


def test_a_checkout_with_a_changed_tracked_file_is_dirty(tmp_path, monkeypatch, fresh_checkout):
    _git("init", "-q", str(tmp_path), cwd=tmp_path)
    (tmp_path / "a.py").write_text("A = 1\n")
    _git("add", "a.py", cwd=tmp_path)
    _git("commit", "-q", "-m", "a", cwd=tmp_path)
    head = _git("rev-parse", "HEAD", cwd=tmp_path)
    monkeypatch.setattr(provenance, "ROOT", str(tmp_path))
    monkeypatch.setenv("GIT_DIR", "/nowhere")           # a hook's environment does not redirect it
    (tmp_path / "untracked.py").write_text("")
    assert provenance.checkout() == {"commit": head, "dirty": False}
    provenance.checkout.cache_clear()
    (tmp_path / "a.py").write_text("A = 2\n")
    assert provenance.checkout()["dirty"] is True


def test_compare_says_what_differs():
    now = provenance.code("clean")
    assert provenance.compare({"code": now}, "clean") == ""
    assert provenance.compare({}, "clean") == "code unknown"
    files = dict(now["files"], **{"stages/clean/quality.py": "0" * 16})
    then = {"commit": "abc1234def", "dirty": True, "files": files, "source": provenance.source_hash(files)}
    line = provenance.compare({"code": then}, "clean")
    assert line == (f"built by other code: stages/clean source {then['source'][:8]} then, "
                    f"{now['source'][:8]} now (changed: stages/clean/quality.py); commit abc1234 (dirty)")
    sdist = dict(then, commit=None, dirty=None)
    assert provenance.compare({"code": sdist}, "clean").endswith("; not built from a git checkout")


def test_status_marks_an_entry_built_by_other_code_and_one_built_before_provenance(tmp_path, capsys):
    """Every stage of the tiny plan committed under its real key (a stand-in for each stage), then one
    manifest's recorded source changed as if an older clean had built it, and one's record removed."""
    root = str(tmp_path / "cache")
    plan = config.load([TINY], [f'pipeline.Settings.cache_root="{root}"'])
    for sp in plan.stages.values():
        cache.run_stage(cache_root=root, stage=sp.stage, key=sp.key, config=sp.config, upstream={}, fn=_write)
    path = storage.join(cache.stage_dir(root, "clean", plan.stages["clean"].key), cache.MANIFEST)
    manifest = storage.read_json(path)
    manifest["code"]["files"]["stages/clean/filters.py"] = "1" * 16
    manifest["code"]["source"] = provenance.source_hash(manifest["code"]["files"])
    storage.write_json(path, manifest)
    path = storage.join(cache.stage_dir(root, "tokenizer", plan.stages["tokenizer"].key), cache.MANIFEST)
    storage.write_json(path, {k: v for k, v in storage.read_json(path).items() if k != "code"})

    assert cli.main(["status", "--gin", TINY, "--gin-param", f'pipeline.Settings.cache_root="{root}"']) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(lines) == set(dag.tree().nodes)
    now = provenance.code("clean")["source"][:8]
    assert re.search(rf"cached .*  built by other code: stages/clean source {manifest['code']['source'][:8]} "
                     rf"then, {now} now \(changed: stages/clean/filters.py\)", lines["clean"]), lines["clean"]
    assert lines["tokenizer"].endswith("  code unknown")
    others = [line for name, line in lines.items() if name not in ("clean", "tokenizer")]
    assert not any("code" in line.split("attempt-")[-1] for line in others), others
