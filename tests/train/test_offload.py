"""Host offload remat policies: on a CPU they run as the policy they are named after, with one warning; for
a TPU slice (compiled ahead of time) XLA moves the saved activations to host memory.

    .venv/bin/python -m pytest tests/train/test_offload.py
"""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pipeline import config
from stages.train import model
from stages.train.model_config import REMAT_NAMES, ModelConfig
from stages.train.planning import aot, memory, planner
from tests.conftest import REPO

TINY = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64, max_seq_len=64,
                   dtype="float32", attention_impl="xla")
OFFLOADS = [name for name in REMAT_NAMES if name.startswith(model.OFFLOAD)]


def _loss_and_grads(cfg, toks):
    graphdef, params = nnx.split(model.Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)

    def loss(p):
        net = nnx.merge(graphdef, p)
        hidden, _ = net(toks[:, :-1])
        logp = jax.nn.log_softmax(net.logits(hidden), axis=-1)                    # (B, T, V)
        return -jnp.take_along_axis(logp, toks[:, 1:, None], axis=-1).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


def test_every_offload_policy_is_named_after_a_policy_that_keeps_the_same_activations():
    assert OFFLOADS == ["offload_full", "offload_minimal", "offload_dots_no_batch"]
    assert all(name.removeprefix(model.OFFLOAD) in REMAT_NAMES for name in OFFLOADS)
    assert set(memory.OFFLOAD_ORDER) == set(OFFLOADS)


def test_on_a_cpu_an_offload_policy_warns_once_and_runs_as_its_namesake(caplog):
    model._warn_no_offload.cache_clear()            # a warning earlier in this process would hide this one
    toks = jax.random.randint(jax.random.PRNGKey(1), (2, 13), 0, TINY.vocab_size, jnp.int32)

    def jaxpr(remat):
        graphdef, params = nnx.split(model.Transformer(dataclasses.replace(TINY, remat=remat),
                                                       rngs=nnx.Rngs(0)), nnx.Param)
        return str(jax.make_jaxpr(lambda p: nnx.merge(graphdef, p)(toks)[0])(params))

    with caplog.at_level(logging.WARNING, logger="stages.train.model"):
        for name in OFFLOADS:
            namesake = name.removeprefix(model.OFFLOAD)
            assert jaxpr(name) == jaxpr(name) == jaxpr(namesake)      # traced twice: the same program
        loss, grads = _loss_and_grads(dataclasses.replace(TINY, remat="offload_full"), toks)
    warnings = [r.getMessage() for r in caplog.records if "cannot offload" in r.getMessage()]
    assert warnings == [f"remat={name!r}: platform 'cpu' cannot offload activations to host memory (only tpu "
                        f"and gpu can); using remat={name.removeprefix(model.OFFLOAD)!r} instead, which "
                        "keeps the same activations in device memory" for name in OFFLOADS]
    ref_loss, ref_grads = _loss_and_grads(TINY, toks)                          # no remat at all
    assert float(ref_loss) > 0
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(g, r, atol=1e-6, rtol=1e-5)


def test_an_unknown_policy_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"remat='offload_none' is not one of \('none', 'full'"):
        model.remat_policy("offload_none")


def test_offloading_for_a_tpu_slice_moves_activations_off_the_device(caplog):
    """The real train step for v5p:2x2x1 (fsdp 4), 32 layers: offload_full compiles, logs no fallback, and
    XLA's device scratch drops below full's by at least what the planner puts in host memory (the layer
    inputs)."""
    def cfg(remat):
        return config.load([f"{REPO}/gin/tiny.gin"], [
            'train.HardwareConfig.device="tpu-v5p"', 'train.HardwareConfig.topology="v5p:2x2x1"',
            'train.ModelConfig.dtype="bfloat16"', "train.ModelConfig.n_layers=32", "train.MeshConfig.fsdp=4",
            f'train.ModelConfig.remat="{remat}"']).stages["train"].config

    model._warn_no_offload.cache_clear()
    with caplog.at_level(logging.WARNING, logger="stages.train.model"):
        offloaded = aot.compile_train_step(cfg("offload_full"))
    kept = aot.compile_train_step(cfg("full"))
    assert not [r for r in caplog.records if "cannot offload" in r.getMessage()]
    host = planner.plan(cfg("offload_full")).host                       # 32 x (4 x 256 tokens) x 128
    assert host == 32 * 4 * 256 * 128 * 2
    assert kept["temp"] - offloaded["temp"] >= host, (kept, offloaded, host)
