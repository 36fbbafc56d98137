"""Multi-slice meshes: each axis is its size within a slice (ICI) x across slices (DCN). A 2-slice mesh on
8 simulated CPU devices (4 a slice) places params and batch as expected, the planner counts every slice's
chips, and the real train step compiles for two v5p:2x2x1 slices ahead of time.

    .venv/bin/python -m pytest tests/train/test_multislice.py -q
"""

from __future__ import annotations

import dataclasses
import math
import textwrap

import jax
import pytest

from pipeline import config
from stages import train
from stages.train import sharding
from stages.train.mesh import Mesh, MeshConfig
from stages.train.model_config import ModelConfig
from stages.train.planning import aot, memory, planner
from stages.train.planning.hardware import HardwareConfig
from tests.conftest import REPO, run_on_simulated_devices

TOPOLOGY = "v5p:2x2x1"        # 4 chips: the smallest v5p slice


@pytest.mark.parametrize("cfg, n, ici, shape", [
    (MeshConfig(fsdp=4, dcn_data=2), 8, (1, 4, 1, 1), (2, 4, 1, 1)),
    (MeshConfig(fsdp=2, dcn_fsdp=2), 8, (2, 2, 1, 1), (2, 4, 1, 1)),
    (MeshConfig(data=2, tensor=2, dcn_data=2, dcn_tensor=2), 16, (2, 1, 1, 2), (4, 1, 1, 4)),
    (MeshConfig(fsdp=4), 8, (2, 4, 1, 1), (2, 4, 1, 1)),                  # one slice: as it always was
    (MeshConfig(expert=2, dcn_expert=2), 8, (2, 1, 2, 1), (2, 1, 4, 1)),
])
def test_each_axis_is_its_size_within_a_slice_times_the_slices_it_spans(cfg, n, ici, shape):
    assert cfg.ici_shape(n) == ici and cfg.shape(n) == shape
    assert cfg.num_slices == n // math.prod(ici)


@pytest.mark.parametrize("make, message", [
    (lambda: MeshConfig(dcn_data=0), r"MeshConfig.dcn_data=0 must be >= 1 \(the slices the data axis spans"),
    (lambda: MeshConfig(dcn_tensor=-1), r"MeshConfig.dcn_tensor=-1 must be >= 1"),
    (lambda: MeshConfig(dcn_data=2).shape(7),
     r"^7 devices do not split into 2 equal slices \(mesh dcn_data=2 x dcn_fsdp=1 x dcn_tensor=1\)$"),
    (lambda: MeshConfig(fsdp=3, dcn_data=2).shape(8),
     r"^mesh per slice \(ICI\) data=-1 x fsdp=3 x tensor=1 does not match the 4 devices of each of 2 slices "
     r"\(8 devices, dcn_data=2 x dcn_fsdp=1 x dcn_tensor=1\)"),
    (lambda: train.Config(mesh=MeshConfig(dcn_data=2)),
     r"^MeshConfig dcn_data=2 x dcn_fsdp=1 x dcn_tensor=1 spans 2 slice\(s\), "
     r"but HardwareConfig.num_slices=1"),
    (lambda: train.Config(hardware=HardwareConfig(num_slices=4)),
     r"spans 1 slice\(s\), but HardwareConfig.num_slices=4; .* \(e.g. train.MeshConfig.dcn_data=4\)$"),
    (lambda: sharding.make_mesh(MeshConfig(dcn_data=2), devices=jax.devices()[:1]),
     r"^1 devices do not split into 2 equal slices"),
])
def test_a_bad_multislice_layout_is_one_line_naming_the_values(make, message):
    with pytest.raises(ValueError, match=message) as e:
        make()
    assert "\n" not in str(e.value)


