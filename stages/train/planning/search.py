"""The reverse question: which TPU slice trains the configured tokens in N days, and fits? (no JAX)

    s = search.smallest_slice(train_config, 30)      # make plan GIN=gin/600b.gin DAYS=30
    s.found, s.runner_up                             # that slice's fastest plan and the next, or None
    print(s.render())

The documented slices of the configured TPU generation (`tpu.SLICES`), smallest first; on each, every layout
(`layouts`: the mesh's fsdp, expert and tensor sizes along whole sides of the torus, `tpu.whole_sides`; the
micro-batches a step; the remat policy; dropless or capacity buffers for an MoE) is planned
(`planner.try_plan`) and ranked by its days: the predicted step (step_time.py) over the goodput (goodput.py:
checkpoints, evaluations, restarts). The answer is the first slice whose fastest layout that fits with
`SEARCH_MARGIN` to spare trains the tokens in time.
"""

from __future__ import annotations

import dataclasses
import math

from stages.train.mesh import Mesh, MeshConfig, power_of_two_divisors
from stages.train.model_config import flops_per_token
from stages.train.planning import devices, step_time
from stages.train.planning.figures import gib, num, token_count
from stages.train.planning.memory import OFFLOAD_ORDER, REMAT_ORDER, optimizer_bytes
from stages.train.planning.plan import HEADROOM, Plan
from stages.train.planning.planner import try_plan
from stages.train.planning.shards import DTYPE_BYTES, param_bytes
from stages.train.planning.topology import grid as chip_grid
from stages.train.planning.topology import order_choices
from stages.train.planning.tpu import SLICES, TPU_GENERATIONS, slice_name, topology_chips, whole_sides

# A layout search takes only layouts whose estimate fits 10% under the budget: the estimate is checked to
# within 10% of XLA's figure (benchmarks/plan_vs_xla.py), so a closer fit may not compile.
SEARCH_MARGIN = 1.1


@dataclasses.dataclass(frozen=True)
class SliceSearch:
    """What `smallest_slice` found: each slice of one TPU generation tried (smallest first) with its fastest
    layout or why none can run, the first slice whose fastest layout that fits trains the tokens in time
    (and that slice's runner-up), and, where none does, the smallest slice of each other generation that
    would."""

    config: object                                     # the stages.train.Config searched for
    days: float
    generation: str
    tried: tuple[tuple[str, Plan | None, str], ...]   # (topology, its fastest plan or None, why none runs)
    found: Plan | None                                 # the fastest layout on the smallest slice; None: none
    runner_up: Plan | None = None                      # the fastest that fits with another mesh there
    elsewhere: tuple[Plan, ...] = ()                   # where none does: other generations' smallest

    def render(self) -> str:
        cfg = self.config
        tokens = cfg.steps * cfg.global_batch * cfg.seq_len
        pace = (f"at {cfg.hardware.mfu:.0%} MFU" if cfg.hardware.mfu else "by the predicted step time") + \
            " over the goodput"
        rows = [f"smallest TPU {self.generation} slice that trains {token_count(tokens)} tokens in "
                f"{self.days:,.3g} days {pace} and fits (one slice; on each, the layout with the fewest "
                "days: the mesh"
                f"{', expert axis' if cfg.model.n_experts else ''} included, micro-batches, remat"
                f"{', dropless or capacity' if cfg.model.n_experts else ''}):"]
        width = max(len(slice_name(t)) for t, _, _ in self.tried)
        for topology, p, why in self.tried:
            head = f"    {slice_name(topology):<{width}} {topology_chips(topology):>6,} chips"
            if p is None:
                rows.append(f"{head}: cannot run: {why}")
                continue
            fits = (f"fits, {_layout(p)}" if _roomy(p) else
                    "fits, but not with 10% to spare" if p.fits else "does NOT fit")
            rows.append(f"{head}: {p.days:>9,.1f} days{' (too long)' if p.days > self.days else ''}; {fits}, "
                        f"{gib(p.per_device['total'])} of {gib(p.budget)} per chip")
        if self.found is not None:
            rows.append(f"  answer: {_slice_answer(self.found)}")
            if self.runner_up is not None:
                rows.append(f"  runner-up: {_slice_answer(self.runner_up)}")
            return "\n".join(rows)
        runnable = [(t, p) for t, p, _ in self.tried if p is not None]
        if runnable:
            topology, p = runnable[-1]
            over = [f"would need {num(p.days)} days" if p.days > self.days else f"takes {num(p.days)} days"]
            if not _roomy(p):
                over.append(f"does NOT fit with 10% to spare ({gib(p.per_device['total'])} per chip with "
                            f"its best layout, of {gib(p.budget)} usable)")
            reason = (f"the largest {self.generation} slice that can run it, {slice_name(topology)} "
                      f"({topology_chips(topology):,} chips), {' and '.join(over)}")
            larger = [(t, why) for t, p, why in self.tried if p is None and topology_chips(t) >
                      topology_chips(topology)]
            if larger:
                reason += f"; larger ones cannot run it ({slice_name(larger[0][0])}: {larger[0][1]})"
        else:
            topology, _, why = self.tried[-1]
            reason = f"no {self.generation} slice can run it: {why} ({slice_name(topology)})"
        rows.append(f"  answer: none on TPU {self.generation}: {reason}")
        for p in self.elsewhere:
            rows.append(f"  elsewhere: {_slice_answer(p, device=True)}")
        rows.append("  (not tried: several slices, train.HardwareConfig.num_slices; a larger global batch; "
                    "a smaller model or fewer tokens)")
        return "\n".join(rows)


