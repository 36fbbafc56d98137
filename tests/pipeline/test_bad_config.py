"""Every config problem that can be known before a stage runs is one `error:` line and exit status 2, before
anything runs: a table of wrong gin files, overrides, cache roots and meshes, each run through the CLI.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_bad_config.py

Each case runs `python -m pipeline run` (a few `plan`, `status` or `sweep`) in a subprocess, from the
repository, with a fresh cache root, and checks: exit status 2, nothing on stdout, exactly one line on
stderr that starts with `error: ` and names the problem, and no stage directory under the cache root. None
of them imports JAX or Beam, so each takes well under a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import socket
import subprocess
import sys

import pytest

from pipeline import __main__ as cli
from pipeline import checks, config, dag
from stages.io import storage
from stages.train.planning import hardware
from tests.conftest import REPO

TINY = "gin/tiny.gin"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    expect: tuple[str, ...]           # substrings of the error line; {gin}, {dir}, {root}: the case's paths
    params: tuple[str, ...] = ()      # --gin-param bindings, after the one that sets the fresh cache root
    gin: str | None = None            # the text of a gin file written for the case (else gin/tiny.gin)
    files: tuple[tuple[str, str | bytes], ...] = ()   # more files next to it: (name, text)
    args: tuple[str, ...] = ()        # more CLI arguments
    command: str = "run"
    root: str = "fresh"               # fresh | under_file | is_file | read_only: what the cache root is
    gin_path: str | None = None       # a --gin argument of its own (instead of the written file)


def _case(name, expect, *params, **kw):
    return Case(name, (expect,) if isinstance(expect, str) else tuple(expect), tuple(params), **kw)


def _parquet(columns: dict[str, list]) -> bytes:
    """A small parquet file's bytes (for a case's `files`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), out)
    return out.getvalue().to_pybytes()