def test_the_planner_counts_every_slice_and_shows_the_ici_and_dcn_split():
    m = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    hw = HardwareConfig(device="tpu-v5p", topology="v5p:2x2x1", num_slices=2)
    p = planner.plan(train.Config(model=m, seq_len=64, global_batch=8, hardware=hw,
                                  mesh=MeshConfig(fsdp=4, dcn_data=2)))
    assert p.chips == 8 and p.mesh == Mesh(data=2, fsdp=4, expert=1, tensor=1) and p.micro_batch == 1
    lines = p.render().splitlines()
    assert lines[3].startswith("  mesh: data 2 x fsdp 4 x tensor 1 = ICI 1x4x1 within each slice x DCN 2x1x1 "
                               "across 2 slices; micro-batch 1 x 64"), lines[3]
    assert lines[-1] == "  verdict: fits on 8 x TPU v5p (95.0 GiB each), topology v5p:2x2x1 x 2 slices"
    xla = {"argument": 2**20, "output": 0, "alias": 0, "temp": 2**20, "total": 2**21}   # as aot returns them
    assert p.render(xla=xla).splitlines()[-2].startswith("  XLA, compiled for v5p:2x2x1 x 2 slices: 2.0 MiB ")


def test_a_data_axis_across_slices_gathers_the_micro_batch_hidden_states_for_the_loss():
    """Measured (benchmarks/RESULTS.md): the 600B on two v5p-2048 slices, one 8K sequence a device, holds
    bf16[2,1048576,20480] (80 GiB) in its loss with 8K-token chunks and half that with 16K chunks; not
    with one slice, and not more with more layers; the 1B, with several chunks a device, twice."""
    def plan(*overrides):
        return planner.plan(config.load([f"{REPO}/gin/600b_dense.gin"], [
            "train.Config.global_batch=1024", *overrides]).stages["train"].config, advise=False)

    two = ["train.HardwareConfig.num_slices=2", "train.MeshConfig.dcn_data=2"]
    logits = 8192 * 128256 // 8 * 4                                # one chunk's float32 logits a device
    hidden = 2 * 1048576 * 20480 * 2
    embed = 3 * 128256 * 2560 * 4                                   # the embedding's gradient, D over tensor
    assert plan(*two).per_device["across_slices"] == hidden + logits + embed
    assert plan(*two, "train.Config.loss_chunk=16384").per_device["across_slices"] == \
        hidden // 2 + logits + embed
    assert plan(*two, "train.ModelConfig.n_layers=2").per_device["across_slices"] == hidden + logits + embed
    assert plan("train.Config.global_batch=512").per_device["across_slices"] == 0
    d = plan(*two).per_device
    assert d["total"] == sum(d[k] for k in memory.ALWAYS) + d["loss"] + d["across_slices"]
    # The 1B on two v5p-128 slices: 4K chunks of a device's 16K tokens, gathered by an all-reduce whose
    # operand and result (bf16[2,256,4096,2048] each) are both live.
    one_b = config.load([f"{REPO}/gin/1b.gin"], two).stages["train"].config
    assert planner.plan(one_b).per_device["across_slices"] == \
        2 * (2 * 2**20 * 2048 * 2) + 4096 * 128256 * 4 + 3 * 128256 * 2048 * 4
    assert "loss 1.0 GiB + what XLA gathers across slices for it 84.2 GiB = " in plan(*two).render()


