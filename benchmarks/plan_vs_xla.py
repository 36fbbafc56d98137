"""The planner's per-device memory estimate against XLA's figure for the real train step, compiled ahead
of time for TPU topologies (no TPU needed: libtpu describes them) and for 8 simulated CPU devices.

    .venv/bin/python -m benchmarks plan_vs_xla          # or `make bench` for every benchmark

Each row is one configuration (model size, mesh, remat, micro-batch): `estimate / xla` is the ratio the
planner is judged by (within 10% is the bar), both in device memory; `host_gib` is what an offload_*
policy keeps in host memory by the planner (not in either device figure). The 600B rows compile for
1,024 chips and take about a minute each on 2 cores. The multi-slice rows (`_2x_`) put the 1B and 9B run
files on two slices, the data axis across them (`memory.across_slices_bytes`). `cpu_rows` compile the
same step with XLA:CPU for 8 simulated CPU devices (CPU_CASES), judged by the same bar: the planner
models what XLA:CPU holds beyond the TPU compiler (`memory.xla_cpu_bytes`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from pipeline import config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOE_124M = ["include 'model/124m.gin'", "train.ModelConfig.n_experts = 8",
            "train.ModelConfig.n_experts_per_token = 2", "train.ModelConfig.n_dense_layers = 2",
            "train.ModelConfig.moe_mlp_dim = 1024", "train.ModelConfig.n_shared_experts = 1",
            "train.Config.seq_len = 1024", "train.Config.global_batch = 16"]
# name -> (gin file, overrides)
CASES = {
    "600b_v5p-2048_fsdp128_tp8_full": ("gin/600b_dense.gin", []),
    "600b_v5p-2048_fsdp128_tp8_offload_full": ("gin/600b_dense.gin",
                                               ["train.ModelConfig.remat = 'offload_full'"]),
    # Sequence parallelism: the saved layer inputs split over the 8 tensor-parallel chips.
    "600b_v5p-2048_fsdp128_tp8_full_sequence_parallel": ("gin/600b_dense.gin",
                                                         ["train.ModelConfig.sequence_parallel = True"]),
    "1b_v5p-16_fsdp8_full": ("gin/tiny.gin", [
        "include 'model/1b.gin'", "train.ModelConfig.max_seq_len = 4096", "train.ModelConfig.remat = 'full'",
        "train.Config.seq_len = 4096", "train.Config.global_batch = 16", "train.MeshConfig.fsdp = 8"]),
    "1b_v5p-16_fsdp8_save_qkv_proj": ("gin/tiny.gin", [
        "include 'model/1b.gin'", "train.ModelConfig.max_seq_len = 4096", "train.Config.seq_len = 4096",
        "train.Config.global_batch = 16", "train.MeshConfig.fsdp = 8"]),
    "124m_v5p-8_data4_none": ("gin/tiny.gin", [
        "include 'model/124m.gin'", "train.Config.seq_len = 1024", "train.Config.global_batch = 16",
        "train.ModelConfig.remat = 'none'"]),
    "124m_v5p-8_fsdp4_minimal": ("gin/tiny.gin", [
        "include 'model/124m.gin'", "train.Config.seq_len = 1024", "train.Config.global_batch = 16",
        "train.ModelConfig.remat = 'minimal'", "train.MeshConfig.fsdp = 4"]),
    "124m_v5p-8_fsdp2_tp2_full_accum2": ("gin/tiny.gin", [
        "include 'model/124m.gin'", "train.Config.seq_len = 1024", "train.Config.global_batch = 32",
        "train.ModelConfig.remat = 'full'", "train.MeshConfig.fsdp = 2", "train.MeshConfig.tensor = 2",
        "train.OptimizerConfig.grad_accum_steps = 2"]),
    # Multi-slice: the run files on two slices joined over DCN, the data axis across them (dcn_data 2).
    "1b_2x_v5p-128_dcn2_fsdp64": ("gin/1b.gin", ["train.HardwareConfig.num_slices = 2",
                                                 "train.MeshConfig.dcn_data = 2"]),
    "9b_2x_v5p-512_dcn2_fsdp32_tp8": ("gin/9b.gin", [
        "train.HardwareConfig.num_slices = 2", "train.MeshConfig.dcn_data = 2", "train.MeshConfig.fsdp = 32",
        "train.MeshConfig.tensor = 8"]),
    # Mixtures of experts: the flagship (expert 64 x fsdp 16, all-to-all of capacity buffers), and the 124M
    # with 8 experts (top-2, one shared, two dense layers first) through each dispatch path.
    "600b-moe_v5p-2048_fsdp128_expert8_offload_dots_no_batch": ("gin/600b.gin", []),
    "124m-moe8_v5p-8_expert2_fsdp2_capacity_full": ("gin/tiny.gin", MOE_124M + [
        "train.ModelConfig.moe_capacity_factor = 1.25", "train.MeshConfig.expert = 2",
        "train.MeshConfig.fsdp = 2", "train.ModelConfig.remat = 'full'"]),
    "124m-moe8_v5p-8_fsdp4_dropless_minimal": ("gin/tiny.gin", MOE_124M + [
        "train.MeshConfig.fsdp = 4", "train.ModelConfig.remat = 'minimal'"]),
    "124m-moe8_v5p-8_expert4_capacity_none": ("gin/tiny.gin", MOE_124M + [
        "train.ModelConfig.moe_capacity_factor = 1.25", "train.MeshConfig.expert = 4",
        "train.ModelConfig.remat = 'none'"]),
}
# model size -> the slice it is compiled for
TOPOLOGY = {"1b": "v5p:2x2x2", "124m": "v5p:2x2x1", "124m-moe8": "v5p:2x2x1"}
# Compiled for this machine's CPU as 8 simulated devices (a subprocess, so the device count is set before
# JAX starts), float32 as CPU runs train.
CPU_DEVICES = 8
CPU_CASES = {
    "124m_cpu8_fsdp8_full": ["train.ModelConfig.remat = 'full'", "train.MeshConfig.fsdp = 8"],
    "124m_cpu8_fsdp4_tp2_minimal": ["train.ModelConfig.remat = 'minimal'", "train.MeshConfig.fsdp = 4",
                                    "train.MeshConfig.tensor = 2"],
    "124m_cpu8_data8_none": ["train.ModelConfig.remat = 'none'", "train.MeshConfig.data = 8"],
}
CPU_COMMON = ["include 'model/124m.gin'", "train.ModelConfig.dtype = 'float32'",
              "train.Config.seq_len = 1024", "train.Config.global_batch = 8"]


def measure(work_dir: str) -> dict:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from stages.train.planning import aot, planner

    rows = {}
    for name, (gin, overrides) in CASES.items():
        size = name.split("_")[0]
        extra = []
        if gin == "gin/tiny.gin" and size in TOPOLOGY:
            topology = TOPOLOGY[size]
            extra = ['train.HardwareConfig.device = "tpu-v5p"',
                     f'train.HardwareConfig.topology = "{topology}"',
                     "train.ModelConfig.dtype = 'bfloat16'", "train.Config.loss_chunk = 4096"]
        rows[name] = _row(_load(gin, overrides + extra), planner, aot)
    cpu_rows = {name: cpu_row(name) for name in CPU_CASES}
    ratios = [r["ratio"] for r in (rows | cpu_rows).values()]
    return {"benchmark": "plan_vs_xla", "rows": rows, "cases": len(ratios),
            "worst_ratio_off": round(max(abs(r - 1) for r in ratios), 3),
            "within_10_percent": sum(abs(r - 1) <= 0.1 for r in ratios), "cpu_rows": cpu_rows}


def _load(gin: str, overrides: list[str]):
    """The train config of `gin` plus `overrides` (bindings, and `include '<file under gin/>'` lines)."""
    includes = [o.split("'")[1] for o in overrides if o.startswith("include")]
    bindings = [o.replace("'", '"') for o in overrides if not o.startswith("include")]
    files = [os.path.join(REPO, gin)] + [os.path.join(REPO, "gin", i) for i in includes]
    return config.load(files, bindings).stages["train"].config


def _row(cfg, planner, aot, devices=None) -> dict:
    estimate = planner.plan(cfg, advise=False)
    start = time.perf_counter()
    xla = aot.compile_train_step(cfg, devices=devices)
    total = estimate.per_device["total"]
    return {"estimate_gib": round(total / 2**30, 3), "xla_gib": round(xla["total"] / 2**30, 3),
            "ratio": round(total / xla["total"], 3), "host_gib": round(estimate.host / 2**30, 3),
            "topology": cfg.hardware.topology or f"cpu x {len(devices)}",
            "compile_s": round(time.perf_counter() - start, 1)}


def cpu_row(name: str) -> dict:
    """The row of CPU_CASES[name], compiled in a subprocess with CPU_DEVICES simulated devices."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={CPU_DEVICES}")
    out = subprocess.run([sys.executable, "-m", "benchmarks.plan_vs_xla", name], cwd=REPO, env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"plan_vs_xla {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":          # one CPU row, in a process whose simulated devices are set
    import jax

    from stages.train.planning import aot, planner

    print(json.dumps(_row(_load("gin/tiny.gin", CPU_COMMON + CPU_CASES[sys.argv[1]]), planner, aot,
                          devices=jax.devices())))