CASES = [
    # ---- gin files
    _case("missing_gin_file", "gin file 'gin/nope.gin' does not exist", gin_path="gin/nope.gin"),
    _case("gin_file_is_a_directory", "gin file 'gin' is a directory", gin_path="gin"),
    _case("missing_include",
          ["{gin} line 2: include 'model/tinny.gin' not found", "then in the gin/ directory",
           "Did you mean 'model/tiny.gin'?"],
          gin="include 'tiny.gin'\ninclude 'model/tinny.gin'\n"),
    _case("include_cycle",
          ["include '{dir}/a.gin' makes an include cycle", "({dir}/a.gin -> {dir}/b.gin -> {dir}/a.gin)"],
          gin_path="{dir}/a.gin",
          files=(("a.gin", "include '{dir}/b.gin'\n"),
                 ("b.gin", "include 'tiny.gin'\ninclude '{dir}/a.gin'\n"))),
    _case("unclosed_parenthesis", "{gin} line 3: '(' is never closed",
          gin="include 'tiny.gin'\n\ntrain.Config.steps = (1,\ntrain.Config.seed = 1\n"),
    _case("unclosed_triple_quoted_string", "{gin} line 2: a triple-quoted string is never closed",
          gin="include 'tiny.gin'\nevaluate.Config.prompts = [\'\'\'Once\n"),
    _case("statement_without_equals_in_a_file",
          "{gin} line 2: Couldn't parse statement, expected ':' or '=' (`train.Config.steps 5`)",
          gin="include 'tiny.gin'\ntrain.Config.steps 5\n"),
    _case("gin_file_not_utf8", "gin file {gin} is not UTF-8 text", gin=b"train.Config.steps = 5 # \xff\n"),
    _case("unknown_module_imported", "{gin} line 1: No module named 'no_such_module_xyz'",
          gin="import no_such_module_xyz\n"),
    _case("error_inside_an_included_file",
          ["{dir}/inner.gin line 1: unknown configurable 'train.MeshConfg'", "included from {gin} line 2"],
          gin="include 'tiny.gin'\ninclude '{dir}/inner.gin'\n",
          files=(("inner.gin", "train.MeshConfg.fsdp = 2\n"),)),
    # ---- overrides
    _case("override_without_equals", ["override 'train.Config.steps'", "an override is NAME=VALUE"],
          args=("--overrides", "train.Config.steps")),
    _case("override_bad_literal", "override 'train.Config.steps=1e': Expected newline",
          "train.Config.steps=1e"),
    _case("override_unclosed_bracket", "override 'train.Config.steps=[1,': '[' is never closed",
          "train.Config.steps=[1,", "train.Config.seed=1"),
    _case("override_unquoted_string", "cannot parse the gin value 'bpe'; strings need quotes",
          "tokenizer.Config.model_type=bpe"),
    _case("override_wrong_type", "train.Config.steps = '10' has type str; expected int",
          'train.Config.steps="10"'),
    _case("misspelled_configurable",
          "override 'train.MeshConfg.fsdp=2': unknown configurable 'train.MeshConfg'. Did you mean "
          "train.MeshConfig", "train.MeshConfg.fsdp=2"),
    _case("nonexistent_parameter", "train.Config has no parameter 'stepz'. Did you mean steps?",
          "train.Config.stepz=2"),
    _case("unknown_reference", "unknown configurable 'download.Filez'. Did you mean download.Files",
          "download.Config.source=@download.Filez()"),
    _case("undefined_macro", "macro %STEPS is used but never set", "train.Config.steps=%STEPS"),
    _case("required_left_unset", "tokenizer.Config.vocab_size is %gin.REQUIRED",
          "tokenizer.Config.vocab_size=%gin.REQUIRED"),
    # ---- values the configs reject
    _case("negative_steps", "train.Config: steps=-5 must be >= 1", "train.Config.steps=-5"),
    _case("val_fraction_one", "shard.Config.val_fraction=1.0 is not in [0, 1)",
          "shard.Config.val_fraction=1.0"),
    _case("unknown_remat", "ModelConfig.remat='fuller' is not one of", 'train.ModelConfig.remat="fuller"'),
    _case("unknown_attention_impl", "ModelConfig.attention_impl='flash' is not one of",
          'train.ModelConfig.attention_impl="flash"'),
    _case("unknown_tokenizer_model_type",
          "tokenizer.Config.model_type='wordpiece' is not one of ('bpe', 'unigram')",
          'tokenizer.Config.model_type="wordpiece"'),
    _case("heads_not_dividing_d_model", "n_heads=3 does not divide d_model=128",
          "train.ModelConfig.n_heads=3"),
    _case("zero_shards", "clean.Config: num_shards=0 must be >= 1", "clean.Config.num_shards=0"),
    _case("seq_len_over_model_max", "seq_len=100000 exceeds model.max_seq_len",
          "train.Config.seq_len=100000"),
    _case("unknown_device", "HardwareConfig: device='a100' is not one of",
          'train.HardwareConfig.device="a100"'),
    _case("unknown_launcher", "kind='slurm' is not one of ('inprocess', 'local', 'tpu_vm')",
          'train.LaunchConfig.kind="slurm"'),
    _case("files_glob_matches_nothing", "download.Files.paths: '{dir}/none/*.txt' matches no files",
          "download.Config.source=@download.Files()", 'download.Files.paths=["{dir}/none/*.txt"]'),
    _case("unknown_stage", "unknown stage 'tokeniser'; stages are: download, classifier, score, clean",
          args=("--stage", "tokeniser")),
    _case("placeholders_left",
          ["leaves placeholders to fill in", "train.LaunchConfig.tpu_name = 'YOUR_TPU_SLICE'"],
          gin_path="gin/600b.gin"),
    # ---- the cache root
    _case("unknown_url_scheme",
          ["cannot reach the cache root s4://bucket/x: unknown URL scheme 's4'",
           "expected a local path or gs://bucket/prefix"],
          'pipeline.Settings.cache_root="s4://bucket/x"'),
    _case("empty_cache_root", "cache_root is empty", 'pipeline.Settings.cache_root=""'),
    _case("cache_root_under_a_regular_file",
          "cannot reach the cache root {root}: NotADirectoryError: {dir}/file is a file, not a directory",
          root="under_file"),
    _case("cache_root_is_a_regular_file", "{root} is a file, not a directory", root="is_file",
          command="status"),
    _case("read_only_cache_root", "cannot write to the cache root {root} (Permission denied: {root})",
          root="read_only"),
    # ---- the training mesh against the devices, before the data half runs
    _case("mesh_larger_than_the_one_cpu_device",
          ["train: train.MeshConfig: mesh data=-1 x fsdp=2 x tensor=1 does not match the 1 devices",
           "train.LaunchConfig.kind='inprocess' trains on 1 process(es) x 1 CPU device(s) = 1"],
          "train.MeshConfig.fsdp=2"),
    _case("mesh_larger_than_the_local_processes",
          ["mesh data=-1 x fsdp=1 x tensor=4 does not match the 2 devices", "num_processes=2"],
          'train.LaunchConfig.kind="local"', "train.LaunchConfig.num_processes=2",
          "train.MeshConfig.tensor=4"),
    _case("batch_not_split_by_the_local_processes",
          "train.Config.global_batch=3 does not divide by the 2 training processes",
          'train.LaunchConfig.kind="local"', "train.Config.global_batch=3"),
    _case("mesh_not_tiling_the_chips_named",
          "train: mesh data=-1 x fsdp=3 x tensor=1 does not match the 4 devices",
          "train.HardwareConfig.chips=4", "train.MeshConfig.fsdp=3"),
    _case("plan_with_a_mesh_not_tiling_the_chips", "train: mesh data=-1 x fsdp=3 x tensor=1 does not match",
          "train.HardwareConfig.chips=4", "train.MeshConfig.fsdp=3", command="plan", args=("--no-compile",)),
    _case("sweep_variant_mesh_too_large",
          "sweep variant 'lr=1e-3': train: train.MeshConfig: mesh data=-1 x fsdp=1 x tensor=2 does not "
          "match the 1 devices", "train.MeshConfig.tensor=2", command="sweep", gin_path="gin/sweeps/lr.gin"),
    # ---- the cache root's home, the sweep file's variants
    _case("cache_root_in_the_home_of_an_unknown_user",
          "cache_root='~no_such_user_xyz/x': no such user's home directory to expand '~no_such_user_xyz' to",
          'pipeline.Settings.cache_root="~no_such_user_xyz/x"'),
    _case("sweep_variant_not_a_list",
          ["sweep: variants['a']=3 is not a list of binding strings; write {{'a': [\"train.",
           "(gin files: {gin};"],
          gin="include 'tiny.gin'\nsweep.variants = {{'a': 3}}\n", command="sweep"),
    _case("sweep_variant_binding_not_a_string",
          "sweep: variants['b']=['train.Config.steps = 2', 3] is not a list of binding strings",
          gin="include 'tiny.gin'\nsweep.variants = {{'a': [], 'b': ['train.Config.steps = 2', 3]}}\n",
          command="sweep"),
    _case("sweep_variant_binding_unknown",
          "sweep variant 'a': override 'train.Config.stepz = 2': train.Config has no parameter 'stepz'",
          gin="include 'tiny.gin'\nsweep.variants = {{'a': ['train.Config.stepz = 2']}}\n", command="sweep"),
    # ---- download.Files: what its readers cannot take, found from a listing and one record before it runs
    _case("files_glob_matches_a_directory",
          "download: download.Files.paths: '{dir}/data/*.jsonl' matches the directory {dir}/data/more.jsonl; "
          "match files only, e.g. '{dir}/data/more.jsonl/*.jsonl'",
          "download.Config.source=@download.Files()", 'download.Files.paths=["{dir}/data/*.jsonl"]',
          files=(("data/a.jsonl", '{{"text": "a"}}\n'), ("data/more.jsonl/b.jsonl", '{{"text": "b"}}\n'))),
    _case("files_json_extension",
          ["download.Files.paths: '{dir}/data/*' matches {dir}/data/a.json, an extension no reader takes",
           "a file of one JSON object per line is .jsonl); supported are .jsonl, .jsonl.gz, .txt"],
          "download.Config.source=@download.Files()", 'download.Files.paths=["{dir}/data/*"]',
          files=(("data/a.json", '{{"text": "a"}}\n'),)),
    _case("files_jsonl_without_the_text_field",
          "download: download.Files.text_field='text': the first record of {dir}/data/a.jsonl (line 2) has "
          "no field 'text'; its fields are 'body', 'url'",
          "download.Config.source=@download.Files()", 'download.Files.paths=["{dir}/data/*.jsonl"]',
          files=(("data/a.jsonl", '\n{{"body": "a", "url": "u"}}\n{{"text": "b"}}\n'),)),
    _case("files_parquet_without_the_text_column",
          "download.Files.text_field='text': {dir}/data/a.parquet has no column 'text'; its columns are "
          "['body', 'id']",
          "download.Config.source=@download.Files()", 'download.Files.paths=["{dir}/data/*.parquet"]',
          files=(("data/a.parquet", _parquet({"body": ["a"], "id": ["1"]})),)),
    # ---- the command line
    _case("workers_zero", "--workers 0: the number of Luigi workers must be >= 1", args=("--workers", "0")),
    _case("workers_negative", "--workers -3: the number of Luigi workers must be >= 1",
          args=("--workers", "-3"), command="sweep", gin_path="gin/sweeps/lr.gin"),
    _case("scheduler_not_host_port", "--scheduler 'localhost' is not HOST:PORT",
          args=("--scheduler", "localhost")),
    # Port 1 on loopback: nothing listens there, and the refusal is immediate (Luigi retried for 62 s).
    _case("scheduler_with_no_luigid", ["--scheduler 127.0.0.1:1: no Luigi scheduler answers there",
                                       "or leave --scheduler out"], args=("--scheduler", "127.0.0.1:1")),
    # ---- the hardware named
    _case("topology_of_an_unknown_tpu_generation",
          "HardwareConfig: topology='v9z:2x2x1' names TPU generation 'v9z', not one of ('v4', 'v5e', 'v5p', "
          "'v6e')", 'train.HardwareConfig.topology="v9z:2x2x1"'),
    # ---- how often training logs, checkpoints, evaluates (0 divided step numbers once the data half had run)
    _case("train_log_every_zero",
          "train.Config: log_every=0 must be >= 1 (a metrics row every this many steps)",
          "train.Config.log_every=0"),
    _case("train_checkpoint_every_zero",
          "train.Config: checkpoint_every=0 must be >= 1 (a periodic checkpoint every this many steps)",
          "train.Config.checkpoint_every=0"),
    _case("train_keep_checkpoints_zero",
          "train.Config: keep_checkpoints=0 must be >= 1 (how many of the newest periodic checkpoints stay)",
          "train.Config.keep_checkpoints=0"),
    # (eval_every need not be a multiple of log_every: evaluations land on its multiples, loop.intervals)
    _case("train_seed_negative", "train.Config: seed=-1 must be in [0, 2**31)", "train.Config.seed=-1"),
    _case("train_eval_every_negative", "train.Config: eval_every=-10 must be >= 0 (evaluate every this many "
          "steps and after the last; 0: never)", "train.Config.eval_every=-10"),
]


