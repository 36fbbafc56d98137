"""The planner: per-device memory from the config alone, a verdict with advice, and the CLI around it."""

import dataclasses
import math
import os
import socket
import subprocess
import sys

import pytest

from benchmarks import plan_vs_xla

# sweep: gin/twins/fineweb_recipe.gin includes a sweep file, whose `sweep.*` bindings parse once the module
# has registered them (as `python -m pipeline` does on start)
from pipeline import config, sweep  # noqa: F401
from stages import train
from stages.train import model_config
from stages.train.mesh import Mesh, MeshConfig
from stages.train.model_config import ModelConfig, active_params, param_counts
from stages.train.planning import devices, figures, memory, plan, planner, search, shards, tpu
from stages.train.planning.hardware import HardwareConfig
from stages.train.planning.tpu import TPU_GENERATIONS
from tests.conftest import REPO, run_files

FLAGSHIP = f"{REPO}/gin/600b.gin"            # a ~600B mixture of experts
DENSE = f"{REPO}/gin/600b_dense.gin"          # the dense 599B on the same slice, measured against XLA
FITS = "verdict: fits on 1,024 x TPU v5p (95.0 GiB each), topology v5p:8x8x16"


def _flagship(*overrides: str):
    return config.load([FLAGSHIP], list(overrides)).stages["train"].config


def _dense(*overrides: str):
    return config.load([DENSE], list(overrides)).stages["train"].config


def test_one_device_holds_every_parameter_gradient_and_both_adam_moments():
    cfg = train.Config(model=ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4,
                                         max_seq_len=64), seq_len=64, global_batch=4)
    p = planner.plan(cfg)
    n = sum(param_counts(cfg.model).values())
    assert p.per_device["params"] == p.per_device["grads"] == 4 * n          # float32
    assert p.per_device["optimizer"] == 2 * 4 * n and p.per_device["gathered"] == 0
    assert p.fits and p.chips == 1 and p.mesh == Mesh(data=1, fsdp=1, expert=1, tensor=1)


def test_sharding_divides_the_state_the_way_training_places_it():
    m = ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, max_seq_len=128)
    base = train.Config(model=m, seq_len=128, global_batch=8, hardware=HardwareConfig(chips=8))
    one = planner.plan(dataclasses.replace(base, mesh=MeshConfig(data=8)))
    fsdp = planner.plan(dataclasses.replace(base, mesh=MeshConfig(data=1, fsdp=8)))
    tensor = planner.plan(dataclasses.replace(base, mesh=MeshConfig(data=4, tensor=2)))
    assert one.per_device["params"] == 4 * sum(param_counts(m).values())     # data parallel: replicated
    # Every parameter has an "embed" axis (256, split 8 ways): fsdp 8 leaves each device exactly an eighth.
    assert fsdp.per_device["params"] * 8 == one.per_device["params"]
    # tensor 2 halves everything with a heads, kv_heads, mlp or vocab axis (2 kv heads split too); the
    # norm scales have none of those axes and stay whole.
    norms = 4 * (2 * 4 * 256 + 256)
    assert tensor.per_device["params"] == (one.per_device["params"] - norms) // 2 + norms
    assert fsdp.per_device["gathered"] > 0 and one.per_device["gathered"] == 0


def test_heavier_remat_keeps_less():
    cfg = _dense()
    kept = {r: memory.activation_bytes(dataclasses.replace(cfg.model, remat=r), 1, 8192, 8, lanes=128,
                                        splash=True)
            for r in model_config.REMAT_NAMES}
    values = [kept[r][0] for r in memory.REMAT_ORDER]
    assert values == sorted(values, reverse=True) and kept["none"][0] > 5 * kept["full"][0]
    assert all(kept[r][1] == 0 for r in memory.REMAT_ORDER)                 # nothing in host memory
    # An offload policy keeps what its namesake keeps, in host memory: the device holds only what stays
    # (the layer input, but for offload_full) and two layers in flight.
    full_input = kept["full"][0]                                             # L x T x D, bfloat16
    assert kept["offload_full"][1] == full_input and kept["offload_full"][0] == 2 * full_input // 120
    for r in ("offload_minimal", "offload_dots_no_batch"):
        device, host = kept[r]
        assert full_input < device < kept[r.removeprefix("offload_")][0] and host > 0


