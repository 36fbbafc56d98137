"""The mixture-of-experts block (stages/train/moe.py): equal experts are the dense MLP, dropless and capacity
paths agree when nothing is dropped, the grouped matmuls agree, gradients match a float64 reference, the
balancing loss matches a hand computation, the router bias resumes exactly from a checkpoint, and expert
parallelism on 8 simulated devices trains as one device does, step for step.

    .venv/bin/python -m pytest tests/train/test_moe.py -q
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pipeline import cache
from stages.io import storage
from stages.train import model_config, moe
from stages.train.checkpoint_arrays import CheckpointArrays
from stages.train.model import Transformer, swiglu
from stages.train.model_config import ModelConfig
from stages.train.stop import TrainingStopped
from tests import jax_env
from tests.conftest import run_on_simulated_devices
from tests.tiny_run import REPO, TINY
from tests.train.test_loop import CONFIG, _losses, _rows, _train, shard  # noqa: F401 - shard: a fixture

MOE = ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, mlp_dim=64, max_seq_len=32,
                  dtype="float32", attention_impl="xla", n_experts=8, n_experts_per_token=2, moe_mlp_dim=48,
                  n_dense_layers=1)


def _weights(key, cfg: ModelConfig, same: bool = False) -> moe.ExpertWeights:
    D, E, F = cfg.d_model, cfg.n_experts, cfg.effective_moe_mlp_dim
    k = jax.random.split(key, 5)
    gate, up, down = (0.2 * jax.random.normal(k[i], s) for i, s in
                      ((0, (E, D, F)), (1, (E, D, F)), (2, (E, F, D))))
    if same:
        gate, up, down = (jnp.broadcast_to(a[:1], a.shape) for a in (gate, up, down))
    return moe.ExpertWeights(jax.random.normal(k[3], (D, E)), 0.1 * jax.random.normal(k[4], (E,)), gate, up,
                             down)


def _h(cfg, n=48, seed=1):
    return jax.random.normal(jax.random.key(seed), (2, n // 2, cfg.d_model))


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_experts_holding_the_same_weights_are_the_dense_mlp(score):
    cfg = dataclasses.replace(MOE, router_score=score, router_norm_topk=True)
    w = _weights(jax.random.key(0), cfg, same=True)
    h = _h(cfg)
    y, stats = moe.moe_ffn(cfg, h, w)
    dense = swiglu(h, w.gate[0], w.up[0], w.down[0])
    np.testing.assert_allclose(y, dense, atol=2e-5, rtol=2e-5)
    assert float(stats["dropped"]) == 0.0 and float(stats["load"].sum()) == pytest.approx(1.0)


def test_a_model_whose_experts_are_one_mlp_is_the_dense_model():
    """The whole decoder: a MoE model (every layer MoE, top-2 of 4 identical experts, normalized weights)
    gives the logits of the dense model holding the same attention and MLP weights."""
    cfg = dataclasses.replace(MOE, n_dense_layers=0, n_experts=4, router_norm_topk=True, moe_mlp_dim=64)
    net = Transformer(cfg, rngs=nnx.Rngs(0))
    dense = Transformer(dataclasses.replace(cfg, n_experts=0), rngs=nnx.Rngs(1))
    m = net.moe_layers
    for name in ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm"):
        getattr(dense.layers, name)[...] = getattr(m, name)[...]
    for name, expert in (("w_gate", "experts_gate"), ("w_up", "experts_up"), ("w_down", "experts_down")):
        getattr(dense.layers, name)[...] = getattr(m, expert)[:, 0]
        getattr(m, expert)[...] = jnp.repeat(getattr(m, expert)[:, :1], cfg.n_experts, axis=1)
    for name in ("embed", "final_norm", "unembedding"):
        getattr(dense, name)[...] = getattr(net, name)[...]
    tokens = jax.random.randint(jax.random.key(2), (2, 16), 0, cfg.vocab_size)
    np.testing.assert_allclose(net.logits(net(tokens)[0]), dense.logits(dense(tokens)[0]), atol=1e-4)


@pytest.mark.parametrize("impl", ["tiled", "ragged_dot"])
def test_dropless_and_capacity_paths_agree_when_nothing_is_dropped(impl):
    cfg = dataclasses.replace(MOE, moe_impl=impl)
    w, h = _weights(jax.random.key(0), cfg), _h(cfg)
    dropless, s1 = moe.moe_ffn(cfg, h, w)
    roomy = dataclasses.replace(cfg, moe_capacity_factor=cfg.n_experts / cfg.n_experts_per_token)   # C = n
    with_capacity, s2 = moe.moe_ffn(roomy, h, w)
    np.testing.assert_allclose(dropless, with_capacity, atol=1e-5)
    assert float(s2["dropped"]) == 0.0
    # A tight capacity drops assignments, says how many, and changes the output.
    tight = dataclasses.replace(cfg, moe_capacity_factor=0.5)
    dropped_out, s3 = moe.moe_ffn(tight, h, w)
    assert 0.3 < float(s3["dropped"]) < 0.8
    assert float(jnp.abs(dropped_out - dropless).max()) > 1e-3


def test_the_grouped_matmuls_agree_with_ragged_dot_in_values_and_gradients():
    rng = np.random.default_rng(0)
    for M, E in ((64, 4), (1000, 8), (37, 16)):
        x = jnp.asarray(rng.normal(size=(M, 16)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(E, 16, 24)), jnp.float32)
        sizes = jnp.asarray(rng.multinomial(M - 3, [1 / E] * E), jnp.int32)     # 3 rows in no group: 0
        ref = jax.lax.ragged_dot(x, w, sizes)
        got = moe.grouped_matmul(x, w, sizes, "tiled")
        np.testing.assert_allclose(got, ref, atol=1e-4)
        assert float(jnp.abs(got[-3:]).max()) == 0.0

        def loss(x, w, impl, sizes=sizes):
            return (moe.grouped_matmul(x, w, sizes, impl) ** 2).sum()

        for a, b in zip(jax.grad(loss, (0, 1))(x, w, "tiled"), jax.grad(loss, (0, 1))(x, w, "ragged_dot")):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)
    assert moe.resolve_impl("auto") == "tiled"                     # on this CPU
    with pytest.raises(ValueError, match=r"moe_impl='gmm' is not one of \('auto', 'ragged_dot'"):
        moe.resolve_impl("gmm")
    assert model_config.MOE_IMPLS == moe.GROUPED_MATMULS


def test_the_balancing_loss_and_load_match_a_hand_computation():
    logits = jnp.array([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 1.0, 0.5], [1.0, 0.0, 2.0, 0.0]])
    scores = jax.nn.softmax(logits, -1)
    experts = jnp.array([[0, 1], [1, 2], [2, 0]])
    routing = moe.Routing(experts, jnp.take_along_axis(scores, experts, -1), scores, logits)
    got = moe.balance_terms(routing, 4)
    # By hand: 6 assignments, expert 0 twice, 1 twice, 2 twice, 3 never.
    load = np.array([2, 2, 2, 0]) / 6
    p = np.asarray(scores).mean(0)
    np.testing.assert_allclose(got["load"], load, rtol=1e-6)
    assert float(got["aux"]) == pytest.approx(4 * float((load * p).sum()), rel=1e-6)
    lse = np.log(np.exp(np.asarray(logits)).sum(-1))
    assert float(got["z"]) == pytest.approx(float((lse ** 2).mean()), rel=1e-6)
    # Perfect balance gives exactly 1.
    flat = moe.Routing(jnp.array([[0, 1], [2, 3]]), jnp.ones((2, 2)) / 4, jnp.ones((2, 4)) / 4,
                       jnp.zeros((2, 4)))
    assert float(moe.balance_terms(flat, 4)["aux"]) == pytest.approx(1.0)
    # The bias step: underloaded experts up, overloaded down.
    np.testing.assert_allclose(moe.bias_update(jnp.zeros(4), jnp.asarray(load), 0.01),
                               [-0.01, -0.01, -0.01, 0.01])


def test_the_sequence_wise_balancing_loss_matches_deepseek_v3s_formula_by_hand():
    """DeepSeek-V3 (eq. 17-20): per sequence, f_i = E / (k T) x the times expert i is chosen, P_i = the mean
    over its T tokens of i's score normalized over experts, loss = sum_i f_i P_i; here averaged over the
    sequences. Two sequences of 3 tokens, each balanced over the batch but not within itself."""
    rng = np.random.default_rng(0)
    experts = jnp.array([[0, 1], [0, 1], [0, 1], [2, 3], [2, 3], [2, 3]])
    chosen = np.zeros((6, 4))
    np.put_along_axis(chosen, np.asarray(experts), 2.0, axis=1)             # a router scores what it chose
    logits = jnp.asarray(chosen + rng.normal(size=(6, 4)) * 0.3, jnp.float32)
    scores = jax.nn.sigmoid(logits)
    routing = moe.Routing(experts, jnp.take_along_axis(scores, experts, -1), scores, logits)
    got = moe.balance_terms(routing, 4, seq_len=3)
    s = np.asarray(scores) / np.asarray(scores).sum(-1, keepdims=True)
    by_hand = []
    for seq in (slice(0, 3), slice(3, 6)):
        f = np.zeros(4)
        for row in np.asarray(experts)[seq]:
            f[row] += 4 / (2 * 3)
        by_hand.append((f * s[seq].mean(0)).sum())
    assert float(got["aux"]) == pytest.approx(np.mean(by_hand), rel=1e-6)
    # Batch-wise, the same routing is perfectly balanced (every expert a quarter of the assignments), so the
    # batch loss is the plain mean score: the sequence-wise one sees the lopsided sequences.
    batch = moe.balance_terms(routing, 4)
    np.testing.assert_allclose(batch["load"], [0.25] * 4)
    assert float(got["aux"]) > 1.2 * float(batch["aux"]) and float(batch["aux"]) == pytest.approx(1.0)


def test_the_sequence_wise_loss_is_summed_over_layers_and_the_batch_one_averaged():
    """alpha weighs each MoE layer's sequence-wise loss (DeepSeek-V3), where the batch-wise loss is one mean:
    with 2 MoE layers the differentiated loss grows by alpha x (aux_1 + aux_2), against alpha x their mean."""
    from stages.train.step import forward_loss

    base = dataclasses.replace(MOE, moe_aux_loss=0.5, moe_router_z_loss=0.0)          # 2 MoE layers of 3
    batch = jax.random.randint(jax.random.key(1), (2, 17), 3, base.vocab_size)
    for scope in ("batch", "sequence"):
        graphdef, params = nnx.split(Transformer(dataclasses.replace(base, moe_aux_scope=scope),
                                                 rngs=nnx.Rngs(0)))
        out = forward_loss(graphdef, params, batch, eos_id=2, loss_chunk=64, z_loss=0.0)
        plain, _ = nnx.split(Transformer(dataclasses.replace(base, moe_aux_scope=scope, moe_aux_loss=0.0),
                                         rngs=nnx.Rngs(0)))
        without = forward_loss(plain, params, batch, eos_id=2, loss_chunk=64, z_loss=0.0)
        added = float(out["loss_with_z"] - without["loss_with_z"])
        layers = 2 if scope == "sequence" else 1
        assert added == pytest.approx(0.5 * float(out["moe/aux_loss"]) * layers, rel=1e-4), scope


def test_the_routed_scaling_factor_scales_the_routed_experts_output_only():
    cfg = dataclasses.replace(MOE, router_norm_topk=True)
    w = _weights(jax.random.key(5), cfg)
    h = _h(cfg)
    one, _ = moe.moe_ffn(cfg, h, w)
    scaled, _ = moe.moe_ffn(dataclasses.replace(cfg, router_scale=2.5), h, w)
    np.testing.assert_allclose(np.asarray(scaled, np.float32), 2.5 * np.asarray(one, np.float32), rtol=2e-2,
                               atol=1e-3)
    routing = moe.route(dataclasses.replace(cfg, router_scale=2.5), h.reshape(-1, cfg.d_model), w.router,
                        w.bias)
    np.testing.assert_allclose(np.asarray(routing.weights).sum(-1), 2.5, rtol=1e-5)   # normalized, then x2.5
    with pytest.raises(ValueError, match=r"router_scale=0.0 must be > 0"):
        dataclasses.replace(cfg, router_scale=0.0)


def test_the_worst_sequences_dropped_share_is_measured_beside_the_batchs():
    """Capacity is a device's: 2 sequences of 4 tokens, top-1 of 4 experts at capacity factor 1 (C = 2 rows
    an expert). Sequence A sends all 4 tokens to expert 0, B one to each: expert 0 gets 5, keeps A's first
    2. A loses 2 of 4 (50%), B its token to expert 0 (25%): the batch 3 of 8, the worst sequence half."""
    cfg = ModelConfig(vocab_size=16, d_model=4, n_layers=2, n_heads=1, n_kv_heads=1, max_seq_len=8,
                      dtype="float32", n_experts=4, n_experts_per_token=1, moe_mlp_dim=8,
                      moe_capacity_factor=1.0, n_dense_layers=1)
    eye = jnp.eye(4, dtype=jnp.float32)
    x = jnp.concatenate([jnp.tile(eye[:1], (4, 1)), eye]) * 5.0                  # (8, 4): A then B
    w = moe.ExpertWeights(eye, jnp.zeros(4), jnp.ones((4, 4, 8)), jnp.ones((4, 4, 8)), jnp.ones((4, 8, 4)))
    _, stats = moe._local(cfg, x, w, jnp.float32, batch_axes=(), expert_axis=None, seq_len=4)
    assert float(stats["dropped"]) == pytest.approx(3 / 8)
    assert float(stats["dropped_worst"]) == pytest.approx(0.5)


def test_a_full_buffer_drops_its_experts_lowest_scored_assignments_not_the_last_tokens():
    """8 tokens all route to expert 0 (top-1 of 4, capacity factor 1: C = 2 rows), their affinity to it
    rising with their position: the buffer keeps the last two, the ones expert 0 scored highest. In token
    order it kept the first two, and a device's last sequences lost everything to a popular expert."""
    cfg = ModelConfig(vocab_size=16, d_model=4, n_layers=2, n_heads=1, n_kv_heads=1, max_seq_len=8,
                      dtype="float32", n_experts=4, n_experts_per_token=1, moe_mlp_dim=8,
                      moe_capacity_factor=1.0, n_dense_layers=1)
    eye = jnp.eye(4, dtype=jnp.float32)
    x = eye[0] * jnp.arange(1.0, 9.0)[:, None]                                   # (8, 4): e0 x 1 .. 8
    routing = moe.route(cfg, x, eye, jnp.zeros(4))
    assert (routing.experts == 0).all()
    ones = jnp.ones((4, 4, 8))
    _, kept = moe._with_capacity(cfg, x, routing, ones, ones, jnp.ones((4, 8, 4)), None, None)
    assert kept[:, 0].tolist() == [0, 0, 0, 0, 0, 0, 1, 1]