def _fill(text, **names):
    return text.format(**names) if isinstance(text, str) else text


def _setup(case: Case, tmp_path) -> tuple[list[str], str, dict[str, str]]:
    """The CLI arguments, the cache root and the names the case's strings use."""
    d = tmp_path / "case"
    d.mkdir()
    root = str(d / "cache")
    if case.root in ("under_file", "is_file"):
        (d / "file").write_text("not a directory")
        root = str(d / "file" / "cache") if case.root == "under_file" else str(d / "file")
    elif case.root == "read_only":
        os.mkdir(root)
        os.chmod(root, 0o555)
    names = {"dir": str(d), "root": root, "gin": str(d / "case.gin")}
    for name, text in case.files:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(_fill(text, **names).encode() if isinstance(text, str) else text)
    if case.gin is not None:
        text = _fill(case.gin, **names)
        (d / "case.gin").write_bytes(text.encode() if isinstance(text, str) else text)
    gin = _fill(case.gin_path, **names) if case.gin_path else names["gin"] if case.gin is not None else TINY
    names["gin"] = gin
    args = [case.command, "--gin", gin, "--gin-param", f'pipeline.Settings.cache_root="{root}"']
    for p in case.params:
        args += ["--gin-param", _fill(p, **names)]
    return args + list(case.args), root, names


