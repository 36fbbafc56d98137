"""What TPU slices exist: the generations a topology may name, the chip grids a slice comes in, and the
checks that refuse a topology no slice has (no JAX).

    tpu.topology_chips("v5p:8x8x16")                  # 1024
    tpu.slice_name("v5p:8x8x16")                      # "v5p-2048", as Cloud TPU names it
    tpu.topology_problem("v5p:3x3x3")                 # why no v5p slice is 3x3x3 ("" for a real one)
    tpu.generation_problem("h100", "v5p:2x2x1")       # why an H100 is not a v5p slice's chip
    tpu.SLICES["v5p"]                                 # the slices search.smallest_slice tries, smallest first

`train.HardwareConfig` (hardware.py) refuses a topology by these checks; the slice search
(planning/search.py) walks `SLICES`; aot.py asks libtpu for a topology's devices by `TPU_GENERATIONS`.
"""

from __future__ import annotations

import math

# TPU generations a topology may name ("v5p:8x8x16") -> (their row in devices.DEVICES, megacore: whether a
# chip's two TensorCores run as one JAX device). libtpu describes v4 with a device per TensorCore unless
# asked for megacore (planning/aot.py asks), v5p as megacore already; v5e and v6e have one TensorCore.
TPU_GENERATIONS = {"v4": ("tpu-v4", True), "v5e": ("tpu-v5e", False), "v5p": ("tpu-v5p", True),
                   "v6e": ("tpu-v6e", False)}


# The chip grids a single TPU slice comes in (Cloud TPU's v4, v5p, v5e and v6e pages). A v4 or v5p slice is a
# 3D torus: one of the small grids, else every side a multiple of 4 (a whole 4x4x4 cube and more), up to the
# largest slice a job may take (v4: the 4,096-chip pod; v5p: 16x16x24, 6,144 chips); v5e and v6e come in the
# listed 2D shapes. SLICES below (the slices a search tries) follows them (a test checks).
TPU_SMALL_3D = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")
TPU_MAX_CHIPS_3D = {"v4": 4096, "v5p": 6144}
TPU_GRIDS_2D = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")


def topology_problem(topology: str) -> str:
    """Why "<generation>:<grid>" names no slice of that TPU generation ("" when it does), so a grid such as
    v5p:3x3x3 is refused rather than planned as 27 chips."""
    generation, _, grid = topology.partition(":")
    if generation not in TPU_GENERATIONS:
        return ""                         # the caller names the generation itself
    sides = [int(n) if n.isdigit() else 0 for n in grid.split("x")]
    if generation in TPU_MAX_CHIPS_3D:
        cap = TPU_MAX_CHIPS_3D[generation]
        if len(sides) == 3 and (grid in TPU_SMALL_3D or all(n and n % 4 == 0 for n in sides)
                                and math.prod(sides) <= cap):
            return ""
        return f"is not a {generation} slice: its grids are {slice_grids(generation)}"
    if grid in TPU_GRIDS_2D:
        return ""
    return f"is not a {generation} slice: its grids are {slice_grids(generation)}"


def generation_problem(device: str, topology: str) -> str:
    """Why `device` (a row of devices.DEVICES) cannot be the chip of `topology` (a slice of a known TPU
    generation), naming both and the valid choices, or "" when the topology is a slice of that device. An
    H100 with "v5p:2x2x1", or tpu-v5p with "v6e:2x2", would plan one chip's memory and speed against
    another's slice (and compile the train step for a TPU the run never gets)."""
    generation = topology.partition(":")[0]
    wanted = TPU_GENERATIONS[generation][0]
    if device == wanted:
        return ""
    mine = next((g for g, (d, _) in TPU_GENERATIONS.items() if d == device), None)
    if mine is None:          # a GPU or the CPU: no TPU topology describes its chips
        return (f"device={device!r} and topology={topology!r} do not match: the topology is a {generation} "
                f"slice, whose chips are device={wanted!r}; set device={wanted!r} for this topology, or "
                f"topology=\"\" for device={device!r} (a topology names TPU slices only)")
    return (f"device={device!r} and topology={topology!r} are different TPU generations: a {generation} "
            f"slice's chips are device={wanted!r}; set device={wanted!r} for this topology, or for "
            f"device={device!r} a {mine} topology ({mine}:<grid>, grids {slice_grids(mine)})")


def slice_grids(generation: str) -> str:
    """The chip grids a slice of a TPU generation comes in, in words (for messages)."""
    if generation in TPU_MAX_CHIPS_3D:
        return (f"{', '.join(TPU_SMALL_3D)}, or AxBxC with every side a multiple of 4 (4x4x4, 4x4x8, "
                f"8x8x16, ...) up to {TPU_MAX_CHIPS_3D[generation]:,} chips")
    return ", ".join(TPU_GRIDS_2D)


def topology_chips(topology: str) -> int:
    """Chips in a TPU topology name: "v5p:8x8x16" -> 1024, "v5e:16x16" -> 256; 0 when it does not parse."""
    grid = topology.partition(":")[2]
    try:
        return math.prod(int(n) for n in grid.split("x"))
    except ValueError:
        return 0


# The single slices each TPU generation comes in, smallest first, from Cloud TPU's documentation (the v4 and
# v5p pages' topology tables, the v5e and v6e pages' slice shapes): power-of-two chip counts, then the
# largest a job may take (v4: the 4,096-chip pod; v5p: 16x16x24, 6,144 chips). generation -> (the
# accelerator type's prefix, TensorCores a chip: v4 and v5p name a slice by its cores, v5p-8 = 4 chips, v5e
# and v6e by their chips; the topologies).
SLICES = {
    "v4": ("v4", 2, ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
                     "8x16x16", "16x16x16")),
    "v5p": ("v5p", 2, ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
                       "8x16x16", "16x16x16", "16x16x24")),
    "v5e": ("v5litepod", 1, ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    "v6e": ("v6e", 1, ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
}
assert set(SLICES) == set(TPU_GENERATIONS)


def slice_name(topology: str) -> str:
    """"v5p:8x8x16" -> "v5p-2048" (the accelerator type Cloud TPU names it by)."""
    generation = topology.partition(":")[0]
    prefix, cores, _ = SLICES[generation]
    return f"{prefix}-{topology_chips(topology) * cores}"


def whole_sides(sides: list[int], sizes: list[int]) -> bool:
    """Whether mesh axes of `sizes` (the data axis taking the rest) each lie along whole sides of a TPU torus
    of `sides` ("8x8x16" -> [8, 8, 16]): every size a product of its own sides, as `jax.make_mesh` lays a
    mesh. Another size splits a side (stages/train/sharding.py warns and does so) and its collectives lose
    the torus's wrap-around links, which the step-time model does not count: a search avoids them."""
    sizes = sorted((n for n in sizes if n > 1), reverse=True)
    if not sizes:
        return True
    n, rest = sizes[0], sizes[1:]
    for chosen in range(1, 2 ** len(sides)):
        picked = [sides[i] for i in range(len(sides)) if chosen >> i & 1]
        if math.prod(picked) == n:
            left = [sides[i] for i in range(len(sides)) if not chosen >> i & 1]
            if whole_sides(left, rest):
                return True
    return False
