"""The training stage end to end on a synthetic token shard: exact resume after a stop, and the
multi-host path (two processes joined by jax.distributed over gloo) agreeing with one process."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pipeline import cache
from stages import train
from stages.io import llmc, storage
from stages.train.launch import LaunchConfig
from stages.train.model_config import ModelConfig
from stages.train.optimizer_config import OptimizerConfig
from stages.train.stop import TrainingStopped
from tests.conftest import REPO

VOCAB, EOS = 64, 1
CONFIG = train.Config(
    model=ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64,
                      max_seq_len=32, dtype="float32", attention_impl="xla"),
    optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=2),
    steps=10, global_batch=4, seq_len=32, eval_every=5, eval_batches=1, log_every=1, checkpoint_every=3)


def _write_shards(config, upstream, out_dir, work_dir):
    """Documents of a repeating pattern with some noise, separated by EOS: learnable in a few steps."""
    rng = np.random.default_rng(0)
    docs = [np.concatenate([(np.arange(rng.integers(5, 40)) * 3 + rng.integers(2, VOCAB)) % (VOCAB - 2) + 2,
                            [EOS]]) for _ in range(400)]
    tokens = np.concatenate(docs)
    split = len(tokens) * 9 // 10
    storage.makedirs(out_dir)
    llmc.write(storage.join(out_dir, "train-00000.bin"), [tokens[:split]], VOCAB)
    llmc.write(storage.join(out_dir, "val-00000.bin"), [tokens[split:]], VOCAB)
    storage.write_json(storage.join(out_dir, "manifest.json"), {
        "dtype": llmc.dtype_for(VOCAB).name, "vocab_size": VOCAB, "bos_id": -1, "eos_id": EOS})


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache"))
    return cache.run_stage(cache_root=root, stage="shard", key="synthetic", config={}, upstream={},
                           fn=_write_shards)


@pytest.fixture(scope="module")
def whole(tmp_path_factory, shard):
    """CONFIG trained once, uninterrupted, in this process: what the stop, damage, two-process and twin tests
    compare with (each trained it again before)."""
    return _train(str(tmp_path_factory.mktemp("whole")), shard, CONFIG)


def _train(root, shard, cfg, key="k"):
    return cache.run_stage(cache_root=root, stage="train", key=key, config=cfg, upstream={"shard": shard},
                           fn=train.run)


def _rows(committed) -> list[dict]:
    return [json.loads(line) for line in storage.read_text(committed.file("metrics.jsonl")).splitlines()]


def _losses(committed) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _rows(committed)}


@pytest.mark.slow
def test_a_stopped_run_resumes_to_the_same_loss_at_every_step(tmp_path, shard, whole):
    root = str(tmp_path / "b")
    with pytest.raises(TrainingStopped, match="stopped at step 6"):
        _train(root, shard, dataclasses.replace(CONFIG, stop_after=6))
    assert cache.load(root, "train", "k") is None                 # a stopped run is not done
    resumed = _train(root, shard, CONFIG)                         # same key: resumes from step 6
    expected, got = _losses(whole), _losses(resumed)
    assert sorted(expected) == list(range(1, 11))
    assert got == expected     # bitwise: steps 7-10 trained after the resume, 1-6 kept from the stopped run
    summary = storage.read_json(resumed.file("summary.json"))
    assert summary["final_loss"] == storage.read_json(whole.file("summary.json"))["final_loss"]
    assert expected[10] < expected[1] - 0.5                       # and it learned something


@pytest.mark.slow
def test_two_processes_over_gloo_match_one_process(tmp_path, shard, whole):
    one = whole
    two_cfg = dataclasses.replace(CONFIG, launcher=LaunchConfig(kind="local", num_processes=2, timeout_s=300))
    two = _train(str(tmp_path / "two"), shard, two_cfg)
    summary = storage.read_json(two.file("summary.json"))
    assert summary["processes"] == 2 and summary["devices"] == 2
    a, b = _losses(one), _losses(two)
    assert sorted(a) == sorted(b)
    np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=2e-5)


def test_gradient_accumulation_makes_the_update_of_one_big_batch():
    import functools

    import jax
    from flax import nnx

    from stages.train import loop, model, optimizer
    from stages.train.step import train_step

    cfg = dataclasses.replace(CONFIG, optimizer=dataclasses.replace(CONFIG.optimizer, total_steps=10))
    net = model.Transformer(cfg.model, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(net, nnx.Param)
    batch = np.random.default_rng(1).integers(2, VOCAB, (8, 33)).astype(np.int32)
    results = []
    for k in (1, 4):
        c = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, grad_accum_steps=k))
        tx = optimizer.make_optimizer(c.optimizer, params)
        step = jax.jit(functools.partial(train_step, graphdef, tx, **loop.step_options(c, EOS)))
        results.append(step(params, tx.init(params), batch))
    (p1, _, o1), (p4, _, o4) = results
    np.testing.assert_allclose(float(o4["loss"]), float(o1["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(o4["grad_norm"]), float(o1["grad_norm"]), rtol=1e-4)
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=1e-6)


def test_logging_intervals_are_the_first_step_then_every_log_every_and_the_last():
    from stages.train import loop

    assert list(loop.intervals(0, 25, 10)) == [(0, 1), (1, 10), (10, 20), (20, 25)]
    assert list(loop.intervals(6, 10, 1)) == [(6, 7), (7, 8), (8, 9), (9, 10)]        # resumed at step 6
    # A resumed run keeps the grid (its rows are an uninterrupted run's when it resumes at a logging step)
    assert list(loop.intervals(12, 30, 10)) == [(12, 20), (20, 30)]
    assert list(loop.intervals(20, 30, 10)) == [(20, 30)]
    assert list(loop.intervals(30, 30, 10)) == []
    # eval_every need not be a multiple of log_every: each evaluation step ends an interval too (an
    # evaluation runs at the end of an interval), so evaluations land where eval_every says.
    assert list(loop.intervals(0, 50, 10, eval_every=15)) == [(0, 1), (1, 10), (10, 15), (15, 20), (20, 30),
                                                              (30, 40), (40, 45), (45, 50)]
    assert list(loop.intervals(0, 25, 10, eval_every=20)) == list(loop.intervals(0, 25, 10))


@pytest.mark.slow
def test_a_non_finite_loss_never_reaches_a_checkpoint(tmp_path, shard):
    """nan_policy="stop" fails at the first logging step after the loss went NaN, before that step's
    checkpoint: the newest checkpoint is the last good state, the place to resume."""
    blowup = dataclasses.replace(CONFIG, optimizer=dataclasses.replace(CONFIG.optimizer, learning_rate=1e6,
                                                                       clip_norm=0.0),
                                 log_every=3, checkpoint_every=3, nan_policy="stop")
    root = str(tmp_path)
    with pytest.raises(FloatingPointError, match="the loss is"):
        _train(root, shard, blowup)
    from stages.train import checkpoint

    saved = checkpoint.Checkpointer(f"{root}/train/k/work/checkpoints", keep=3, every=3)
    steps = saved.all_steps()
    saved.close()
    rows = [json.loads(line) for line in storage.read_text(f"{root}/train/k/{_attempt(root)}/metrics.jsonl")
            .splitlines()]
    assert all(np.isfinite(r["loss"]) for r in rows)
    last_good = max((r["step"] for r in rows), default=0)
    assert max(steps, default=0) <= last_good          # no checkpoint holds a step past the last good row


def _attempt(root) -> str:
    return next(n for n in storage.listdir(f"{root}/train/k") if n.startswith("attempt-"))


@pytest.mark.slow
def test_a_stopped_multi_process_run_raises_training_stopped(tmp_path, shard):
    """Each worker saves its part of the checkpoint and exits with launch.STOPPED_EXIT_CODE; the launcher
    lets the slower one finish saving, then reports the stop (not a crash), and a rerun resumes."""
    two = LaunchConfig(kind="local", num_processes=2, timeout_s=300)
    root = str(tmp_path)
    with pytest.raises(TrainingStopped, match="all 2 training processes stopped at a checkpoint"):
        _train(root, shard, dataclasses.replace(CONFIG, launcher=two, stop_after=4))
    resumed = _train(root, shard, dataclasses.replace(CONFIG, launcher=two))
    assert sorted(_losses(resumed)) == list(range(1, 11))    # continuous: the rows before the resume kept


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning_and_the_one_before_restored(tmp_path, shard,
                                                                                          whole, caplog):
    root = str(tmp_path / "b")
    with pytest.raises(TrainingStopped, match="stopped at step 7"):
        _train(root, shard, dataclasses.replace(CONFIG, stop_after=7))     # checkpoints at 3, 6 and 7
    newest = f"{root}/train/k/work/checkpoints/7"
    for dirpath, _, files in os.walk(newest):                              # damage every file of step 7
        for name in files:
            with open(os.path.join(dirpath, name), "r+b") as f:
                f.truncate(max(0, os.path.getsize(f.name) // 2))
    with caplog.at_level(logging.INFO, logger="stages.train.loop"):
        resumed = _train(root, shard, CONFIG)
    assert "checkpoint step 7 in" in caplog.text and "cannot be restored" in caplog.text
    assert "resumed from step 6" in caplog.text
    assert _losses(resumed) == _losses(whole)                          # steps 7-10 retrained from 6, bitwise


SIGTERM_SCRIPT = """
import dataclasses, logging, sys
logging.basicConfig(level=logging.INFO)             # the metrics rows are logged: the test reads them
from pipeline import cache
from stages import train
from tests.train import test_loop as t
shard = cache.load(sys.argv[1], "shard", "synthetic")
cfg = dataclasses.replace(t.CONFIG, steps={steps}, log_every={steps}, checkpoint_every={steps}, eval_every=0)
try:
    t._train(sys.argv[2], shard, cfg)
