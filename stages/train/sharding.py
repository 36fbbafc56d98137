"""One device mesh with named axes ("data", "fsdp", "expert", "tensor") and the logical-axis rules that place
parameters and activations on it.

    from stages.train import sharding
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=4))              # 8 devices; fails before compiling
    mesh = sharding.make_mesh(MeshConfig(fsdp=4, dcn_data=2))          # 2 slices of 4: data 2 across them
    params = jax.device_put(params, sharding.param_shardings(params, mesh))   # placed by their logical names
    batch = sharding.global_batch(local_tokens, mesh)                  # (B_local, T) numpy -> global Array
    with jax.set_mesh(mesh):                                           # activation constraints take effect
        loss = jax.jit(step)(...)

`data` splits the batch only (parameters replicated), `fsdp` splits the batch and shards parameters
(ZeRO-3: gathered per layer inside the scan), `expert` splits the batch and a mixture of experts' experts
(stages/train/moe.py), `tensor` splits heads and the MLP dim (Megatron).
`MeshConfig` (the axis sizes; gin binds it) and the logical-axis rules (`LOGICAL_RULES`, `mesh_axes`) live
in `mesh.py`, JAX-free, so the planner shards parameters exactly as training does.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import PartitionSpec

from stages.train.mesh import AXES, BATCH_AXES, Mesh, MeshConfig, mesh_axes
from stages.train.planning import topology

log = logging.getLogger(__name__)


def make_mesh(cfg: MeshConfig, devices=None):
    """A `jax.sharding.Mesh` with axes ("data", "fsdp", "expert", "tensor") over `devices` (default: all).

    Multi-slice (`cfg.num_slices` > 1, see MeshConfig): each axis is its size within a slice x its dcn size
    across slices, slice-major (with dcn_data=2 the first half of the data indices is one slice, the second
    half the other). Devices that carry `slice_index` (a TPU slice's, or a multi-slice topology's
    compile-only devices) are grouped by it with `mesh_utils.create_hybrid_device_mesh`; devices without it
    (CPU and GPU, like the simulated devices in tests) are split in order into `num_slices` contiguous
    groups that stand for the slices, so the same config gives the same layout.

    `cfg.device_order` (one slice's; "" is jax's placement, the code below) is built exactly on devices
    that carry `coords` (a TPU slice's, or an AOT topology's compile-only devices): the device at each mesh
    index is the one at `topology.coords` of it. Devices without coordinates (CPU, GPU) ignore it.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = cfg.shape(len(devices))                           # whole mesh: ici x dcn per axis
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    if (grid := _placed(cfg, devices)) is not None:
        return jax.sharding.Mesh(grid, AXES, axis_types=auto)
    found = _slices_in(devices)
    if found is not None and found != cfg.num_slices:
        raise ValueError(f"the {len(devices)} devices are in {found} slices, but MeshConfig "
                         f"{cfg.describe_dcn()} spans {cfg.num_slices}; the dcn sizes must multiply to the "
                         "number of slices")
    if cfg.num_slices == 1:
        try:
            return jax.make_mesh(shape, AXES, axis_types=auto, devices=devices)
        except NotImplementedError as e:          # an axis is no product of whole torus sides: split one
            _warn_split(shape, e)
            grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
            return jax.sharding.Mesh(grid, AXES, axis_types=auto)
    ici = cfg.ici_shape(len(devices))
    if found is not None:
        try:
            grid = mesh_utils.create_hybrid_device_mesh(ici, cfg.dcn_shape, devices)
        except NotImplementedError as e:
            _warn_split(ici, e)
            grid = mesh_utils.create_hybrid_device_mesh(ici, cfg.dcn_shape, devices,
                                                        allow_split_physical_axes=True)
    else:
        grid = _contiguous_slices(devices, ici, cfg.dcn_shape)
    return jax.sharding.Mesh(grid, AXES, axis_types=auto)


