"""attention(): every implementation against the xla reference, in value and in gradients.

    .venv/bin/python -m pytest tests/train/test_attention.py
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stages.train import attention as attn

# Atol on outputs and on gradients (relative to the gradient's largest entry). bfloat16 is loose because the
# two paths round the softmax weights to bfloat16 at different points (normalized vs. running max).
TOL = {jnp.float32: (2e-5, 2e-5), jnp.bfloat16: (2e-2, 2e-2)}


def _inputs(B, T, S, N, K, H, dtype, seed=0):
    kq, kk, kv, kw = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (B, T, N, H), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (B, S, K, H), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (B, S, K, H), jnp.float32).astype(dtype)
    w = jax.random.normal(kw, (B, T, N, H), jnp.float32).astype(dtype)    # a random linear functional
    return q, k, v, w


def _packed(B, T, lengths):
    """Segment ids of documents of `lengths` packed into T tokens (the rest of the row is one more id)."""
    ids = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)] + [np.full(T, len(lengths))])[:T]
    return jnp.asarray(np.stack([np.roll(ids, 3 * b) for b in range(B)]), jnp.int32)


def _value_and_grads(impl, q, k, v, w, **kwargs):
    """(out, (dq, dk, dv)) of sum(attention(q, k, v) * w), jitted once."""
    def f(q, k, v):
        out, pullback = jax.vjp(lambda q, k, v: attn.attention(q, k, v, impl=impl, **kwargs), q, k, v)
        return out, pullback(w)
    return jax.jit(f)(q, k, v)


def _assert_close(got, want, dtype, what):
    atol_out, rtol_grad = TOL[dtype]
    out, grads = got
    ref_out, ref_grads = want
    assert out.dtype == ref_out.dtype == dtype
    assert not np.isnan(np.asarray(out, np.float32)).any(), what
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref_out, np.float32), atol=atol_out,
                               err_msg=f"{what}: output")
    for name, g, r in zip("qkv", grads, ref_grads):
        g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
        scale = float(np.abs(r).max())
        assert scale > 0, f"{what}: d{name} of the reference is all zeros"
        np.testing.assert_allclose(g, r, atol=rtol_grad * scale, err_msg=f"{what}: d{name}")


# (name, B, T, S, N, K, H, causal, segments, block_q, block_k)
# segments: None, "packed" (one array) or "decode" (the pair form, T < S)
CASES = [
    ("causal_mha_blocks_divide", 2, 32, 32, 2, 2, 8, True, None, 16, 16),
    ("bidirectional_gqa_ragged", 2, 40, 40, 4, 2, 8, False, None, 16, 8),
    ("causal_mqa_packed_ragged", 2, 40, 40, 4, 1, 8, True, "packed", 16, 16),
    ("bidirectional_gqa_packed", 1, 24, 24, 4, 2, 16, False, "packed", 8, 16),
    ("decode_chunk_t_lt_s_pairs", 2, 12, 40, 4, 2, 8, True, "decode", 8, 16),
]


def _segment_ids(kind, B, T, S):
    if kind is None:
        return None
    if kind == "packed":
        return _packed(B, T, [13, 9, 5])
    # Queries of document 1 against S keys: slots 0-9 hold document 0, 10-33 document 1, and the last 6 are
    # empty cache slots carrying an id no query has.
    kv = np.array([0] * 10 + [1] * 24 + [-1] * 6)
    kv_seg = jnp.asarray(np.tile(kv, (B, 1)), jnp.int32)
    q_seg = jnp.ones((B, T), jnp.int32)
    return q_seg, kv_seg


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_blockwise_matches_xla(case, dtype):
    name, B, T, S, N, K, H, causal, seg_kind, bq, bk = case
    q, k, v, w = _inputs(B, T, S, N, K, H, dtype)
    kwargs = {"causal": causal, "segment_ids": _segment_ids(seg_kind, B, T, S), "block_q": bq, "block_k": bk}
    want = _value_and_grads("xla", q, k, v, w, **kwargs)
    got = _value_and_grads("blockwise", q, k, v, w, **kwargs)
    _assert_close(got, want, dtype, f"blockwise {name} {jnp.dtype(dtype).name}")


def test_decode_alignment_is_last_query_to_last_key():
    """With T < S, query i sees keys j <= i + S - T: the last query sees every key, the first S - T + 1."""
    q, k, v, _ = _inputs(1, 3, 8, 1, 1, 4, jnp.float32)
    q, k, v = (np.asarray(x[0, :, 0], np.float64) for x in (q, k, v))         # (T, H), (S, H), (S, H)
    want = []
    for i in range(3):                          # plain softmax over the keys query i may see: 0 .. 5 + i
        s = k[:6 + i] @ q[i] / 2.0
        p = np.exp(s - s.max())
        want.append(p @ v[:6 + i] / p.sum())
    for impl in ("xla", "blockwise"):
        out = jax.jit(lambda q, k, v, impl=impl: attn.attention(q, k, v, impl=impl, block_q=2, block_k=3))(
            *(jnp.asarray(x, jnp.float32)[None, :, None] for x in (q, k, v)))
        np.testing.assert_allclose(out[0, :, 0], np.stack(want), atol=1e-6, err_msg=impl)


def test_auto_matches_xla_and_picks_blockwise_for_long_sequences(monkeypatch):
    assert attn._auto_choice(64, 64) == "xla"
    assert attn._auto_choice(1024, 1024) == "blockwise"
    assert attn._auto_choice(1, 512) == "xla"
    # Lower the threshold so the small case runs through auto's blockwise path, and check it against xla.
    monkeypatch.setattr(attn, "AUTO_BLOCKWISE_SCORES", 1)
    q, k, v, w = _inputs(2, 40, 40, 4, 2, 8, jnp.float32, seed=1)
    kwargs = {"causal": True, "segment_ids": _packed(2, 40, [11, 17]), "block_q": 16, "block_k": 16}
    want = _value_and_grads("xla", q, k, v, w, **kwargs)
    _assert_close(_value_and_grads("auto", q, k, v, w, **kwargs), want, jnp.float32, "auto (blockwise)")


@pytest.mark.parametrize("impl", ["xla", "blockwise", "auto"])
def test_queries_that_see_no_key_give_zeros_not_nan(impl):
    B, T, S = 2, 10, 16
    q, k, v, w = _inputs(B, T, S, 4, 2, 8, jnp.float32)
    q_seg = jnp.asarray(np.tile([7, 7, 7] + [1] * 7, (B, 1)), jnp.int32)    # id 7: no key has it
    kv_seg = jnp.ones((B, S), jnp.int32)
    out, grads = _value_and_grads(impl, q, k, v, w, segment_ids=(q_seg, kv_seg), block_q=4, block_k=8)
    assert not any(np.isnan(np.asarray(x)).any() for x in (out, *grads))
    np.testing.assert_array_equal(np.asarray(out[:, :3]), 0.0)
    assert float(jnp.abs(out[:, 3:]).max(axis=-1).min()) > 0
    np.testing.assert_array_equal(np.asarray(grads[0][:, :3]), 0.0)
    # Causal with T > S: query i sees keys j <= i - (T - S), so the first T - S queries see nothing.
    kk, vv = k[:, :6], v[:, :6]
    out, grads = _value_and_grads(impl, q, kk, vv, w, causal=True, block_q=4, block_k=4)
    assert not any(np.isnan(np.asarray(x)).any() for x in (out, *grads))
    np.testing.assert_array_equal(np.asarray(out[:, :4]), 0.0)
    ref, _ = _value_and_grads("xla", q, kk, vv, w, causal=True)
    np.testing.assert_allclose(out, ref, atol=2e-5)


def test_blockwise_memory_is_linear_in_t():
    """At T = 16K, compiled forward+backward scratch of blockwise is >= 10x below xla's (compile only)."""
    B, T, N, K, H = 1, 16384, 2, 1, 64
    shapes = [jax.ShapeDtypeStruct((B, T, N, H), jnp.float32)] + [jax.ShapeDtypeStruct((B, T, K, H),
                                                                                       jnp.float32)] * 2

    def temp_bytes(impl):
        def loss(q, k, v):
            return jnp.sum(attn.attention(q, k, v, impl=impl) * q)
        compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(*shapes).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    blockwise, xla = temp_bytes("blockwise"), temp_bytes("xla")
    assert xla >= B * N * T * T * 4, xla                     # the reference holds at least the f32 scores
    assert blockwise * 10 <= xla, (blockwise, xla)
    assert blockwise < 256 * 2**20, blockwise                 # and blockwise is O(T): tens of MiB here


