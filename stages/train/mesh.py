"""The device mesh's named axes without JAX: `MeshConfig` (the sizes gin binds as `train.MeshConfig.<field>`),
`Mesh` (the sizes it resolves to for a number of devices) and the logical-axis rules that say which mesh
axes split each dimension of a parameter or activation.

    from stages.train.mesh import Mesh, MeshConfig, mesh_axes
    mesh = MeshConfig(fsdp=4, tensor=2).for_devices(8)       # Mesh(data=1, fsdp=4, expert=1, tensor=2)
    mesh.fsdp, mesh.batch_shards, mesh.describe()            # 4, 4, "data 1 x fsdp 4 x tensor 2"
    mesh_axes(("embed", "heads"), (4096, 32), mesh)          # (("fsdp", "expert"), ("tensor",))

sharding.py lays a `jax.sharding.Mesh` out by these sizes and turns `mesh_axes` into PartitionSpecs; the
planner (stages/train/planning/) divides every array's size by the same rules, so it shards parameters
exactly as training does. This module must not import JAX (`make plan` stays fast).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence

from stages.train.model_config import ModelConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mesh:
    """The whole mesh's size along each named axis (every slice's devices), as `MeshConfig.for_devices`
    resolves it: what the planner counts with. The axes are its fields, in order; a size is read by name
    (`mesh.tensor`), or, for an axis a logical rule names, with `size`.

        mesh = Mesh(fsdp=64, expert=16)          # 1,024 devices: data 1 x fsdp 64 x expert 16 x tensor 1
        mesh.batch_shards, mesh.embed_shards     # what a batch and a parameter's embed dimension split over
        mesh.without(("fsdp", "expert"))         # as a layer sees the mesh once FSDP gathered it
        Mesh.of(jax_mesh)                        # a jax.sharding.Mesh's sizes (sharding.make_mesh's)
    """

    data: int = 1      # splits the batch only (parameters replicated)
    fsdp: int = 1      # splits the batch and every parameter's embed dimension (ZeRO-3)
    expert: int = 1    # splits the batch and a mixture of experts' experts (and, as fsdp, the rest's embed)
    tensor: int = 1    # splits heads and the MLP dimension (Megatron)

    def __post_init__(self):
        if min(self.shape) < 1:
            axis, size = next((a, n) for a, n in self.items() if n < 1)
            raise ValueError(f"Mesh.{axis}={size!r} must be >= 1 (the devices along the {axis} axis)")

    @classmethod
    def from_shape(cls, shape: Sequence[int]) -> Mesh:
        """The mesh of sizes `shape`, in the order of AXES (data, fsdp, expert, tensor)."""
        if len(shape) != len(AXES):
            raise ValueError(f"a mesh shape has a size for each of {AXES}; got {tuple(shape)}")
        return cls(**dict(zip(AXES, shape)))

    @classmethod
    def of(cls, jax_mesh) -> Mesh:
        """The sizes of a `jax.sharding.Mesh` (or an abstract one) along AXES; an axis it lacks (a mesh not
        made by sharding.make_mesh) counts as 1."""
        sizes = dict(jax_mesh.shape)
        return cls(**{a: sizes.get(a, 1) for a in AXES})

    def items(self) -> tuple[tuple[str, int], ...]:
        """((axis, size), ...) in the order of AXES."""
        return tuple(zip(AXES, self.shape))

    @functools.cached_property      # read thousands of times a layout search (shards.py caches by it)
    def shape(self) -> tuple[int, ...]:
        """(data, fsdp, expert, tensor)."""
        return tuple(getattr(self, a) for a in AXES)

    def size(self, axis: str) -> int:
        """The size of the axis named `axis` (as a logical rule or a collective names it)."""
        if axis in AXES:
            return getattr(self, axis)
        raise ValueError(_unknown(axis))

    def product(self, axes: Iterable[str]) -> int:
        """The devices along `axes` together: a group that a collective over them spans."""
        return math.prod(self.size(a) for a in axes)

    @property
    def devices(self) -> int:
        return math.prod(self.shape)

    @property
    def batch_shards(self) -> int:
        """The devices a batch is split over (BATCH_AXES: data x fsdp x expert)."""
        return self.product(BATCH_AXES)

    @property
    def embed_shards(self) -> int:
        """The devices a parameter's embed dimension is split over (fsdp x expert, LOGICAL_RULES["embed"]),
        and so what FSDP gathers a layer over: 1 when nothing is gathered."""
        return self.product(LOGICAL_RULES["embed"])

    def without(self, axes: Iterable[str]) -> Mesh:
        """This mesh with `axes` taken as 1: what an array already gathered over them sees."""
        axes = tuple(axes)
        if unknown := set(axes) - set(AXES):
            raise ValueError(_unknown(min(unknown)))
        return Mesh.from_shape(tuple(1 if a in axes else n for a, n in self.items())) if axes else self

    def describe(self) -> str:
        """"data 1 x fsdp 128 x tensor 8", the expert axis named where it is used."""
        return " x ".join(f"{a} {n}" for a, n in self.items() if a != "expert" or n > 1)

    def describe_batch(self) -> str:
        """"data x fsdp" (with " x expert" where the mesh has an expert axis): what a batch is split over."""
        return " x ".join(a for a in BATCH_AXES if a != "expert" or self.expert > 1)


AXES = tuple(f.name for f in dataclasses.fields(Mesh))    # ("data", "fsdp", "expert", "tensor"), in order
BATCH_AXES = ("data", "fsdp", "expert")        # the mesh axes a batch is split over


def _unknown(axis: str) -> str:
    return f"mesh axis {axis!r} is not one of {AXES}"


# Logical axis -> mesh axes (None: replicated). A mesh axis already used by an earlier dimension of the
# same array is skipped, so ("batch", "length", "embed") shards batch over data x fsdp and leaves embed whole.
# `data` splits the batch only (parameters replicated), `fsdp` splits the batch and shards parameters
# (ZeRO-3: gathered per layer inside the scan), `tensor` splits heads and the MLP dim (Megatron), `expert`
# splits the batch and a mixture of experts' experts (each device holds E / expert of them; tokens travel
# to their experts by all-to-all, stages/train/moe.py) and, as fsdp does, every other parameter's embed
# dimension (an expert's embed is split over fsdp only: its experts dimension took the expert axis), so no
# weight or optimizer state is held whole on every device of the expert axis.
LOGICAL_RULES: dict[str, tuple[str, ...] | str | None] = {
    "batch": BATCH_AXES,
    "length": None,
    "sequence": "tensor",    # the residual stream's length under sequence parallelism (ModelConfig)
    "embed": ("fsdp", "expert"),
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    # Multi-head latent attention's compressed query and key-value (model_config.mla_layout): the input
    # dimension of its up projections, split as embed is (FSDP gathers it per layer, planning/shards.py).
    "latent": ("fsdp", "expert"),
    "layers": None,
    "experts": "expert",
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes. Gin: `train.MeshConfig.<field>`.

    data, fsdp, expert and tensor are the sizes WITHIN one slice (ICI, the chips' own links): their product
    is a slice's device count. dcn_data, dcn_fsdp, dcn_expert and dcn_tensor split the same axes ACROSS
    slices (DCN, the data-center network between TPU slices): their product is the number of slices, and
    must equal train.HardwareConfig.num_slices. Each mesh axis is ici x dcn long, under the same name, so
    every logical rule holds unchanged: MeshConfig(fsdp=4, dcn_data=2) on 2 slices of 4 chips is the mesh
    data 2 x fsdp 4 x expert 1 x tensor 1, data crossing the slices and fsdp within each. Put the DCN split
    on data: it crosses the slow network once per step (the gradient reduction), fsdp, expert and tensor
    every layer. With every dcn_* = 1 (the default) there is one slice and the sizes are the whole mesh's.

    device_order says where each axis lies on a TPU slice's chip grid (train.HardwareConfig.topology), per
    axis its extent along each side, x by y by z: "fsdp:8x8x1,expert:1x1x16" on v5p:8x8x16 lays each
    expert group as a ring along the 16-long side, "fsdp:2x2x16,expert:4x4x1" as a 4x4 plane,
    "fsdp:4x4x4,expert:2x2x4" as a 2x2x4 block (stages/train/planning/topology.py: the format, and what
    each shape costs a collective). "" (the default) is jax's own placement (the torus rule of its
    create_device_mesh; for fsdp 64 x expert 16 on 8x8x16 that is the ring). `sharding.make_mesh` builds an
    explicit order from the devices' coordinates, one slice's; the planner charges collectives by it.
    """

    data: int = -1         # -1: all of a slice's devices that fsdp, expert and tensor leave
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1        # expert parallelism: splits the batch and a mixture of experts' experts
    dcn_data: int = 1      # slices the data axis spans (1: it stays within a slice)
    dcn_fsdp: int = 1
    dcn_tensor: int = 1
    dcn_expert: int = 1
    # "": jax's placement; else "axis:XxYxZ,..." on the topology's grid (above). Where the chips sit, not
    # what they compute: not part of the train stage's cache key (as train.HardwareConfig is not).
    device_order: str = dataclasses.field(default="", metadata={"key": False})

    def __post_init__(self):
        for name in AXES:
            size = getattr(self, name)
            if size == 0 or size < -1:
                raise ValueError(f"MeshConfig.{name}={size} must be >= 1 (or -1 for data: the rest)")
            dcn = getattr(self, f"dcn_{name}")
            if dcn < 1:
                raise ValueError(f"MeshConfig.dcn_{name}={dcn} must be >= 1 (the slices the {name} axis "
                                 "spans; 1: within one slice)")
        if -1 in (self.fsdp, self.tensor, self.expert):
            raise ValueError(f"MeshConfig: only data may be -1 (fsdp={self.fsdp}, expert={self.expert}, "
                             f"tensor={self.tensor})")

    @property
    def dcn_shape(self) -> tuple[int, ...]:
        """(data, fsdp, expert, tensor) across slices."""
        return tuple(getattr(self, f"dcn_{a}") for a in AXES)

    @property
    def num_slices(self) -> int:
        """The slices this mesh spans: the product of the dcn_* sizes."""
        return math.prod(self.dcn_shape)

    def describe_dcn(self) -> str:
        """"dcn_data=2 x dcn_fsdp=1 x dcn_tensor=1" (dcn_expert named where it is not 1)."""
        return " x ".join(f"dcn_{a}={getattr(self, f'dcn_{a}')}" for a in self._named_axes())

    def describe(self) -> str:
        """"data=-1 x fsdp=4 x tensor=2" (expert named where it is not 1)."""
        return " x ".join(f"{a}={getattr(self, a)}" for a in self._named_axes())

    def _named_axes(self) -> tuple[str, ...]:
        return tuple(a for a in AXES if a != "expert" or self.expert != 1 or self.dcn_expert != 1)

    def ici_shape(self, n_devices: int) -> tuple[int, ...]:
        """(data, fsdp, expert, tensor) within one slice, for `n_devices` over all `num_slices` slices;
        ValueError naming the sizes when they do not fit."""
        slices = self.num_slices
        dcn = self.describe_dcn()
        if n_devices % slices:
            raise ValueError(f"{n_devices} devices do not split into {slices} equal slices (mesh {dcn})")
        n = n_devices // slices
        other = self.fsdp * self.expert * self.tensor
        data = self.data if self.data != -1 else n // other
        if self.data == -1 and n % other:
            data = 0
        if data * other != n:
            sizes = self.describe()
            named = " x ".join(a for a in self._named_axes() if a != "data")
            if slices == 1:
                raise ValueError(f"mesh {sizes} does not match the {n} devices; the product must equal the "
                                 f"device count (data=-1 takes the rest, and needs {named} = {other} "
                                 f"to divide {n})")
            raise ValueError(f"mesh per slice (ICI) {sizes} does not match the {n} devices of each of "
                             f"{slices} slices ({n_devices} devices, {dcn}); the product must equal a "
                             f"slice's device count (data=-1 takes the rest, and needs {named} = "
                             f"{other} to divide {n})")
        return data, self.fsdp, self.expert, self.tensor

    def shape(self, n_devices: int) -> tuple[int, ...]:
        """The whole mesh's (data, fsdp, expert, tensor) for `n_devices`: per axis, the size within a slice
        x the slices it spans (`ici_shape` x `dcn_shape`); ValueError naming the sizes when they do not
        fit."""
        return tuple(i * d for i, d in zip(self.ici_shape(n_devices), self.dcn_shape))

    def for_devices(self, n_devices: int) -> Mesh:
        """The whole mesh for `n_devices` (`shape`, by axis); ValueError naming the sizes when they do not
        fit."""
        return Mesh.from_shape(self.shape(n_devices))