def test_the_planner_advises_sizes_within_a_slice_and_keeps_the_split_across_slices():
    # The flagship on two v5p-2048 slices: data 2 x fsdp 128 x tensor 8 leaves 256 batch shards for a
    # micro-batch of 128 sequences; the advice never adds chips, and a mesh layout binds the sizes within
    # a slice (1,024 chips each).
    # With one micro-batch a step (none fewer to try), a mesh layout is what splits it.
    cfg = config.load([f"{REPO}/gin/600b_dense.gin"], ["train.HardwareConfig.num_slices=2",
                                                 "train.MeshConfig.dcn_data=2"]).stages["train"].config
    p = planner.plan(cfg)
    assert p.chips == 2048 and p.mesh == Mesh(data=2, fsdp=128, expert=1, tensor=8) and not p.fits
    assert "does not split over data x fsdp = 256 devices" in p.problem
    # Two micro-batches a step would split it, but gather 256 sequences' hidden states across the slices
    # (80 GiB): one slice is what fits.
    assert p.advice.startswith("It would fit with train.HardwareConfig.num_slices=1 "
                               "train.MeshConfig.dcn_data=1 "), p.advice
    one = dataclasses.replace(cfg, global_batch=64, optimizer=dataclasses.replace(cfg.optimizer,
                                                                                  grad_accum_steps=1))
    p = planner.plan(one)
    assert "a micro-batch of 64 sequences" in p.problem
    assert p.advice.startswith("It would fit with train.MeshConfig.fsdp=16 train.MeshConfig.tensor=32 ")


TWO_SLICES = textwrap.dedent("""
    import json
    import jax, numpy as np
    from flax import nnx
    from stages.train import loop, sharding
    from stages.train.mesh import MeshConfig
    from stages.train.model_config import ModelConfig
    from stages.train.optimizer_config import OptimizerConfig

    assert jax.device_count() == 8 and not hasattr(jax.devices()[0], "slice_index"), jax.devices()

    def ids(mesh):
        # the (data, fsdp) grid of device ids (tensor is 1)
        return [[d.id for d in row] for row in mesh.devices[..., 0, 0]]

    def spec(s):
        # a PartitionSpec as JSON with trailing Nones dropped
        s = list(s.spec)
        while s and s[-1] is None:
            s.pop()
        return [list(a) if isinstance(a, tuple) else a for a in s]

    def per_slice(x):
        # slice (0: devices 0-3, 1: devices 4-7) -> the sorted distinct index ranges its devices hold
        held = {0: set(), 1: set()}
        for d, index in x.sharding.devices_indices_map(x.shape).items():
            held[d.id // 4].add(tuple((i.start or 0, x.shape[k] if i.stop is None else i.stop)
                                      for k, i in enumerate(index)))
        return {s: sorted(v) for s, v in held.items()}

    out = {}
    mesh = sharding.make_mesh(MeshConfig(fsdp=4, dcn_data=2))
    plain = sharding.make_mesh(MeshConfig(data=2, fsdp=4))
    out["data_across"] = {"shape": dict(mesh.shape), "ids": ids(mesh),
                          "same_as_one_slice": ids(mesh) == ids(plain)}
    out["fsdp_across"] = {"ids": ids(sharding.make_mesh(MeshConfig(fsdp=2, dcn_fsdp=2)))}

    mcfg = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64,
                       max_seq_len=32, dtype="float32", attention_impl="xla")
    graphdef, tx, init = loop.init_program(mcfg, OptimizerConfig(total_steps=10, warmup_steps=1), mesh)
    params, opt_state = init(0)
    out["params"] = {".".join(path): {"spec": spec(v[...].sharding), "slices": per_slice(v[...])}
                     for path, v in nnx.to_flat_state(params)}
    expected = jax.tree.leaves(sharding.param_shardings(params, mesh))
    out["params_as_param_shardings"] = all(x.sharding.is_equivalent_to(s, x.ndim)
                                           for x, s in zip(jax.tree.leaves(params), expected))
    toks = np.arange(8 * 17, dtype=np.int32).reshape(8, 17)
    batch = sharding.global_batch(toks, mesh)
    out["batch"] = {"spec": spec(batch.sharding),
                    "rows": {s.device.id: [s.index[0].start, s.index[0].stop]
                             for s in batch.addressable_shards},
                    "equal": bool((np.asarray(batch) == toks).all())}
    print("RESULT " + json.dumps(out))
""")


