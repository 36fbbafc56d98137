"""Where a run is meant to train: `train.HardwareConfig` (the chip, the TPU topology, the slices), and for a
run on this machine's CPU the devices its processes will get, checked before anything runs (no JAX).

    HardwareConfig(device="tpu-v5p", topology="v5p:8x8x16")     # ValueError naming a bad device or topology
    hardware.cpu_run_problem(train_config, os.environ)          # "" or why the CPU devices cannot run it

The planner (planner.py) checks the config against the hardware's memory and speed (devices.py); training
refuses to start a config that does not fit unless `allow_unfit`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from stages.train.planning import devices
from stages.train.planning.tpu import TPU_GENERATIONS, generation_problem, topology_chips, topology_problem

# The goodput's defaults (goodput.py), each configurable in HardwareConfig.
# Assumed, conservative: 1 GB/s a host. One stream to Cloud Storage moves ~200 MiB/s and one VM with parallel
# streams over 8 GiB/s (beginswithdata.com, "High throughput file transfers with Google Cloud Storage", 2024);
# TensorStore writes a checkpoint's chunks in parallel, below a v5p host's 200 Gbps network (devices.py).
STORAGE_BYTES_PER_S = 1e9
# Llama 3 405B (Meta, "The Llama 3 Herd of Models", 2024, section 3.3.4): 466 job interruptions (47 planned,
# 419 unexpected) in a 54-day snapshot on 16,384 H100s, each stopping the whole synchronous job.
INTERRUPTIONS_PER_CHIP_HOUR = 466 / (54 * 24 * 16_384)
# Assumed: rescheduling the slice, starting JAX on every host and compiling the train step again, 10 minutes.
RESTART_S = 600.0


@dataclasses.dataclass(frozen=True)
class HardwareConfig:
    """Where the run is meant to train: what `make plan` checks the config against and what training
    refuses to start without (see planner.py). Gin: `train.HardwareConfig.<field>`.

    device: a row of `stages.train.planning.devices.DEVICES` ("tpu-v5p", "h100", "cpu", ...).
    topology: a TPU topology ("v5p:8x8x16"); the planner compiles the real train step for it ahead of time.
        A slice of the device's generation: device "tpu-v5p" with "v5p:...", and none for a GPU or the CPU.
    chips: chips per slice; 0 = the topology's, or (no topology) the mesh's explicit sizes.
    num_slices: slices joined over the data-center network (multi-slice); all chips = chips x num_slices,
        and train.MeshConfig's dcn_data x dcn_fsdp x dcn_tensor must equal it.
    mfu: 0 (the default): the plan's days come from the predicted step (stages/train/planning/step_time.py);
        else the model FLOPs utilization the days assume instead (the prediction is printed beside them).
    allow_unfit: start training even when the plan says the state does not fit in device memory.

    What the plan's goodput (goodput.py: the share of wall-clock time that trains) assumes:
    storage_bytes_per_s: the rate at which one host writes its chips' checkpoint shards to the checkpoint
        directory, and reads them back on a restart (bytes/s). Default `STORAGE_BYTES_PER_S`.
    interruptions_per_chip_hour: how often a chip's failure or maintenance stops the whole job, per chip-hour.
        Default `INTERRUPTIONS_PER_CHIP_HOUR`; 0 plans no restarts.
    restart_s: what one interruption costs before training resumes, besides restoring the checkpoint and
        redoing the steps since it (s). Default `RESTART_S`.
    """

    device: str = "cpu"
    topology: str = ""
    chips: int = 0
    num_slices: int = 1
    mfu: float = 0.0
    allow_unfit: bool = False
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S
    interruptions_per_chip_hour: float = INTERRUPTIONS_PER_CHIP_HOUR
    restart_s: float = RESTART_S

    def __post_init__(self):
        if self.chips < 0 or self.num_slices < 1:
            raise ValueError(f"HardwareConfig: chips={self.chips} must be >= 0 (0 = from the topology) and "
                             f"num_slices={self.num_slices} >= 1")
        if self.device not in devices.DEVICES:
            raise ValueError(f"HardwareConfig: device={self.device!r} is not one of {tuple(devices.DEVICES)}")
        if not 0 <= self.mfu <= 1:
            raise ValueError(f"HardwareConfig: mfu={self.mfu} must be in [0, 1] (0: predict the step time)")
        for name, low, what in (
                ("storage_bytes_per_s", "> 0", "bytes a host writes to the checkpoint directory a second, "
                 "e.g. 1e9"),
                ("interruptions_per_chip_hour", ">= 0", "interruptions of the job a chip-hour, e.g. "
                 f"{INTERRUPTIONS_PER_CHIP_HOUR:.3g} (Llama 3's); 0: none"),
                ("restart_s", ">= 0", "seconds from an interruption to training again, e.g. 600")):
            value = getattr(self, name)
            bad = not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            if bad or (value <= 0 if low == "> 0" else value < 0):
                raise ValueError(f"HardwareConfig: {name}={value!r} must be a finite number {low} ({what})")
        if self.topology and (":" not in self.topology or topology_chips(self.topology) < 1):
            raise ValueError(f"HardwareConfig: topology={self.topology!r} is not a TPU topology such as "
                             '"v5p:8x8x16" (generation, then the chip grid)')
        generation = self.topology.partition(":")[0]
        if self.topology and generation not in TPU_GENERATIONS:
            raise ValueError(f"HardwareConfig: topology={self.topology!r} names TPU generation "
                             f"{generation!r}, not one of {tuple(TPU_GENERATIONS)} (a topology such as "
                             '"v5p:8x8x16")')
        if self.topology and (problem := topology_problem(self.topology)):
            raise ValueError(f"HardwareConfig: topology={self.topology!r} {problem}")
        if self.topology and (problem := generation_problem(self.device, self.topology)):
            raise ValueError(f"HardwareConfig: {problem}")


CPU_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def cpu_devices_per_process(env: Mapping[str, str]) -> int:
    """The CPU devices one JAX process started with `env` gets, read as JAX reads them: JAX_NUM_CPU_DEVICES,
    else XLA_FLAGS' --xla_force_host_platform_device_count=N, else 1 (how tests simulate 8 devices)."""
    try:
        count = int(env.get("JAX_NUM_CPU_DEVICES", "-1"))
    except ValueError:
        count = -1
    if count >= 0:           # JAX's own rule: -1 (unset) defers to XLA_FLAGS
        return count
    count = 1
    for flag in env.get("XLA_FLAGS", "").split():     # XLA splits on whitespace; the last one wins
        name, _, value = flag.partition("=")
        if name == CPU_DEVICE_FLAG and value.isdigit():
            count = int(value)
    return count