def expert_split_problem(model: ModelConfig, mesh: MeshConfig) -> str:
    """Why a mixture of experts' experts do not split evenly over the mesh's expert axis (its size within a
    slice x the slices it spans), or "": each device holds n_experts / expert of them (stages/train/moe.py),
    which training would find only when it starts, after the data half."""
    experts = mesh.expert * mesh.dcn_expert
    if not model.n_experts or model.n_experts % experts == 0:
        return ""
    return (f"ModelConfig.n_experts={model.n_experts} does not split over the mesh's expert axis of "
            f"{experts} (train.MeshConfig.expert={mesh.expert} x dcn_expert={mesh.dcn_expert}): each device "
            f"holds n_experts / {experts} experts; pick n_experts a multiple of {experts}, or an expert size "
            f"that divides {model.n_experts}")


def power_of_two_divisors(n: int) -> list[int]:
    """The powers of two that divide `n`, smallest first: the sizes a mesh axis over `n` devices (or slices)
    is given where layouts are searched (advice, the slice search)."""
    return [d for d in range(1, n + 1) if n % d == 0 and (d & (d - 1)) == 0]


def mesh_axes(names, shape=None, mesh: Mesh | None = None, rules=None) -> tuple[tuple[str, ...], ...]:
    """Logical axis names -> the mesh axes each dimension is split over (() = replicated), by `rules`
    (default LOGICAL_RULES). With `shape` and `mesh`, a mesh axis that does not divide its dimension is
    dropped (that dimension stays replicated over it) rather than failing at placement.
    `sharding.logical_to_spec` turns the result into a PartitionSpec; the planner divides sizes by it."""
    rules = LOGICAL_RULES if rules is None else rules
    used: set[str] = set()
    out = []
    for i, name in enumerate(names):
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used)
        if shape is not None and mesh is not None:
            kept, size = [], 1
            for a in axes:
                if shape[i] % (size * mesh.size(a)) == 0:
                    kept.append(a)
                    size *= mesh.size(a)
            axes = tuple(kept)
        used.update(axes)
        out.append(axes)
    return tuple(out)