def test_a_two_slice_mesh_on_simulated_devices_places_params_and_batch():
    """dcn_data=2, fsdp=4 on 8 CPU devices (slices = devices 0-3 and 4-7): data crosses the slices, fsdp
    stays within each; every slice holds a whole copy of the parameters, split 4 ways by fsdp; the batch's
    first half lives on the first slice."""
    got = run_on_simulated_devices(TWO_SLICES, devices=8, timeout=300)
    across = got["data_across"]
    assert across["shape"] == {"data": 2, "fsdp": 4, "expert": 1, "tensor": 1}
    assert across["ids"] == [[0, 1, 2, 3], [4, 5, 6, 7]] and across["same_as_one_slice"]
    # fsdp 2 within a slice x 2 slices: the first half of fsdp is slice 0, the second slice 1.
    assert got["fsdp_across"]["ids"] == [[0, 1, 4, 5], [2, 3, 6, 7]]

    params = got["params"]
    assert got["params_as_param_shardings"]
    assert params["layers.wq"]["spec"] == [None, ["fsdp", "expert"], "tensor"]   # (L, D, N, H); expert 1
    assert params["embed"]["spec"] == ["tensor", ["fsdp", "expert"]]              # (V, D)
    for name, p in params.items():
        assert "data" not in str(p["spec"]), name                             # replicated over data
        assert p["slices"]["0"] == p["slices"]["1"], name                      # each slice: the same parts
        split = 4 if "fsdp" in str(p["spec"]) else 1
        assert len(p["slices"]["0"]) == split, (name, p)                       # fsdp splits within a slice
    batch = got["batch"]
    assert batch["spec"] == [["data", "fsdp", "expert"]] and batch["equal"]
    assert batch["rows"] == {str(i): [i, i + 1] for i in range(8)}           # slice 0: rows 0-3


def _on_tpu_slices(*overrides: str):
    # gin/tiny.gin cut to 2 layers, T=128 and 8 sequences: the compile takes seconds, not tens of them
    return config.load([f"{REPO}/gin/tiny.gin"], [
        'train.HardwareConfig.device="tpu-v5p"', f'train.HardwareConfig.topology="{TOPOLOGY}"',
        "train.ModelConfig.n_layers=2", "train.Config.seq_len=128", "train.Config.global_batch=8",
        *overrides]).stages["train"].config


def test_the_train_step_compiles_for_two_tpu_slices_ahead_of_time():
    """Two v5p:2x2x1 slices joined over DCN (libtpu describes them, with their slice_index): the hybrid
    mesh puts the dcn axes across slices, and the real train step compiles for all 8 chips."""
    devices = aot._topology_devices(TOPOLOGY, 2)
    assert len(devices) == 8 and sorted({d.slice_index for d in devices}) == [0, 1]

    def slice_grid(mesh_config):          # the (data, fsdp) grid of slice indices (tensor is 1)
        grid = sharding.make_mesh(mesh_config, devices).devices[..., 0, 0]
        return [[d.slice_index for d in row] for row in grid]

    assert slice_grid(MeshConfig(fsdp=4, dcn_data=2)) == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert slice_grid(MeshConfig(fsdp=2, dcn_fsdp=2)) == [[0, 0, 1, 1], [0, 0, 1, 1]]
    with pytest.raises(ValueError, match=r"^the 8 devices are in 2 slices, but MeshConfig dcn_data=1 x "
                                         r"dcn_fsdp=1 x dcn_tensor=1 spans 1; "):
        sharding.make_mesh(MeshConfig(fsdp=8), devices)

    two = aot.compile_train_step(_on_tpu_slices("train.HardwareConfig.num_slices=2",
                                                "train.MeshConfig.fsdp=4", "train.MeshConfig.dcn_data=2"))
    one = aot.compile_train_step(_on_tpu_slices("train.MeshConfig.fsdp=4"))
    assert two["argument"] > 0 and two["total"] > two["temp"] > 0, two
    # The same fsdp 4 within a slice, but the batch split over twice the chips: less scratch per chip.
    assert two["temp"] < one["temp"], (two, one)