def _env() -> dict[str, str]:
    # The device count a CPU run sees comes from these: a case must not depend on the caller's.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    return {**env, "JAX_PLATFORMS": "cpu"}


def test_the_table_has_every_kind_of_mistake():
    assert len(CASES) >= 25 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_config_is_one_error_line_before_anything_runs(case, tmp_path):
    assert_one_error_line_before_work(case, tmp_path)


def assert_one_error_line_before_work(case: Case, tmp_path) -> None:
    """Runs `case` through the CLI and checks: exit 2, nothing on stdout, one `error:` line naming the
    problem, no stage directory made. Neighbouring tables (tests/pipeline/test_bad_*.py) call it."""
    if case.root == "read_only" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only (0o555) directory anyway")
    args, root, names = _setup(case, tmp_path)
    # A case the checks miss would start the stages: the time limit ends it instead of the suite.
    out = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert out.stdout == ""
    assert out.stderr.endswith("\n") and out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert out.stderr.startswith("error: "), out.stderr
    for expect in case.expect:
        assert _fill(expect, **names) in out.stderr, out.stderr
    if case.root == "fresh":
        assert not os.path.exists(root), f"{root} was made: {os.listdir(root)}"
    elif os.path.isdir(root):
        ran = [s for s in dag.tree().nodes if os.path.exists(os.path.join(root, s))]
        assert not ran, f"stage directories were made under {root}: {ran}"


