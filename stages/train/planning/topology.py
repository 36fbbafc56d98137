"""Where a mesh's devices sit on a TPU slice's chip grid, and what that means for each collective's group:
its shape on the grid, the hops its bytes cross, the ports it can use, its bisection (no JAX).

    grid = topology.grid("v5p:8x8x16")                   # Grid(sides=(8, 8, 16), wraps=(True, True, True))
    order = topology.device_order(grid, mesh)            # jax's own placement (MeshConfig.device_order "")
    order = topology.parse_order("fsdp:2x2x16,expert:4x4x1", grid, mesh)   # an expert group a 4x4 plane
    g = topology.group(grid, order, ("expert",))         # Group(shape=(4, 4, 1), ...)
    g.hops, g.ring_ports, g.all_to_all_time(bytes_per_chip, port_bytes_per_s)
    topology.coords(grid, order, (0, 5, 3, 0))           # the chip at mesh index (data, fsdp, expert, tensor)

The grid. A topology "v5p:8x8x16" is a chip grid of sides (x, y, z) = (8, 8, 16); a 2D one ("v6e:16x16")
gets z = 1, as libtpu's devices carry (x, y, 0). A side wraps around (its last chip linked to its first)
where the slice is a torus along it: v4 and v5p slices of a whole 4x4x4 cube or more wrap every side
(Cloud TPU's v5p page: "All 4x4x4 and larger slices (one cube) have full 3D torus" connectivity; the v4
page: a 3D torus where every side is a multiple of 4), the smaller ones (2x2x1 ... 2x4x4) wrap none; v5e and
v6e (2D, 4 ports a chip) wrap a side of 16, the whole pod's, and no shorter one. Each chip has 2 ports a
side, one to each neighbour (6 on a 3D torus, 4 on a 2D one; the v6e page lists "ICI ports per chip 4").

The device order (`train.MeshConfig.device_order`, parsed by `parse_order`): per mesh axis, its extent on
each side ("expert:1x1x16" is a ring along z). A side split between axes holds the one listed later
innermost (contiguous); the one listed earlier strides over it: "fsdp:2x2x16,expert:4x4x1" gives each
expert group a contiguous 4x4 plane and each fsdp group x, y in {0, 4} (stride 4). An axis's index runs over
its sides x-major (as jax's create_device_mesh lays them). "" is jax's own choice (`default_order`: its
create_device_mesh for a TPU torus, each axis from tensor to data on the most whole sides that multiply to
its size, the first such set in itertools' order); `sharding.make_mesh` builds an explicit order from the
devices' coordinates.

A group (`group`): the chips one collective spans, the same shape for every group of that axis (they are
translates). Per side, its positions P (n chips, stride s between neighbours):

    hops         the mean distance between two distinct chips of the group, in links: per side the mean
                 over all ordered pairs of P of the ring distance min(d, L - d) where the side wraps and
                 the group covers it (n s = L), else the line distance d; summed over sides, x N / (N - 1)
                 to leave out a chip's distance to itself (a wrapped ring of 16: 16 / 4 x 16 / 15 = 4.27)
    ring_ports   the ports a ring collective (all-gather, reduce-scatter, all-reduce) drives a chip: 2 a
                 side the group wraps (a bidirectional ring), 1 a side it spans unwrapped (the ring folds
                 back over the line, each link carrying both its directions), over the stride (a strided
                 group's hop crosses s links, shared with the s - 1 groups interleaved with it)
    links        the link-directions a chip has along the sides the group spans, for the all-to-all's
                 bytes: 2 a wrapped side, 2 (m - 1) / m a side spanning m chips unwrapped
    bisection    the time to move B bytes a chip all-to-all across the group's worst halving cut: half the
                 group sends each chip of the other half B / N, N B / 4 bytes each way, over the links the
                 cut crosses (N / n of them a side, twice that wrapped, over the stride)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence

from stages.train.mesh import AXES

SIDE_NAMES = "xyz"
_WRAP_ALL_3D = ("v4", "v5p")           # a whole cube (every side a multiple of 4) or more: every side wraps
_WRAP_2D_SIDE = 16                     # v5e, v6e: only the pod's whole side wraps


@dataclasses.dataclass(frozen=True)
class Grid:
    """A TPU slice's chips: its sides (x, y, z; z = 1 for a 2D slice) and which wrap around."""

    topology: str
    sides: tuple[int, int, int]
    wraps: tuple[bool, bool, bool]

    @property
    def chips(self) -> int:
        return math.prod(self.sides)

    def describe(self) -> str:
        """"8x8x16, every side wrapped" / "2x4x4, no side wrapped"."""
        shape = "x".join(map(str, self.sides))
        if all(w or n == 1 for w, n in zip(self.wraps, self.sides)):
            return f"{shape}, every side wrapped"
        if not any(self.wraps):
            return f"{shape}, no side wrapped"
        return f"{shape}, {', '.join(SIDE_NAMES[i] for i, w in enumerate(self.wraps) if w)} wrapped"