def smallest_slice(cfg, days: float, *, elsewhere: bool = True) -> SliceSearch:
    """The smallest single slice of `cfg`'s TPU generation (its topology's, else its device's; `SLICES`)
    whose fastest layout that fits trains its tokens (steps x global batch x seq_len) in `days`:

        s = search.smallest_slice(train_config, 30)       # make plan DAYS=30
        s.found, s.runner_up                              # that slice's fastest plan and the next, or None
        print(s.render())

    On each slice every layout is planned (`layouts`: the mesh's fsdp, expert and tensor sizes, data the
    rest; the micro-batches a step; the remat policy, host offload among them; for an MoE, dropless or
    capacity buffers) and ranked by the plan's days: its step (the prediction's, or an assumed MFU's where
    train.HardwareConfig.mfu sets one) over its goodput (goodput.py), whose checkpoint writes and restarts
    grow with the chips and the step. A slice is skipped, with
    why, where even its matmuls at the calibrated rate need more than `days`, or where the parameters and
    optimizer state split over every chip do not fit. Where no slice of the generation does it
    (`elsewhere`), the smallest of each other generation that would. ValueError for a device that is not
    a TPU."""
    hw = cfg.hardware
    generation = hw.topology.partition(":")[0] if hw.topology else next(
        (g for g, (device, _) in TPU_GENERATIONS.items() if device == hw.device), "")
    if generation not in SLICES:
        raise ValueError(f"train.HardwareConfig.device={hw.device!r} is not a TPU, and the smallest slice "
                         "is searched among a TPU generation's: set train.HardwareConfig.device to one of "
                         f"{', '.join(repr(d) for d, _ in TPU_GENERATIONS.values())} (or a topology such as "
                         '"v5p:2x2x1")')
    tried = []
    for grid in SLICES[generation][2]:
        topology = f"{generation}:{grid}"
        chips = topology_chips(topology)
        hardware = dataclasses.replace(hw, device=TPU_GENERATIONS[generation][0], topology=topology, chips=0,
                                       num_slices=1)
        on_slice = dataclasses.replace(cfg, hardware=hardware, mesh=MeshConfig(data=-1))
        if why := _hopeless(on_slice, chips, days):
            tried.append((topology, None, why))
            continue
        ranked, why = _fastest_layouts(on_slice, chips)
        best = ranked[0] if ranked else None
        tried.append((topology, best, why))
        if best is not None and _roomy(best) and best.days <= days:
            # The runner-up lays the mesh out differently (the same mesh with another remat is no choice
            # a user weighs: the answer already takes the fastest policy that fits).
            runner_up = next((r for r in ranked[1:] if _roomy(r) and r.mesh != best.mesh), None)
            return SliceSearch(cfg, days, generation, tuple(tried), best, runner_up)
    others = ()
    if elsewhere:
        searches = (smallest_slice(dataclasses.replace(cfg, hardware=dataclasses.replace(
            hw, device=TPU_GENERATIONS[g][0], topology="")), days, elsewhere=False)
            for g in SLICES if g != generation)
        others = tuple(found for found in (s.found for s in searches) if found is not None)
    return SliceSearch(cfg, days, generation, tuple(tried), None, None, others)


