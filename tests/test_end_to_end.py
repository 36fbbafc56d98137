"""The whole DAG (download -> clean -> tokenizer -> shard -> train -> evaluate) on a small slice of the
embedded corpus with a few training steps, locally and with the cache on a real GCS emulator."""

import glob
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from pipeline import __main__ as cli
from pipeline import cache, config
from stages.io import llmc, storage
from stages.train import hf, model
from tests import tiny_run as tiny
from tests.conftest import REPO
from tests.tiny_run import ALL, SMALL


def _argv(root, *extra):
    return tiny.argv(root, *extra)


def _ran(capsys):
    return tiny.ran(capsys.readouterr().out)


def _check_outputs(root, extra=()):
    params = [f'pipeline.Settings.cache_root = "{root}"', *SMALL, *extra]
    plan = config.load([f"{REPO}/gin/tiny.gin"], params)
    done = {s: cache.load(plan.cache_root, s, sp.key) for s, sp in plan.stages.items()}
    assert all(done.values()), done
    clean_stats = storage.read_json(done["clean"].file("stats.json"))
    assert clean_stats["docs_kept"] > 100
    manifest = storage.read_json(done["shard"].file("manifest.json"))
    train = done["shard"].paths("train-*.bin")
    assert train and done["shard"].paths("val-*.bin")
    with storage.local_files(train[:1]) as (local,):
        tokens = llmc.read(local)
    assert tokens.dtype == np.uint16 and len(tokens) > 0
    assert int(tokens.max()) < manifest["vocab_size"]
    assert (tokens == manifest["eos_id"]).sum() > 0
    rows = [json.loads(line) for line in storage.read_text(done["train"].file("metrics.jsonl")).splitlines()]
    assert len(rows) >= 4 and np.isfinite([r["loss"] for r in rows]).all()
    evaluation = storage.read_json(done["evaluate"].file("eval.json"))
    assert evaluation["loss"] > 0 and evaluation["bits_per_byte"] > 0 and evaluation["tokens"] > 0
    report = storage.read_text(done["evaluate"].file("report.md"))
    assert "unigram" in report.lower()
    assert storage.read_bytes(done["evaluate"].file("loss.png"))[:4] == b"\x89PNG"
    assert storage.read_text(done["evaluate"].file("samples.txt")).strip()
    assert storage.read_json(done["export"].file("config.json"))["architectures"] == ["LlamaForCausalLM"]
    return plan


@pytest.mark.slow
@pytest.mark.optimized      # trains long enough that XLA's optimized code pays (tests/jax_env.py)
def test_data_half_locally_with_reruns_overrides_and_force(tiny_run, tmp_path, capsys):
    assert tiny_run.ran == ALL                # the session's shared run, on a fresh cache of its own
    _check_outputs(tiny_run.root)
    root = str(tmp_path / "cache")
    tiny_run.copy_to(root, tuple(ALL))

    assert cli.main(["run", *_argv(root)]) == 0
    assert _ran(capsys) == []

    lr = "train.OptimizerConfig.learning_rate = 1e-3"
    assert cli.main(["run", *_argv(root, lr)]) == 0
    assert _ran(capsys) == ["train", "evaluate", "export"]
    _check_outputs(root, [lr])

    assert cli.main(["run", "--stage", "shard", *_argv(root, "tokenizer.Config.vocab_size = 700")]) == 0
    assert _ran(capsys) == ["tokenizer", "shard"]

    assert cli.main(["run", "--stage", "tokenizer", "--force", *_argv(root)]) == 0
    assert _ran(capsys) == ["tokenizer", "shard", "yardsticks", "train", "evaluate", "export"]