def test_splash_in_the_pallas_interpreter_matches_xla():
    """The TPU kernel's code path (masks, segment ids, GQA through the MQA kernel), run by the interpreter."""
    B, T, S, N, K, H = 1, 128, 256, 4, 2, 64
    q, k, v, w = _inputs(B, T, S, N, K, H, jnp.float32)
    q_seg = jnp.ones((B, T), jnp.int32)
    kv_seg = jnp.asarray([[0] * 60 + [1] * 190 + [7] * 6], jnp.int32)   # last 6 slots: empty cache
    segs = (q_seg, kv_seg)

    def splash(q, k, v):
        qs, ks = attn._segments(segs, q.shape[:2], k.shape[:2])
        return attn.splash_attention(q, k, v, qs, ks, causal=True, block_q=128, block_k=128, interpret=True)

    out, pullback = jax.vjp(splash, q, k, v)
    got = (out, pullback(w))
    _assert_close(got, _value_and_grads("xla", q, k, v, w, segment_ids=segs), jnp.float32, "splash")


def test_unavailable_kernels_raise_clearly_and_auto_falls_back(monkeypatch, caplog):
    q, k, v, _ = _inputs(1, 16, 16, 2, 1, 8, jnp.float32)
    if jax.default_backend() == "cpu":
        with pytest.raises(ValueError, match="impl='splash' needs a TPU.*'blockwise'"):
            attn.attention(q, k, v, impl="splash")
        with pytest.raises(ValueError, match="impl='cudnn' needs a GPU"):
            attn.attention(q, k, v, impl="cudnn")
    # A kernel that refuses (here: splash, not on a TPU, or T not a multiple of 128) falls back, logged once.
    monkeypatch.setattr(attn, "_auto_choice", lambda T, S: "splash")
    monkeypatch.setattr(attn, "_LOGGED", set())
    with caplog.at_level(logging.WARNING, logger=attn.__name__):
        first = attn.attention(q, k, v, impl="auto")
        second = attn.attention(q, k, v, impl="auto")
    assert [r.getMessage().count("splash refused") for r in caplog.records] == [1]
    assert "falling back to blockwise" in caplog.records[0].getMessage()
    want = attn.attention(q, k, v, impl="xla")
    np.testing.assert_allclose(first, want, atol=2e-5)
    np.testing.assert_array_equal(first, second)