def _hopeless(cfg, chips: int, days: float) -> str:
    """Why no layout of `cfg` on `chips` chips can do it, by bounds that need no layout ("" when one may):
    the step's model FLOPs at the calibrated matmul rate alone take longer than `days` (an assumed MFU is
    not a bound: it is then what the plan says), or the parameters and optimizer state split over every
    chip exceed the usable memory of one."""
    m, device = cfg.model, devices.get(cfg.hardware.device)
    eff, _ = step_time.efficiency(device)
    tokens = cfg.steps * cfg.global_batch * cfg.seq_len
    floor = flops_per_token(m, cfg.seq_len) * tokens / (chips * device.peak_flops * eff.matmul) / 86400
    if not cfg.hardware.mfu and floor > days:
        return f"{num(floor)} days at least (every FLOP at the calibrated matmul rate)"
    whole = Mesh()                  # every array whole on one device
    pbytes = DTYPE_BYTES[m.param_dtype]
    state = (param_bytes(m, whole, pbytes) + optimizer_bytes(m, whole, pbytes, cfg.optimizer.name)) / chips
    budget = device.hbm_bytes * HEADROOM
    if state > budget:
        return (f"the parameters and optimizer state split over all {chips:,} chips, {gib(state)} a chip, "
                f"exceed {gib(budget)} usable")
    return ""


