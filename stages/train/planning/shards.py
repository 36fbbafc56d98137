"""How big one device's share of a training config's arrays is (no JAX): the sizes both the memory model
(memory.py) and the step-time model (step_time.py) count from.

    shards.shard_size(shape, names, mesh)      # elements of one device's shard of an array
    shards.param_bytes(model_config, mesh, 4)  # every parameter's shard, in bytes
    shards.moe_rows(model_config, tokens, 8)   # rows of an MoE layer's expert buffers on a device
"""

from __future__ import annotations

import functools
import math

from stages.train.mesh import Mesh, mesh_axes
from stages.train.model_config import ModelConfig, param_layout

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def param_bytes(m: ModelConfig, mesh: Mesh, dtype_bytes: int) -> int:
    """Bytes of one device's shards of every parameter (a dimension a mesh axis does not divide stays
    replicated over it, as in training)."""
    return sum(shard_size(shape, names, mesh) * dtype_bytes for shape, names in param_layout(m).values())


def moe_rows(m: ModelConfig, tokens: int, expert: int) -> int:
    """Rows of an MoE layer's expert buffers on one device with `tokens` tokens (stages/train/moe.py): the
    n * k assignments sorted by expert (dropless, no expert axis), else E capacity buffers of
    C = ceil(factor * n * k / E) rows (C = n dropless with an expert axis); after the all-to-all a device
    holds E / expert experts' buffers from all `expert` devices: E * C rows again."""
    E, k = m.n_experts, m.n_experts_per_token
    if not capacity_path(m, expert):
        return tokens * k
    if not m.moe_capacity_factor:
        return E * tokens
    return E * min(tokens, max(1, math.ceil(m.moe_capacity_factor * tokens * k / E)))


def all_to_all_bytes(cfg, mesh: Mesh, micro_batch: int) -> tuple[int, int]:
    """(bytes of one all-to-all's buffer on one device, all-to-alls per step) of an MoE model whose experts
    are split over an expert axis (0, 0 without one): each MoE layer sends its (E, C, D) capacity buffer to
    the experts' devices and gets their outputs back the same way, in the compute dtype, for each
    micro-batch: twice forward, twice backward (the transposes), and twice more where a remat policy
    recomputes the layer's forward pass."""
    m = cfg.model
    if not m.n_experts or mesh.expert == 1:
        return 0, 0
    buffer = moe_rows(m, micro_batch * cfg.seq_len, mesh.expert) * m.d_model * DTYPE_BYTES[m.dtype]
    passes = 2 + 2 + (0 if m.remat == "none" else 2)
    return buffer, m.n_moe_layers * cfg.optimizer.grad_accum_steps * passes


def capacity_path(m: ModelConfig, expert: int) -> bool:
    """Whether an MoE layer runs through capacity buffers (a capacity factor, or an expert axis) rather than
    the dropless grouped matmul (stages/train/moe.py)."""
    return bool(m.moe_capacity_factor) or expert > 1


def gathered_axes(shape, names, mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes FSDP gathers an array of `shape` and logical `names` over for a layer's compute: those
    of more than one device its embed dimension is split over (fsdp, and expert for all but the experts)."""
    return _gathered(tuple(shape), tuple(names), mesh.shape)[0]


def gathered_shape(shape, names, mesh: Mesh) -> tuple[int, ...]:
    """The dimensions of one device's part of an array of `shape` and logical `names` once FSDP gathered it
    for a layer's compute (`gathered_axes` taken as 1; still split over tensor, and the experts over
    expert)."""
    return _gathered(tuple(shape), tuple(names), mesh.shape)[1]


@functools.lru_cache(maxsize=65536)
def _gathered(shape, names, mesh_shape) -> tuple[tuple[str, ...], tuple[int, ...]]:
    mesh = Mesh.from_shape(mesh_shape)
    axes = mesh_axes(names, shape, mesh)
    # "latent": an MLA up projection's input dimension, split as embed is (mesh.LOGICAL_RULES)
    embed = next((a for n, a in zip(names, axes) if n in ("embed", "latent") and a), ())
    over = tuple(a for a in embed if mesh.size(a) > 1)
    return over, shard_shape(shape, names, mesh.without(over))


def shard_size(shape, names, mesh: Mesh) -> int:
    """Elements of one device's shard of an array of `shape` with logical axes `names` on `mesh`."""
    return math.prod(shard_shape(shape, names, mesh))


def shard_shape(shape, names, mesh: Mesh) -> tuple[int, ...]:
    """The dimensions of one device's shard of an array of `shape` with logical axes `names` on `mesh`."""
    return _shard_shape(tuple(shape), tuple(names), mesh.shape)


@functools.lru_cache(maxsize=65536)
def _shard_shape(shape, names, mesh_shape) -> tuple[int, ...]:   # a layout search plans thousands of meshes
    mesh = Mesh.from_shape(mesh_shape)
    axes = mesh_axes(names, shape, mesh)
    return tuple(dim // mesh.product(dim_axes) for dim, dim_axes in zip(shape, axes))