def cpu_run_problem(cfg, env: Mapping[str, str]) -> str:
    """Why `cfg` (a stages.train.Config) cannot train on the devices its processes will have, in one line
    naming the sizes, the device count and where that comes from, or "" when it can or only the running
    processes could tell. `python -m pipeline run` asks before any stage runs; without it the mesh and the
    batch split are found out when training starts, after the whole data half has run:

        cpu_run_problem(dataclasses.replace(cfg, mesh=MeshConfig(fsdp=2)), os.environ)   # 1 device: fsdp 2?

    Known offline: a "cpu" run (train.HardwareConfig.device) gets `cpu_devices_per_process(env)` devices per
    process (the launchers pass the environment on): one process in process, num_processes with the local
    launcher. Checked then as training will: the mesh must tile the devices (`MeshConfig.shape`), the global
    batch must divide by the processes (stages/train/data.py) and each micro-batch split over data x fsdp
    (the planner's rule). Not checked: accelerators (their count is the machine's; the planner checks the
    mesh against train.HardwareConfig.chips) and tpu_vm slices (the planner checks the topology).
    """
    hardware, launcher, mesh = cfg.hardware, cfg.launcher, cfg.mesh
    if hardware.device != "cpu" or launcher.kind not in ("inprocess", "local"):
        return ""
    if env.get("JAX_PLATFORMS", "cpu").split(",")[0].strip() not in ("", "cpu"):
        return ""          # JAX is told to prefer another platform: the count is that machine's
    per_process = cpu_devices_per_process(env)
    processes = launcher.num_processes if launcher.kind == "local" else 1
    devices = per_process * processes
    kind = f"train.LaunchConfig.kind={launcher.kind!r}" + (
        f" with num_processes={processes}" if launcher.kind == "local" else "")
    where = (f"a CPU run (train.HardwareConfig.device='cpu') with {kind} trains on {processes} process(es) x "
             f"{per_process} CPU device(s) = {devices} (XLA_FLAGS={CPU_DEVICE_FLAG}=N gives each process N)")
    try:
        whole = mesh.for_devices(devices)
    except ValueError as e:
        return f"train.MeshConfig: {e}; {where}"
    if cfg.global_batch % processes:
        return (f"train.Config.global_batch={cfg.global_batch} does not divide by the {processes} training "
                f"processes: use a multiple of {processes}; {where}")
    accum = cfg.optimizer.grad_accum_steps
    micro, shards = cfg.global_batch // accum, whole.batch_shards
    if micro % shards:
        return (f"a micro-batch of {micro} sequences (train.Config.global_batch {cfg.global_batch} / "
                f"grad_accum_steps {accum}) does not split over {whole.describe_batch()} = {shards} "
                f"devices; {where}")
    return ""