# --------------------------------------------------------------------------------------------------------
# The checks behind the table pass what is right, and leave nothing behind


@pytest.mark.parametrize("env, devices", [
    ({}, 1),
    ({"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false --xla_force_host_platform_device_count=8"}, 8),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_NUM_CPU_DEVICES": "4"}, 4),
    ({"JAX_NUM_CPU_DEVICES": "-1", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, 2),
])
def test_the_cpu_devices_of_a_process_are_read_as_jax_reads_them(env, devices):
    assert hardware.cpu_devices_per_process(env) == devices


def test_a_mesh_that_fits_the_simulated_devices_passes():
    cfg = config.load([TINY], ["train.MeshConfig.fsdp=4", 'train.LaunchConfig.kind="local"',
                               "train.LaunchConfig.num_processes=2"]).stages["train"].config
    four = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert hardware.cpu_run_problem(cfg, four) == ""
    assert "does not match the 2 devices" in hardware.cpu_run_problem(cfg, {})
    # Another platform first, or a device that is not the CPU: only the running processes know the count.
    assert hardware.cpu_run_problem(cfg, {"JAX_PLATFORMS": "cuda,cpu"}) == ""


# Every run file and its twin, by glob: a new run file is checked without editing this list.
SHIPPED = sorted(os.path.relpath(p, REPO) for name in glob.glob(f"{REPO}/gin/*.gin")
                 for p in (name, f"{REPO}/gin/twins/{os.path.basename(name)}") if os.path.exists(p))


@pytest.mark.parametrize("gin", SHIPPED)
def test_the_shipped_configs_pass_the_checks_before_a_run(gin, tmp_path):
    root = str(tmp_path / "cache")
    plan = config.load([gin], [f'pipeline.Settings.cache_root="{root}"'])
    args = argparse.Namespace(stage=None, force=False, command="run")
    assert checks.unwritable(plan.cache_root) == ""
    assert checks.cannot_run(plan, ["train", "evaluate"]) == ""
    if "twins" in gin or gin == "gin/tiny.gin":          # offline, their keys (and so the cache) can be read
        assert cli._to_run(plan, args) == list(dag.tree().nodes)
    assert not os.path.exists(root)                    # the write probe made nothing, not even the root


def test_the_write_probe_leaves_an_existing_root_as_it_was(tmp_path):
    (tmp_path / "kept").write_text("x")
    storage.check_writable(str(tmp_path))
    assert os.listdir(tmp_path) == ["kept"]


def test_a_cache_root_in_the_home_directory_is_expanded_there(tmp_path):
    """`~/x` is x in the home directory, as a shell reads it, not a directory `~` where the run starts."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    argv = [sys.executable, "-m", "pipeline", "status", "--gin", f"{REPO}/gin/tiny.gin",
            "--gin-param", 'pipeline.Settings.cache_root="~/refinery"']
    out = subprocess.run(argv, cwd=work, env={**_env(), "HOME": str(home), "PYTHONPATH": REPO},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    paths = [line.split()[-1] for line in out.stdout.splitlines()[1:]]
    assert len(paths) == len(dag.tree().nodes)
    assert all(p.startswith(f"{home}/refinery/") for p in paths), out.stdout
    assert os.listdir(work) == []


def test_a_scheduler_that_accepts_connections_and_one_or_more_workers_pass():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert checks.arguments(1, f"127.0.0.1:{port}") == ""
        assert checks.arguments(4, f":{port}") == ""          # no host: this machine, as Luigi reads it
    assert checks.arguments(1, None) == ""


def test_what_force_reruns_is_one_set_for_the_checks_and_the_tasks():
    assert dag.forced() == []
    assert dag.forced("tokenizer") == ["tokenizer", "shard", "yardsticks", "train", "evaluate", "export"]
    assert dag.forced("train", "clean") == ["clean", "tokenizer", "shard", "yardsticks", "train", "evaluate",
                                            "export"]
    # What the command line forces: --stage, else the first stage (so everything); a sweep forces nothing.
    run = {"stage": "train", "force": True, "command": "run"}
    assert cli._force(argparse.Namespace(**run)) == ["train"]
    assert cli._force(argparse.Namespace(**{**run, "stage": None})) == ["download"]
    assert cli._force(argparse.Namespace(**{**run, "command": "sweep"})) == []
    assert cli._force(argparse.Namespace(**{**run, "force": False})) == []