def test_the_dense_600b_fits_its_slice_and_an_undersized_layout_is_told_what_would():
    p = planner.plan(_dense())
    assert p.fits and p.chips == 1024 and p.device.name == "tpu-v5p"
    assert p.render().splitlines()[-1] == "  " + FITS
    small = planner.plan(_dense("train.MeshConfig.fsdp=16"))
    assert not small.fits
    assert "does NOT fit" in small.render() and "It would fit with train.MeshConfig.fsdp=64" in small.advice
    unsplit = planner.plan(_dense("train.MeshConfig.fsdp=16", "train.MeshConfig.tensor=1"))
    assert "does not split over data x fsdp = 1024 devices" in unsplit.problem
    assert "train.MeshConfig.tensor=8" in unsplit.advice


# The layout: the dense 600B (then the flagship) on four v5p-8192 slices, whose compile XLA refused
# (issue 15).
FOUR_SLICES = ('train.HardwareConfig.topology="v5p:16x16x16"', "train.HardwareConfig.num_slices=4",
               "train.MeshConfig.dcn_data=4", "train.MeshConfig.fsdp=512", "train.MeshConfig.tensor=8",
               "train.Config.global_batch=8192")
# libtpu's message (its format string, with the figures the issue quotes).
LIBTPU_OOM = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
              "(362.47G) exceeds available HBM (95.74G).")


def test_xla_running_out_of_memory_is_a_does_not_fit_verdict_quoting_its_figure():
    from stages.train.planning import aot

    p = planner.plan(_dense(*FOUR_SLICES))
    oom = aot._out_of_memory(LIBTPU_OOM)
    assert oom.figures["total"] == round(362.47 * 2**30) and oom.figures["hbm"] == round(95.74 * 2**30)
    lines = p.render(xla=oom.figures, xla_note=oom.said).splitlines()
    assert not p.fits_with(oom.figures) and "fits on" not in lines[-1]
    assert lines[-1].startswith("  verdict: does NOT fit: XLA's compile for v5p:16x16x16 x 4 slices needs "
                                "at least 362.5 GiB per device > the 95.7 GiB it had (XLA's figure wins over "
                                "the estimate, "), lines[-1]
    assert lines[-2].startswith("  XLA, compiled for v5p:16x16x16 x 4 slices: out of memory, needs at least "
                                "362.5 GiB per device of 95.7 GiB; libtpu: ")
    assert aot._out_of_memory("INTERNAL: something else") is None


def test_xla_figure_over_the_usable_memory_wins_over_an_estimate_that_fits():
    p = planner.plan(_flagship())
    assert p.fits
    over = {"argument": 0, "output": 0, "alias": 0, "temp": p.budget + 1, "total": p.budget + 1}
    assert not p.fits_with(over)
    assert p.render(xla=over).splitlines()[-1].startswith(
        "  verdict: does NOT fit: XLA's compile for v5p:8x8x16 needs 85.5 GiB per device > 85.5 GiB usable")
    under = dict(over, temp=p.budget, total=p.budget)
    assert p.render(xla=under).splitlines()[-1] == "  " + FITS