def grid(topology: str) -> Grid:
    """The chip grid of a TPU topology "<generation>:<AxBxC or AxB>" (see the module docstring for the
    wraparound); ValueError naming the topology for one that does not parse."""
    generation, _, shape = topology.partition(":")
    try:
        sides = tuple(int(n) for n in shape.split("x"))
    except ValueError:
        sides = ()
    if len(sides) not in (2, 3) or min(sides) < 1:
        raise ValueError(f"topology {topology!r} is not '<generation>:AxBxC' or '<generation>:AxB' (e.g. "
                         "'v5p:8x8x16', 'v6e:16x16')")
    if len(sides) == 2:
        wraps = tuple(n == _WRAP_2D_SIDE for n in sides) + (False,)
        sides = sides + (1,)
    else:
        cube = generation in _WRAP_ALL_3D and all(n % 4 == 0 for n in sides)
        wraps = (cube,) * 3
    return Grid(topology, sides, wraps)


# A device order: per mesh axis (AXES order), its extent on each side; `listed` the axes in the order the
# string lists them (earlier = outer on a shared side).
@dataclasses.dataclass(frozen=True)
class Order:
    extents: dict[str, tuple[int, int, int]]
    listed: tuple[str, ...]

    def describe(self) -> str:
        """"fsdp:8x8x1,expert:1x1x16": the string `parse_order` reads back (axes of one chip left out)."""
        return ",".join(f"{a}:{'x'.join(map(str, self.extents[a]))}" for a in self.listed
                        if math.prod(self.extents[a]) > 1)

    def strides(self, axis: str) -> tuple[int, int, int]:
        """Per side, how far apart (in chips) two neighbours along `axis` sit: the extents of the axes
        listed after it on that side."""
        later = self.listed[self.listed.index(axis) + 1:]
        return tuple(math.prod(self.extents[b][i] for b in later) for i in range(3))


# What a device order that no longer matches its mesh (a run file's, after an override of the mesh) says.
RELAY = ('; an override of the mesh needs its own train.MeshConfig.device_order, or device_order="" for '
         "jax's placement (make plan DAYS=N finds one)")


def parse_order(text: str, g: Grid, sizes: Sequence[int]) -> Order:
    """`text` ("fsdp:8x8x1,expert:1x1x16"; a 2D grid's extents may leave z out: "fsdp:16x16") as an Order
    over `g` for a mesh of `sizes` per slice ((data, fsdp, expert, tensor), `MeshConfig.ici_shape`);
    ValueError naming the bad part and what would be right: each axis's extents multiply to its size,
    each side's to the side's length, and an axis of more than one chip not named must not exist."""
    extents, listed = {}, []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        axis, _, shape = part.partition(":")
        axis = axis.strip()
        if axis not in AXES or axis in extents:
            raise ValueError(f"device_order {text!r}: {axis!r} is not one of {AXES}, each at most once "
                             "(write 'axis:XxYxZ,...', e.g. 'fsdp:8x8x1,expert:1x1x16')")
        try:
            ext = tuple(int(n) for n in shape.split("x"))
        except ValueError:
            ext = ()
        if len(ext) == 2 and g.sides[2] == 1:
            ext = ext + (1,)
        if len(ext) != 3 or min(ext) < 1:
            raise ValueError(f"device_order {text!r}: {part!r} needs an extent for each side of "
                             f"{g.topology}'s grid {'x'.join(map(str, g.sides))} (e.g. '{axis}:1x1x16')")
        extents[axis] = ext
        listed.append(axis)
    for axis, size in zip(AXES, sizes):
        if axis not in extents:
            if size > 1:
                raise ValueError(f"device_order {text!r} does not place the {axis} axis of {size} chips; "
                                 f"name it ('{axis}:AxBxC', its sides multiplying to {size}){RELAY}")
            extents[axis] = (1, 1, 1)
            listed.insert(0, axis)
        elif math.prod(extents[axis]) != size:
            raise ValueError(f"device_order {text!r}: {axis} {'x'.join(map(str, extents[axis]))} is "
                             f"{math.prod(extents[axis])} chips, but the mesh's {axis} axis has {size}"
                             f"{RELAY}")
    for i, side in enumerate(g.sides):
        got = math.prod(e[i] for e in extents.values())
        if got != side:
            raise ValueError(f"device_order {text!r}: the axes' extents along {SIDE_NAMES[i]} multiply to "
                             f"{got}, but {g.topology}'s side there is {side}")
    return Order(extents, tuple(listed))


