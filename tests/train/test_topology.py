"""Where a mesh lies on a TPU slice's chips (stages/train/planning/topology.py) and what the step-time model
charges its collectives for it, against hand computations. No JAX (tests/train/test_aot.py builds the
meshes on an AOT topology's devices and reads their coordinates).

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/train/test_topology.py
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from stages.train.mesh import MeshConfig
from stages.train.model_config import ModelConfig
from stages.train.optimizer_config import OptimizerConfig
from stages.train.planning import devices, planner, search, step_time, topology
from stages.train.planning.hardware import HardwareConfig
from stages.train.stage_config import Config

V5P = topology.grid("v5p:8x8x16")
SIZES = (1, 64, 16, 1)                               # (data, fsdp, expert, tensor): the flagship's mesh
RING, PLANE, BLOCK = "fsdp:8x8x1,expert:1x1x16", "fsdp:2x2x16,expert:4x4x1", "fsdp:4x4x4,expert:2x2x4"


def test_a_slice_wraps_its_sides_as_its_generation_does():
    assert V5P.sides == (8, 8, 16) and V5P.wraps == (True, True, True)          # a whole cube or more
    assert topology.grid("v5p:2x4x4").wraps == (False, False, False)           # less than a cube
    assert topology.grid("v4:4x4x4").wraps == (True, True, True)
    assert topology.grid("v6e:16x16") == topology.Grid("v6e:16x16", (16, 16, 1), (True, True, False))
    assert topology.grid("v5e:8x16").wraps == (False, True, False)             # only the pod's 16 wraps
    with pytest.raises(ValueError, match="'v5p:8' is not .*'v5p:8x8x16'"):
        topology.grid("v5p:8")


def _brute_hops(g: topology.Grid, chips: list[tuple[int, int, int]]) -> float:
    """The mean links between two distinct chips of `chips`, counted pair by pair: per side the ring
    distance where the group covers a wrapped side, else the line distance."""
    covers = []
    for i in range(3):
        at = sorted({c[i] for c in chips})
        step = at[1] - at[0] if len(at) > 1 else 1
        covers.append(g.wraps[i] and len(at) * step == g.sides[i])
    total = 0
    for a, b in itertools.permutations(chips, 2):
        for i in range(3):
            d = abs(a[i] - b[i])
            total += min(d, g.sides[i] - d) if covers[i] else d
    return total / (len(chips) * (len(chips) - 1))


@pytest.mark.parametrize("text, shape, hops, ports, links", [
    # A wrapped ring of 16: mean distance to the 15 others (0 + 2 (1 + ... + 7) + 8) / 15 = 64 / 15.
    (RING, (1, 1, 16), 64 / 15, 2, 2),
    # A 4x4 plane inside the 8-long sides (no wraparound of its own): per side the line's mean over all 16
    # ordered pairs, (2 (3 x 1 + 2 x 2 + 1 x 3)) / 16 = 1.25, two sides, x 16 / 15.
    (PLANE, (4, 4, 1), 2.5 * 16 / 15, 2, 2 * 2 * 3 / 4),
    # A 2x2x4 block: 0.5 + 0.5 + 1.25 over all pairs, x 16 / 15; a port a side; links 1 + 1 + 1.5.
    (BLOCK, (2, 2, 4), 2.25 * 16 / 15, 3, 1 + 1 + 1.5),
])
def test_an_expert_group_of_16_as_a_ring_a_plane_and_a_block(text, shape, hops, ports, links):
    order = topology.parse_order(text, V5P, SIZES)
    g = topology.group(V5P, order, ("expert",))
    assert g.shape == shape and g.chips == 16
    assert g.hops == pytest.approx(hops) and g.ring_ports == ports and g.links == pytest.approx(links)
    members = [topology.coords(V5P, order, (0, 0, e, 0)) for e in range(16)]
    assert g.hops == pytest.approx(_brute_hops(V5P, members))
    # Every chip of the grid is some mesh position's, once.
    every = {topology.coords(V5P, order, i) for i in itertools.product(*map(range, SIZES))}
    assert len(every) == 1024


def test_jax_places_the_flagship_mesh_as_an_fsdp_plane_and_an_expert_ring():
    """create_device_mesh's torus rule: expert (16) takes the one side of 16, fsdp (64) the 8x8 rest."""
    order = topology.default_order(V5P, SIZES)
    assert order.describe() == RING
    g = topology.group(V5P, order, ("fsdp",))
    assert g.shape == (8, 8, 1) and g.ring_ports == 4 and all(g.wrapped[:2])
    assert topology.default_order(V5P, (1, 512, 2, 1)) is None         # 512 x 2 splits a side: jax's own
    # Strided: fsdp around a 4x4 expert plane holds x, y in {0, 4}: each hop crosses 4 links.
    plane = topology.parse_order(PLANE, V5P, SIZES)
    f = topology.group(V5P, plane, ("fsdp",))
    assert f.strides == (4, 4, 1) and f.wrapped == (True, True, True)
    assert f.ring_ports == pytest.approx(2 / 4 + 2 / 4 + 2)


