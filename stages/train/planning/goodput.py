"""How much of a run's wall-clock time trains (its goodput): what checkpoint saves, evaluations and restarts
after interruptions take besides the steps, from the config and the step-time model (no JAX).

    p = planner.plan(train_config)          # a Plan; p.goodput is `estimate(p)`
    p.goodput.share                         # the share of the wall-clock time spent in training steps
    p.goodput.checkpoint_s, p.goodput.eval_s, p.goodput.restart_s   # what each costs over the run (s)
    p.days                                  # the run's wall-clock days: steps x step / share
    make plan GIN=gin/600b.gin              # prints the goodput block under the step time

Over the whole run, train = steps x the step (`Plan.step_s`), and besides it:

  checkpoints  every train.Config.checkpoint_every steps the state is saved: the parameters and the optimizer
               state (memory.py's "params" and "optimizer", in param_dtype). The saves are asynchronous
               (stages/train/checkpoint.py: CheckpointManagerOptions.enable_async_checkpointing). A save
               blocks the step while each chip copies its shard to host memory over the host link
               (devices.py: 32 GB/s a TPU chip; Orbax's guide "Maximizing Performance": an async save's
               blocking time "is largely attributable to the device/host transfer bandwidth"); a background
               thread then writes it, each host its chips' shards at train.HardwareConfig.storage_bytes_per_s.
               The next save first waits for that write (orbax-checkpoint 0.12.8: CheckpointManager.save calls
               wait_until_finished), so a write longer than the time between saves stalls training by the
               difference. The final checkpoint is synchronous (stages/train/loop.py `finish`): its copy and
               its whole write block.
  evaluations  at every multiple of train.Config.eval_every and after the last step, eval_batches batches of
               global_batch sequences, forward only (loop.py `evaluate`, all of the batch at once): each the
               forward share of the step the step-time model predicts for that batch without remat or
               accumulation (`forward_seconds`, `FORWARD_SHARE`).
  restarts     interruptions at train.HardwareConfig.interruptions_per_chip_hour x the chips over the whole
               wall-clock time (restarts and saves included); each costs restart_s (rescheduling, starting
               every host, compiling), restoring the checkpoint (a host reads what it wrote, at the storage
               rate) and the steps since that checkpoint, half the interval between saves on average.

    wall  = (train + checkpoints + evaluations) / (1 - interruptions a second x one interruption's cost)
    share = train / wall;  days = wall / 86400

Where an interruption's cost times their rate reaches 1, the run never finishes: share 0, days infinite.
What it leaves out: stragglers and slow steps, the input pipeline, an interruption's own timing (a failure
right after a save loses less), capacity waits before a restart (Google's "scheduling goodput").
"""

from __future__ import annotations

import dataclasses
import math

from stages.train.mesh import Mesh
from stages.train.planning import devices, step_time
from stages.train.planning.figures import duration, gib, num
from stages.train.planning.hardware import INTERRUPTIONS_PER_CHIP_HOUR
from stages.train.planning.memory import optimizer_bytes
from stages.train.planning.shards import DTYPE_BYTES, param_bytes

# Chips a host drives, by the machine types of a multi-host slice or node (Google Cloud: v4 ct4p-hightpu-4t,
# v5e ct5lp-hightpu-4t, v5p ct5p-hightpu-4t, v6e ct6e-standard-4t; H100 a3-highgpu-8g, H200 a3-ultragpu-8g):
# a host writes its chips' checkpoint shards. "cpu": one process, one host.
HOST_CHIPS = {"tpu-v4": 4, "tpu-v5e": 4, "tpu-v5p": 4, "tpu-v6e": 4, "h100": 8, "h200": 8, "cpu": 1}

# The share of each step-time term (step_time.py, by the start of its name) that a forward pass alone
# takes, in the step predicted without remat or accumulation: the matmuls run once of their three times
# (forward, and twice that backward), the attention once of 1 + FLASH_BACKWARD, the fsdp all-gather once of
# its two gathers and a reduce-scatter of the same array, the loss's logits, the tensor axis's all-reduces
# and the expert axis's all-to-alls half of theirs (forward, and their transposes backward), the hidden
# collectives' HBM passes 2 of the 7 a layer's fsdp arrays make (2 a gather, twice, 3 the reduction; a data
# axis's gradient all-reduce adds passes no forward makes, so with one this overstates it); no gradient
# all-reduce, no offload. "memory-bound ops" is `forward_seconds`' own: a third of the layers' and the loss's
# work, without the optimizer's update.
FORWARD_SHARE = (
    ("matmuls", 1 / 3),
    ("experts (grouped matmul)", 1 / 3),
    ("attention", 1 / (1 + step_time.FLASH_BACKWARD)),
    ("fsdp", 1 / 3),
    ("logits", 1 / 2),
    ("tensor", 1 / 2),
    ("all-to-all", 1 / 2),
    ("HBM passes", 2 / 7),
    ("gradient all-reduce", 0.0),
    ("host offload", 0.0),
)
UNNAMED_SHARE = 1 / 3     # a term FORWARD_SHARE does not name: a forward's share of forward + backward


