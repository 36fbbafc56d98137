"""32K-token training on a CPU: blockwise attention and full remat keep the train step's memory linear in
the sequence length, and a tiny model really trains at T = 32768.

The model is one layer of one head: what these tests are about is the sequence axis (grouped-query
attention's blockwise path is tests/train/test_attention.py's, the layer scan every other training's), and at
T = 32768 each head of each layer is a T^2 / 2 causal score matrix a step computes three times (forward,
remat, backward)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stages import train
from stages.train import loop, sharding
from stages.train.mesh import MeshConfig
from stages.train.model_config import ModelConfig
from stages.train.optimizer_config import OptimizerConfig


def _compiled_step(seq_len: int):
    m = ModelConfig(vocab_size=256, d_model=64, n_layers=1, n_heads=1, n_kv_heads=1, mlp_dim=128,
                    max_seq_len=seq_len, dtype="float32", attention_impl="blockwise", remat="full")
    cfg = train.Config(model=m, optimizer=OptimizerConfig(warmup_steps=1), steps=3, seq_len=seq_len,
                       global_batch=1, loss_chunk=4096)
    mesh = sharding.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    graphdef, tx, init = loop.init_program(m, cfg.optimizer_for_run(), mesh)
    params, opt_state = init(0)
    step, _ = loop.jit_steps(graphdef, tx, loop.step_options(cfg, 1), sharding.shardings_of(params),
                             sharding.shardings_of(opt_state), mesh)
    batch = jax.ShapeDtypeStruct((1, seq_len + 1), jnp.int32, sharding=sharding.batch_sharding(mesh))
    with jax.set_mesh(mesh):
        compiled = step.lower(params, opt_state, batch).compile()
    return compiled, params, opt_state, mesh


def test_the_train_steps_memory_grows_linearly_with_the_context():
    temp = {t: _compiled_step(t)[0].memory_analysis().temp_size_in_bytes for t in (8192, 16384, 32768)}
    # Doubling T doubles the scratch memory (scores materialized whole would quadruple it).
    assert 1.8 < temp[16384] / temp[8192] < 2.2 and 1.8 < temp[32768] / temp[16384] < 2.2, temp


@pytest.mark.slow
@pytest.mark.optimized      # runs long enough that optimized code pays (tests/jax_env.py); its own compile
def test_a_tiny_model_trains_at_32k_tokens():
    compiled, params, opt_state, mesh = _compiled_step(32768)
    tokens = np.random.default_rng(0).integers(2, 256, (1, 32769)).astype(np.int32)
    params, opt_state, out = compiled(params, opt_state, sharding.global_batch(tokens, mesh))
    assert 4.0 < float(out["loss"]) < 7.0                           # ~ln(256): an untrained model, finite
    assert np.isfinite(float(out["grad_norm"])) and float(out["grad_norm"]) > 0
    # The step's learning rate is 0 (warmup starts at 0), but AdamW's first moment took the gradient.
    moments = [np.abs(np.asarray(x)).sum() for x in jax.tree.leaves(opt_state) if np.ndim(x) == 4]
    assert moments and all(m > 0 for m in moments)