def test_bad_arguments_name_what_is_wrong():
    q, k, v, _ = _inputs(1, 8, 8, 3, 2, 4, jnp.float32)
    with pytest.raises(ValueError, match=r"impl='flash' is not one of \('xla', 'blockwise'"):
        attn.attention(q, k, v, impl="flash")
    with pytest.raises(ValueError, match="N=3 must be a multiple of kv heads K=2"):
        attn.attention(q, k, v)
    q, k, v, _ = _inputs(1, 4, 8, 2, 2, 4, jnp.float32)
    with pytest.raises(ValueError, match="one segment_ids array needs T == S"):
        attn.attention(q, k, v, segment_ids=jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"kv segment ids must be integers of shape \(1, 8\)"):
        attn.attention(q, k, v, segment_ids=(jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32)))
    with pytest.raises(ValueError, match="k.*and v.*must have the same shape"):
        attn.attention(q, k, v[:, :4])


SHARDED_SPLASH = """
import json
import jax, jax.numpy as jnp, numpy as np
from stages.train import attention as attn, sharding
from stages.train.mesh import MeshConfig

B, T, N, K, H = 4, 256, 8, 2, 64
keys = jax.random.split(jax.random.key(0), 4)
q = jax.random.normal(keys[0], (B, T, N, H), jnp.float32)
k, v = (jax.random.normal(kk, (B, T, K, H), jnp.float32) for kk in keys[1:3])
w = jax.random.normal(keys[3], (B, T, N, H), jnp.float32)
segs = jnp.asarray(np.repeat(np.arange(4), T // 4)[None].repeat(B, 0), jnp.int32)   # 4 documents a row

def value_and_grads(fn):
    def f(q, k, v):
        out, pullback = jax.vjp(fn, q, k, v)
        return out, pullback(w)
    return jax.jit(f)(q, k, v)

ref = value_and_grads(lambda q, k, v: attn.xla_attention(q, k, v, segs, segs))
splash = lambda q, k, v: attn.splash_attention(q, k, v, segs, segs, block_q=128, block_k=128, interpret=True)
result = {}
for name, cfg in {"d2_f2_t2": MeshConfig(data=2, fsdp=2, tensor=2),     # kv heads split like q heads
                  "f2_t4": MeshConfig(data=1, fsdp=2, tensor=4)}.items():   # K=2 < tensor=4: kv repeated
    mesh = sharding.make_mesh(cfg)
    with jax.set_mesh(mesh):
        out, grads = value_and_grads(splash)
        jaxpr = str(jax.make_jaxpr(splash)(q, k, v))
    result[name] = {
        "shard_map": "shard_map" in jaxpr,
        "out_diff": float(jnp.abs(out - ref[0]).max()),
        "grad_diff": max(float(jnp.abs(g - r).max() / jnp.abs(r).max()) for g, r in zip(grads, ref[1])),
        "out_spec": list(out.sharding.spec),
    }
print("RESULT " + json.dumps(result))
"""


