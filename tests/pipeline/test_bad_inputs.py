"""More mistakes that are one `error:` line and exit status 2 before any stage runs, nothing written: sweeps,
experts and TPU slices, reference files, download paths and the cache root's stage directories. The table
and its assertion are tests/pipeline/test_bad_config.py's (`Case`, `_case`,
`assert_one_error_line_before_work`); this file holds its own cases so that no two tables are edited at once.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_bad_inputs.py
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline import dag, search_bindings
from stages.download.sources import Files
from stages.train.planning import tpu
from tests.conftest import REPO
from tests.pipeline.test_bad_config import _case, _env, _setup, assert_one_error_line_before_work

BINARY = bytes(range(256)) * 8     # what a reference "text" file holds when it is an image or an archive

CASES = [
    # ---- sweeps: planning built a config per run, so a billion seeds never finished planning
    _case("sweep_seeds_beyond_the_bound",
          [f"sweep: seeds=1000000000 must be an int >= 1 and <= {search_bindings.MAX_SEEDS}",
           "(gin files: {gin};"],
          gin="include 'tiny.gin'\nsweep.variants = {{'a': []}}\nsweep.seeds = 1000000000\n",
          command="sweep"),
    # gin keeps the last of two equal keys, so the first variant was dropped without a word
    _case("sweep_variant_named_twice",
          "{gin} line 4: sweep.variants names 'lr=1e-3' twice (first on line 3); gin would keep the last",
          gin="include 'tiny.gin'\nsweep.variants = {{\n"
              "  'lr=1e-3': ['train.OptimizerConfig.learning_rate = 1e-3'],\n"
              "  'lr=1e-3': ['train.OptimizerConfig.learning_rate = 3e-3'],\n}}\n", command="sweep"),
    _case("sweep_variant_named_twice_in_an_override", "sweep.variants names 'a' twice",
          'sweep.variants={{"a": [], "a": ["train.Config.steps = 2"]}}', command="sweep",
          gin_path="gin/sweeps/lr.gin"),
    # ---- experts: training found this 47 s in, after make plan had said "fits"
    _case("experts_not_splitting_over_the_expert_axis",
          ["ModelConfig.n_experts=6 does not split over the mesh's expert axis of 4",
           "pick n_experts a multiple of 4"], "train.ModelConfig.n_experts=6", "train.MeshConfig.expert=4"),
    _case("plan_with_experts_not_splitting_over_the_expert_axis",
          "ModelConfig.n_experts=6 does not split over the mesh's expert axis of 4",
          "train.ModelConfig.n_experts=6", "train.MeshConfig.expert=2", "train.MeshConfig.dcn_expert=2",
          "train.HardwareConfig.num_slices=2",
          command="plan", args=("--no-compile",)),
    _case("negative_experts", "ModelConfig.n_experts=-4 must be >= 0 (0 = a dense model)",
          "train.ModelConfig.n_experts=-4"),
    # ---- TPU slices: v5p:3x3x3 was planned as 27 chips
    _case("tpu_grid_that_is_no_slice",
          ["topology='v5p:3x3x3' is not a v5p slice", "every side a multiple of 4", "up to 6,144 chips"],
          'train.HardwareConfig.topology="v5p:3x3x3"', command="plan", args=("--no-compile",)),
    _case("tpu_grid_of_the_wrong_rank", "topology='v6e:2x2x2' is not a v6e slice: its grids are 1x1, 2x2",
          'train.HardwareConfig.topology="v6e:2x2x2"'),
    # ---- yardstick reference files: the stage failed on them after the tokenizer had trained
    _case("reference_file_empty",
          "yardsticks: yardsticks.Config.reference_files['c4']: {dir}/ref/empty.txt hold no document with "
          "text (the files are empty)", 'c4/download.Files.paths=["{dir}/ref/empty.txt"]',
          'yardsticks.Config.reference_files={{"c4": @c4/download.Files()}}', files=(("ref/empty.txt", ""),)),
    _case("reference_file_binary",
          ["yardsticks.Config.reference_files['c4']: {dir}/ref/*.jsonl hold no document with text (",
           "record(s) invalid_utf8"], 'c4/download.Files.paths=["{dir}/ref/*.jsonl"]',
          'yardsticks.Config.reference_files={{"c4": @c4/download.Files()}}',
          files=(("ref/val.jsonl", BINARY),)),
    # ---- download.Files paths
    _case("files_path_is_a_directory",
          "download.Files.paths: '{dir}/data' is a directory; name the files in it, e.g. "
          "'{dir}/data/*.jsonl'",
          "download.Config.source=@download.Files()", 'download.Files.paths=["{dir}/data"]',
          files=(("data/a.jsonl", '{{"text": "a"}}\n'),)),
    _case("files_path_in_the_home_of_an_unknown_user",
          "Files.paths: '~no_such_user_xyz/data/*.jsonl': no such user's home directory to expand",
          "download.Config.source=@download.Files()",
          'download.Files.paths=["~no_such_user_xyz/data/*.jsonl"]'),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_input_is_one_error_line_before_anything_runs(case, tmp_path):
    assert_one_error_line_before_work(case, tmp_path)


@pytest.mark.parametrize("command", ["plan", "status", "run"])
def test_a_file_where_a_stage_directory_belongs_is_one_error_line(command, tmp_path):
    """`<cache_root>/export` a regular file: planning read the cache through it (NotADirectoryError)."""
    case = _case("stage_directory_is_a_file", "", command=command,
                 files=(("cache/export", "not a directory"),))
    args, root, _ = _setup(case, tmp_path)
    out = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr[-3000:]
    assert out.stderr == (f"error: {root}/export is a file, not a directory: the cache keeps the export "
                          "stage's outputs there; move the file away, or set pipeline.Settings.cache_root to "
                          "another directory\n")
    assert os.listdir(root) == ["export"]


def test_a_files_path_in_the_home_directory_is_expanded_there(tmp_path, monkeypatch):
    """`~/x` in download.Files.paths is x in the home directory, as cache_root's is ("matches no files" while
    the files existed)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"text": "a"}\n')
    monkeypatch.setenv("HOME", str(tmp_path))
    files = Files(paths=("~/data/*.jsonl",))
    assert files.paths == (f"{tmp_path}/data/*.jsonl",)
    assert list(files.fingerprint()) == [f"{tmp_path}/data/a.jsonl"]
    assert Files(paths=("gs://bucket/~x/*.jsonl",)).paths == ("gs://bucket/~x/*.jsonl",)    # a URL as it is


def test_every_slice_the_planner_searches_is_a_slice_of_its_generation():
    """The planner's list of slices and the rule that refuses a topology are written apart; they agree, and
    each generation's largest listed slice is the largest the rule lets through."""
    for generation, (_, _, grids) in tpu.SLICES.items():
        assert all(tpu.topology_problem(f"{generation}:{g}") == "" for g in grids), generation
        if generation in tpu.TPU_MAX_CHIPS_3D:
            assert tpu.topology_chips(f"{generation}:{grids[-1]}") == \
                tpu.TPU_MAX_CHIPS_3D[generation]
        else:
            assert grids == tpu.TPU_GRIDS_2D
    for bad in ("v5p:3x3x3", "v5p:4x4", "v4:4x4x6", "v4:16x16x32", "v5e:2x8", "v5p:2x2x0"):
        assert tpu.topology_problem(bad), bad


def test_the_table_names_each_case_once():
    assert len({c.name for c in CASES}) == len(CASES)
    assert dag.STAGES        # the stage-directory case covers every stage's directory the same way
