"""Kernels compiled ahead of time for a TPU slice that is not here (libtpu describes its chips).

    .venv/bin/python -m pytest tests/train/test_aot.py
"""

import collections
import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import pytest

from pipeline import config
from stages.train import attention, moe, sharding
from stages.train.mesh import MeshConfig
from stages.train.planning import aot, hlo, planner, step_time, topology
from tests.conftest import REPO

TOPOLOGY = "v5p:2x2x1"        # 4 chips: the smallest v5p slice


def _tiny(*overrides: str):
    return config.load([f"{REPO}/gin/tiny.gin"], [
        'train.HardwareConfig.device="tpu-v5p"', f'train.HardwareConfig.topology="{TOPOLOGY}"',
        *overrides]).stages["train"].config


def test_auto_attention_picks_splash_under_a_mesh_of_tpu_chips_on_a_cpu_machine():
    """`auto` chooses by where the step will run (the mesh's devices), not by the machine tracing it."""
    mesh = sharding.make_mesh(MeshConfig(data=2, tensor=2), devices=aot._topology_devices(TOPOLOGY))
    q = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 256, 2, 64), jnp.bfloat16)
    fn = lambda q, k, v: attention.attention(q, k, v, impl="auto")        # noqa: E731
    with jax.set_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(fn)(q, kv, kv))
    assert "shard_map" in jaxpr and "pallas_call" in jaxpr
    assert "pallas_call" not in str(jax.make_jaxpr(fn)(q, kv, kv))      # no mesh: this CPU, no TPU kernel


@pytest.mark.parametrize("mesh", ["train.MeshConfig.fsdp=4",
                                  "train.MeshConfig.fsdp=2 train.MeshConfig.tensor=2"])
def test_the_train_step_with_splash_compiles_for_a_tpu_topology(mesh):
    """The real train step (scan over layers, remat, grad accumulation) with the Pallas splash kernel inside
    shard_map, compiled by the TPU compiler: `splash` never falls back, so a compile is splash's."""
    cfg = _tiny('train.ModelConfig.attention_impl="splash"', "train.ModelConfig.attention_block_q=128",
                "train.ModelConfig.attention_block_k=128", 'train.ModelConfig.remat="minimal"',
                'train.ModelConfig.dtype="bfloat16"', *mesh.split())
    compiled = []
    figures = aot.compile_train_step(cfg, collectives=compiled)
    assert figures["argument"] > 0 and figures["temp"] > 0 and figures["total"] > figures["temp"], figures
    _the_model_names_the_compiled_collectives(cfg, compiled)
    # A sequence that is not a multiple of 128 is refused while tracing, naming the rule.
    short = dataclasses.replace(cfg, seq_len=200)
    with pytest.raises(ValueError, match=r"impl='splash' needs T=200 .* multiples of 128"):
        aot.compile_train_step(short)


@pytest.mark.parametrize("topology, chips", [("v4:2x2x4", 16), ("v5p:2x2x1", 4), ("v5e:2x2", 4),
                                             ("v6e:2x2", 4)])
def test_a_topology_compiles_for_one_device_per_chip(topology, chips):
    """v4 and v5p chips have two TensorCores that JAX runs as one device (megacore); libtpu describes v4 with
    a device per TensorCore unless asked (v4:2x2x4 gave 32 devices), so aot asks for megacore."""
    devices = aot._topology_devices(topology)
    assert len(devices) == chips and {d.core_on_chip for d in devices} == {0}
    assert len({tuple(d.coords) for d in devices}) == chips


MOE = ("train.ModelConfig.n_experts=8", "train.ModelConfig.n_experts_per_token=2",
       "train.ModelConfig.n_dense_layers=1", "train.ModelConfig.moe_mlp_dim=256",
       'train.ModelConfig.dtype="bfloat16"', 'train.ModelConfig.remat="full"')


@pytest.mark.parametrize("mesh", ["train.MeshConfig.expert=2 train.MeshConfig.fsdp=2",
                                  "train.MeshConfig.expert=2 train.MeshConfig.fsdp=2 "
                                  'train.MeshConfig.device_order="fsdp:2x1x1,expert:1x2x1"',
                                  "train.MeshConfig.fsdp=4"])