@pytest.mark.slow
@pytest.mark.optimized      # trains long enough that XLA's optimized code pays (tests/jax_env.py)
def test_a_sweep_shares_upstream_stages_and_compares_its_variants(tiny_run, tmp_path, capsys):
    sweep = tmp_path / "lrs.gin"
    sweep.write_text(f"include '{REPO}/gin/tiny.gin'\n"
                     "sweep.variants = {'slow': ['train.OptimizerConfig.learning_rate = 1e-4'],\n"
                     "                  'fast': ['train.OptimizerConfig.learning_rate = 1e-2']}\n")
    root = str(tmp_path / "cache")
    tiny_run.copy_to(root)      # the data half; the sweep checks that its variants share it
    argv = ["sweep", "--gin", str(sweep), "--gin-param", f'pipeline.Settings.cache_root = "{root}"',
            *[a for p in SMALL for a in ("--gin-param", p)]]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "| slow |" in out and "| fast |" in out
    for stage, runs in [("download", 1), ("shard", 1), ("train", 2), ("evaluate", 2)]:
        assert len(storage.listdir(f"{root}/{stage}")) == runs, stage
    rows = storage.read_json(f"{root}/sweeps/lrs/comparison.json")
    assert set(rows) == {"slow", "fast"} and all(r["loss"] > 0 for r in rows.values())
    assert rows["fast"]["loss"] < rows["slow"]["loss"]          # 12 steps at 1e-4 barely move
    assert storage.read_bytes(f"{root}/sweeps/lrs/comparison.png")[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_two_concurrent_runs_on_one_cache_both_finish_with_one_commit_per_stage(where, tmp_path, request,
                                                                                capsys):
    """Two `python -m pipeline run` started together on one fresh cache: every key is computed once (the
    other run waits on its lease and reuses the commit), both exit 0, and each stage has exactly one
    attempt, the one its manifest names (before leases, a commit deleted the other run's attempt while
    it was being written, and the other run then committed what was left of it).

    Both runs have tokens planted where a run would find real ones (the hub, GCS, AWS, any *_TOKEN): no
    manifest, log, report, spec or checkpoint of what they write, and nothing either prints, holds one (a
    whole DAG of its own once; these runs are one, and the tokens change nothing else they do). A third
    run then finds every stage cached. On GCS the cache starts empty (the whole DAG on GCS, once a test of
    its own); locally it starts with the session's data half, so the two race on train, evaluate and
    export."""
    root = str(tmp_path / "cache")
    if where == "gcs":
        root = f"{request.getfixturevalue('gcs_bucket')}/refinery"
    else:
        request.getfixturevalue("tiny_run").copy_to(root)
    copied = set(storage.sizes(root)) if where == "local" else set()
    secret = "planted-" + "5ecret-" + os.urandom(8).hex()
    env = dict(os.environ, PYTHONPATH=REPO, HF_TOKEN=secret, HUGGING_FACE_HUB_TOKEN=secret,
               GCS_OAUTH_TOKEN=secret, AWS_SECRET_ACCESS_KEY=secret, WANDB_API_KEY=secret,
               REFINERY_TEST_TOKEN=secret)
    argv = [sys.executable, "-m", "pipeline", "run", *_argv(root)]
    procs = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(o[-3000:] for o in outs)
    assert not [o for o in outs if secret in o]
    written = [name for name in storage.sizes(root) if name not in copied]      # every file the two wrote
    assert len(written) > 20 and not [n for n in written if secret.encode() in storage.read_bytes(
        storage.join(root, n))]
    plan = _check_outputs(root)
    ran = [[row.split()[0] for row in out.splitlines() if len(row.split()) > 2 and row.split()[2] == "ran"]
           for out in outs]
    expected = ALL if where == "gcs" else ["train", "evaluate", "export"]
    assert sorted(ran[0] + ran[1]) == sorted(expected), ran              # each stage ran exactly once
    for stage, sp in plan.stages.items():
        key_dir = cache.stage_dir(root, stage, sp.key)
        attempts = [n for n in storage.listdir(key_dir) if n.startswith("attempt-")]
        done = cache.load(root, stage, sp.key)
        assert attempts == [done.manifest["attempt"]], (stage, attempts)
        assert storage.sizes(done.path) == dict(done.files)              # exactly the files it committed
    assert plan.cache_root == root
    capsys.readouterr()
    assert cli.main(["run", *_argv(root)]) == 0
    assert _ran(capsys) == []


def test_the_flagship_config_resolves_and_targets_a_tpu_slice():
    from stages.train import launch

    plan = config.load([f"{REPO}/gin/600b.gin"])
    train = plan.stages["train"].config
    assert 590e9 < model.num_params(train.model) < 610e9
    assert (train.mesh.fsdp, train.mesh.expert, train.mesh.tensor) == (128, 8, 1)
    assert train.mesh.shape(1024) == (1, 128, 8, 1) and train.model.n_experts == 256
    assert train.mesh.device_order == "fsdp:4x4x8,expert:2x2x2"
    cmd = launch.tpu_vm_command(train.launcher, f"{plan.cache_root}/train/k/work/spec.json")
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "YOUR_TPU_SLICE"]
    assert "--worker=all" in cmd