@dataclasses.dataclass(frozen=True)
class Goodput:
    """What a run spends besides its steps, over the whole run (seconds), and the share that trains."""

    train_s: float                 # steps x the step
    state_bytes: int               # what a checkpoint holds: every parameter and the optimizer state, whole
    shard_bytes: int               # of it, what one chip copies to its host
    host_bytes: int                # what the busiest host writes (its chips' shards)
    checkpoints: int               # periodic saves (steps // checkpoint_every), besides the final one
    copy_s: float                  # one save's device-to-host copy: blocks the step
    write_s: float                 # one save's write by the busiest host: in the background
    interval_s: float              # the steps between two periodic saves
    checkpoint_s: float            # every save's blocking time, the final save's whole write included
    evaluations: int               # at every multiple of eval_every and after the last step
    batch_s: float                 # one evaluation batch's forward pass
    eval_s: float
    interruptions: float           # expected over the wall-clock time (inf: the run never finishes)
    restore_s: float               # one restart's read of the checkpoint
    interruption_s: float          # one interruption's cost: restart_s + restore + half an interval
    restart_s: float               # every interruption's cost over the run (inf: it never finishes)

    @property
    def wall_s(self) -> float:
        return self.train_s + self.checkpoint_s + self.eval_s + self.restart_s

    @property
    def share(self) -> float:
        """The share of the wall-clock time spent in training steps (0 when the run never finishes)."""
        return self.train_s / self.wall_s if math.isfinite(self.wall_s) and self.wall_s > 0 else (
            1.0 if self.wall_s == 0 else 0.0)

    def rows(self, cfg, device: devices.Device, chips: int) -> list[str]:
        """The goodput block of `make plan` (plan.py): the share, then each term and where it comes from."""
        hw = cfg.hardware
        wall, per = self.wall_s, 86400

        def part(seconds: float) -> str:
            return f"{duration(seconds)} ({seconds / wall:.2%})" if math.isfinite(wall) else duration(seconds)

        if math.isfinite(wall):
            head = (f"  goodput: {self.share:.1%} of the wall-clock time trains: "
                    f"{num(self.train_s / per)} days of steps take {num(wall / per)} days")
        else:
            head = (f"  goodput: 0%: the run never finishes, interrupted faster than it recovers "
                    f"({num(self.train_s / per)} days of steps)")
        stall = max(0.0, self.write_s - self.interval_s)
        waits = (f"the next save waits {duration(stall)} for it" if stall else
                 f"done before the next save, {duration(self.interval_s)} of steps later")
        state = f"{num(self.state_bytes / 1e12)} TB" if self.state_bytes >= 1e12 else gib(self.state_bytes)
        shard = gib(self.shard_bytes)
        if device.host_link_bytes_per_s:
            copy = (f"blocks while a chip copies its {shard} to host memory ({duration(self.copy_s)} at "
                    f"{num(device.host_link_bytes_per_s / 1e9)} GB/s)")
        else:
            copy = f"blocks only to hand each device's {shard} over (its memory is the host's)"
        rows = [head,
                f"    checkpoints: {self.checkpoints:,} + the final one of {state} (parameters and optimizer "
                f"state) every {cfg.checkpoint_every:,} steps, asynchronous: each {copy}, then a host writes "
                f"{gib(self.host_bytes)} in the background ({duration(self.write_s)} at "
                f"{num(hw.storage_bytes_per_s / 1e9)} GB/s, train.HardwareConfig.storage_bytes_per_s), "
                f"{waits}; with the final save, which blocks for its write too, {part(self.checkpoint_s)} "
                "in all"]
        if self.evaluations:
            rows.append(f"    evaluations: {self.evaluations:,} x {cfg.eval_batches:,} batches of "
                        f"{cfg.global_batch:,} x {cfg.seq_len:,} tokens, forward only, "
                        f"{duration(self.batch_s)} a batch: {part(self.eval_s)} in all")
        else:
            rows.append("    evaluations: none (train.Config.eval_every=0)")
        rate = hw.interruptions_per_chip_hour
        source = (": Llama 3 405B's 466 in 54 days on 16,384 GPUs" if rate == INTERRUPTIONS_PER_CHIP_HOUR
                  else "")
        cost = (f"each {duration(hw.restart_s)} to restart (train.HardwareConfig.restart_s) + "
                f"{duration(self.restore_s)} to restore + {duration(self.interval_s / 2)} of steps since the "
                f"last checkpoint")
        if not rate:
            rows.append("    restarts: none (train.HardwareConfig.interruptions_per_chip_hour=0)")
        elif math.isfinite(self.restart_s):
            rows.append(f"    restarts: {num(self.interruptions)} interruptions expected ({rate:.3g} a "
                        f"chip-hour, train.HardwareConfig.interruptions_per_chip_hour{source}, x {chips:,} "
                        f"chip{'s' if chips != 1 else ''}), {cost}: {part(self.restart_s)} in all")
        else:
            every = 3600 / (rate * chips)
            rows.append(f"    restarts: one every {duration(every)} ({rate:.3g} a chip-hour{source}, x "
                        f"{chips:,} chips), {cost} = {duration(self.interruption_s)}: longer than the time "
                        "between them; checkpoint more often (train.Config.checkpoint_every) or use fewer "
                        "chips")
        return rows