def _placed(cfg: MeshConfig, devices) -> np.ndarray | None:
    """`devices` as the (data, fsdp, expert, tensor) array `cfg.device_order` plans, by their coordinates;
    None for jax's placement ("") or devices without coordinates; ValueError for an order over several
    slices (an order names one slice's grid) or one that does not tile these devices' grid."""
    if not cfg.device_order or not all(hasattr(d, "coords") for d in devices):
        return None
    if cfg.num_slices > 1:
        raise ValueError(f"MeshConfig.device_order={cfg.device_order!r} places one slice's grid; with "
                         f"{cfg.num_slices} slices ({cfg.describe_dcn()}) leave it \"\" (jax's placement)")
    low = [min(d.coords[i] for d in devices) for i in range(3)]
    at = {tuple(c - m for c, m in zip(d.coords[:3], low)): d for d in devices}
    sides = tuple(max(xyz[i] for xyz in at) + 1 for i in range(3))
    if len(at) != len(devices) or math.prod(sides) != len(devices):
        raise ValueError(f"the {len(devices)} devices are not one chip each of a {sides} grid (a megacore "
                         "TPU's devices are; MeshConfig.device_order needs that)")
    named = "x".join(map(str, sides))
    grid = topology.Grid(f"the devices' grid {named}", sides, (False,) * 3)   # wraps: no part of the order
    sizes = cfg.ici_shape(len(devices))
    order = topology.parse_order(cfg.device_order, grid, sizes)
    out = np.empty(sizes, dtype=object)
    for index in np.ndindex(*sizes):
        out[index] = at[topology.coords(grid, order, index)]
    return out


def _warn_split(shape, error) -> None:
    """A TPU slice lays a mesh axis along whole sides of its torus where it can (v5p-2048 is 8x8x16: axes of
    8, 16, 64, 128 or 1024 chips); an axis of another size (fsdp 512 x expert 2) splits a side, as MaxText's
    allow_split_physical_axes does, and its collectives use fewer of the torus's wrap-around links."""
    log.warning("mesh %s is not whole sides of the TPU torus (%s); splitting a physical axis",
                dict(zip(AXES, shape)), str(error).split(".")[0])


def _slices_in(devices) -> int | None:
    """How many slices `devices` come from, by their `slice_index`; None when they carry none."""
    if not all(hasattr(d, "slice_index") for d in devices):
        return None
    return len({d.slice_index for d in devices})


def _contiguous_slices(devices, ici, dcn) -> np.ndarray:
    """Devices without `slice_index`, taken in order as prod(dcn) slices of prod(ici) devices each, laid
    out as `create_hybrid_device_mesh` lays real slices: slice s sits at position s of the dcn grid."""
    n = math.prod(ici)
    slices = [mesh_utils.create_device_mesh(ici, devices[s * n:(s + 1) * n]) for s in range(math.prod(dcn))]
    grid = np.stack(slices).reshape(*dcn, *ici)               # (Dd, Df, De, Dt, Id, If, Ie, It)
    # Interleave each axis's dcn and ici positions, dcn outer: index along data = dd * Id + id.
    n_axes = len(ici)
    order = [j for a in range(n_axes) for j in (a, n_axes + a)]
    return grid.transpose(order).reshape([d * i for d, i in zip(dcn, ici)])


def logical_to_spec(names, shape=None, mesh=None, rules=None):
    """Logical axis names -> `PartitionSpec` (see `mesh.mesh_axes`; with `shape` and `mesh`, a mesh axis
    that does not divide its dimension, or that the mesh lacks, leaves that dimension replicated over it)."""
    axes = mesh_axes(names, shape, None if mesh is None else Mesh.of(mesh), rules)
    if shape is not None and mesh is not None:      # a mesh without one of AXES splits nothing over it
        axes = tuple(tuple(a for a in dim if a in mesh.axis_names) for dim in axes)
    return PartitionSpec(*(None if not a else a[0] if len(a) == 1 else a for a in axes))


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


def opt_state_shardings(tx, abstract_params, params_shardings, mesh):
    """Shardings for `tx.init(params)`: every moment shaped like a parameter takes that parameter's
    sharding; everything else (step counts, scalars) is replicated."""
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    return optax.tree_map_params(tx, lambda _, s: s, abstract_opt, params_shardings,
                                 transform_non_params=lambda _: replicated(mesh),
                                 is_leaf=lambda x: isinstance(x, nnx.Variable))


def shardings_of(tree):
    """The shardings of a pytree of arrays (the same structure), e.g. to jit with in/out_shardings."""
    return jax.tree.map(lambda x: x.sharding, tree)


def replicated(mesh):
    """A sharding that keeps a whole copy on every device of `mesh`."""
    return jax.sharding.NamedSharding(mesh, PartitionSpec())


def target_platform() -> str:
    """The platform the computation being traced will run on: the active mesh's ("tpu" while compiling
    ahead of time for a TPU topology on a CPU machine), else JAX's default backend."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return device.platform if device is not None and device.platform else jax.default_backend()


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
    n = Mesh.of(mesh).batch_shards
    global_rows = local_batch.shape[0] * jax.process_count()
    if global_rows % n:
        raise ValueError(f"global batch {global_rows} rows is not divisible by data x fsdp = {n} "
                         f"(mesh {dict(mesh.shape)})")
    return jax.make_array_from_process_local_data(batch_sharding(mesh, local_batch.ndim), local_batch)