def test_a_device_order_that_does_not_tile_the_grid_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"expert 1x1x8 is 8 chips, but the mesh's expert axis has 16"):
        topology.parse_order("fsdp:8x8x1,expert:1x1x8", V5P, SIZES)
    with pytest.raises(ValueError, match=r"along z multiply to 32, but v5p:8x8x16's side there is 16"):
        topology.parse_order("fsdp:8x8x2,expert:1x1x16", V5P, (1, 128, 16, 1))
    with pytest.raises(ValueError, match=r"does not place the expert axis of 16 chips"):
        topology.parse_order("fsdp:8x8x1", V5P, SIZES)


def test_the_search_tries_the_ring_the_plane_and_the_block():
    texts = topology.order_choices(V5P, SIZES)
    assert texts[0] == ""                                      # jax's placement first: the ring
    shapes = {topology.group(V5P, topology.device_order(V5P, SIZES, t), ("expert",)).shape for t in texts}
    assert {(1, 1, 16), (4, 4, 1), (2, 2, 4)} <= shapes


MOE = ModelConfig(vocab_size=1024, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=512,
                  max_seq_len=512, remat="none", n_experts=16, n_experts_per_token=2, moe_mlp_dim=128,
                  n_dense_layers=1, moe_capacity_factor=1.25)


def _flagship_mesh(order: str = "") -> Config:
    return Config(model=MOE, seq_len=512, global_batch=1024, steps=1000,
                  optimizer=OptimizerConfig(warmup_steps=10),
                  mesh=MeshConfig(fsdp=64, expert=16, device_order=order),
                  hardware=HardwareConfig(device="tpu-v5p", topology="v5p:8x8x16"))


def test_the_all_to_all_over_a_ring_of_16_is_the_hand_computation():
    cfg = _flagship_mesh()
    p = planner.plan(cfg, advise=False)
    [a2a] = [c for c in step_time.collectives(cfg, p.mesh, p.micro_batch) if c.kind == "all-to-all"]
    # By hand: each chip sends 15/16 of its B-byte buffer, each byte on average 16/4 x 16/15 = 4.267 links
    # round the ring, over its 2 link-directions along z, each 1,200 GB/s / 12 = 100 GB/s at 70%.
    rate = 1200e9 / 6 / 2 * 0.7
    hand = a2a.count * a2a.bytes * (15 / 16) * (16 / 4 * 16 / 15) / (2 * rate)
    assert hand == pytest.approx(a2a.count * a2a.bytes * 2 / rate)       # = 2 B / r a buffer
    term = p.predicted.term("all-to-all")
    assert term.seconds == pytest.approx(hand) and term.exposed == term.seconds
    assert "1x1x16 (a ring along z, wrapped): 4.27 hops, 2 ring ports" in term.note
    # The ring's bisection gives the same: 16 B / 4 each way over the 2 links a halving cut crosses.
    assert 16 * a2a.bytes / 4 / (2 * rate) * a2a.count == pytest.approx(hand)
    # As a 4x4 plane or a 2x2x4 block the worst cut is 4 links: half the ring's time.
    for order in (PLANE, BLOCK):
        other = planner.plan(_flagship_mesh(order), advise=False).predicted.term("all-to-all")
        assert other.seconds == pytest.approx(hand / 2)


def test_ring_collectives_use_only_their_groups_ports():
    cfg = _flagship_mesh()
    p = planner.plan(cfg, advise=False)
    links = step_time.Links.of(cfg, p.mesh, devices.get("tpu-v5p"), step_time.EFFICIENCY["tpu-v5p"])
    assert links.ring_rate(("fsdp",)) == pytest.approx(4 * 100e9 * 0.7)           # the 8x8 plane, wrapped
    assert links.ring_rate(("fsdp", "expert")) == pytest.approx(6 * 100e9 * 0.7)  # the whole torus
    assert "device order fsdp:8x8x1,expert:1x1x16 on v5p:8x8x16 (8x8x16, every side wrapped; jax's" \
        in p.render()
    # Without a topology nothing is placed: the chip's whole ICI, the group taken as a cube.
    loose = dataclasses.replace(cfg, hardware=HardwareConfig(device="tpu-v5p", chips=1024))
    p = planner.plan(loose, advise=False)
    assert step_time.Links.of(loose, p.mesh, p.device, step_time.EFFICIENCY["tpu-v5p"]).grid is None


def test_the_slice_search_names_the_device_order_it_picks():
    cfg = dataclasses.replace(_flagship_mesh(), mesh=MeshConfig())
    ranked, _ = search._fastest_layouts(cfg, 1024)
    orders = {p.config.mesh.device_order for p in ranked if p.mesh.expert == 16 and p.mesh.fsdp == 64}
    assert "" in orders and len(orders) > 1
    placed = next(p for p in ranked if p.config.mesh.device_order)
    binding = f'train.MeshConfig.device_order="{placed.config.mesh.device_order}"'
    assert binding in search._slice_answer(placed)