def estimate(p) -> Goodput:
    """The goodput of a plan (`plan.Plan`: its config, device, chips, mesh, micro-batch, per-device bytes and
    step), by the module docstring's model."""
    cfg, device = p.config, p.device
    hw, m = cfg.hardware, cfg.model
    train_s = cfg.steps * p.step_s
    pbytes = DTYPE_BYTES[m.param_dtype]
    whole = Mesh()
    state = param_bytes(m, whole, pbytes) + optimizer_bytes(m, whole, pbytes, cfg.optimizer.name)
    shard = p.per_device["params"] + p.per_device["optimizer"]
    host = shard * min(HOST_CHIPS.get(device.name, 1), p.chips)
    copy_s = shard / device.host_link_bytes_per_s if device.host_link_bytes_per_s else 0.0
    write_s = host / hw.storage_bytes_per_s
    interval_s = cfg.checkpoint_every * p.step_s
    checkpoints = cfg.steps // cfg.checkpoint_every
    checkpoint_s = checkpoints * (copy_s + max(0.0, write_s - interval_s)) + copy_s + write_s
    evaluations = -(-cfg.steps // cfg.eval_every) if cfg.eval_every else 0
    batch_s = (forward_seconds(cfg, p.mesh, p.micro_batch * cfg.optimizer.grad_accum_steps) if evaluations
               else 0.0)
    eval_s = evaluations * cfg.eval_batches * batch_s
    restore_s = write_s
    interruption_s = hw.restart_s + restore_s + interval_s / 2
    rate = hw.interruptions_per_chip_hour * p.chips / 3600          # interruptions a wall-clock second
    base = train_s + checkpoint_s + eval_s
    if rate * interruption_s >= 1:
        interruptions = restart_s = math.inf
    else:
        wall = base / (1 - rate * interruption_s)
        interruptions, restart_s = rate * wall, wall - base
    return Goodput(train_s, state, shard, host, checkpoints, copy_s, write_s, interval_s, checkpoint_s,
                   evaluations, batch_s, eval_s, interruptions, restore_s, interruption_s, restart_s)


def forward_seconds(cfg, mesh: Mesh, batch: int) -> float:
    """One forward pass over `batch` sequences a device (of `cfg`, a stages.train.Config, on `mesh`), as the
    step-time model prices it: the step it predicts for that batch without remat or gradient accumulation,
    each term at its forward share (`FORWARD_SHARE`), the memory-bound work a third without the optimizer's
    update."""
    m = cfg.model
    once = dataclasses.replace(cfg, model=dataclasses.replace(m, remat="none"),
                               optimizer=dataclasses.replace(cfg.optimizer, grad_accum_steps=1))
    device = devices.get(cfg.hardware.device)
    eff, _ = step_time.efficiency(device)
    update = step_time.update_bytes(once, mesh) / (device.hbm_bytes_per_s * eff.memory)
    seconds = 0.0
    for term in step_time.predict(once, mesh, batch, 0).terms:
        if term.name == "memory-bound ops":
            seconds += (term.exposed - update) / 3
        else:
            seconds += forward_share(term.name) * term.exposed
    return seconds


def forward_share(name: str) -> float:
    """The forward pass's share of the step-time term `name` (`FORWARD_SHARE`; `UNNAMED_SHARE` otherwise)."""
    return next((share for prefix, share in FORWARD_SHARE if name.startswith(prefix)), UNNAMED_SHARE)
