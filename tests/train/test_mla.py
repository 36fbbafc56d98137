"""Multi-head latent attention (ModelConfig.attention_kind="mla", DeepSeek-V3's): the config's refusals, the
parameter table against DeepSeek-V3's published sizes, the forward pass against a float64 reference written
here in numpy, KV-cache decoding (the latent and the RoPE key cached) against the full forward, and the
training FLOPs.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/train/test_mla.py
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stages.train import model as M
from stages.train import model_config as C

MLA = C.ModelConfig(vocab_size=61, d_model=48, n_layers=2, n_heads=4, n_kv_heads=4, mlp_dim=64,
                    max_seq_len=64, dtype="float32", attention_impl="xla", attention_kind="mla",
                    q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                    init_std=0.2)
# DeepSeek-V3 (arXiv 2412.19437 section 4.2, its config.json and transformers' DeepseekV3Config defaults):
# 61 layers, d 7168, 128 heads, MLA ranks 1536 / 512, head dims 128 nope + 64 rope, values 128; 256
# routed experts of 2048, 1 shared, top 8.
DEEPSEEK_V3 = C.ModelConfig(vocab_size=129280, d_model=7168, n_layers=61, n_heads=128, n_kv_heads=128,
                            mlp_dim=18432, attention_kind="mla", q_lora_rank=1536, kv_lora_rank=512,
                            qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_experts=256,
                            n_experts_per_token=8, n_shared_experts=1, moe_mlp_dim=2048, n_dense_layers=3,
                            router_score="sigmoid", router_groups=8, router_topk_groups=4)


def build(cfg=MLA, seed=0):
    return M.Transformer(cfg, rngs=nnx.Rngs(seed))


def tokens(shape, seed=1, vocab=MLA.vocab_size):
    return jax.random.randint(jax.random.PRNGKey(seed), shape, 0, vocab, jnp.int32)


def logits(net, toks):
    graphdef, state = nnx.split(net)
    return jax.jit(lambda s, t: (lambda m: m.logits(m(t)[0]))(nnx.merge(graphdef, s)))(state, toks)


# ------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs, message", [
    ({"attention_kind": "latent"}, "attention_kind='latent' is not one of ('mha', 'mla')"),
    ({"attention_kind": "mha"}, "q_lora_rank=24 is a multi-head latent attention size, but "
                                "attention_kind='mha'"),
    ({"kv_lora_rank": 0}, "kv_lora_rank=0 must be >= 1 with attention_kind='mla'"),
    ({"qk_rope_head_dim": 0}, "qk_rope_head_dim=0 must be >= 1"),
    ({"q_lora_rank": -1}, "q_lora_rank=-1 must be >= 0"),
    ({"qk_rope_head_dim": 5}, "qk_rope_head_dim=5 must be even for RoPE"),
    ({"v_head_dim": 13}, "v_head_dim=13 must be <= qk_nope_head_dim + qk_rope_head_dim = 12"),
    ({"n_kv_heads": 2}, "n_kv_heads=2: multi-head latent attention gives every head its own key"),
    ({"head_dim": 12}, "head_dim=12: attention_kind='mla' sizes its heads"),
])
def test_config_refusals_name_the_field_and_what_is_valid(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        dataclasses.replace(MLA, **kwargs)


def test_mla_dims_and_heads_not_dividing_d_model():
    cfg = dataclasses.replace(MLA, n_heads=5, n_kv_heads=5)           # 48 % 5: fine, heads sized by MLA
    assert (cfg.effective_head_dim, cfg.value_head_dim, cfg.rope_dim) == (12, 6, 4)
    assert (MLA.mla, C.ModelConfig().mla) == (True, False)


# ------------------------------------------------------------------------------------------- parameters
def test_param_layout_has_deepseek_v3s_published_sizes():
    layout = C.param_layout(DEEPSEEK_V3)
    attention = sum(math.prod(layout[f"layers.{n}"][0][1:]) for n in C.mla_layout(DEEPSEEK_V3))
    # 7168 x 1536 + 1536 + 1536 x 128 x 192 + 7168 x 576 + 512 + 512 x 128 x 256 + 128 x 128 x 7168
    assert attention == 187_107_328
    # DeepSeek-V3's weights documentation (README_WEIGHTS.md): the main model 671B, 36.6B activated with the
    # output head (so without the input embedding's 0.93B), its MTP module apart
    counts = C.param_counts(DEEPSEEK_V3)
    total, active = sum(counts.values()), C.active_params(DEEPSEEK_V3) - counts["embed"]
    assert abs(total / 671e9 - 1) < 1e-4 and abs(active / 36.6e9 - 1) < 2e-3
    assert layout["moe_layers.wkv_b"] == ((58, 512, 128, 256), ("layers", "latent", "heads", "head_dim"))
    assert "layers.wq" not in layout and "layers.wk" not in layout


def test_the_model_builds_the_layout_with_logical_names_and_q_lora_rank_0_projects_directly():
    for cfg in (MLA, dataclasses.replace(MLA, q_lora_rank=0)):
        net = build(cfg)
        layout = C.param_layout(cfg)
        state = nnx.state(net, nnx.Param)
        got = {".".join(str(k) for k in path): leaf for path, leaf in nnx.to_flat_state(state)}
        assert set(got) == set(layout)
        for name, (shape, names) in layout.items():
            assert got[name].shape == shape and tuple(got[name].get_metadata()["out_sharding"]) == names
        assert ("layers.wq" in layout) == (cfg.q_lora_rank == 0)
        assert M.num_params(cfg) == sum(C.param_counts(cfg).values())


# ---------------------------------------------------------------------------------- float64 reference
def _np_rms(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _np_rope(x, pos, theta):
    """x (T, ..., Hr): the pairs (i, i + Hr/2) rotated by pos * theta^(-2i / Hr)."""
    half = x.shape[-1] // 2
    ang = pos[:, None] * theta ** (-np.arange(half) * 2.0 / x.shape[-1])          # (T, Hr/2)
    ang = ang.reshape(ang.shape[:1] + (1,) * (x.ndim - 2) + ang.shape[1:])
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], axis=-1)


def reference_logits(net, toks, cfg=MLA):
    """The decoder with MLA, written from DeepSeek-V3's equations (arXiv 2412.19437 eqs. 1-11) in float64,
    one sequence at a time, head by head."""
    p = {".".join(str(k) for k in path): np.asarray(leaf[...], np.float64)
         for path, leaf in nnx.to_flat_state(nnx.state(net, nnx.Param))}
    Rkv, Hn, Hr = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    out = []
    for seq in np.asarray(toks):
        T = len(seq)
        pos = np.arange(T, dtype=np.float64)
        x = p["embed"][seq]                                                          # (T, D)
        for i in range(cfg.n_layers):
            L = {k.split(".", 1)[1]: v[i] for k, v in p.items() if k.startswith("layers.")}
            h = _np_rms(x, L["attn_norm"], cfg.norm_eps)
            if cfg.q_lora_rank:
                c_q = _np_rms(h @ L["wq_a"], L["q_norm"], 1e-6)                       # (T, Rq)
                q = np.einsum("tr,rnh->tnh", c_q, L["wq_b"])
            else:
                q = np.einsum("td,dnh->tnh", h, L["wq"])                              # (T, N, Hn + Hr)
            q = np.concatenate([q[..., :Hn], _np_rope(q[..., Hn:], pos, cfg.rope_theta)], axis=-1)
            kv_a = h @ L["wkv_a"]                                                     # (T, Rkv + Hr)
            c_kv = _np_rms(kv_a[:, :Rkv], L["kv_norm"], 1e-6)
            k_rope = _np_rope(kv_a[:, Rkv:], pos, cfg.rope_theta)                     # (T, Hr), shared
            heads = []
            for n in range(cfg.n_heads):
                up = c_kv @ L["wkv_b"][:, n]                                          # (T, Hn + Hv)
                k = np.concatenate([up[:, :Hn], k_rope], axis=1)                      # (T, Hn + Hr)
                v = up[:, Hn:]                                                        # (T, Hv)
                s = q[:, n] @ k.T / np.sqrt(Hn + Hr)
                s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
                a = np.exp(s - s.max(1, keepdims=True))
                heads.append((a / a.sum(1, keepdims=True)) @ v)                      # (T, Hv)
            x = x + np.einsum("tnh,nhd->td", np.stack(heads, 1), L["wo"])
            h = _np_rms(x, L["mlp_norm"], cfg.norm_eps)
            gate = h @ L["w_gate"]
            x = x + (gate / (1 + np.exp(-gate)) * (h @ L["w_up"])) @ L["w_down"]
        x = _np_rms(x, p["final_norm"], cfg.norm_eps)
        out.append(x @ p["unembedding"])
    return np.stack(out)


@pytest.mark.parametrize("q_lora_rank, impl", [(24, "xla"), (0, "xla"), (24, "blockwise")])
def test_forward_matches_a_float64_numpy_reference(q_lora_rank, impl):
    cfg = dataclasses.replace(MLA, q_lora_rank=q_lora_rank, attention_impl=impl, attention_block_q=4,
                              attention_block_k=4)
    net = build(cfg)
    toks = tokens((2, 11))
    got, want = np.asarray(logits(net, toks), np.float64), reference_logits(net, toks, cfg)
    assert np.abs(want).max() > 1.0                     # not a degenerate (all-small) comparison
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-4)


# ----------------------------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("moe", [False, True])
def test_decoding_from_the_latent_cache_matches_the_full_forward(moe):
    cfg = MLA if not moe else dataclasses.replace(
        MLA, n_experts=4, n_experts_per_token=2, n_shared_experts=1, moe_mlp_dim=16, n_dense_layers=1,
        router_score="sigmoid", router_norm_topk=True)
    net = build(cfg)
    toks = tokens((2, 12))
    full = logits(net, toks)
    graphdef, state = nnx.split(net)
    step = jax.jit(lambda s, t, c: (lambda m: (lambda h, c: (m.logits(h), c))(*m(t, cache=c)))(
        nnx.merge(graphdef, s)))
    cache = net.init_cache(2, 16)
    # What DeepSeek caches: the latent and the shared RoPE key, per layer, not per-head keys and values.
    assert cache.k.shape == (2, 2, 16, cfg.kv_lora_rank) and cache.v.shape == (2, 2, 16, cfg.qk_rope_head_dim)
    got = []
    for lo, hi in ((0, 5), (5, 6), (6, 9), (9, 10), (10, 12)):                     # prefill, tokens, chunks
        out, cache = step(state, toks[:, lo:hi], cache)
        got.append(out)
    assert int(cache.length) == 12
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), full, atol=1e-5, rtol=1e-5)


def test_each_remat_policy_gives_the_gradients_of_none():
    toks = tokens((2, 9))

    def grads(remat):
        net = build(dataclasses.replace(MLA, remat=remat))
        graphdef, params = nnx.split(net, nnx.Param)

        def loss(p):
            m = nnx.merge(graphdef, p)
            logp = jax.nn.log_softmax(m.logits(m(toks[:, :-1])[0]), axis=-1)
            return -jnp.take_along_axis(logp, toks[:, 1:, None], axis=-1).mean()

        return jax.jit(jax.value_and_grad(loss))(params)

    ref_loss, ref = grads("none")
    assert float(jnp.abs(ref["layers"]["wkv_b"][...]).max()) > 0          # the latent path is trained
    for remat in ("full", "minimal", "save_dots"):
        got_loss, got = grads(remat)
        np.testing.assert_allclose(got_loss, ref_loss, rtol=1e-6)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), got, ref)


# ----------------------------------------------------------------------------------------------- FLOPs
def test_flops_per_token_counts_the_projections_and_the_scores_at_their_widths():
    cfg, T = MLA, 64
    D, N, Rq, Rkv, Hn, Hr, Hv, F, V = 48, 4, 24, 16, 8, 4, 6, 64, 61
    per_layer = D * Rq + Rq * N * (Hn + Hr) + D * (Rkv + Hr) + Rkv * N * (Hn + Hv) + N * Hv * D + 3 * D * F
    n_matmul = cfg.n_layers * per_layer + D * V                                    # the unembedding
    attention = cfg.n_layers * 3 * N * (Hn + Hr + Hv) * T                          # causal, fwd + bwd
    assert C.flops_per_token(cfg, T) == 6 * n_matmul + attention


def test_deepseek_v3s_flops_per_token_equal_maxtexts_published_count():
    # MaxText's DeepSeek-V3 671B run on v5p-1024 printed 152.415 TFLOP/s a device at 542.108 tokens/s a
    # device (benchmarks/published/throughput_sources.md section 3): 281.15 GFLOP a token by its count.
    assert C.flops_per_token(DEEPSEEK_V3, 8192) == pytest.approx(152.415e12 / 542.108, rel=1e-4)


# ------------------------------------------------------------------------------------------- the planner
def test_the_step_time_models_matmuls_are_the_flops_per_token_without_the_scores():
    from stages.train.planning import step_time

    cfg, T = dataclasses.replace(DEEPSEEK_V3, n_experts=0, n_dense_layers=0), 8192
    groups = step_time.matmul_flops(cfg, 1, 6 * T)                                 # forward, a token
    D, N, L = 7168, 128, 61
    assert groups["qkv"] == 2 * L * (D * 1536 + 1536 * N * 192 + D * (512 + 64) + 512 * N * (128 + 128))
    assert groups["out"] == 2 * L * N * 128 * D
    scores = 3 * L * N * (192 + 128) * T
    assert 3 * sum(groups.values()) + scores == pytest.approx(C.flops_per_token(cfg, T), rel=1e-12)


def test_memory_counts_the_latents_and_the_kv_cache_holds_them_alone():
    from stages.train.planning import memory

    layer = memory.layer_activations(DEEPSEEK_V3, tensor=1)
    assert (layer["latent"], layer["q"], layer["k"], layer["v"], layer["attention"]) == (
        1536 + 512 + 64, 128 * 192, 128 * 192, 128 * 128, 128 * 128)
    assert memory.layer_activations(DEEPSEEK_V3, tensor=1, lanes=128)["latent"] == 1536 + 640
    assert memory.layer_activations(C.ModelConfig(), tensor=1)["latent"] == 0
    # bfloat16: 61 layers x (512 + 64) x 2 bytes a token, and an int32 segment id a slot
    assert memory.kv_cache_bytes(DEEPSEEK_V3, batch=2, seq_len=1000) == 2 * 1000 * (61 * 576 * 2 + 4)
    gqa = dataclasses.replace(DEEPSEEK_V3, attention_kind="mha", n_kv_heads=8, head_dim=128,
                              **dict.fromkeys(C.MLA_DIMS, 0))
    assert memory.kv_cache_bytes(gqa, 1, 1) == 61 * 2 * 8 * 128 * 2 + 4
    net = build()
    cache = net.init_cache(3, 7)
    assert memory.kv_cache_bytes(MLA, 3, 7) == sum(x.size * x.dtype.itemsize for x in (cache.k, cache.v)) \
        + cache.segment_ids.size * 4