@pytest.fixture(scope="module")
def twins_cache(tmp_path_factory):
    """One cache for every twin: they share their data stages (the embedded corpus, the same settings),
    so the data half runs once and each twin trains and evaluates its own model."""
    return str(tmp_path_factory.mktemp("twins") / "cache")


# Every run file (gin/*.gin but the embedded default, which is its own twin), found by glob: a new run
# file without a twin fails here rather than going untested.
RUN_FILES = sorted(os.path.basename(p)[:-len(".gin")] for p in glob.glob(f"{REPO}/gin/*.gin")
                   if not p.endswith("/tiny.gin"))


def test_every_run_file_has_a_twin():
    assert {"124m", "600b"} <= set(RUN_FILES)
    missing = [f"gin/twins/{name}.gin" for name in RUN_FILES
               if not os.path.exists(f"{REPO}/gin/twins/{name}.gin")]
    assert not missing, f"run files without a tiny twin: {missing}"


@pytest.mark.parametrize("name", ["tiny", *RUN_FILES])
def test_every_run_file_binds_its_vocabulary_once(name):
    """The model file binds the macro VOCAB_SIZE and the run file's tokenizer reads it: the tokenizer the
    run trains is the vocabulary the plan sizes (training itself takes the tokenizer's from the manifest)."""
    plan = config.load([f"{REPO}/gin/{name}.gin"])
    assert plan.stages["tokenizer"].config.vocab_size == plan.stages["train"].config.model.vocab_size
    with open(f"{REPO}/gin/{name}.gin") as f:
        assert "tokenizer.Config.vocab_size = %VOCAB_SIZE" in f.read()


@pytest.mark.parametrize("size", RUN_FILES)
def test_every_twin_keeps_the_structure_of_its_run_file(size):
    """Config only (the twins' runs below check what running shows): the twin keeps the structure that
    makes its run file what it is, at CPU size, and the real run exports exactly when its twin does."""
    twin = config.load([f"{REPO}/gin/twins/{size}.gin"], SMALL).stages["train"].config.model
    real = config.load([f"{REPO}/gin/{size}.gin"]).stages["train"].config.model
    assert (twin.remat, twin.tie_embeddings, twin.rope_scaling) == (real.remat, real.tie_embeddings,
                                                                   real.rope_scaling)
    assert (twin.n_kv_heads < twin.n_heads) == (real.n_kv_heads < real.n_heads)
    assert (bool(twin.n_experts), bool(twin.n_shared_experts), bool(twin.n_dense_layers), twin.router_score) \
        == (bool(real.n_experts), bool(real.n_shared_experts), bool(real.n_dense_layers), real.router_score)
    # Group-limited routing as the real run routes: the twin's token chooses among the experts of its best
    # groups, never takes every one of them (2 groups of 2, top-2 of the best group, chose nothing)
    assert (twin.router_groups > 1) == (real.router_groups > 1)
    for m in (twin, real):
        if m.router_groups > 1:
            assert m.n_experts_per_token < m.n_experts // m.router_groups * m.router_topk_groups, m
    # Every run exports, in the transformers class its twin exports as (Llama; the MoE as GLM-4-MoE)
    assert hf.problem(real) == hf.problem(twin) == "", hf.problem(real) or hf.problem(twin)
    assert hf.architecture(real) == hf.architecture(twin)