@pytest.mark.slow
def test_make_plan_never_says_fits_when_the_tpu_compile_runs_out_of_memory():
    """The tiny model's estimate (112 MiB) fits a v5p easily; libtpu told its chips have 8 MiB of HBM
    (--xla_tpu_max_hbm_size_mib, a real compile) refuses the step, and the verdict follows XLA."""
    out = _cli("plan", "--gin", f"{REPO}/gin/tiny.gin", "--overrides",
               'train.HardwareConfig.device="tpu-v5p" train.HardwareConfig.topology="v5p:2x2x1" '
               "train.MeshConfig.fsdp=4", env={"LIBTPU_INIT_ARGS": "--xla_tpu_max_hbm_size_mib=8"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.rstrip().splitlines()
    assert "fits on" not in out.stdout, lines[-3:]
    assert "HLO temporaries" in lines[-2] and "exceeds available HBM (8.00M)" in lines[-2], lines[-2]
    assert lines[-1].startswith("  verdict: does NOT fit: XLA's compile for v5p:2x2x1 needs at least "), \
        lines[-1]
    assert lines[-1].endswith("per device > the 8.0 MiB it had (XLA's figure wins over the estimate, 111.8 "
                              f"MiB). {plan._XLA_ADVICE}"), lines[-1]


def test_a_batch_that_cannot_split_over_the_chips_is_never_told_to_use_more_chips():
    """More chips means more batch shards: the advice names a change that leaves every shard a sequence."""
    p = planner.plan(_dense(*FOUR_SLICES[:-1]))             # 128 sequences a micro-batch, 2,048 shards
    assert "does not split over data x fsdp = 2048 devices" in p.problem
    assert "more chips" not in p.advice
    assert p.advice.endswith("over these 16,384 chips and fits: use fewer chips (at most 128 data x fsdp "
                             "shards, each a whole sequence) or a smaller model."), p.advice
    # 256 shards for 128 sequences: two micro-batches a step instead of four split, before any mesh layout.
    half = planner.plan(_dense("train.MeshConfig.tensor=4"))
    assert half.problem
    assert half.advice.startswith("It would fit with train.OptimizerConfig.grad_accum_steps=2 ")


def test_a_layout_that_cannot_run_is_not_compiled_and_the_verdict_stays_last():
    lines = train.plan(_dense("train.MeshConfig.fsdp=16", "train.MeshConfig.tensor=1")).splitlines()
    assert lines[-2] == "  XLA: not compiled: this layout cannot run (the verdict says why)", lines
    assert lines[-1].startswith("  verdict: does NOT fit: a micro-batch of 128 sequences"), lines


def test_the_loss_and_the_layers_backward_pass_are_phases_that_never_overlap():
    """The loss (forward and backward, one chunk of logits at a time) runs before the layers' backward pass:
    the device total holds the larger of the two, not their sum (1B, full remat: the sum was 19% above
    XLA's figure, benchmarks/RESULTS.md)."""
    d = planner.plan(_dense()).per_device
    held = sum(d[k] for k in memory.ALWAYS)
    backward = d["grads"] + d["gathered"] + d["recompute"]
    assert d["total"] == held + max(backward, d["loss"]) < held + backward + d["loss"]


def test_xla_cpu_holds_the_layers_gradients_and_two_transposed_output_matrices_through_the_loss():
    """The same config planned for a CPU and for an H100 differs by what XLA:CPU is measured to hold
    (benchmarks/RESULTS.md): the zero-filled gradient stacks of the layers and two float32 copies of the
    output matrix in the loss phase, and every parameter's update at once in the update phase."""
    m = ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=8, max_seq_len=128)
    cfg = train.Config(model=m, seq_len=128, global_batch=8, mesh=MeshConfig(data=-1, fsdp=4),
                       hardware=HardwareConfig(chips=8))
    cpu = planner.plan(cfg).per_device
    gpu = planner.plan(dataclasses.replace(cfg, hardware=HardwareConfig(device="h100", chips=8))).per_device
    counts = param_counts(m)             # every parameter has the "embed" axis: fsdp 4 leaves a quarter
    assert cpu["xla_cpu"] == 4 * (counts["layers"] + 2 * counts["unembed"]) // 4     # all float32
    assert cpu["updates"] == cpu["params"]
    assert gpu["xla_cpu"] == gpu["updates"] == 0
    assert {k: v for k, v in cpu.items() if k not in ("xla_cpu", "updates", "total")} == \
        {k: v for k, v in gpu.items() if k not in ("xla_cpu", "updates", "total")}
    held = sum(cpu[k] for k in memory.ALWAYS)
    assert cpu["total"] == max(held + max(cpu["grads"] + cpu["gathered"] + cpu["recompute"],
                                          cpu["loss"] + cpu["xla_cpu"]),
                               held - cpu["activations"] + cpu["grads"] + cpu["updates"])


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(plan_vs_xla.CPU_CASES))
def test_the_plan_is_within_ten_percent_of_xla_cpu_on_8_simulated_devices(case):
    """The benchmark's CPU rows (124M, float32, 8 x 1K tokens on 8 simulated devices), compiled here."""
    row = plan_vs_xla.cpu_row(case)
    assert 0.9 <= row["ratio"] <= 1.1, row


def test_offloaded_activations_count_in_host_memory_not_in_hbm():
    full = planner.plan(_dense())
    offload = planner.plan(_dense('train.ModelConfig.remat="offload_full"'))
    layer_inputs = 120 * 8192 * 20480 * 2                                   # L x T x D in bfloat16
    assert full.host == 0 and full.per_device["activations"] == layer_inputs
    assert offload.host == layer_inputs and offload.fits
    assert offload.per_device["activations"] == 2 * 8192 * 20480 * 2       # two layers in flight
    assert full.per_device["total"] - offload.per_device["total"] == layer_inputs - 2 * 8192 * 20480 * 2
    line = offload.render().splitlines()[5]
    assert line == ("  host memory per device: 37.5 GiB of activations offloaded by remat offload_full (not "
                    "in the device total) of 87.3 GiB usable (90% of 104.3 GiB, less the checkpoint's copy "
                    "of the state)"), line


