"""Training through the splash kernel (the one every TPU run's `auto` picks): train steps, then an eval
step, then a stop and a resume, each program jitted anew, on CPU with the Pallas interpreter.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q tests/train/test_splash_training.py

One process traces several programs with the same attention shape: the train step, the eval step, and
after a resume new jitted steps. A splash kernel cached across them (`attention._splash_kernel` was, with
the first trace's tracers in its mask tables) broke the second program: every TPU run died at its first
evaluation.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pipeline import cache
from stages import train
from stages.io import storage
from stages.train import attention as attn
from stages.train.model_config import ModelConfig
from stages.train.optimizer_config import OptimizerConfig
from stages.train.stop import TrainingStopped
from tests.train.test_loop import _write_shards

# The smallest model splash takes: T a multiple of 128, heads of 64 (GQA: 2 query heads per kv head).
# Rows at steps 1 (the first), 2 (an evaluation: eval_every need not be a multiple of log_every), 3 (a
# logging step) and 4 (the last, evaluated).
SPLASH = train.Config(
    model=ModelConfig(vocab_size=64, d_model=128, n_layers=1, n_heads=2, n_kv_heads=1, mlp_dim=64,
                      max_seq_len=128, dtype="float32", attention_impl="splash", attention_block_q=128,
                      attention_block_k=128),
    optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=1),
    steps=4, global_batch=2, seq_len=128, eval_every=2, eval_batches=1, log_every=3, checkpoint_every=2)


@pytest.fixture
def splash_traces(monkeypatch) -> list[tuple[int, ...]]:
    """splash as training calls it, run by the Pallas interpreter (no TPU here); yields the q shape of each
    trace that went through it."""
    traced = []

    def interpreted(q, *args, **kwargs):
        traced.append(q.shape)
        return attn.splash_attention(q, *args, **kwargs, interpret=True)

    monkeypatch.setitem(attn._KERNELS, "splash", interpreted)
    return traced


def _train(root, shard, cfg):
    return cache.run_stage(cache_root=root, stage="train", key="k", config=cfg, upstream={"shard": shard},
                           fn=train.run)


def _rows(committed) -> dict[int, dict]:
    lines = storage.read_text(committed.file("metrics.jsonl")).splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


@pytest.mark.slow
def test_splash_trains_evaluates_and_resumes_across_programs_like_xla(tmp_path, splash_traces):
    root = str(tmp_path / "cache")
    shard = cache.run_stage(cache_root=root, stage="shard", key="synthetic", config={}, upstream={},
                            fn=_write_shards)
    # Steps 1-2, the eval step at 2 (a second program with the train step's attention shape), a checkpoint.
    with pytest.raises(TrainingStopped, match="stopped at step 2"):
        _train(root, shard, dataclasses.replace(SPLASH, stop_after=2))
    # A resume: a new init program and new jitted steps in the same process; steps 3-4, the eval at 4.
    resumed = _rows(_train(root, shard, SPLASH))
    # Splash ran in four programs with one attention shape: train and eval steps, twice (before, after).
    assert len(splash_traces) >= 4 and len(set(splash_traces)) == 1, splash_traces
    xla = _rows(_train(str(tmp_path / "xla"), shard, dataclasses.replace(
        SPLASH, model=dataclasses.replace(SPLASH.model, attention_impl="xla"))))
    assert sorted(resumed) == sorted(xla) == [1, 2, 3, 4]
    for key in ("loss", "eval_loss"):
        steps = [s for s in xla if key in xla[s]]
        assert steps == ([1, 2, 3, 4] if key == "loss" else [2, 4])
        np.testing.assert_allclose([resumed[s][key] for s in steps], [xla[s][key] for s in steps], rtol=1e-4,
                                   err_msg=key)
