"""Mesh construction, logical-axis rules, and a tiny model's loss and grads on 8 simulated CPU devices
equal to one device's, for data, fsdp and tensor parallel meshes."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stages.train import sharding
from stages.train.mesh import MeshConfig
from tests.conftest import run_on_simulated_devices


@pytest.mark.parametrize("cfg, n, shape", [
    (MeshConfig(), 8, (8, 1, 1, 1)), (MeshConfig(fsdp=4), 8, (2, 4, 1, 1)),
    (MeshConfig(data=2, fsdp=2, tensor=2), 8, (2, 2, 1, 2)),
    (MeshConfig(tensor=8), 8, (1, 1, 1, 8)), (MeshConfig(), 1, (1, 1, 1, 1)),
    (MeshConfig(fsdp=2, expert=4), 8, (1, 2, 4, 1)),
])
def test_mesh_shapes(cfg, n, shape):
    assert cfg.shape(n) == shape


@pytest.mark.parametrize("cfg, message", [
    (MeshConfig(fsdp=3), "mesh data=-1 x fsdp=3 x tensor=1 does not match the 8 devices"),
    (MeshConfig(data=2, fsdp=2), "mesh data=2 x fsdp=2 x tensor=1 does not match the 8 devices"),
    (MeshConfig(fsdp=2, expert=3), "mesh data=-1 x fsdp=2 x expert=3 x tensor=1 does not match the 8 "
                                   r"devices; .* needs fsdp x expert x tensor = 6 to divide 8"),
])
def test_a_mesh_that_does_not_fit_the_devices_fails_naming_the_axes(cfg, message):
    with pytest.raises(ValueError, match=message):
        cfg.shape(8)


def test_make_mesh_checks_before_building_and_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="does not match the 1 devices"):
        sharding.make_mesh(MeshConfig(data=2), devices=jax.devices()[:1])
    mesh = sharding.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    assert mesh.axis_names == ("data", "fsdp", "expert", "tensor")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
    with pytest.raises(ValueError, match="MeshConfig.tensor=0 must be >= 1"):
        MeshConfig(tensor=0)
    with pytest.raises(ValueError, match="only data may be -1"):
        MeshConfig(fsdp=-1)


def test_logical_rules_use_each_mesh_axis_once_and_skip_axes_that_do_not_divide():
    P = jax.sharding.PartitionSpec
    assert sharding.logical_to_spec(("batch", "length", "embed")) == P(("data", "fsdp", "expert"), None, None)
    experts = ("layers", "experts", "embed", "mlp")               # a MoE layer's stacked expert weights
    assert sharding.logical_to_spec(experts) == P(None, "expert", "fsdp", "tensor")
    wq_names = ("layers", "embed", "heads", "head_dim")     # embed: fsdp and expert (the experts': fsdp)
    assert sharding.logical_to_spec(wq_names) == P(None, ("fsdp", "expert"), "tensor", None)
    mesh = jax.sharding.AbstractMesh((2, 2, 4), ("data", "fsdp", "tensor"))
    assert sharding.logical_to_spec(("embed", "kv_heads"), (64, 2), mesh) == P("fsdp", None)   # 2 % 4 != 0
    with pytest.raises(ValueError, match="logical axis 'embd' has no sharding rule"):
        sharding.logical_to_spec(("embd",))


def test_with_logical_constraint_is_a_noop_outside_a_mesh():
    x = jnp.arange(6.0).reshape(2, 3)
    assert sharding.with_logical_constraint(x, ("batch", "embed")) is x


def test_global_batch_on_one_device():
    mesh = sharding.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    batch = sharding.global_batch(np.arange(12, dtype=np.int32).reshape(3, 4), mesh)
    np.testing.assert_array_equal(batch, np.arange(12).reshape(3, 4))


SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from stages.train import model as M, sharding
    from stages.train.mesh import MeshConfig
    from stages.train.model_config import ModelConfig

    assert jax.device_count() == 8, jax.devices()

    def spec(x):
        # x's PartitionSpec as JSON with trailing Nones dropped, e.g. [["data", "fsdp"]]
        s = list(x.sharding.spec)
        while s and s[-1] is None:
            s.pop()
        return [list(a) if isinstance(a, tuple) else a for a in s]
    cfg = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64,
                        max_seq_len=32, dtype="float32", attention_impl="xla")
    toks = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (8, 17), 0, 128), np.int32)

    def loss_fn(graphdef):
        def loss(p, t):
            m = nnx.merge(graphdef, p)
            hidden, _ = m(t[:, :-1], segment_ids=(t[:, :-1] < 3).cumsum(-1))
            logp = jax.nn.log_softmax(m.logits(hidden), axis=-1)
            return -jnp.take_along_axis(logp, t[:, 1:, None], axis=-1).mean(), hidden
        return jax.jit(jax.value_and_grad(loss, has_aux=True))

    net = M.Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(net, nnx.Param)
    (ref_loss, _), ref_grads = loss_fn(graphdef)(params, jnp.asarray(toks))
    out = {"ref_loss": float(ref_loss)}
    for name, mcfg in {"data8": MeshConfig(), "data2_fsdp4": MeshConfig(data=2, fsdp=4),
                       "data2_fsdp2_tensor2": MeshConfig(data=2, fsdp=2, tensor=2)}.items():
        mesh = sharding.make_mesh(mcfg)
        graphdef, params = nnx.split(M.Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
        params = jax.device_put(params, sharding.param_shardings(params, mesh))
        batch = sharding.global_batch(toks, mesh)
        with jax.set_mesh(mesh):
            (loss, hidden), grads = loss_fn(graphdef)(params, batch)
        pairs = zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))
        diffs = [float(jnp.abs(g - r).max()) for g, r in pairs]
        out[name] = {"loss": float(loss), "grad_max_diff": max(diffs),
                     "grad_max": max(float(jnp.abs(r).max()) for r in jax.tree.leaves(ref_grads)),
                     "wq_spec": spec(params["layers"]["wq"][...]),
                     "embed_spec": spec(params["embed"][...]),
                     "batch_spec": spec(batch),
                     "hidden_on_batch_axes": hidden.sharding.is_equivalent_to(
                         sharding.batch_sharding(mesh, 3), 3)}

    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def sharded_results():
    return run_on_simulated_devices(SCRIPT, timeout=300)


@pytest.mark.parametrize("mesh", ["data8", "data2_fsdp4", "data2_fsdp2_tensor2"])
def test_sharded_loss_and_grads_equal_one_device(sharded_results, mesh):
    ref, got = sharded_results["ref_loss"], sharded_results[mesh]
    assert 3.0 < ref < 6.0                                       # ~ln(128): an untrained model's loss
    assert got["loss"] == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert got["grad_max"] > 1e-4 and got["grad_max_diff"] < 1e-5, got
    assert got["batch_spec"] == [["data", "fsdp", "expert"]]
    assert got["hidden_on_batch_axes"] is True                  # the activation constraints held


def test_params_are_placed_by_their_logical_names(sharded_results):
    r = sharded_results
    # mesh axes of size 1: harmless
    assert r["data8"]["wq_spec"] == [None, ["fsdp", "expert"], "tensor"]
    assert r["data2_fsdp2_tensor2"]["wq_spec"] == [None, ["fsdp", "expert"], "tensor"]
    assert r["data2_fsdp2_tensor2"]["embed_spec"] == ["tensor", ["fsdp", "expert"]]