def test_splash_under_a_mesh_runs_per_device_in_shard_map_and_matches_xla():
    """Splash is a one-device kernel: under a training mesh it runs inside shard_map over batch and heads,
    and gives the reference's values and gradients (the Pallas interpreter runs the kernel on CPU)."""
    from tests.conftest import run_on_simulated_devices

    got = run_on_simulated_devices(SHARDED_SPLASH, devices=8, timeout=600)
    for name, r in got.items():
        assert r["shard_map"], name
        assert r["out_diff"] < 2e-5 and r["grad_diff"] < 2e-5, (name, r)
    assert got["d2_f2_t2"]["out_spec"][0] == ["data", "fsdp"] and got["d2_f2_t2"]["out_spec"][2] == "tensor"
    assert got["f2_t4"]["out_spec"][2] == "tensor"


def test_cudnn_runs_packed_documents_blockwise_and_says_so(monkeypatch, caplog):
    """cuDNN takes packed documents only as a dense T x S mask; the model's packed batches go blockwise."""
    monkeypatch.setattr(attn, "target_platform", lambda: "gpu")          # what a GPU run sees
    monkeypatch.setattr(attn, "_LOGGED", set())
    q, k, v, _ = _inputs(2, 64, 64, 4, 2, 16, jnp.bfloat16)
    segs = _packed(2, 64, [20, 30])
    with caplog.at_level(logging.WARNING, logger=attn.__name__):
        got = attn.attention(q, k, v, segment_ids=segs, impl="cudnn", block_q=16, block_k=16)
        attn.attention(q, k, v, segment_ids=segs, impl="cudnn", block_q=16, block_k=16)
    want = attn.attention(q, k, v, segment_ids=segs, impl="blockwise", block_q=16, block_k=16)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert [r.getMessage() for r in caplog.records] == [
        "attention: cudnn takes packed documents only as a dense (T, S) mask; using blockwise for "
        "q(2, 64, 4, 16) k(2, 64, 2, 16) with segment ids"]
