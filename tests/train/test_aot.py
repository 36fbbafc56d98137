"""Kernels compiled ahead of time for a TPU slice that is not here (libtpu describes its chips).

    .venv/bin/python -m pytest tests/train/test_aot.py
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from pipeline import config
from stages.train import aot, attention, moe, sharding
from stages.train.configs import MeshConfig
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
    figures = aot.compile_train_step(cfg)
    assert figures["argument"] > 0 and figures["temp"] > 0 and figures["total"] > figures["temp"], figures
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
                                  "train.MeshConfig.fsdp=4"])
def test_the_moe_train_step_compiles_for_a_tpu_topology(mesh):
    """The mixture-of-experts train step compiled by the TPU compiler: with an expert axis (all-to-all of
    the capacity buffers inside shard_map) and without (dropless, the Pallas megablox grouped matmul)."""
    cfg = _tiny(*MOE, *mesh.split())
    figures = aot.compile_train_step(cfg)
    assert figures["argument"] > 0 and figures["temp"] > 0, figures
    devices = aot._topology_devices(TOPOLOGY)
    with jax.set_mesh(sharding.make_mesh(cfg.mesh, devices=devices)):
        assert moe.resolve_impl("auto") == "megablox"
        x = jax.ShapeDtypeStruct((256, 64), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((8, 64, 128), jnp.bfloat16)
        sizes = jax.ShapeDtypeStruct((8,), jnp.int32)
        assert "pallas_call" in str(jax.make_jaxpr(moe.grouped_matmul)(x, w, sizes))


def test_sequence_parallelism_splits_the_saved_layer_inputs_over_the_tensor_axis():
    """Full remat keeps each layer's input: identical on the tensor-parallel chips without sequence
    parallelism, split over them with it. XLA's compiled scratch for the TPU shrinks accordingly."""
    base = ('train.ModelConfig.dtype="bfloat16"', 'train.ModelConfig.remat="full"',
            "train.Config.seq_len=256", "train.Config.global_batch=4", "train.ModelConfig.n_layers=8",
            "train.MeshConfig.tensor=4")
    whole = aot.compile_train_step(_tiny(*base))
    split = aot.compile_train_step(_tiny(*base, "train.ModelConfig.sequence_parallel=True"))
    assert split["temp"] < whole["temp"], (split, whole)
