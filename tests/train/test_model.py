"""The decoder: config validation, shapes, causality, packing, scan/loop, remat, RoPE, KV cache, and the
parameter counts of the gin model sizes."""

from __future__ import annotations

import ast
import dataclasses
import glob
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stages.train import model as M
from stages.train import model_config as C

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = C.ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64,
                     max_seq_len=64, dtype="float32", attention_impl="xla")


def build(cfg=TINY, seed=0):
    return M.Transformer(cfg, rngs=nnx.Rngs(seed))


def tokens(shape, seed=1, vocab=TINY.vocab_size):
    return jax.random.randint(jax.random.PRNGKey(seed), shape, 0, vocab, jnp.int32)


def forward(net, toks, **kw):
    """Jitted forward (hidden only) with the given keyword arguments."""
    graphdef, state = nnx.split(net)
    return jax.jit(lambda s, t, kw: nnx.merge(graphdef, s)(t, **kw)[0])(state, toks, kw)


def loss_and_grads(net, toks):
    """A plain mean next-token cross entropy and its gradients (float32)."""
    graphdef, params = nnx.split(net, nnx.Param)

    def loss(p):
        m = nnx.merge(graphdef, p)
        hidden, _ = m(toks[:, :-1])
        logp = jax.nn.log_softmax(m.logits(hidden), axis=-1)                       # (B, T, V)
        return -jnp.take_along_axis(logp, toks[:, 1:, None], axis=-1).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


# ------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs, message", [
    ({"n_heads": 5}, "n_heads=5 does not divide d_model=256"),
    ({"n_heads": 4, "n_kv_heads": 3}, "n_kv_heads=3 does not divide n_heads=4"),
    ({"rope_scaling": "ntk2"},
     "rope_scaling='ntk2' is not one of ('none', 'linear', 'ntk', 'yarn', 'llama3')"),
    ({"remat": "fulll"}, "remat='fulll' is not one of ('none', 'full', 'minimal'"),
    ({"dtype": "bf16"}, "dtype='bf16' is not one of ('float32', 'bfloat16', 'float16')"),
    ({"param_dtype": "int8"}, "param_dtype='int8' is not one of"),
    ({"attention_impl": "flash"}, "attention_impl='flash' is not one of"),
    ({"rope_factor": 0.5}, "rope_factor=0.5 must be >= 1.0"),
    ({"n_layers": 0}, "n_layers=0 must be >= 1"),
    ({"head_dim": 7, "n_heads": 4}, "head dim 7 must be even"),
])
def test_config_errors_name_the_field_and_the_valid_values(kwargs, message):
    with pytest.raises(ValueError) as e:
        C.ModelConfig(**kwargs)
    assert message in str(e.value)


def test_derived_dims_and_attention_impl_names():
    from stages.train import attention

    assert C.ATTENTION_IMPLS == attention.IMPLS
    assert C.ModelConfig(d_model=256).effective_mlp_dim == 768          # 8/3 * 256 = 682.7 -> 768
    assert C.ModelConfig(d_model=768, n_heads=12).effective_mlp_dim == 2048
    assert C.ModelConfig(d_model=256, n_heads=4).effective_head_dim == 64
    assert tuple(M.REMAT_POLICIES) == C.REMAT_NAMES


