"""pipeline/gin_internals.py, the one place that reads gin's private state: it reads a real parse as
gin-config 0.5.0 keeps it, and a gin that keeps it otherwise fails loudly, naming the version and what
changed.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_gin_internals.py

If the first test fails after a gin upgrade, its message names the installed version and the attribute:
adapt `gin_internals.state()` (its docstring says what it relies on and why) before trusting a plan.
"""

import os
import subprocess

import pytest

import gin
from pipeline import config, gin_internals
from pipeline.gin_errors import GIN_DIR
from tests.conftest import REPO

TINY = os.path.join(REPO, "gin", "tiny.gin")


def test_state_reads_the_bindings_and_search_paths_of_a_real_parse():
    """Every kind of binding config.py looks for, through gin's own parser: unscoped, scoped, nested scope,
    a macro, a reference in a scope. What `state()` returns is a copy: changing it leaves gin as it was."""
    config.load([TINY])              # registers every configurable, adds gin/ to the search paths
    gin.parse_config('\n'.join([
        'pipeline.Settings.cache_root = %ROOT',
        'ROOT = "/tmp/r"',
        'code/pipeline.Settings.cache_root = "/tmp/c"',
        'a/b/beam_runner.Runner.name = "DirectRunner"',
        'clean.Config.keep_top = @web/clean.KeepTop()']))
    found = gin_internals.state()
    assert found.bindings[("code", "pipeline.Settings")] == {"cache_root": "/tmp/c"}
    assert found.bindings[("a/b", "beam_runner.Runner")] == {"name": "DirectRunner"}
    assert found.bindings[("ROOT", "gin.macro")] == {"value": "/tmp/r"}
    refs = {(tuple(r.scopes), r.selector) for r in gin.config.iterate_references(found.bindings)}
    assert {(("ROOT",), "gin.macro"), (("web",), "clean.KeepTop")} <= refs, refs
    assert found.search_paths[0] == "" and GIN_DIR in found.search_paths
    found.bindings[("code", "pipeline.Settings")]["cache_root"] = "changed"
    del found.bindings[("a/b", "beam_runner.Runner")]
    again = gin_internals.state()
    assert again.bindings[("code", "pipeline.Settings")] == {"cache_root": "/tmp/c"}
    assert ("a/b", "beam_runner.Runner") in again.bindings
    gin.clear_config()
    assert gin_internals.state().bindings == {}


def test_gin_dir_is_added_to_the_search_paths_once():
    for _ in range(3):
        config.load([TINY])
    assert gin_internals.state().search_paths.count(GIN_DIR) == 1


@pytest.mark.parametrize("name, value, expect", [
    ("_CONFIG", None, "gin.config has no _CONFIG (a dict {(scope, selector): {parameter: value}})"),
    ("_CONFIG", [], "gin.config._CONFIG is a list, not a dict {(scope, selector): {parameter: value}}"),
    ("_CONFIG", {"clean.Config": {"min_chars": 1}}, "gin.config._CONFIG holds 'clean.Config': dict, not"),
    ("_CONFIG", {("", "clean.Config"): ["min_chars"]}, "holds ('', 'clean.Config'): list, not (scope, "),
    ("_LOCATION_PREFIXES", None, "gin.config has no _LOCATION_PREFIXES (a list of path prefixes)"),
    ("_LOCATION_PREFIXES", ("",), "gin.config._LOCATION_PREFIXES is a tuple, not a list of path prefixes"),
    ("_LOCATION_PREFIXES", ["", 3], "gin.config._LOCATION_PREFIXES = ['', 3] is not a list of path prefixes"),
])
def test_a_gin_that_keeps_its_state_otherwise_fails_naming_the_version_and_the_attribute(monkeypatch, name,
                                                                                          value, expect):
    """What a gin upgrade that renames or reshapes either attribute looks like: one RuntimeError naming the
    installed gin version, the attribute and its expected shape, never a plan that lets a stray scope by."""
    if value is None:
        monkeypatch.delattr(gin.config, name)
    else:
        monkeypatch.setattr(gin.config, name, value)
    with pytest.raises(RuntimeError) as e:
        gin_internals.state()
    text = str(e.value)
    assert text.startswith(f"gin-config {gin_internals.gin_version()}: ") and expect in text, text
    assert "pipeline/gin_internals.py" in text and "gin-config==0.5.0" in text, text


def test_no_private_gin_name_outside_gin_internals():
    """The issue's done-when, as a test: `grep -rn "gin\\.config\\._\\|gin\\._" pipeline stages` finds only
    pipeline/gin_internals.py."""
    out = subprocess.run(["grep", "-rl", "--exclude-dir=__pycache__", r"gin\.config\._\|gin\._", "pipeline",
                          "stages"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.stdout.split() == ["pipeline/gin_internals.py"], out.stdout