def test_a_cpu_has_no_host_memory_to_offload_to_so_offload_plans_as_its_namesake():
    m = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, max_seq_len=64)
    plans = {r: planner.plan(train.Config(model=dataclasses.replace(m, remat=r), seq_len=64, global_batch=4))
             for r in ("minimal", "offload_minimal")}
    assert plans["offload_minimal"].per_device == plans["minimal"].per_device
    assert plans["offload_minimal"].host == 0
    assert "host memory: cpu has none to offload to; remat offload_minimal runs as minimal" in \
        plans["offload_minimal"].render()


def _long_context(remat: str):
    """64 layers x 128K tokens on one TPU v5e: the saved layer inputs (8 GiB) are what does not fit."""
    m = ModelConfig(vocab_size=32000, d_model=512, n_layers=64, n_heads=4, n_kv_heads=4, max_seq_len=131072,
                    remat=remat, attention_impl="blockwise")
    return train.Config(model=m, seq_len=131072, global_batch=1, loss_chunk=4096,
                        hardware=HardwareConfig(device="tpu-v5e", chips=1))


def test_host_offload_is_the_advice_when_it_is_what_fits():
    # One chip (no more FSDP), the heaviest remat already, one sequence (no smaller micro-batch).
    p = planner.plan(_long_context("full"))
    assert not p.fits
    assert p.advice.startswith('It would fit with train.ModelConfig.remat="offload_full" (')
    assert p.advice.endswith(", 8.0 GiB of activations in host memory).")
    assert planner.plan(_long_context("offload_full")).fits


def test_offloading_more_than_the_host_holds_does_not_fit():
    p = planner.plan(_long_context("offload_full"))
    over = dataclasses.replace(p, host=p.host_budget + 1)
    assert p.fits and not over.fits
    assert over.render().splitlines()[-1].startswith(
        f"  verdict: does NOT fit: {figures.gib(over.host)} of offloaded activations per device > ")


def test_training_refuses_a_config_that_cannot_fit_unless_told_to_try():
    cfg = _dense("train.MeshConfig.fsdp=16")
    with pytest.raises(ValueError, match="Refusing to train a config that does not fit"):
        train.check_fits(cfg)
    train.check_fits(dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, allow_unfit=True)))


def test_the_flagship_is_a_600b_mixture_of_experts_that_trains_2t_tokens_within_30_days_on_its_slice():
    cfg = _flagship()
    m = cfg.model
    assert 590e9 < sum(param_counts(m).values()) < 610e9 and 25e9 < active_params(m) < 35e9
    p = planner.plan(cfg)
    # The days are the predicted step's (no assumed MFU) over the goodput, each collective charged on the
    # links its group spans: the layout and device order are the slice search's answer
    # (test_days_searches_layouts_...), each expert group of 8 a 2x2x2 block.
    assert cfg.hardware.mfu == 0 and p.step_s == p.predicted.seconds
    assert p.fits and p.chips == 1024 and p.tokens >= 2e12 and p.days <= 30
    assert p.mesh == Mesh(data=1, fsdp=128, expert=8, tensor=1) and p.micro_batch == 1
    assert cfg.mesh.device_order == "fsdp:4x4x8,expert:2x2x2"
    assert p.per_device["total"] * search.SEARCH_MARGIN <= p.budget
    lines = p.render().splitlines()
    assert lines[1].endswith("; active 30.2B of 598B a token (top-8 of 256 routed experts + 1 shared in 52 "
                             "of 55 layers)"), lines[1]
    assert "GFLOP (6 x active N + causal attention at T=8192)" in lines[2]
    # One 8K sequence a chip: C = ceil(1.25 x 8192 x 8 / 256) = 320 rows an expert; 52 layers x (to the
    # experts and back) x (forward, backward, the remat's recompute) = 312 all-to-alls of 1.1 GiB.
    moved = next(line for line in lines if line.startswith("  all-to-all"))
    assert moved.startswith("  all-to-all over expert 8: 341.2 GiB per device per step, 312 of the (E, "
                            "C, D) = (256, 320, 7,168) capacity buffer (1.1 GiB): "), moved
    assert moved.endswith("(expert 8 as 2x2x2 (a block along xyz, no wraparound): 1.71 hops, 3 ring ports, 3 "
                          "link-directions, 100 GB/s a port each way, on the critical path)"), moved
    assert ("  device order fsdp:4x4x8,expert:2x2x2 on v5p:8x8x16 (8x8x16, every side wrapped; "
            "train.MeshConfig.device_order's)") in lines
    assert "  goodput: 97.8% of the wall-clock time trains: 28.4 days of steps take 29.1 days" in lines
    assert any(line.startswith(f"  time, predicted: {figures.num(p.step_s)} s/step ({p.predicted.mfu:.1%} "
                               "MFU)") for line in lines)
    assert lines[-1] == "  " + FITS


