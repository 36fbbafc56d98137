"""Where `include` finds a file: beside the file that holds it, then the repository's gin/, never the working
directory; and a gin file may start with a UTF-8 byte-order mark.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_gin_includes.py

Gin's own lookup tried the working directory first, with a reader that takes `data/embedded.gin` for the file
`embedded.gin` of a Python package `data`: a folder named data, model or recipe where a user ran the command
broke every shipped gin file with a TypeError (pipeline/gin_errors.py `includes_beside_their_files`).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline import config, dag
from tests.conftest import REPO

TINY = os.path.join(REPO, "gin", "tiny.gin")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    return {**env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO}


def _status(gin: str, cwd, root) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pipeline", "status", "--gin", gin,
            "--gin-param", f'pipeline.Settings.cache_root="{root}"']
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("gin", ["tiny.gin", "twins/600b.gin"])
def test_folders_named_like_gin_directories_where_the_run_starts_change_nothing(gin, tmp_path):
    """data/, model/ and recipe/ in the working directory, one even holding a gin file of the included name
    with bindings of its own: the shipped files read the repository's, and the keys are the repository's."""
    work = tmp_path / "work"
    for name in ("data", "model", "recipe"):
        (work / name).mkdir(parents=True)
    (work / "data" / "embedded.gin").write_text("clean.Config.min_chars = 12345\n")
    (work / "model" / "base.gin").write_text("this is not gin\n")
    root = tmp_path / "cache"
    out = _status(os.path.join(REPO, "gin", gin), work, root)
    assert out.returncode == 0, out.stderr[-3000:]
    keys = [line.split()[1] for line in out.stdout.splitlines()[1:]]
    plan = config.load([os.path.join(REPO, "gin", gin)], [f'pipeline.Settings.cache_root="{root}"'])
    assert keys == [plan.stages[s].key[:12] for s in dag.tree().nodes]
    assert plan.stages["clean"].config.min_chars != 12345
    assert sorted(os.listdir(work)) == ["data", "model", "recipe"]     # status wrote nothing there


def test_an_include_is_found_beside_the_file_that_holds_it_whatever_the_working_directory(tmp_path):
    """A user's run file includes its own data file by a name relative to itself and tiny.gin from gin/; a
    sibling of the same name in the working directory is not read."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "mine").mkdir(parents=True)
    (elsewhere / "mine").mkdir(parents=True)
    (project / "run.gin").write_text("include 'tiny.gin'\ninclude 'mine/data.gin'\n")
    (project / "mine" / "data.gin").write_text("clean.Config.min_chars = 77\n")
    (elsewhere / "mine" / "data.gin").write_text("clean.Config.min_chars = 99\n")
    cwd = os.getcwd()
    try:
        os.chdir(elsewhere)
        plan = config.load([str(project / "run.gin")])
    finally:
        os.chdir(cwd)
    assert plan.stages["clean"].config.min_chars == 77
    assert plan.stages["train"].config == config.load([TINY]).stages["train"].config


def test_a_missing_include_says_where_it_was_looked_up(tmp_path):
    (tmp_path / "run.gin").write_text("include 'tiny.gin'\ninclude 'mine/data.gin'\n")
    with pytest.raises(config.ConfigError) as e:
        config.load([str(tmp_path / "run.gin")])
    assert str(e.value).startswith(f"{tmp_path}/run.gin line 2: include 'mine/data.gin' not found; includes "
                                   f"are looked up relative to the including file ({tmp_path}), then in the "
                                   f"gin/ directory ({config.GIN_DIR})")


def test_an_include_in_an_override_is_read_from_gin():
    plan = config.load([TINY], ["include 'model/124m.gin'"])
    assert plan.stages["train"].config.model.d_model == 768


def test_a_gin_file_that_starts_with_a_byte_order_mark_is_read_without_it(tmp_path):
    """Editors on Windows save UTF-8 with a BOM; gin saw it as a token ("Unexpected token"). It is skipped,
    in a run file and in a file it includes, and the bindings after it apply."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "inner.gin").write_bytes(bom + b"train.Config.seed = 7\n")
    run = b"include 'tiny.gin'\ninclude 'inner.gin'\ntrain.Config.steps = 40\n"
    (tmp_path / "run.gin").write_bytes(bom + run)
    plan = config.load([str(tmp_path / "run.gin")])
    assert (plan.stages["train"].config.steps, plan.stages["train"].config.seed) == (40, 7)
    # The same config as without the mark: the key does not see it.
    (tmp_path / "plain.gin").write_bytes(run.replace(b"include 'inner.gin'", b"train.Config.seed = 7"))
    assert plan.stages["export"].key == config.load([str(tmp_path / "plain.gin")]).stages["export"].key