def layouts(cfg, chips: int):
    """Every layout `smallest_slice` tries for `cfg` on one slice of `chips`, as configs: tensor 1-8 (dividing
    the heads), for an MoE an expert axis dividing the experts (with it, capacity buffers; without, dropless
    or capacity), fsdp any power of two of the rest and data what remains, 1-8 micro-batches a step whose
    micro-batch splits over the batch shards, and on a TPU topology each device order
    (`topology.order_choices`: jax's placement, and the busiest axis as each ring, plane or block); the remat
    policy is `_fastest_layouts`'."""
    m = cfg.model
    capacity = m.moe_capacity_factor or 1.25
    sides = [int(n) for n in cfg.hardware.topology.partition(":")[2].split("x")]
    grid = chip_grid(cfg.hardware.topology)
    for tensor in (t for t in (1, 2, 4, 8) if chips % t == 0 and m.n_heads % t == 0):
        experts = ([e for e in power_of_two_divisors(chips // tensor) if m.n_experts % e == 0]
                   if m.n_experts else [1])
        for expert in experts:
            factors = ([0.0, capacity] if expert == 1 else [capacity]) if m.n_experts else [0.0]
            rest = chips // (tensor * expert)
            for fsdp in power_of_two_divisors(rest):
                if not whole_sides(sides, [fsdp, expert, tensor]):
                    continue
                orders = order_choices(grid, (rest // fsdp, fsdp, expert, tensor)) or [""]
                for k in (1, 2, 4, 8):
                    micro = cfg.global_batch // k
                    if cfg.global_batch % k or micro % (rest * expert):
                        continue
                    for factor in factors:
                        for order in orders:
                            yield dataclasses.replace(
                                cfg, mesh=MeshConfig(data=-1, fsdp=fsdp, expert=expert, tensor=tensor,
                                                     device_order=order),
                                optimizer=dataclasses.replace(cfg.optimizer, grad_accum_steps=k),
                                model=dataclasses.replace(m, moe_capacity_factor=factor))


def _fastest_layouts(cfg, chips: int) -> tuple[list[Plan], str]:
    """(every layout's fastest plan that fits with the estimate's margin (`SEARCH_MARGIN`), fewest days first
    (the step over the goodput: `Plan.days`), else the one layout closest to fitting; why none can run). For
    each layout the lightest remat policy that fits (`REMAT_ORDER`), and where the device has host memory the
    lightest offload policy that fits (`OFFLOAD_ORDER`): a heavier policy only adds recompute, so these two
    are the layout's fastest."""
    fitting, closest = [], None
    host = devices.get(cfg.hardware.device).host_bytes
    # Memory ignores the device order, so what one order of a layout found holds for the others: the first
    # remat that fits, or that none does (their tries would hold the same bytes, none closer to fitting).
    lightest, none_fits = {}, set()
    for layout in layouts(cfg, chips):
        same = (layout.mesh.fsdp, layout.mesh.expert, layout.mesh.tensor,
                layout.optimizer.grad_accum_steps, layout.model.moe_capacity_factor)
        for order in (REMAT_ORDER, OFFLOAD_ORDER) if host else (REMAT_ORDER,):
            if (same, order) in none_fits:
                continue
            for remat in order[order.index(lightest[same, order]) if (same, order) in lightest else 0:]:
                candidate = dataclasses.replace(layout, model=dataclasses.replace(layout.model, remat=remat))
                p = try_plan(candidate, timed=False)      # the step is timed only where the memory fits
                if p is None or p.problem:
                    break
                if _roomy(p):
                    if (p := try_plan(candidate)) is None:      # timing reads the device order; memory not
                        break
                    fitting.append(p)
                    lightest[same, order] = remat
                    break
                if closest is None or p.per_device["total"] < closest.per_device["total"]:
                    closest = p
            else:
                none_fits.add((same, order))
    if fitting:       # fewest days first; within 0.1% of each other, the one holding less memory
        return sorted(fitting, key=lambda p: (round(math.log(p.days), 3), p.per_device["total"])), ""
    if closest is not None and (timed := try_plan(closest.config)) is not None:
        return [timed], ""
    return [], (f"a global batch of {cfg.global_batch} sequences does not split over its batch shards "
                f"(data x fsdp x expert) with tensor 1-8, 1-8 micro-batches and every axis along whole "
                f"sides of the torus")


def _roomy(p: Plan) -> bool:
    """Whether `p` fits with the estimate's margin (`SEARCH_MARGIN`), as a layout search requires."""
    return p.fits and p.per_device["total"] * SEARCH_MARGIN <= p.budget


def _layout(p: Plan) -> str:
    """"data 1 x fsdp 16 x expert 64 x tensor 1, remat full, capacity 1.25"."""
    m = p.config.model
    out = p.mesh.describe()
    if p.config.mesh.device_order:
        out += f" placed {p.config.mesh.device_order}"
    out += f", remat {m.remat}"
    if p.config.optimizer.grad_accum_steps > 1:
        out += f", {p.config.optimizer.grad_accum_steps} micro-batches"
    if m.n_experts:
        out += f", capacity {m.moe_capacity_factor:g}" if m.moe_capacity_factor else ", dropless"
    return out


def _slice_answer(p: Plan, device: bool = False) -> str:
    """"v5p-2048 (1,024 chips, 23.8 days at 98.1% goodput, 40.6% MFU predicted, 46.0 GiB of 85.5 GiB per chip,
    <layout>): <bindings>"."""
    cfg, m = p.config, p.config.model
    bindings = [f'train.HardwareConfig.device="{cfg.hardware.device}"'] if device else []
    bindings += [f'train.HardwareConfig.topology="{cfg.hardware.topology}"', "train.MeshConfig.data=-1",
                 f"train.MeshConfig.fsdp={p.mesh.fsdp}", f"train.MeshConfig.tensor={p.mesh.tensor}"]
    if m.n_experts:
        bindings.append(f"train.MeshConfig.expert={p.mesh.expert}")
        bindings.append(f"train.ModelConfig.moe_capacity_factor={m.moe_capacity_factor:g}")
    if cfg.mesh.device_order:
        bindings.append(f'train.MeshConfig.device_order="{cfg.mesh.device_order}"')
    bindings.append(f'train.ModelConfig.remat="{m.remat}"')
    bindings.append(f"train.OptimizerConfig.grad_accum_steps={cfg.optimizer.grad_accum_steps}")
    return (f"{slice_name(cfg.hardware.topology)} ({p.chips:,} chips, {num(p.days)} days at "
            f"{p.goodput.share:.1%} goodput, "
            f"{p.predicted.mfu:.1%} MFU predicted, {gib(p.per_device['total'])} of {gib(p.budget)} per "
            "chip, "
            f"{_layout(p)}): " + " ".join(bindings))
