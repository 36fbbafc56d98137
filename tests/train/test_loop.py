"""The training stage end to end on a synthetic token shard: exact resume after a stop, and the
multi-host path (two processes joined by jax.distributed over gloo) agreeing with one process."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pipeline import cache
from stages import train
from stages.io import llmc, storage
from stages.train.configs import ModelConfig, OptimizerConfig
from stages.train.launch import LaunchConfig, TrainingStopped

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


def _train(root, shard, cfg, key="k"):
    return cache.run_stage(cache_root=root, stage="train", key=key, config=cfg, upstream={"shard": shard},
                           fn=train.run)


def _losses(committed) -> dict[int, float]:
    rows = [json.loads(line) for line in storage.read_text(committed.file("metrics.jsonl")).splitlines()]
    return {r["step"]: r["loss"] for r in rows}


@pytest.mark.slow
def test_a_stopped_run_resumes_to_the_same_loss_at_every_step(tmp_path, shard):
    whole = _train(str(tmp_path / "a"), shard, CONFIG)
    root = str(tmp_path / "b")
    with pytest.raises(TrainingStopped, match="stopped at step 6"):
        _train(root, shard, dataclasses.replace(CONFIG, stop_after=6))
    assert cache.load(root, "train", "k") is None                 # a stopped run is not done
    resumed = _train(root, shard, CONFIG)                         # same key: resumes from step 6
    expected, got = _losses(whole), _losses(resumed)
    assert sorted(expected) == list(range(1, 11))
    assert {s: got[s] for s in range(7, 11)} == {s: expected[s] for s in range(7, 11)}   # bitwise
    summary = storage.read_json(resumed.file("summary.json"))
    assert summary["final_loss"] == storage.read_json(whole.file("summary.json"))["final_loss"]
    assert expected[10] < expected[1] - 0.5                       # and it learned something


@pytest.mark.slow
def test_two_processes_over_gloo_match_one_process(tmp_path, shard):
    one = _train(str(tmp_path / "one"), shard, CONFIG)
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

    cfg = dataclasses.replace(CONFIG, optimizer=dataclasses.replace(CONFIG.optimizer, total_steps=10))
    net = model.Transformer(cfg.model, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(net, nnx.Param)
    batch = np.random.default_rng(1).integers(2, VOCAB, (8, 33)).astype(np.int32)
    results = []
    for k in (1, 4):
        c = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, grad_accum_steps=k))
        tx = optimizer.make_optimizer(c.optimizer, params)
        step = jax.jit(functools.partial(loop.train_step, graphdef, tx, **loop.step_options(c, EOS)))
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
    assert list(loop.intervals(12, 30, 10)) == [(12, 13), (13, 20), (20, 30)]
    assert list(loop.intervals(30, 30, 10)) == []


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
    assert sorted(_losses(resumed)) == list(range(5, 11))            # steps after the resume point