@pytest.mark.slow
@pytest.mark.parametrize("size", RUN_FILES)
def test_every_run_file_has_a_tiny_twin_that_runs_the_whole_dag(size, twins_cache, capsys):
    params = [f'pipeline.Settings.cache_root = "{twins_cache}"', *SMALL]
    argv = ["run", "--gin", f"{REPO}/gin/twins/{size}.gin", *[a for p in params for a in ("--gin-param", p)]]
    assert cli.main(argv) == 0
    assert {"train", "evaluate"} <= set(_ran(capsys))
    plan = config.load([f"{REPO}/gin/twins/{size}.gin"], params)
    twin = plan.stages["train"].config.model
    done = cache.load(plan.cache_root, "evaluate", plan.stages["evaluate"].key)
    assert storage.read_json(done.file("eval.json"))["loss"] > 0
    exported = cache.load(plan.cache_root, "export", plan.stages["export"].key)
    if twin.n_experts:       # trained, every expert used
        trained = cache.load(plan.cache_root, "train", plan.stages["train"].key)
        rows = [json.loads(line) for line in storage.read_text(trained.file("metrics.jsonl")).splitlines()]
        assert rows[-1]["loss"] < rows[0]["loss"] and min(rows[-1]["moe/load"]) > 0, rows[-1]
    # Every twin exports, the MoE one too: transformers loads each, no tensor missing or left over
    hf_config = storage.read_json(exported.file("config.json"))
    assert hf_config["architectures"] == [hf.architecture(twin)]
    transformers = pytest.importorskip("transformers")
    _, info = transformers.AutoModelForCausalLM.from_pretrained(exported.path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert (hf_config["num_hidden_layers"], hf_config["tie_word_embeddings"]) == (twin.n_layers,
                                                                                 twin.tie_embeddings)
    assert any(name.endswith(".safetensors") for name in exported.files)


@pytest.mark.slow
def test_status_verify_finds_a_file_rewritten_at_its_size_and_gc_removes_orphans(tiny_run, tmp_path, capsys):
    root = str(tmp_path / "cache")
    tiny_run.copy_to(root, ("download",))
    plan = config.load([f"{REPO}/gin/tiny.gin"], [f'pipeline.Settings.cache_root = "{root}"', *SMALL])
    done = cache.load(root, "download", plan.stages["download"].key)
    capsys.readouterr()
    assert cli.main(["status", "--verify", *_argv(root)]) == 0
    assert "verify: download" in capsys.readouterr().out
    shard = done.paths("docs-*.parquet")[0]
    data = bytearray(storage.read_bytes(shard))
    data[len(data) // 2] ^= 0xFF                                      # one flipped byte, same size
    storage.write_bytes(shard, bytes(data))
    assert cli.main(["status", "--verify", *_argv(root)]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED {shard}: checksum" in out and "the next run that needs it rebuilds it" in out
    assert cache.load(root, "download", plan.stages["download"].key) is None
    key_dir = cache.stage_dir(root, "download", plan.stages["download"].key)
    orphan = f"{key_dir}/attempt-20260101T000000-0rphan00"
    storage.write_text(f"{orphan}/part.txt", "a crashed run's leftovers")
    assert cli.main(["run", "--stage", "download", *_argv(root)]) == 0   # rebuilt; its commit removes both
    assert _ran(capsys) == ["download"] and not storage.exists(orphan)
    storage.write_text(f"{orphan}/part.txt", "left by another crash")
    assert cli.main(["status", "--gc", *_argv(root)]) == 0
    assert f"gc: removing {orphan}" in capsys.readouterr().out and not storage.exists(orphan)
    assert cache.load(root, "download", plan.stages["download"].key) is not None


@pytest.mark.slow
def test_sigterm_during_training_is_one_line_and_exit_75_and_the_rerun_resumes(tiny_run, tmp_path):
    root = str(tmp_path / "cache")
    tiny_run.copy_to(root)
    # long enough that the signal, sent when step 1 is logged, lands in the middle of the run (the loop
    # stops within two steps of it), short enough that the resumed run's rest costs little
    long = ["train.Config.steps = 100", "train.Config.log_every = 100",
            "train.Config.checkpoint_every = 100", "train.Config.eval_every = 0"]
    argv = [sys.executable, "-m", "pipeline", "run", "--stage", "train", *_argv(root, *long)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))
    for line in proc.stderr:
        if "step 1/100" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 75, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped after ") and "train: stopped at step " in last and "preempted" in last
    assert "Traceback" not in err, err[-3000:]
    rerun = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=REPO))
    assert rerun.returncode == 0 and "resumed from step" in rerun.stderr, rerun.stderr[-3000:]