def test_the_moe_train_step_compiles_for_a_tpu_topology(mesh):
    """The mixture-of-experts train step compiled by the TPU compiler: with an expert axis (all-to-all of
    the capacity buffers inside shard_map), also laid in a device order other than jax's (expert along y,
    where jax puts it along x), and without (dropless, the Pallas megablox grouped matmul)."""
    cfg = _tiny(*MOE, *mesh.split())
    compiled = []
    figures = aot.compile_train_step(cfg, collectives=compiled)
    assert figures["argument"] > 0 and figures["temp"] > 0, figures
    _the_model_names_the_compiled_collectives(cfg, compiled)
    devices = aot._topology_devices(TOPOLOGY)
    with jax.set_mesh(sharding.make_mesh(cfg.mesh, devices=devices)):
        assert moe.resolve_impl("auto") == "megablox"
        x = jax.ShapeDtypeStruct((256, 64), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((8, 64, 128), jnp.bfloat16)
        sizes = jax.ShapeDtypeStruct((8,), jnp.int32)
        assert "pallas_call" in str(jax.make_jaxpr(moe.grouped_matmul)(x, w, sizes))


def test_mla_projections_are_gathered_as_the_step_model_says_under_full_remat():
    """Multi-head latent attention's five projections, compiled for the TPU under full remat: its query and
    key-value projections are gathered three times a layer (forward, recompute, backward), its output
    projection twice, as step_time.REGATHERED says."""
    cfg = _tiny('train.ModelConfig.attention_kind="mla"', "train.ModelConfig.n_kv_heads=4",
                "train.ModelConfig.q_lora_rank=64", "train.ModelConfig.kv_lora_rank=64",
                "train.ModelConfig.qk_nope_head_dim=32", "train.ModelConfig.qk_rope_head_dim=32",
                "train.ModelConfig.v_head_dim=32", 'train.ModelConfig.dtype="bfloat16"',
                'train.ModelConfig.attention_impl="xla"', 'train.ModelConfig.remat="full"',
                "train.MeshConfig.fsdp=4")
    compiled = []
    aot.compile_train_step(cfg, collectives=compiled)
    _the_model_names_the_compiled_collectives(cfg, compiled)


def test_sequence_parallelism_splits_the_saved_layer_inputs_over_the_tensor_axis():
    """Full remat keeps each layer's input: identical on the tensor-parallel chips without sequence
    parallelism, split over them with it. XLA's compiled scratch for the TPU shrinks accordingly."""
    base = ('train.ModelConfig.dtype="bfloat16"', 'train.ModelConfig.remat="full"',
            "train.Config.seq_len=256", "train.Config.global_batch=4", "train.ModelConfig.n_layers=8",
            "train.MeshConfig.tensor=4")
    whole = aot.compile_train_step(_tiny(*base))
    split = aot.compile_train_step(_tiny(*base, "train.ModelConfig.sequence_parallel=True"))
    assert split["temp"] < whole["temp"], (split, whole)


def _key(kind: str, dtype: str, dims) -> tuple:
    """A collective's class, dtype and its array's dimensions without 1s (an all-to-all's by its elements:
    XLA reshapes the buffers it exchanges). A gradient may be reduced as a reduce-scatter or as an
    all-reduce (the TPU compiler picks per array): the two are one class here."""
    if kind == "all-to-all":
        return kind, dtype, math.prod(dims)
    kind = "reduce" if kind in ("all-reduce", "reduce-scatter") else kind
    return kind, dtype, tuple(d for d in dims if d > 1)


def _the_model_names_the_compiled_collectives(cfg, compiled: list[hlo.Collective]) -> None:
    """Every collective the step model says the step runs (step_time.collectives: FSDP's per-layer gathers
    and gradient reductions, the loss's logits, the tensor axis's activations, the expert axis's capacity
    buffers) is in the compiled step with its shape, dtype and count, so the model's bytes of each kind are
    the compiled step's. What the model leaves out (token indices, norms, scalars, the embedding's
    reshards, the output matrix's gathers) is what remains. With an expert axis XLA also reduces the
    non-expert gradients over it, some arrays combined with others: those reductions are not compared."""
    p = planner.plan(cfg)
    model = step_time.collectives(cfg, p.mesh, p.micro_batch)
    assert model, "the step model names no collective for a mesh of 4 chips"
    got = collections.Counter()
    for c in compiled:
        for dtype, dims in c.shapes:
            got[_key(c.kind, dtype, dims)] += c.count
    want = collections.Counter()
    for c in model:
        expert_axis_reduce = p.mesh.expert > 1 and c.kind == "reduce-scatter"
        if not (expert_axis_reduce and not c.what.startswith("moe_layers.expert")):
            want[_key(c.kind, c.dtype, c.shape)] += c.count
    assert {k: got[k] for k in want} == dict(want), [c for c in compiled if c.count]
    # Each array, count and dtype equal, so are the bytes of each kind the model names.
    assert any(c.kind == "all-gather" for c in model)


@pytest.mark.parametrize("order, shape", [("", (1, 1, 16)), ("fsdp:8x8x1,expert:1x1x16", (1, 1, 16)),
                                          ("fsdp:2x2x16,expert:4x4x1", (4, 4, 1)),
                                          ("fsdp:4x4x4,expert:2x2x4", (2, 2, 4))])
def test_make_mesh_lays_the_planned_device_order_on_a_topologys_chips(order, shape):
    """On v5p:8x8x16's compile-only devices (they carry `coords`) every mesh position holds the chip the
    order plans ("" : jax's own placement, which topology.default_order describes), and an expert group's
    hops and ports read from those chips' coordinates are the planner's."""
    devices = aot._topology_devices("v5p:8x8x16")
    cfg = MeshConfig(fsdp=64, expert=16, device_order=order)
    mesh = sharding.make_mesh(cfg, devices=devices)
    grid = topology.grid("v5p:8x8x16")
    planned = topology.device_order(grid, (1, 64, 16, 1), order)
    for index in itertools.product(range(1), range(64), range(16), range(1)):
        assert tuple(mesh.devices[index].coords) == topology.coords(grid, planned, index), index
    group = [tuple(d.coords) for d in mesh.devices[0, 5, :, 0]]          # one expert group's 16 chips
    spans = tuple(len({c[i] for c in group}) for i in range(3))
    assert spans == shape
    placed = topology.group(grid, planned, ("expert",))
    assert placed.shape == shape
    wrapped = [grid.wraps[i] and spans[i] == grid.sides[i] for i in range(3)]
    pairs = [(a, b) for a in group for b in group if a != b]
    hops = sum(min(abs(a[i] - b[i]), 8 * (1 + (i == 2)) - abs(a[i] - b[i])) if wrapped[i] else
               abs(a[i] - b[i]) for a, b in pairs for i in range(3)) / len(pairs)
    assert placed.hops == pytest.approx(hops)
    assert placed.ring_ports == sum((2 if wrapped[i] else 1) for i in range(3) if spans[i] > 1)