def _tiny_moe(**fields):
    """3 layers (1 dense, 2 MoE of 8 experts, top-2) on 8 devices: data 1 x fsdp 2 x expert 4, one 128-token
    sequence a device."""
    m = ModelConfig(vocab_size=1024, d_model=256, n_layers=3, n_heads=4, n_kv_heads=4, max_seq_len=128,
                    n_experts=8, n_experts_per_token=2, moe_mlp_dim=64, n_dense_layers=1,
                    moe_capacity_factor=1.25, remat="full", **fields)
    return train.Config(model=m, seq_len=128, global_batch=8, mesh=MeshConfig(fsdp=2, expert=4),
                        hardware=HardwareConfig(device="h100", chips=8))


def test_the_expert_axis_splits_the_experts_and_every_other_parameters_embed_dim():
    """Not only the experts: the expert axis splits every parameter's embed dimension too (the experts'
    embed stays on fsdp alone, their experts dimension took the expert axis), so a data 4 x fsdp 2 mesh holds
    4x what fsdp 2 x expert 4 does of everything but the routers' (E,) biases, replicated in both."""
    cfg = _tiny_moe()
    split = planner.plan(cfg)
    whole = planner.plan(dataclasses.replace(cfg, mesh=MeshConfig(data=4, fsdp=2)))
    splittable = sum(param_counts(cfg.model).values()) - 2 * 8              # less 2 MoE layers' router bias
    assert whole.per_device["params"] - split.per_device["params"] == 4 * (splittable // 2 - splittable // 8)
    assert split.mesh == Mesh(data=1, fsdp=2, expert=4, tensor=1)


def test_an_moe_layer_holds_its_dispatch_buffers_in_the_backward_pass_and_moves_them_by_all_to_all():
    cfg = _tiny_moe()
    m, n, D, bf16 = cfg.model, 128, 256, 2
    # A device's 128 tokens x top-2 into 8 experts' buffers of C = ceil(1.25 x 128 x 2 / 8) = 40 rows.
    rows = 8 * 40
    assert shards.moe_rows(m, n, expert=4) == rows
    assert shards.moe_rows(dataclasses.replace(m, moe_capacity_factor=0.0), n, expert=1) == n * 2  # dropless
    assert shards.moe_rows(dataclasses.replace(m, moe_capacity_factor=0.0), n, expert=4) == 8 * n   # C = n
    buffers = memory.moe_buffers(m, n, tensor=1, expert=4)
    assert buffers == {"logits": n * 8 * 4, "scores": n * 8 * 4, "sent": rows * D * bf16,
                       "received": rows * D * bf16, "gate": rows * 64 * bf16, "up": rows * 64 * bf16,
                       "act": rows * 64 * bf16, "down": rows * D * bf16, "returned": rows * D * bf16,
                       "combined": n * 2 * D * bf16}
    assert memory.moe_buffers(m, n, tensor=1, expert=1)["received"] == 0             # no all-to-all
    # Full remat keeps only each layer's input; recomputing an MoE layer holds its buffers and their
    # gradients, more than the larger dense layer's activations here.
    kept, _ = memory.activation_bytes(m, 1, n, 1, expert=4)
    assert kept == 3 * n * D * bf16
    moe_layer = n * sum(memory.layer_activations(m, 1, stack="moe_layers").values()) * bf16 + sum(
        buffers.values())
    assert memory.recompute_bytes(m, 1, n, 1, expert=4) == 2 * moe_layer
    # Without remat an MoE layer keeps what its backward pass reads: the experts' input (what the all-to-all
    # received, in place of what was sent), gate, up, their product and SiLU's three (rows, Fe) arrays (6 in
    # all), not the buffers the all-to-alls move back.
    none = dataclasses.replace(m, remat="none")
    kept_none = memory.activation_bytes(none, 1, n, 1, expert=4)[0]
    assert kept_none == memory.activation_bytes(none, 1, n, 1, expert=1)[0]
    wider = dataclasses.replace(none, moe_mlp_dim=128)
    assert memory.activation_bytes(wider, 1, n, 1, expert=4)[0] - kept_none == 2 * 6 * rows * 64 * bf16
    # Each MoE layer: to the experts and back, forward, backward and full remat's recompute.
    assert shards.all_to_all_bytes(cfg, planner.plan(cfg).mesh, 1) == (rows * D * bf16, 2 * 6)
    assert shards.all_to_all_bytes(cfg, Mesh(data=4, fsdp=2, expert=1, tensor=1), 1) == (0, 0)


def test_the_moe_layers_are_gathered_cast_and_optimized_as_a_layer_stack():
    cfg = _tiny_moe()
    mesh = planner.plan(cfg).mesh
    m = cfg.model
    moe_only = dataclasses.replace(m, n_dense_layers=0, n_layers=2)
    # No dense layer at all: FSDP still gathers one MoE layer (4 of its 8 experts' weights here) and XLA
    # casts the MoE stack to bfloat16 (its router, read in float32, excepted).
    layer = (4 * 256 * 256 + 2 * 256) + 256 * 8 + 8 + 3 * 2 * 256 * 64          # attention, router, 2 experts
    assert memory.gathered_bytes(moe_only, mesh) == layer * 3 * 2     # this layer, its gradient, the next
    # Split over fsdp 2 x expert 4: attention and norms' embed 8 ways, the 8 experts 4 ways and their embed 2.
    stack = 2 * ((4 * 256 * 256 + 2 * 256) // 8 + 3 * 8 * 256 * 64 // 8)
    unembed = 256 * 1024 // 8
    assert memory.cast_bytes(moe_only, mesh) == (stack + unembed) * 2
    assert memory.optimizer_bytes(moe_only, mesh, 4, "adamw") == 2 * shards.param_bytes(moe_only, mesh, 4)


def test_days_searches_layouts_and_the_flagship_is_its_fastest_on_the_smallest_slice():
    """DAYS=30: the layout with the fewest days (the predicted step over the goodput), device order
    included, on the smallest v5p slice that does it, with its runner-up; the flagship's run file is that
    layout."""
    cfg = _flagship()
    found = search.smallest_slice(cfg, 30)
    p = found.found
    assert p is not None and p.config.hardware.topology == "v5p:8x8x16" and p.days <= 30
    # The flagship's run file is the search's answer: its mesh, device order, remat, capacity, micro-batches.
    assert p.config.mesh == cfg.mesh and p.config.model == cfg.model and p.config.optimizer == cfg.optimizer
    assert p.mesh == Mesh(data=1, fsdp=128, expert=8, tensor=1)
    assert p.config.mesh.device_order == "fsdp:4x4x8,expert:2x2x2"       # each expert group a 2x2x2 block
    runner = found.runner_up
    assert runner is not None and runner.fits and runner.predicted.seconds >= p.predicted.seconds
    assert runner.mesh != p.mesh
    lines = found.render().splitlines()
    assert lines[0].startswith("smallest TPU v5p slice that trains 2.01T tokens in 30 days by the predicted "
                               "step time over the goodput and fits")
    assert lines[1] == ("    v5p-8         4 chips: cannot run: 2,940 days at least (every FLOP at the "
                        "calibrated matmul rate)")
    assert any(line.startswith("    v5p-512     256 chips: cannot run: 46 days at least") for line in lines)
    assert lines[-2].startswith("  answer: v5p-2048 (1,024 chips, 29.1 days at 97.8% goodput, 34.0% MFU "
                                "predicted, ")
    assert lines[-2].endswith('train.HardwareConfig.topology="v5p:8x8x16" train.MeshConfig.data=-1 '
                              "train.MeshConfig.fsdp=128 train.MeshConfig.tensor=1 train.MeshConfig.expert=8 "
                              "train.ModelConfig.moe_capacity_factor=1.25 "
                              'train.MeshConfig.device_order="fsdp:4x4x8,expert:2x2x2" '
                              'train.ModelConfig.remat="offload_dots_no_batch" '
                              "train.OptimizerConfig.grad_accum_steps=1"), lines[-2]
    runner_row = ("  runner-up: v5p-2048 (1,024 chips, 34.6 days at 97.5% goodput, 28.7% MFU predicted, "
                  "36.5 GiB of 85.5 GiB per chip, data 1 x fsdp 8 x expert 128 x tensor 1 placed "
                  "fsdp:2x1x4,expert:4x8x4, ")
    assert lines[-1].startswith(runner_row), lines[-1]
    # Only meshes along whole sides of the 8x8x16 torus: fsdp 512 x expert 2 would split one.
    assert tpu.whole_sides([8, 8, 16], [128, 8]) and tpu.whole_sides([8, 8, 16], [16, 64])
    assert not tpu.whole_sides([8, 8, 16], [512, 2]) and not tpu.whole_sides([16, 16], [64, 4])
    # Every layout tried trades time for memory: none faster than the answer fits with the margin.
    ranked, _ = search._fastest_layouts(p.config, 1024)
    assert ranked[0].predicted.seconds == p.predicted.seconds
    # In 10 days no v5p slice: v5p-4096 needs 21.5, and a 1,024-sequence batch splits over v5p-8192's 4,096
    # chips only with tensor 4 or 8, no whole side of its 16x16x16 torus.
    ten = search.smallest_slice(cfg, 10)
    assert ten.found is None
    assert next(line for line in ten.render().splitlines() if line.startswith("  answer: ")).startswith(
        "  answer: none on TPU v5p: the largest v5p slice that can run it, v5p-4096 (2,048 chips), would "
        "need 21.5 days; larger ones cannot run it (v5p-8192: a global batch of 1024 sequences does not "
        "split ")


def test_a_search_times_only_the_layouts_whose_memory_fits():
    """The slice search weighs a layout's memory before it predicts the step (`planner.plan(timed=False)`):
    an untimed plan holds the timed one's bytes and verdict and no step; every layout ranked is timed."""
    cfg = _flagship()
    timed, untimed = planner.plan(cfg, advise=False), planner.plan(cfg, advise=False, timed=False)
    assert (untimed.per_device, untimed.host, untimed.fits) == (timed.per_device, timed.host, timed.fits)
    assert untimed.predicted is None and math.isnan(untimed.step_s) and timed.step_s > 0
    ranked, _ = search._fastest_layouts(cfg, 1024)
    assert len(ranked) > 1 and all(p.predicted is not None and search._roomy(p) for p in ranked)


# "600B on a TPU v4-32 in 30 days": the flagship on 16 v4 chips, its experts split 16 ways.
V4_32 = ('train.HardwareConfig.topology="v4:2x2x4" train.HardwareConfig.device="tpu-v4" '
         'train.MeshConfig.expert=16 train.MeshConfig.fsdp=1 train.MeshConfig.device_order=""')


def test_600b_on_a_v4_32_in_30_days_is_refused_with_the_memory_the_days_and_what_would_do_it():
    out = _cli("plan", "--gin", FLAGSHIP, "--no-compile", "--overrides", V4_32, "--days", "30")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    verdict = next(line for line in lines if line.startswith("  verdict: "))
    assert verdict.startswith("  verdict: does NOT fit: 2,154.4 GiB per device > 28.8 GiB usable. "), verdict
    time = next(line for line in lines if line.startswith("  time, predicted: "))
    assert time.endswith("days for 2.01T tokens; TPU v4 borrows tpu-v5p's efficiencies, none calibrated for "
                         "it"), time
    assert ("    v4-32       16 chips: cannot run: 1,230 days at least (every FLOP at the calibrated matmul "
            "rate)") in lines
    # v4-2048 can hold it (tensor 8, expert 8, everything offloaded) but needs 482 days: its tensor axis is
    # every other chip of a 16-long side: its 2 ports at 25 GB/s each way (devices.py), each hop 2 links; at
    # ~2 minutes a step, 500 steps between checkpoints lose hours an interruption (377 days of steps).
    row = ("    v4-2048  1,024 chips:     481.4 days (too long); fits, data 1 x fsdp 16 x expert 8 x "
           "tensor 8 placed fsdp:4x4x1,tensor:1x1x8,expert:2x2x2")
    assert any(line.startswith(row) for line in lines), lines
    answer = next(line for line in lines if line.startswith("  answer: "))
    assert answer.startswith("  answer: none on TPU v4: the largest v4 slice that can run it, v4-4096 (2,048 "
                             "chips), would need 159 days; larger ones cannot run it (v4-8192: "), answer
    elsewhere = next(line for line in lines if line.startswith("  elsewhere: "))
    assert elsewhere.startswith("  elsewhere: v5p-2048 (1,024 chips, 29.1 days at 97.8% goodput, 34.0% MFU "
                                "predicted, "), \
        elsewhere
    assert 'train.HardwareConfig.device="tpu-v5p" train.HardwareConfig.topology="v5p:8x8x16"' in elsewhere


def test_days_on_a_device_that_is_not_a_tpu_is_one_line():
    out = _cli("plan", "--gin", f"{REPO}/gin/tiny.gin", "--days", "30")
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: train.HardwareConfig.device='cpu' is not a TPU"), out.stderr


def test_a_topology_takes_the_device_of_its_own_generation_only():
    """An H100 planned on "v5p:2x2x1", or a v5p on "v6e:2x2", planned one chip against another's slice; each
    TPU generation's topology now takes its own device and refuses every other, naming both."""
    for generation, (device, _) in TPU_GENERATIONS.items():
        topology = f"{generation}:{tpu.SLICES[generation][2][0]}"
        assert HardwareConfig(device=device, topology=topology).topology == topology
        for other in devices.DEVICES.keys() - {device}:
            with pytest.raises(ValueError, match=f"device='{other}' and topology='{topology}' "
                                                 f".* set device='{device}' for this topology"):
                HardwareConfig(device=other, topology=topology)
        assert HardwareConfig(device=device).topology == ""        # no topology: any device, as before


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=None if env is None else {**os.environ, **env})


def test_plan_with_placeholders_works_offline_and_run_stops_with_one_line():
    plan = _cli("plan", "--gin", FLAGSHIP, "--no-compile")     # the compile (~50 s) is shown by hand
    assert plan.returncode == 0, plan.stderr
    assert "note: fill in before running: pipeline.Settings.cache_root = 'gs://YOUR_BUCKET/refinery'" \
        in plan.stdout
    assert plan.stdout.rstrip().endswith(FITS)
    run = _cli("run", "--gin", FLAGSHIP)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "leaves placeholders to fill in" in run.stderr
    assert "train.LaunchConfig.tpu_name = 'YOUR_TPU_SLICE'" in run.stderr


def test_an_unreachable_cache_root_is_one_line():
    out = _cli("status", "--gin", f"{REPO}/gin/tiny.gin", "--gin-param",
               'pipeline.Settings.cache_root = "s4://bucket/x"')
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("error: cannot reach the cache root s4://bucket/x")


def test_a_gcs_cache_root_whose_server_is_down_is_one_line_naming_the_host():
    """gcsfs retries a refused connection for about 50 s and logs a traceback for each try; the connection
    is checked first (storage.check_reachable), so the user reads one line naming the server."""
    with socket.socket() as s:       # a port that nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        out = _cli("status", "--gin", f"{REPO}/gin/tiny.gin", "--gin-param",
                   'pipeline.Settings.cache_root = "gs://bucket/x"',
                   env={"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"})
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: cannot reach the cache root gs://bucket/x: ")
    assert f"cannot connect to 127.0.0.1:{port}" in out.stderr