def test_group_limited_routing_draws_a_tokens_experts_from_its_best_groups():
    cfg = dataclasses.replace(MOE, n_experts=8, n_experts_per_token=2, router_groups=4, router_topk_groups=1)
    w = _weights(jax.random.key(3), cfg)
    routing = moe.route(cfg, _h(cfg).reshape(-1, cfg.d_model), w.router, w.bias)
    groups = np.asarray(routing.experts) // 2
    assert (groups[:, 0] == groups[:, 1]).all()                   # both experts from the one best group
    free = moe.route(dataclasses.replace(cfg, router_groups=1), _h(cfg).reshape(-1, cfg.d_model), w.router,
                     w.bias)
    assert (np.asarray(free.experts) // 2)[:, 0].tolist() != (np.asarray(free.experts) // 2)[:, 1].tolist()


X64_SCRIPT = textwrap.dedent("""
    import dataclasses, json
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from stages.train import moe
    from stages.train.model_config import ModelConfig

    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2, dtype="float32",
                      n_experts=6, n_experts_per_token=2, moe_mlp_dim=24, router_score="sigmoid",
                      router_norm_topk=True)
    k = jax.random.split(jax.random.key(0), 6)
    D, E, F = 16, 6, 24
    w64 = moe.ExpertWeights(jax.random.normal(k[0], (D, E), jnp.float64),
                            0.1 * jax.random.normal(k[1], (E,), jnp.float64),
                            0.3 * jax.random.normal(k[2], (E, D, F), jnp.float64),
                            0.3 * jax.random.normal(k[3], (E, D, F), jnp.float64),
                            0.3 * jax.random.normal(k[4], (E, F, D), jnp.float64))
    h64 = jax.random.normal(k[5], (2, 20, D), jnp.float64)

    def reference(h, w):        # every token through every expert, masked by its top-k weights (float64)
        x = h.reshape(-1, D)
        r = moe.route(cfg, x, w.router, w.bias)
        mask = jnp.zeros((x.shape[0], E)).at[jnp.arange(x.shape[0])[:, None], r.experts].set(r.weights)
        act = jax.nn.silu(jnp.einsum("nd,edf->nef", x, w.gate)) * jnp.einsum("nd,edf->nef", x, w.up)
        y = jnp.einsum("nef,efd,ne->nd", act, w.down, mask)
        return (y ** 2).sum()

    def ours(cfg):
        def f(h, w):
            return (moe.moe_ffn(cfg, h, w)[0].astype(jnp.float32) ** 2).sum()
        return f

    ref = jax.grad(reference, (0, 1))(h64, w64)
    to32 = lambda t: jax.tree.map(lambda a: a.astype(jnp.float32), t)
    out = {}
    for name, c in (("tiled", cfg), ("ragged_dot", dataclasses.replace(cfg, moe_impl="ragged_dot")),
                    ("capacity", dataclasses.replace(cfg, moe_capacity_factor=3.0))):
        got = jax.grad(ours(c), (0, 1))(to32(h64), to32(w64))
        errs = [float(jnp.abs(a.astype(jnp.float64) - b).max() / (jnp.abs(b).max() + 1e-30))
                for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref))]
        out[name] = errs
    out["router_grad"] = float(jnp.abs(ref[1].router).max())
    out["bias_grad"] = float(jnp.abs(ref[1].bias).max())
    print("RESULT " + json.dumps(out))
""")


def test_gradients_match_a_float64_reference():
    r = run_on_simulated_devices(X64_SCRIPT, devices=1, timeout=300)
    assert r["router_grad"] > 1e-3 and r["bias_grad"] == 0.0       # the router learns; the bias only selects
    for name in ("tiled", "ragged_dot", "capacity"):
        assert max(r[name]) < 1e-5, (name, r[name])


@pytest.mark.parametrize("path", [{"moe_impl": "tiled"}, {"moe_capacity_factor": 1.25}])
def test_the_backward_pass_keeps_no_copy_of_the_routed_rows_or_of_the_expert_weights_per_tile(path):
    """The tokens move by gathers (their gradients read only indices), so no boolean mask and no copy of
    the n * k assignments' rows is saved for the backward pass; the tiled matmul slices each tile's weight
    again rather than saving a stack of (D, F) slices."""
    cfg = dataclasses.replace(MOE, **path)
    w, h = _weights(jax.random.key(0), cfg), _h(cfg, n=256)
    n, k, D = 256, cfg.n_experts_per_token, cfg.d_model
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        jax.ad_checkpoint.print_saved_residuals(lambda h, w: moe.moe_ffn(cfg, h, w)[0].sum(), h, w)
    saved = [(dtype, tuple(int(d) for d in dims.split(",") if d))     # "bf16[8192,768] output of ..."
             for dtype, dims in re.findall(r"^(\w+)\[([\d,]*)\]", printed.getvalue(), re.M)]
    assert saved and not [s for s in saved if s[0] == "bool"], saved
    assert (cfg.n_experts, D, cfg.effective_moe_mlp_dim) in [s[1] for s in saved]    # the weights, once
    assert not [s for s in saved if len(s[1]) == 3 and s[1][1:] in ((D, cfg.effective_moe_mlp_dim),
                                                                  (cfg.effective_moe_mlp_dim, D))
                and s[1][0] != cfg.n_experts], saved
    assert (n * k, D) not in [s[1] for s in saved], saved


# ------------------------------------------------------------------------------------ training end to end

MOE_TRAIN = dataclasses.replace(
    CONFIG, model=dataclasses.replace(MOE, n_experts=4, moe_bias_update_rate=1e-2, moe_aux_loss=1e-2,
                                      moe_router_z_loss=1e-3, router_score="sigmoid", router_norm_topk=True))


@pytest.mark.slow
def test_a_stopped_moe_run_resumes_the_router_bias_exactly(tmp_path, shard):  # noqa: F811
    whole = _train(str(tmp_path / "a"), shard, MOE_TRAIN)
    root = str(tmp_path / "b")
    with pytest.raises(TrainingStopped, match="stopped at step 6"):
        _train(root, shard, dataclasses.replace(MOE_TRAIN, stop_after=6))
    resumed = _train(root, shard, MOE_TRAIN)
    assert _losses(resumed) == _losses(whole)
    bias = [CheckpointArrays(storage.join(c.path, "checkpoint")).read("moe_layers.router_bias")
            for c in (whole, resumed)]
    np.testing.assert_array_equal(bias[0], bias[1])
    # Ten steps of -0.01, 0 or +0.01 each (the optimizer never touched it): multiples of the rate, not all 0.
    assert np.abs(bias[0]).max() > 0 and np.allclose(np.round(bias[0] / 0.01), bias[0] / 0.01, atol=1e-4)
    rows = _rows(whole)
    last = rows[-1]
    assert len(last["moe/load"]) == 4 and sum(last["moe/load"]) == pytest.approx(1.0, abs=1e-4)
    assert 1.0 <= last["moe/max_load"] <= 4.0 and last["moe/dropped"] == 0.0
    assert last["moe/aux_loss"] > 0.5 and last["moe/router_z_loss"] > 0
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5                  # it learns


EP_SCRIPT = textwrap.dedent("""
    import dataclasses, json
    import jax, jax.numpy as jnp, numpy as np
    from stages.train import loop, sharding
    from stages.train.mesh import MeshConfig
    from stages.train.model_config import ModelConfig
    from stages.train.optimizer_config import OptimizerConfig

    mcfg = ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, mlp_dim=64,
                       max_seq_len=32, dtype="float32", attention_impl="xla", n_experts=8,
                       n_experts_per_token=2, moe_mlp_dim=48, n_dense_layers=1, n_shared_experts=1,
                       router_score="sigmoid", router_norm_topk=True, moe_aux_loss=1e-2,
                       moe_router_z_loss=1e-3, moe_bias_update_rate=1e-2, remat="full")
    ocfg = OptimizerConfig(learning_rate=1e-2, warmup_steps=2, total_steps=4)
    options = {"eos_id": 1, "loss_chunk": 64, "z_loss": 0.0, "grad_accum_steps": 1, "skip_nonfinite": False,
               "bias_rate": mcfg.moe_bias_update_rate}
    rng = np.random.default_rng(0)
    batches = [rng.integers(2, 64, size=(8, 33)).astype(np.int32) for _ in range(4)]

    def run(mesh_cfg, devices, mcfg=mcfg):
        mesh = sharding.make_mesh(mesh_cfg, devices=devices)
        graphdef, tx, init = loop.init_program(mcfg, ocfg, mesh)
        params, opt = init(0)
        step, _ = loop.jit_steps(graphdef, tx, options, sharding.shardings_of(params),
                                 sharding.shardings_of(opt), mesh)
        losses, loads = [], []
        with jax.set_mesh(mesh):
            for b in batches:
                params, opt, out = step(params, opt, sharding.global_batch(b, mesh))
                losses.append(float(out["loss"]))
                loads.append(np.asarray(out["moe/load"]).tolist())
        spec = params["moe_layers"]["experts_gate"][...].sharding.spec
        return losses, loads, jax.device_get(params), [str(a) for a in spec]

    one = run(MeshConfig(), jax.devices()[:1])
    out = {"one": one[0], "spec": None}
    sp = dataclasses.replace(mcfg, sequence_parallel=True)
    for name, m, c in (("expert4_fsdp2", MeshConfig(expert=4, fsdp=2), mcfg),
                       ("expert2_fsdp2_tensor2", MeshConfig(expert=2, fsdp=2, tensor=2), mcfg),
                       ("expert2_fsdp2_tensor2_sp", MeshConfig(expert=2, fsdp=2, tensor=2), sp)):
        got = run(m, jax.devices(), c)
        diffs = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), got[2], one[2])
        out[name] = {"losses": got[0], "max_param_diff": max(jax.tree.leaves(diffs)), "spec": got[3],
                     "load_diff": float(np.abs(np.asarray(got[1]) - np.asarray(one[1])).max())}
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_expert_parallel_training_on_8_devices_equals_one_device_step_for_step():
    """And with the tensor axis and sequence parallelism (the residual stream split over tensor)."""
    r = run_on_simulated_devices(EP_SCRIPT, devices=8, timeout=600)
    for name in ("expert4_fsdp2", "expert2_fsdp2_tensor2", "expert2_fsdp2_tensor2_sp"):
        got = r[name]
        np.testing.assert_allclose(got["losses"], r["one"], rtol=2e-5)
        assert got["max_param_diff"] < 2e-5 and got["load_diff"] < 1e-6, (name, got)
    assert r["expert4_fsdp2"]["spec"][:3] == ["None", "expert", "fsdp"]      # (L, E, D, F): experts split
    assert r["one"][-1] < r["one"][0]


def test_the_report_plots_expert_balance_for_a_mixture_of_experts_only(tmp_path):
    from stages.evaluate import report

    rows = [{"step": s, "loss": 3.0 - s / 10, "moe/max_load": 2.0 - s / 10, "moe/aux_loss": 1.2,
             "moe/dropped": 0.0, "moe/load": [0.4, 0.3, 0.2, 0.1]} for s in (1, 5, 10)]
    assert report.moe_plot(rows, str(tmp_path)) == ["moe.png"]
    assert (tmp_path / "moe.png").read_bytes()[:4] == b"\x89PNG"
    assert report.moe_plot([{"step": 1, "loss": 3.0}], str(tmp_path / "dense")) == []


def test_the_layer_loop_equals_the_scan_and_accumulated_micro_batches_move_the_bias():
    from stages.train import loop, sharding
    from stages.train.mesh import MeshConfig
    from stages.train.optimizer_config import OptimizerConfig

    cfg = dataclasses.replace(MOE, n_shared_experts=1, moe_bias_update_rate=0.01)
    tokens = jax.random.randint(jax.random.key(4), (2, 16), 0, cfg.vocab_size)
    scanned = Transformer(cfg, rngs=nnx.Rngs(0))
    looped = Transformer(dataclasses.replace(cfg, scan_layers=False), rngs=nnx.Rngs(0))
    (a, _, sa), (b, _, sb) = scanned(tokens, with_moe_stats=True), looped(tokens, with_moe_stats=True)
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(sa["load"], sb["load"], atol=1e-6)
    assert sa["load"].shape == (cfg.n_moe_layers, cfg.n_experts)

    mesh = sharding.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    ocfg = OptimizerConfig(learning_rate=1e-2, warmup_steps=1, total_steps=2, grad_accum_steps=2)
    graphdef, tx, init = loop.init_program(cfg, ocfg, mesh)
    params, opt = init(0)
    options = {"eos_id": 1, "loss_chunk": 64, "z_loss": 0.0, "grad_accum_steps": 2, "skip_nonfinite": True,
               "bias_rate": 0.01}
    step, _ = loop.jit_steps(graphdef, tx, options, sharding.shardings_of(params), sharding.shardings_of(opt),
                             mesh)
    batch = np.asarray(jax.random.randint(jax.random.key(5), (4, 17), 2, cfg.vocab_size), np.int32)
    with jax.set_mesh(mesh):
        new, _, out = step(params, opt, sharding.global_batch(batch, mesh))
    bias = np.asarray(new["moe_layers"]["router_bias"][...])
    assert out["moe/load"].shape == (cfg.n_moe_layers, cfg.n_experts)
    # One bias step after the two micro-batches' mean load: each entry -0.01, 0 or +0.01.
    assert np.isin(np.round(np.abs(bias) * 100), (0.0, 1.0)).all()
    assert np.abs(bias).max() == pytest.approx(0.01)


@pytest.mark.slow
def test_an_expert_parallel_run_on_simulated_devices_with_no_chip_count_trains(tiny_run, tmp_path):
    """`python -m pipeline run` of an MoE model on fsdp 2 x expert 2 over 4 simulated CPU devices, with
    neither train.HardwareConfig.chips nor a topology: the fit check counts the expert axis's chips (it
    once counted data x fsdp x tensor only, and refused the run before its first step: "does not match the
    2 devices"), and the run trains on the 4 devices the mesh asks for."""
    root = str(tmp_path / "cache")
    tiny_run.copy_to(root)
    moe_mesh = ("train.ModelConfig.n_experts = 4", "train.ModelConfig.moe_mlp_dim = 64",
                "train.MeshConfig.fsdp = 2", "train.MeshConfig.expert = 2", "train.HardwareConfig.chips = 0",
                'train.HardwareConfig.topology = ""', "train.Config.steps = 4", "train.Config.eval_every = 0")
    env = dict(os.environ, XLA_FLAGS=jax_env.xla_flags("--xla_force_host_platform_device_count=4"),
               JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-m", "pipeline", "run", "--stage", "train",
                          *TINY.argv(root, *moe_mesh)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    plan = TINY.plan(root, *moe_mesh)
    done = cache.load(plan.cache_root, "train", plan.stages["train"].key)
    rows = [json.loads(line) for line in storage.read_text(done.file("metrics.jsonl")).splitlines()]
    assert rows[-1]["step"] == 4 and len(rows[-1]["moe/load"]) == 4
