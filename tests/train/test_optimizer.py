"""stages/train/optimizer.py: config, schedules, decay mask, each optimizer, clipping, accumulation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from stages.train import optimizer
from stages.train.optimizer_config import OPTIMIZERS, SCHEDULES, OptimizerConfig

L, D, V, B = 2, 8, 16, 32


def model_params(seed=0):
    """Named like a scanned model: the norm scale is 2-D (L, D), the kernel 3-D (L, D, F) with F = D."""
    k = jax.random.split(jax.random.key(seed), 2)
    return {"layers": {"attn_norm": {"scale": jnp.ones((L, D))},
                       "mlp": {"kernel": 0.3 * jax.random.normal(k[0], (L, D, D))}},
            "embed": {"embedding": jax.random.normal(k[1], (V, D))}}


def problem(seed=1, batch=B):
    """A tiny residual MLP regressing random targets from token embeddings: (tokens (B,), targets (B, D))."""
    k = jax.random.split(jax.random.key(seed), 2)
    return jax.random.randint(k[0], (batch,), 0, V), jax.random.normal(k[1], (batch, D))


def loss_fn(params, tokens, targets):
    x = params["embed"]["embedding"][tokens]                                    # (B, D)
    for layer in range(L):
        h = x * params["layers"]["attn_norm"]["scale"][layer]
        x = x + jnp.tanh(jnp.einsum("bd,df->bf", h, params["layers"]["mlp"]["kernel"][layer]))
    return jnp.mean((x - targets) ** 2)


def train(cfg, params, steps, batch):
    tx = optimizer.make_optimizer(cfg, params)

    @jax.jit
    def step(params, state):
        grads = jax.grad(loss_fn)(params, *batch)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = tx.init(params)
    for _ in range(steps):
        params, state = step(params, state)
    return params


# ---- config ----

@pytest.mark.parametrize(("field", "value", "match"), [
    ("name", "adam", r"name='adam' is not one of \('adamw', 'lion', 'adafactor', 'muon'\)"),
    ("schedule", "cos", r"schedule='cos' is not one of \('cosine', 'linear', 'wsd', 'constant'\)"),
    ("learning_rate", 0.0, "learning_rate=0.0"),
    ("warmup_steps", 2000, "warmup_steps=2000"),
    ("total_steps", -1, "total_steps=-1"),
    ("min_lr_ratio", 1.5, "min_lr_ratio=1.5"),
    ("b2", 1.0, "b2=1.0"),
    ("eps", 0.0, "eps=0.0"),
    ("weight_decay", -0.1, "weight_decay=-0.1"),
    ("clip_norm", -1.0, "clip_norm=-1.0"),
    ("grad_accum_steps", 0, "grad_accum_steps=0"),
])
def test_config_rejects_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        OptimizerConfig(**{"total_steps": 1000, field: value})


def test_total_steps_left_to_the_training_stage():
    cfg = OptimizerConfig(warmup_steps=2000)                      # 0 = train.Config.steps, checked there
    with pytest.raises(ValueError, match="total_steps is 0"):
        optimizer.schedule(cfg)


def test_config_rejects_wsd_without_room_for_decay():
    with pytest.raises(ValueError, match="warmup_steps=900"):
        OptimizerConfig(schedule="wsd", warmup_steps=900, total_steps=1000, wsd_decay_fraction=0.2)
    OptimizerConfig(schedule="wsd", warmup_steps=800, total_steps=1000, wsd_decay_fraction=0.2)


# ---- schedule ----

@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_key_steps(name):
    cfg = OptimizerConfig(schedule=name, learning_rate=1e-3, warmup_steps=100, total_steps=1000,
                          min_lr_ratio=0.1, wsd_decay_fraction=0.2)
    lr = lambda s: float(optimizer.schedule(cfg)(s))                           # noqa: E731
    assert lr(0) == 0.0
    np.testing.assert_allclose(lr(50), 5e-4, rtol=1e-6)                        # linear warmup
    np.testing.assert_allclose(lr(100), 1e-3, rtol=1e-6)                       # warmup end = peak
    end = 1e-3 if name == "constant" else 1e-4                                 # end = min_lr_ratio * peak
    np.testing.assert_allclose(lr(1000), end, rtol=1e-6)
    np.testing.assert_allclose(lr(5000), end, rtol=1e-6)                       # stays there after the end
    if name == "cosine":
        np.testing.assert_allclose(lr(550), 5.5e-4, rtol=1e-5)                 # halfway: mean of peak and end
    if name == "linear":
        np.testing.assert_allclose(lr(325), 7.75e-4, rtol=1e-5)
    if name == "wsd":
        assert {lr(s) for s in (100, 300, 600, 800)} == {lr(100)}             # stable phase is flat at peak
        np.testing.assert_allclose(lr(900), 5.5e-4, rtol=1e-5)     # linear decay over the last 200
        assert lr(801) < lr(800)
    steps = jnp.arange(0, 1001)
    values = optimizer.schedule(cfg)(steps)                                    # works on arrays (and in jit)
    assert values.shape == (1001,) and bool(jnp.all(values[100:-1] >= values[101:]))


def test_schedule_without_warmup_starts_at_peak():
    cfg = OptimizerConfig(warmup_steps=0, total_steps=10, learning_rate=2.0)
    assert float(optimizer.schedule(cfg)(0)) == 2.0


# ---- decay mask ----

WANT_MASK = {"layers": {"attn_norm": {"scale": False}, "mlp": {"kernel": True}}, "embed": {"embedding": True}}


class _Norm(nnx.Module):
    def __init__(self):
        self.scale = nnx.Param(jnp.ones((L, D)))


class _Mlp(nnx.Module):
    def __init__(self):
        self.kernel = nnx.Param(jnp.ones((L, D, D)))
        self.bias = nnx.Param(jnp.zeros((L, D)))


class _Layers(nnx.Module):
    def __init__(self):
        self.attn_norm = _Norm()
        self.mlp = _Mlp()


class _Embed(nnx.Module):
    def __init__(self):
        self.embedding = nnx.Param(jnp.ones((V, D)))


class _Model(nnx.Module):
    def __init__(self):
        self.layers = _Layers()
        self.embed = _Embed()
        self.temperature = nnx.Param(jnp.ones(()))


def test_decay_mask_plain_dict_by_name_not_ndim():
    assert optimizer.decay_mask(model_params()) == WANT_MASK


def test_decay_mask_nnx_state_and_pure_dict():
    state = nnx.state(_Model(), nnx.Param)
    want = {"layers": {"attn_norm": {"scale": False}, "mlp": {"kernel": True, "bias": False}},
            "embed": {"embedding": True}, "temperature": False}                # scalars do not decay
    assert optimizer.decay_mask(nnx.to_pure_dict(state)) == want
    masked_state = optimizer.decay_mask(state)                                 # Variables holding bools
    assert isinstance(masked_state, nnx.State)
    assert nnx.to_pure_dict(masked_state) == want


def test_make_optimizer_decays_only_masked_params():
    """With zero gradients an update is pure weight decay: -lr * wd * param on decayed params, 0 elsewhere."""
    params = model_params()
    zeros = jax.tree.map(jnp.zeros_like, params)
    for name in ("adamw", "lion", "muon"):
        cfg = OptimizerConfig(name=name, learning_rate=0.5, warmup_steps=0, total_steps=100,
                              schedule="constant",
                              weight_decay=0.1)
        tx = optimizer.make_optimizer(cfg, params)
        updates, _ = tx.update(zeros, tx.init(params), params)
        kernel = params["layers"]["mlp"]["kernel"]
        np.testing.assert_allclose(updates["layers"]["mlp"]["kernel"], -0.05 * kernel, 1e-5, err_msg=name)
        np.testing.assert_allclose(updates["embed"]["embedding"], -0.05 * params["embed"]["embedding"],
                                   rtol=1e-5, err_msg=name)
        np.testing.assert_array_equal(updates["layers"]["attn_norm"]["scale"], 0.0, err_msg=name)


def test_muon_dimension_numbers_for_scanned_kernels():
    params = {"layers": {"attn_norm": jnp.ones((L, D)), "w_up": jnp.ones((L, D, 3 * D)),
                         "wq": jnp.ones((L, D, 2, 4)), "wo": jnp.ones((L, 2, 4, D))},
              "embed": jnp.ones((V, D)), "unembedding": jnp.ones((D, V)), "proj": jnp.ones((D, 4))}
    dims = optimizer.muon_dimension_numbers(params)
    M = optax.contrib.MuonDimensionNumbers
    assert dims["layers"]["attn_norm"] is None and dims["embed"] is None and dims["unembedding"] is None
    assert dims["layers"]["w_up"] == M((1,), (2,))                  # axis 0 (layers) is a batch axis
    assert dims["layers"]["wq"] == M((1,), (2, 3))
    assert dims["layers"]["wo"] == M((1, 2), (3,))
    assert dims["proj"] == M((0,), (1,))


def test_muon_orthogonalizes_each_layer_separately():
    """A (L, D, D) kernel whose layer 1 gradient is layer 0's times 100: Newton-Schulz is scale-free per
    matrix, so both layers get the same near-orthogonal update; flattening or mixing the layers would let
    the 100x layer dominate."""
    g0 = jax.random.normal(jax.random.key(3), (D, D))
    grads = {"layers": {"mlp": {"kernel": jnp.stack([g0, 100.0 * g0])}}}
    params = jax.tree.map(jnp.zeros_like, grads)
    cfg = OptimizerConfig(name="muon", learning_rate=1.0, warmup_steps=0, total_steps=100,
                          schedule="constant", clip_norm=0.0)
    tx = optimizer.make_optimizer(cfg, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    u = np.asarray(updates["layers"]["mlp"]["kernel"])                         # (L, D, D)
    np.testing.assert_allclose(u[0], u[1], rtol=1e-4, atol=1e-6)
    sv = np.linalg.svd(u[0], compute_uv=False)
    assert sv.min() > 0.3 * sv.max(), sv                                       # roughly orthogonal


# ---- optimizers ----

@pytest.mark.parametrize(("name", "lr"),
                         [("adamw", 3e-2), ("lion", 1e-2), ("adafactor", 3e-2), ("muon", 3e-2)])
def test_each_optimizer_reduces_loss(name, lr):
    params, batch = model_params(), problem()
    cfg = OptimizerConfig(name=name, learning_rate=lr, warmup_steps=5, total_steps=60, weight_decay=0.01)
    before = float(loss_fn(params, *batch))
    after = float(loss_fn(train(cfg, params, 60, batch), *batch))
    assert after < 0.5 * before, (name, before, after)


def test_clipping_bounds_the_update():
    """eps=1 makes adam's first step ~ lr * g / (|g| + 1) ~ lr * g for small g, so the update shows the
    clipped gradient: its norm is at most lr * clip_norm, and without clipping it is far larger."""
    params = model_params()
    grads = jax.tree.map(lambda p: 1000.0 * jnp.ones_like(p), params)
    base = OptimizerConfig(learning_rate=0.1, warmup_steps=0, total_steps=100, schedule="constant", eps=1.0,
                           weight_decay=0.0)
    norms = {}
    for clip in (1.0, 0.0):
        cfg = dataclasses.replace(base, clip_norm=clip)
        tx = optimizer.make_optimizer(cfg, params)
        updates, _ = tx.update(grads, tx.init(params), params)
        norms[clip] = float(optax.tree.norm(updates))
    assert 0.5 * 0.1 < norms[1.0] <= 0.1 * 1.0
    assert norms[0.0] > 10 * norms[1.0]


def test_make_optimizer_on_nnx_state():
    state = nnx.state(_Model(), nnx.Param)
    for name in OPTIMIZERS:
        tx = optimizer.make_optimizer(OptimizerConfig(name=name, warmup_steps=0, total_steps=100), state)
        grads = jax.tree.map(jnp.ones_like, state)
        updates, _ = tx.update(grads, tx.init(state), state)
        new = optax.apply_updates(state, updates)
        assert isinstance(new, nnx.State)
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new))
