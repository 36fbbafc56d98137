"""stages/train/loss.py: chunked cross entropy against a full-logits reference, and its compiled memory."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stages.train import loss


def reference(hidden, unembed, targets, mask, z_loss):
    """Full (N, V) float32 logits; the same sums as loss.cross_entropy."""
    logits = jnp.einsum("nd,dv->nv", hidden, unembed.astype(hidden.dtype), preferred_element_type=jnp.float32)
    m = mask.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return {"loss_sum": jnp.sum(m * ce), "z_loss_sum": z_loss * jnp.sum(m * lse * lse),
            "correct": jnp.sum(m * (jnp.argmax(logits, -1) == targets)), "count": jnp.sum(m)}


def inputs(n=37, d=16, v=50, dtype=jnp.float32, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(k[0], (n, d)).astype(dtype)
    unembed = 0.5 * jax.random.normal(k[1], (d, v))                               # float32 params
    targets = jax.random.randint(k[2], (n,), 0, v)
    mask = jax.random.bernoulli(k[3], 0.7, (n,))
    return hidden, unembed, targets, mask


def mean_loss(fn, hidden, unembed, targets, mask):
    out = fn(hidden, unembed, targets, mask)
    return (out["loss_sum"] + out["z_loss_sum"]) / out["count"]


@pytest.mark.parametrize("chunk_size", [8, 37, 64])   # 37 tokens: padded last chunk, exact, one short chunk
@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_matches_reference_float32(chunk_size, z_loss):
    hidden, unembed, targets, mask = inputs()
    chunked = lambda h, w, t, m: loss.cross_entropy(h, w, t, m, chunk_size=chunk_size, z_loss=z_loss)  # noqa: E731
    ref = lambda h, w, t, m: reference(h, w, t, m, z_loss)                                            # noqa: E731
    got, want = chunked(hidden, unembed, targets, mask), ref(hidden, unembed, targets, mask)
    for name in ("loss_sum", "z_loss_sum", "correct", "count"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    assert float(got["count"]) == float(mask.sum()) < 37                       # the mask really drops tokens
    if z_loss:
        assert float(got["z_loss_sum"]) > 0

    g_got = jax.grad(lambda h, w: mean_loss(chunked, h, w, targets, mask), argnums=(0, 1))(hidden, unembed)
    g_want = jax.grad(lambda h, w: mean_loss(ref, h, w, targets, mask), argnums=(0, 1))(hidden, unembed)
    for got_g, want_g in zip(g_got, g_want):
        assert got_g.dtype == want_g.dtype
        np.testing.assert_allclose(got_g, want_g, rtol=1e-5, atol=1e-6)
    # masked tokens get no gradient
    assert float(jnp.abs(g_got[0][~mask]).max()) == 0.0


def test_matches_reference_bfloat16_hidden():
    hidden, unembed, targets, mask = inputs(n=64, d=32, v=96, dtype=jnp.bfloat16, seed=1)
    chunked = lambda h, w, t, m: loss.cross_entropy(h, w, t, m, chunk_size=16, z_loss=1e-3)  # noqa: E731
    ref = lambda h, w, t, m: reference(h, w, t, m, 1e-3)                                    # noqa: E731
    got, want = chunked(hidden, unembed, targets, mask), ref(hidden, unembed, targets, mask)
    np.testing.assert_allclose(got["loss_sum"], want["loss_sum"], rtol=1e-3)
    np.testing.assert_allclose(got["z_loss_sum"], want["z_loss_sum"], rtol=1e-3)
    (l_got, g_got) = jax.value_and_grad(lambda h, w: mean_loss(chunked, h, w, targets, mask),
                                        argnums=(0, 1))(hidden, unembed)
    (l_want, g_want) = jax.value_and_grad(lambda h, w: mean_loss(ref, h, w, targets, mask),
                                          argnums=(0, 1))(hidden, unembed)
    np.testing.assert_allclose(l_got, l_want, rtol=1e-3)
    assert g_got[0].dtype == jnp.bfloat16 and g_got[1].dtype == jnp.float32
    for got_g, want_g in zip(g_got, g_want):
        got_g, want_g = np.asarray(got_g, np.float32), np.asarray(want_g, np.float32)
        # bfloat16 has 8 bits of mantissa: compare relative to the gradient's scale
        assert np.abs(got_g - want_g).max() <= 2e-2 * np.abs(want_g).max()


def test_jit_and_float_mask_weights():
    hidden, unembed, targets, mask = inputs(n=20)
    weights = jnp.where(mask, 0.5, 0.0)
    got = jax.jit(lambda *a: loss.cross_entropy(*a, chunk_size=6))(hidden, unembed, targets, weights)
    want = reference(hidden, unembed, targets, weights, 0.0)
    np.testing.assert_allclose(got["loss_sum"], want["loss_sum"], rtol=1e-5)
    np.testing.assert_allclose(got["count"], 0.5 * float(mask.sum()))


def test_rejects_bad_shapes():
    hidden, unembed, targets, mask = inputs(n=8)
    with pytest.raises(ValueError, match="unembed"):
        loss.cross_entropy(hidden, unembed.T, targets, mask)
    with pytest.raises(ValueError, match="targets"):
        loss.cross_entropy(hidden, unembed, targets[:4], mask)
    with pytest.raises(ValueError, match="chunk_size=0"):
        loss.cross_entropy(hidden, unembed, targets, mask, chunk_size=0)


def test_compiled_memory_is_several_times_below_full_logits():
    n, d, v = 8192, 256, 32768
    args = (jax.ShapeDtypeStruct((n, d), jnp.bfloat16), jax.ShapeDtypeStruct((d, v), jnp.float32),
            jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.float32))

    def temp_bytes(fn):
        grad_fn = jax.value_and_grad(lambda h, w, t, m: mean_loss(fn, h, w, t, m), argnums=(0, 1))
        return jax.jit(grad_fn).lower(*args).compile().memory_analysis().temp_size_in_bytes

    chunked = temp_bytes(lambda h, w, t, m: loss.cross_entropy(h, w, t, m, chunk_size=1024, z_loss=1e-4))
    naive = temp_bytes(lambda h, w, t, m: reference(h, w, t, m, 1e-4))
    assert naive >= n * v * 4                     # the full float32 logits, at least once
    assert chunked * 4 < naive, (chunked, naive)