def default_order(g: Grid, sizes: Sequence[int]) -> Order | None:
    """The order jax's create_device_mesh gives a mesh of `sizes` ((data, fsdp, expert, tensor) in a slice)
    on a TPU torus (its `_create_device_mesh_for_nd_torus`): from the last axis (tensor) to the first, each
    takes the first set of still-free whole sides, most sides first, whose lengths multiply to its size.
    None where some axis finds none (jax then splits a side its own way, which this does not follow)."""
    free = list(g.sides)
    taken: dict[str, tuple[int, ...]] = {}
    for axis, size in reversed(list(zip(AXES, sizes))):
        taken[axis] = ()
        for k in range(3, 0, -1):
            pick = next((c for c in itertools.combinations(range(3), k)
                         if math.prod(free[i] for i in c) == size), None)
            if pick is not None:
                taken[axis] = pick
                free = [0 if i in pick else n for i, n in enumerate(free)]
                break
        else:
            if size > 1:
                return None
    extents = {a: tuple(g.sides[i] if i in taken[a] else 1 for i in range(3)) for a in AXES}
    return Order(extents, AXES)


def device_order(g: Grid, sizes: Sequence[int], text: str = "") -> Order | None:
    """`parse_order(text)`, or for "" jax's (`default_order`, None where jax would split a side)."""
    return parse_order(text, g, sizes) if text else default_order(g, sizes)


def coords(g: Grid, order: Order, index: Sequence[int]) -> tuple[int, int, int]:
    """The (x, y, z) of the chip at mesh position `index` ((data, fsdp, expert, tensor) within a slice)."""
    out = [0, 0, 0]
    for axis, i in zip(AXES, index):
        ext, stride = order.extents[axis], order.strides(axis)
        digits = []
        for e in reversed(ext):               # x-major: z the fastest digit
            digits.append(i % e)
            i //= e
        for side, d in enumerate(reversed(digits)):
            out[side] += d * stride[side]
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Group:
    """The chips one collective over some mesh axes spans (see the module docstring)."""

    grid: Grid
    shape: tuple[int, int, int]       # chips along each side
    strides: tuple[int, int, int]     # chips between neighbours along each side
    wrapped: tuple[bool, bool, bool]  # the group closes a ring through the side's wraparound

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    def describe(self) -> str:
        """"1x1x16 (a ring along z, wrapped)"."""
        spans = [i for i, n in enumerate(self.shape) if n > 1]
        kind = {0: "one chip", 1: "a ring", 2: "a plane", 3: "a block"}[len(spans)]
        along = "".join(SIDE_NAMES[i] for i in spans)
        wrapped = [SIDE_NAMES[i] for i in spans if self.wrapped[i]]
        strided = [f"{SIDE_NAMES[i]} every {self.strides[i]}" for i in spans if self.strides[i] > 1]
        notes = ["wrapped" if len(wrapped) == len(spans) else
                 f"{''.join(wrapped)} wrapped" if wrapped else "no wraparound"] + strided
        return f"{'x'.join(map(str, self.shape))} ({kind}{' along ' + along if spans else ''}, " \
               f"{', '.join(notes)})"

    @functools.cached_property      # the layout search asks each group's hops many times
    def hops(self) -> float:
        """Mean links between two distinct chips of the group."""
        n = self.chips
        if n <= 1:
            return 0.0
        total = sum(self._mean_distance(i) for i in range(3))     # over all ordered pairs, self included
        return total * n / (n - 1)

    def _mean_distance(self, side: int) -> float:
        n, s, length = self.shape[side], self.strides[side], self.grid.sides[side]
        if n == 1:
            return 0.0
        pos = [k * s for k in range(n)]
        if self.wrapped[side]:
            dist = [min(abs(a - b), length - abs(a - b)) for a in pos for b in pos]
        else:
            dist = [abs(a - b) for a in pos for b in pos]
        return sum(dist) / n ** 2

    @property
    def ring_ports(self) -> float:
        """Ports a ring collective over the group drives a chip (strided sides count 1 / stride)."""
        return sum((2 if self.wrapped[i] else 1) / self.strides[i] for i in range(3) if self.shape[i] > 1)

    @property
    def links(self) -> float:
        """Link-directions a chip has along the sides the group spans (an all-to-all's bytes use them)."""
        out = 0.0
        for i in range(3):
            if self.shape[i] > 1:
                span = (self.shape[i] - 1) * self.strides[i] + 1
                out += 2 if self.wrapped[i] else 2 * (span - 1) / span
        return out

    def ring_time(self, nbytes: float, port_bytes_per_s: float) -> float:
        """A ring all-gather or reduce-scatter of an array of `nbytes` (whole, on each chip) over the group:
        (N - 1) / N of it through each chip's `ring_ports` at `port_bytes_per_s` a port each way."""
        n = self.chips
        if n <= 1:
            return 0.0
        return nbytes * (n - 1) / n / (self.ring_ports * port_bytes_per_s)

    def all_to_all_time(self, nbytes: float, port_bytes_per_s: float) -> float:
        """An all-to-all of `nbytes` a chip (1 / N of it to each chip of the group, itself included): the
        larger of the link-bytes bound ((N - 1) / N of it, `hops` links each, over the chip's `links`) and
        the bisection bound (N B / 4 each way over the links the worst halving cut crosses)."""
        n = self.chips
        if n <= 1:
            return 0.0
        spread = nbytes * (n - 1) / n * self.hops / (self.links * port_bytes_per_s)
        return max(spread, self.bisection_time(nbytes, port_bytes_per_s))

    def bisection_time(self, nbytes: float, port_bytes_per_s: float) -> float:
        """N B / 4 bytes each way across the cut halving the group across one side, over N / n links (2 N / n
        wrapped) shared by the `stride` interleaved groups: the slowest side's, n s B / (4 w) / rate."""
        worst = 0.0
        for i in range(3):
            n = self.shape[i]
            if n > 1:
                worst = max(worst, n * self.strides[i] / (4 * (2 if self.wrapped[i] else 1)))
        return nbytes * worst / port_bytes_per_s