def test_the_training_configs_and_the_stage_import_no_jax():
    # What planning imports: every training config, their parameter counts and FLOPs, the stage's Config,
    # and the planner with every module it answers from (all of stages/train/planning/ but aot.py).
    code = ("import sys; import stages.train, stages.train.model_config as c; "
            "import stages.train.mesh, stages.train.optimizer_config, stages.train.planning.hardware; "
            "import stages.train.planning.planner, stages.train.planning.search; "
            "c.flops_per_token(c.ModelConfig(), 256); "
            "print('HEAVY', sorted(m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


# ------------------------------------------------------------------------------------------------ forward
def test_forward_shapes_and_dtypes():
    cfg = dataclasses.replace(TINY, dtype="bfloat16")
    net = build(cfg)
    hidden, cache = net(tokens((2, 8)))
    assert hidden.shape == (2, 8, 32) and hidden.dtype == jnp.bfloat16 and cache is None
    assert net.unembed().shape == (32, 97)
    logits = net.logits(hidden)
    assert logits.shape == (2, 8, 97) and logits.dtype == jnp.float32
    assert bool(jnp.isfinite(logits).all())
    tied = build(dataclasses.replace(cfg, tie_embeddings=True))
    np.testing.assert_array_equal(tied.unembed(), tied.embed[...].T.astype(jnp.bfloat16))
    assert "unembedding" not in nnx.state(tied)


def test_every_param_has_logical_names_with_the_layers_axis_on_stacked_ones():
    state = nnx.state(nnx.eval_shape(lambda: build()), nnx.Param)
    for path, var in nnx.to_flat_state(state):
        names = var.get_metadata()["out_sharding"]
        assert len(names) == len(var.shape), path
        assert (names[0] == "layers") == (path[0] == "layers"), (path, names)
        assert set(names) <= {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", "layers"}


def test_causal_a_future_token_does_not_change_the_past():
    net = build()
    a = tokens((2, 16))
    b = a.at[:, 10].set((a[:, 10] + 1) % TINY.vocab_size)
    ha, hb = forward(net, a), forward(net, b)
    np.testing.assert_allclose(ha[:, :10], hb[:, :10], atol=1e-6)
    assert float(jnp.abs(ha[:, 10:] - hb[:, 10:]).max()) > 1e-3


def test_packed_documents_equal_each_run_alone():
    net = build()
    first, second = tokens((1, 7), seed=2), tokens((1, 9), seed=3)
    packed = jnp.concatenate([first, second], axis=1)                               # (1, 16)
    seg = jnp.asarray([[0] * 7 + [1] * 9], jnp.int32)
    hp = forward(net, packed, segment_ids=seg)
    np.testing.assert_allclose(hp[:, :7], forward(net, first), atol=1e-5)
    np.testing.assert_allclose(hp[:, 7:], forward(net, second), atol=1e-5)


def test_scan_and_loop_give_the_same_hidden_states():
    toks = tokens((2, 12))
    scanned = forward(build(TINY), toks)
    looped = forward(build(dataclasses.replace(TINY, scan_layers=False)), toks)
    np.testing.assert_allclose(scanned, looped, atol=1e-6)


@pytest.fixture(scope="module")
def remat_reference():
    toks = tokens((2, 13))
    return toks, loss_and_grads(build(TINY), toks)


@pytest.mark.parametrize("remat, scan", [
    ("full", True), ("minimal", True), ("save_qkv_proj", True),
    pytest.param("full", False, marks=pytest.mark.slow),
    pytest.param("dots_no_batch", True, marks=pytest.mark.slow),
    pytest.param("save_dots", True, marks=pytest.mark.slow),
])
def test_each_remat_policy_gives_the_same_loss_and_grads_as_none(remat_reference, remat, scan):
    toks, (ref_loss, ref_grads) = remat_reference
    net = build(dataclasses.replace(TINY, remat=remat, scan_layers=scan))
    graphdef, params = nnx.split(net, nnx.Param)
    jaxpr = str(jax.make_jaxpr(lambda p: nnx.merge(graphdef, p)(toks)[0])(params))
    assert "remat2[" in jaxpr and "policy=" in jaxpr                          # the layer really is rematted
    loss, grads = loss_and_grads(net, toks)
    assert float(ref_loss) > 0
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(g, r, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------------------- RoPE
def test_rope_depends_only_on_relative_positions():
    net = build()
    toks = tokens((1, 12))
    pos = jnp.arange(12, dtype=jnp.int32)[None]
    np.testing.assert_allclose(forward(net, toks, positions=pos), forward(net, toks, positions=pos + 1000),
                               atol=2e-4)


def test_rope_inv_freq_scalings():
    base = C.ModelConfig(d_model=256, n_heads=4, max_seq_len=4096)                 # H = 64
    none, _ = M.rope_inv_freq(base)
    np.testing.assert_allclose(none, 10000.0 ** (-np.arange(0, 64, 2) / 64))
    lin, _ = M.rope_inv_freq(dataclasses.replace(base, rope_scaling="linear", rope_factor=4.0))
    np.testing.assert_allclose(lin, none / 4)
    ntk, _ = M.rope_inv_freq(dataclasses.replace(base, rope_scaling="ntk", rope_factor=4.0))
    assert ntk[0] == none[0] and np.isclose(ntk[-1], none[-1] / 4, rtol=1e-9)  # base stretched by 4^(H/(H-2))
    for kind in ("llama3", "yarn"):
        scaled, temp = M.rope_inv_freq(dataclasses.replace(base, rope_scaling=kind, rope_factor=4.0))
        # High frequencies (short wavelengths) are kept, the lowest are interpolated by the factor.
        assert scaled[0] == none[0] and np.isclose(scaled[-1], none[-1] / 4), kind
        assert np.all(scaled <= none + 1e-15) and np.all(scaled >= none / 4 - 1e-15), kind
    assert M.rope_inv_freq(dataclasses.replace(base, rope_scaling="yarn", rope_factor=4.0))[1] == \
        pytest.approx(0.1 * np.log(4) + 1)


def test_rope_scalings_run_and_differ_from_none_beyond_the_original_length():
    toks = tokens((1, 40))
    ref = forward(build(TINY), toks)                                              # max_seq_len 64
    for kind in C.ROPE_SCALINGS[1:]:
        cfg = dataclasses.replace(TINY, rope_scaling=kind, rope_factor=4.0)      # original length 16
        out = forward(build(cfg), toks)
        assert bool(jnp.isfinite(out).all()), kind
        assert float(jnp.abs(out[:, 16:] - ref[:, 16:]).max()) > 1e-3, kind


# ----------------------------------------------------------------------------------------------- KV cache
def test_prefill_then_decoding_with_the_cache_matches_one_full_forward_pass():
    net = build()
    toks = tokens((2, 12))
    full = net.logits(forward(net, toks))                                         # (2, 12, V)
    graphdef, state = nnx.split(net)
    step = jax.jit(lambda s, t, c: nnx.merge(graphdef, s)(t, cache=c))
    cache = net.init_cache(2, 16)
    assert cache.k.shape == (2, 2, 16, 2, 8) and int(cache.length) == 0
    got = []
    for lo, hi in ((0, 5), (5, 6), (6, 7), (7, 10), (10, 11), (11, 12)):         # prefill, tokens, a chunk
        hidden, cache = step(state, toks[:, lo:hi], cache)
        got.append(net.logits(hidden))
    assert int(cache.length) == 12
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), full, atol=1e-5)
    # Segment ids 0 (the default) occupy the 12 written slots; the 4 oldest are still empty.
    np.testing.assert_array_equal(cache.segment_ids[0], [M.EMPTY_SLOT] * 4 + [0] * 12)


# ------------------------------------------------------------------------------------ model sizes (gin)
def load_gin_model(name: str) -> C.ModelConfig:
    """A minimal reader of gin/model/<name>.gin: follows includes, binds `train.ModelConfig.<field>` and
    macros (`VOCAB_SIZE = 4096`, used as `%VOCAB_SIZE`)."""
    values: dict = {}
    macros: dict = {}

    def value_of(text: str):
        text = text.strip()
        return macros[text[1:]] if text.startswith("%") else ast.literal_eval(text)

    def read(rel):
        with open(os.path.join(REPO, "gin", rel)) as f:
            for raw in f:
                line = raw.split("#", 1)[0].strip()
                if line.startswith("include"):
                    read(ast.literal_eval(line.split(None, 1)[1]))
                elif line.startswith("train.ModelConfig."):
                    key, value = line[len("train.ModelConfig."):].split("=", 1)
                    values[key.strip()] = value_of(value)
                elif line and line.split("=", 1)[0].strip().isidentifier():        # a macro
                    key, value = line.split("=", 1)
                    macros[key.strip()] = value_of(value)
                elif line:
                    raise AssertionError(f"{rel}: unexpected line {raw!r}")

    read(f"model/{name}.gin")
    return C.ModelConfig(**values)


# name -> the published size of the model each config imitates
NOMINAL = {"124m": 124.4e6, "1b": 1.236e9, "9b": 9.24e9, "600b": 600e9, "600b_dense": 600e9}


# Every model file but the shared base, found by glob so that a new size cannot go untested.
MODEL_SIZES = sorted(os.path.basename(p)[:-len(".gin")] for p in glob.glob(f"{REPO}/gin/model/*.gin")
                     if not p.endswith("/base.gin"))


def test_the_model_sizes_are_found():
    assert {"tiny", "124m", "600b"} <= set(MODEL_SIZES) and "base" not in MODEL_SIZES


@pytest.mark.parametrize("name", MODEL_SIZES)
def test_gin_model_sizes_have_their_nominal_parameter_count(name):
    assert name == "tiny" or name in NOMINAL, \
        f"gin/model/{name}.gin: add the published size of the model it imitates to NOMINAL"
    cfg = load_gin_model(name)
    n = M.num_params(cfg)                                     # abstract shapes only: nothing allocated
    assert n == sum(C.param_counts(cfg).values())
    if name == "tiny":
        assert cfg.d_model == 128 and cfg.n_layers == 4 and cfg.max_seq_len == 256
        assert 1e6 < n < 3e6
    else:
        assert abs(n / NOMINAL[name] - 1) < 0.03, f"{name}: {n:,} params vs nominal {NOMINAL[name]:,.0f}"


def test_flops_per_token_is_6n_plus_causal_attention():
    cfg = load_gin_model("124m")                              # tied: the embedding is the unembedding
    counts = C.param_counts(cfg)
    n_matmul = counts["layers"] - 12 * 2 * 768 + counts["embed"]
    # Causal attention: half of PaLM's full 12 * L * H * Dh * T (MaxText's convention).
    assert C.flops_per_token(cfg, 1024) == 6 * n_matmul + 6 * 12 * 768 * 1024
    assert C.flops_per_token(cfg, 1024) == pytest.approx(6 * 123.5e6 + 56.6e6, rel=0.01)
