"""One device mesh with named axes ("data", "fsdp", "tensor") and the logical-axis rules that place
parameters and activations on it.

    from stages.train import sharding
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=4))              # 8 devices; fails before compiling
    sharding.shard_model(net, mesh)                                    # params placed by their logical names
    batch = sharding.global_batch(local_tokens, mesh)                  # (B_local, T) numpy -> global Array
    with jax.set_mesh(mesh):                                           # activation constraints take effect
        loss = jax.jit(step)(...)

`data` splits the batch only (parameters replicated), `fsdp` splits the batch and shards parameters
(ZeRO-3: gathered per layer inside the scan), `tensor` splits heads and the MLP dim (Megatron).
`MeshConfig` (the axis sizes; gin binds it) lives in `configs.py`, JAX-free.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec

from stages.train.configs import AXES, MeshConfig

BATCH_AXES = ("data", "fsdp")
# Logical axis -> mesh axes (None: replicated). A mesh axis already used by an earlier dimension of the
# same array is skipped, so ("batch", "length", "embed") shards batch over data x fsdp and leaves embed whole.
LOGICAL_RULES: dict[str, tuple[str, ...] | str | None] = {
    "batch": BATCH_AXES,
    "length": None,
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "layers": None,
}


def make_mesh(cfg: MeshConfig, devices=None):
    """A `jax.sharding.Mesh` with axes ("data", "fsdp", "tensor") over `devices` (default: all)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = cfg.shape(len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.make_mesh(shape, AXES, axis_types=auto, devices=devices)


def logical_to_spec(names, shape=None, mesh=None, rules=None):
    """Logical axis names -> `PartitionSpec`. With `shape` and `mesh`, a mesh axis that does not divide its
    dimension is dropped (that dimension stays replicated over it) rather than failing at placement."""
    rules = LOGICAL_RULES if rules is None else rules
    used: set[str] = set()
    spec = []
    for i, name in enumerate(names):
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used)
        if shape is not None and mesh is not None:
            kept, size = [], 1
            for a in axes:
                if shape[i] % (size * mesh.shape[a]) == 0:
                    kept.append(a)
                    size *= mesh.shape[a]
            axes = tuple(kept)
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def param_shardings(model_state, mesh):
    """`NamedSharding`s for an `nnx.State` (or a module's `nnx.state(...)`), from each Variable's logical
    names (`out_sharding` metadata); the same tree structure, ready for `jax.device_put` or jit."""
    def one(var):
        shape = tuple(np.shape(var.get_value()))            # arrays or ShapeDtypeStructs (abstract state)
        names = var.get_metadata().get("out_sharding") or (None,) * len(shape)
        if len(names) != len(shape):
            raise ValueError(f"a variable of shape {shape} has logical names {names} of another rank")
        return var.replace(jax.sharding.NamedSharding(mesh, logical_to_spec(names, shape, mesh)))

    return jax.tree.map(one, model_state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model, mesh):
    """Places every variable of `model` (an nnx.Module) on `mesh` by its logical names, in place.

    Returns the model."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, param_shardings(state, mesh)))
    return model


def with_logical_constraint(x, names):
    """`jax.lax.with_sharding_constraint` by logical names under a mesh context (`jax.set_mesh(mesh)`);
    a no-op without one, so the model runs unchanged on one device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(names, x.shape, mesh))


def batch_sharding(mesh, ndim: int = 2):
    """The sharding of a batch: the leading axis over ("data", "fsdp"), the rest replicated."""
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(BATCH_AXES, *(None,) * (ndim - 1)))


def global_batch(local_batch: np.ndarray, mesh) -> Any:
    """This process's rows (B_local, ...) -> the global `jax.Array` (B_local * processes, ...) sharded over
    ("data", "fsdp") on the batch axis. Every process passes its own, equally sized rows."""
    n = math.prod(mesh.shape[a] for a in BATCH_AXES)
    global_rows = local_batch.shape[0] * jax.process_count()
    if global_rows % n:
        raise ValueError(f"global batch {global_rows} rows is not divisible by data x fsdp = {n} "
                         f"(mesh {dict(mesh.shape)})")
    return jax.make_array_from_process_local_data(batch_sharding(mesh, local_batch.ndim), local_batch)