def group(g: Grid, order: Order, axes: Sequence[str]) -> Group:
    """The group a collective over `axes` spans (their chips together, the others' held fixed). Axes that
    share a side must lie next to each other in the order there (they do in every order this module
    makes); their positions then run with the innermost one's stride."""
    axes = [a for a in axes if a in order.extents]
    shape, strides, wrapped = [1, 1, 1], [1, 1, 1], [False, False, False]
    for i in range(3):
        on_side = [a for a in axes if order.extents[a][i] > 1]
        if not on_side:
            continue
        shape[i] = math.prod(order.extents[a][i] for a in on_side)
        strides[i] = min(order.strides(a)[i] for a in on_side)
        wrapped[i] = g.wraps[i] and shape[i] * strides[i] == g.sides[i]
    return Group(g, tuple(shape), tuple(strides), tuple(wrapped))


# The groups whose shapes tell two orders apart for the step time (step_time.collectives' axes).
_SEARCHED_GROUPS = (("data",), ("fsdp",), ("expert",), ("tensor",), ("fsdp", "expert"))


def order_choices(g: Grid, sizes: Sequence[int]) -> list[str]:
    """The device orders a layout search tries for a mesh of `sizes` (per slice), as
    train.MeshConfig.device_order strings: "" (jax's placement, where it has one without splitting a side),
    then each way of laying the busiest axis (expert, else tensor) as a contiguous block dividing the
    grid's sides (a ring, a plane, a block), innermost, the other axes taking whole remaining extents as
    jax does (tensor first); one order per distinct set of group shapes."""
    named = dict(zip(AXES, sizes))
    busiest = next((a for a in ("expert", "tensor") if named[a] > 1), None)
    out, seen = [], set()

    def add(text: str, order: Order) -> None:
        key = tuple(group(g, order, axes).describe() for axes in _SEARCHED_GROUPS)
        if key not in seen:
            seen.add(key)
            out.append(text)

    if (first := default_order(g, sizes)) is not None:
        add("", first)
    if busiest is None:
        return out
    size = named[busiest]
    for ext in itertools.product(*([d for d in range(1, n + 1) if n % d == 0] for n in g.sides)):
        if math.prod(ext) != size:
            continue
        free = [n // e for n, e in zip(g.sides, ext)]
        extents = {busiest: tuple(ext)}
        for axis in reversed(AXES):
            if axis == busiest:
                continue
            pick = next((c for k in range(3, 0, -1) for c in itertools.combinations(range(3), k)
                         if math.prod(free[i] for i in c) == named[axis]), ())
            if not pick and named[axis] > 1:
                break
            extents[axis] = tuple(free[i] if i in pick else 1 for i in range(3))
            free = [1 if i in pick else n for i, n in enumerate(free)]
        else:
            order = Order({a: extents[a] for a in AXES}, tuple(a for a in AXES if a != busiest) + (busiest,))
            add(order.describe(), order)
    return out