@pytest.mark.slow
def test_plan_compiles_the_real_train_step_for_a_tpu_topology_ahead_of_time():
    out = _cli("plan", "--gin", f"{REPO}/gin/tiny.gin", "--overrides",
               'train.HardwareConfig.device="tpu-v5p" train.HardwareConfig.topology="v5p:2x2x1" '
               "train.MeshConfig.fsdp=4")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.rstrip().splitlines()
    assert lines[-1] == "  verdict: fits on 4 x TPU v5p (95.0 GiB each), topology v5p:2x2x1"
    assert lines[-2].startswith("  XLA, compiled for v5p:2x2x1: ") and "per device" in lines[-2], lines[-2]
    # libtpu's warnings about the chips this machine does not have are held back (aot.py)
    assert "TPU_ACCELERATOR_TYPE" not in out.stderr and "InitGoogle" not in out.stderr, out.stderr


def test_no_topology_means_no_compile_and_no_jax():
    code = ("import sys; from pipeline import config; from stages import train; "
            f"print(train.plan(config.load([{REPO + '/gin/tiny.gin'!r}]).stages['train'].config)); "
            "print('JAX', 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.rstrip().endswith("JAX False"), out.stdout + out.stderr
    assert "XLA, compiled" not in out.stdout, out.stdout


RUN_FILES = run_files()


@pytest.mark.parametrize("run_file", RUN_FILES)
def test_every_run_file_fits_its_hardware(run_file):
    """A run file that the planner rejects would fail in training before its first step: catch it here."""
    p = planner.plan(config.load([f"{REPO}/gin/{run_file}"]).stages["train"].config)
    assert p.fits, p.render()


def test_every_run_file_has_a_twin():
    runs = {f for f in RUN_FILES if "/" not in f and f != "tiny.gin"}
    assert runs == {"124m.gin", "1b.gin", "9b.gin", "600b.gin", "600b_dense.gin"}
    assert {f"twins/{f}" for f in runs} <= set(RUN_FILES)