except t.TrainingStopped as e:
    print("STOPPED", e, flush=True)
    sys.exit(75)
print("FINISHED", flush=True)
"""


@pytest.mark.slow
def test_sigterm_stops_training_within_two_steps_whatever_the_intervals_and_the_rerun_resumes(tmp_path,
                                                                                            shard):
    """log_every = checkpoint_every = steps: the loop has no reason to look up from the device until the
    end. SIGTERM right after the first step must still stop it within about two steps (the host stays
    MAX_IN_FLIGHT steps ahead), with a checkpoint, and the rerun continues from there to the same end."""
    steps = 1000
    root = str(tmp_path / "b")
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT.format(steps=steps),
                             shard.path.rsplit("/shard/", 1)[0], root],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))
    for line in proc.stderr:                      # the first step's row: compiled, now stepping
        if f"step 1/{steps}" in line:
            break
    time.sleep(0.5)                               # into the long interval: the old loop had queued all of it
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, out + err
    stopped = int(re.search(r"stopped at step (\d+) \(preempted: SIGTERM\)", out).group(1))
    assert 1 < stopped < steps
    assert cache.load(root, "train", "k") is None
    resumed = _train(root, shard, dataclasses.replace(CONFIG, steps=steps, log_every=steps,
                                                      checkpoint_every=steps, eval_every=0))
    losses = _losses(resumed)
    assert sorted(losses) == [1, steps]       # continuous: the stopped run's row for step 1 kept
    whole = _train(str(tmp_path / "a"), shard, dataclasses.replace(CONFIG, steps=steps, log_every=steps,
                                                                   checkpoint_every=steps, eval_every=0))
    # The last row's loss averages a different interval; its norms are the final step's own: bitwise equal
    # final parameters and last gradient mean the resumed run is the uninterrupted one.
    last = [_rows(c)[-1] for c in (resumed, whole)]
    assert [(r["step"], r["param_norm"], r["grad_norm"]) for r in last] == [(steps, last[1]["param_norm"],
                                                                           last[1]["grad_norm"])] * 2


TWIN_SCRIPT = """
import json, sys
from pipeline import cache
from tests.train import test_loop as t
shard = cache.load(sys.argv[1], "shard", "synthetic")
print("ROWS " + json.dumps(t._rows(t._train(sys.argv[2], shard, t.CONFIG))))
"""
# What a metrics row holds besides the numerics: the clock and rates, which no two runs share.
TIMING = ("time", "compile_and_first_step_s", "tokens_per_s", "step_time_s", "mfu")


def test_two_trainings_of_one_config_give_bitwise_identical_metrics(tmp_path, shard, whole):
    """One config trained here (after whatever else this process ran: another test's jax.config left behind
    would show) and in a fresh process with another hash seed gives the same losses, norms and evaluation
    losses to the last bit. Same machine and CPU count: XLA:CPU splits reductions and a matmul's inner
    dimension over its thread pool, one thread per CPU the process may use, so a machine with another CPU
    count (or instruction set) adds in another order and trains other bits."""
    here = _rows(whole)
    proc = subprocess.run([sys.executable, "-c", TWIN_SCRIPT, shard.path.rsplit("/shard/", 1)[0],
                           str(tmp_path / "there")], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=REPO, PYTHONHASHSEED="12345"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    there = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("ROWS "))[5:])

    def numerics(rows):
        return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    assert len(here) == CONFIG.steps and any("eval_loss" in r for r in here)
    assert numerics(here) == numerics(there)


def test_the_host_never_runs_more_than_max_in_flight_steps_ahead_of_the_device(tmp_path, shard, monkeypatch):
    """What makes a stop prompt: after dispatching step s the loop waits for step s - MAX_IN_FLIGHT + 1."""
    from stages.train import loop

    dispatched, waits = [], []
    real_global_batch, real_wait = loop.sharding.global_batch, loop.wait_for

    def counting_batch(batch, mesh):
        dispatched.append(len(dispatched))
        return real_global_batch(batch, mesh)

    def recording_wait(step, outputs):
        waits.append((dispatched[-1], step))
        return real_wait(step, outputs)

    monkeypatch.setattr(loop.sharding, "global_batch", counting_batch)
    monkeypatch.setattr(loop, "wait_for", recording_wait)
    _train(str(tmp_path), shard, dataclasses.replace(CONFIG, log_every=100, checkpoint_every=100,
                                                     eval_every=0))
    assert dispatched == list(range(CONFIG.steps))
    # intervals [0, 1) and [1, 10): from the interval's second step on, every dispatch waits for the step
    # MAX_IN_FLIGHT - 1 before it
    lead = loop.MAX_IN_FLIGHT - 1
    assert waits == [(s, s - lead) for s in range(1 + lead, CONFIG.steps)]


def test_every_seed_runs_one_init_program_with_the_bits_of_its_own_rngs():
    """The init program takes the seed as an argument (as a constant, each seed of a sweep compiled its own):
    seeds 0 and 7 run one executable, and each gives the bits the program with the seed as a constant gave
    (jitted both: XLA's fused initializers may differ from eager ones in the last bit)."""
    import jax
    from flax import nnx

    from stages.train import loop, sharding
    from stages.train.mesh import MeshConfig
    from stages.train.model import Transformer

    m = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2, mlp_dim=32,
                    max_seq_len=16)
    mesh = sharding.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    _, _, init = loop.init_program(m, OptimizerConfig(total_steps=2, warmup_steps=1), mesh)
    for seed in (0, 7):
        params, _ = init(seed)
        want = jax.jit(lambda s=seed: nnx.split(Transformer(m, rngs=nnx.Rngs(s)), nnx.Param)[1])()
        got, expected = jax.tree.leaves(params), jax.tree.leaves(want)
        assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected)), seed
    assert init._cache_size() == 1
