"""The training stage: a Llama-style decoder trained with JAX/Flax NNX on the shard stage's tokens.

    make pipeline                                          (gin/tiny.gin: a tiny model, minutes on CPU)
    make pipeline OVERRIDES='train.OptimizerConfig.learning_rate=1e-3'   (reruns train and evaluate)
    make pipeline GIN=gin/600b.gin                         (the flagship; gin/twins/600b.gin on a CPU)

Writes into `out_dir`: `checkpoint/` (the final Orbax checkpoint: params, optimizer state, step),
`metrics.jsonl`, `tensorboard/`, `summary.json`; the cache adds `config.gin`. Periodic checkpoints
go to `work_dir`, the scratch directory the cache hands every stage and keeps across failed attempts of
a key, so a preempted run resumes from its last save with exactly the batches an uninterrupted run would
have seen.

Modules, one job each: `model.py` (the decoder), `attention.py` (the only place kernels are chosen),
`sharding.py` (mesh and logical axes), `optimizer.py`, `loss.py` (chunked cross entropy),
`data.py` (memory-mapped shards; the batch is a pure function of the step), `checkpoint.py`
(Orbax), `metrics.py` (jsonl, TensorBoard, MFU), `loop.py` (the training loop), `worker.py` (one
process; launchers in `stages/train/launch.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

from stages.io import storage
from stages.train import planner
from stages.train.configs import (
    NAN_POLICIES,
    HardwareConfig,
    MeshConfig,
    ModelConfig,
    OptimizerConfig,
    cpu_run_problem,
)
from stages.train.launch import LaunchConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    steps: int = 200
    global_batch: int = 16               # sequences per optimizer step, over all processes
    seq_len: int = 256                   # tokens per sequence (<= model.max_seq_len)
    seed: int = 0                        # parameter init and data order
    z_loss: float = 0.0
    loss_chunk: int = 4096               # tokens per cross-entropy chunk (bounds the logits' memory)
    eval_every: int = 50                 # held-out loss on `eval_batches` val batches (metrics.jsonl)
    eval_batches: int = 4
    nan_policy: str = "stop"             # "stop": fail naming the step; "skip": drop that update
    log_every: int = dataclasses.field(default=10, metadata={"key": False})
    checkpoint_every: int = dataclasses.field(default=100, metadata={"key": False})
    keep_checkpoints: int = dataclasses.field(default=2, metadata={"key": False})
    launcher: LaunchConfig = dataclasses.field(default_factory=LaunchConfig, metadata={"key": False})
    hardware: HardwareConfig = dataclasses.field(default_factory=HardwareConfig, metadata={"key": False})
    stop_after: int = dataclasses.field(default=0, metadata={"key": False})   # testing: exit at this step

    def __post_init__(self):
        for name in ("steps", "global_batch", "seq_len", "loss_chunk", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(f"seq_len={self.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}")
        if self.nan_policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy={self.nan_policy!r} is not one of {NAN_POLICIES}")
        if self.mesh.num_slices != self.hardware.num_slices:
            m = self.mesh
            raise ValueError(f"MeshConfig dcn_data={m.dcn_data} x dcn_fsdp={m.dcn_fsdp} x dcn_tensor="
                             f"{m.dcn_tensor} spans {m.num_slices} slice(s), but HardwareConfig.num_slices="
                             f"{self.hardware.num_slices}; the dcn sizes must multiply to the number of "
                             f"slices (e.g. train.MeshConfig.dcn_data={self.hardware.num_slices})")
        if self.global_batch % self.optimizer.grad_accum_steps:
            raise ValueError(f"global_batch={self.global_batch} must be a multiple of "
                             f"OptimizerConfig.grad_accum_steps={self.optimizer.grad_accum_steps} "
                             "(each optimizer step is that many equal micro-batches)")
        self.optimizer_for_run()   # the schedule's checks (warmup vs steps) against this run's length

    def optimizer_for_run(self) -> OptimizerConfig:
        """The optimizer config with total_steps = steps (the run length is stated once, here)."""
        if self.optimizer.total_steps not in (0, self.steps):
            raise ValueError(f"OptimizerConfig.total_steps={self.optimizer.total_steps} disagrees with "
                             f"steps={self.steps}; leave total_steps unset (0): it is train.Config.steps")
        return dataclasses.replace(self.optimizer, total_steps=self.steps)


CONFIGURABLES = (Config, ModelConfig, OptimizerConfig, MeshConfig, LaunchConfig, HardwareConfig)
# 2: parameters and optimizer state are initialized by one jitted program directly in their shardings;
#    the weights differ from version 1's op-by-op initialization in the last bits.
VERSION = "2"


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.train import launch, spec

    check_fits(config)
    spec_path = storage.join(work_dir, "spec.json")     # JSON, never code: every TPU host reads it (spec.py)
    spec.write(spec.WorkerSpec(config, inputs["shard"], out_dir, work_dir), spec_path)
    log.info("training %d steps with the %s launcher into %s", config.steps, config.launcher.kind, out_dir)
    launch.launch(config.launcher, spec_path)


def plan(config: Config, *, compile: bool | None = None) -> str:
    """The planner's report for `make plan`: memory per device, the verdict, the time (planner.py).

    With `compile` (the default when train.HardwareConfig.topology names a TPU slice) the real train step
    is also compiled for that slice ahead of time (aot.py) and XLA's per-device figure printed beside
    the estimate; that imports JAX and takes seconds to a minute.
    """
    p = planner.plan(config)
    if not (config.hardware.topology if compile is None else compile):
        return p.render()
    if p.problem:            # a batch that does not split over the mesh cannot even be traced
        return p.render(xla_note="this layout cannot run (the verdict says why)")
    # Planning needs no accelerator: keep JAX on the CPU (the topology is described, not used), which
    # also keeps libtpu from trying to start a TPU runtime here.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from stages.train import aot

    try:
        return p.render(xla=aot.compile_train_step(config))
    except aot.OutOfMemory as e:         # XLA's figure wins: the verdict says does NOT fit, quoting it
        return p.render(xla=e.figures, xla_note=e.said)
    except (RuntimeError, ValueError) as e:
        return p.render(xla_note=str(e))


def check(config: Config) -> str:
    """What stops `config` before anything runs, in one line, or "" (the command line asks before any stage
    starts, so a wrong mesh does not wait for the data half): a CPU run whose mesh or batch does not fit
    the devices its processes will have (`configs.cpu_run_problem`), a config the planner says cannot fit
    its hardware (unless `train.HardwareConfig.allow_unfit`)."""
    if problem := cpu_run_problem(config, os.environ):
        return problem
    p = planner.plan(config)
    if not p.fits and not config.hardware.allow_unfit:
        verdict = p.render().splitlines()[-1].strip()
        return f"{verdict} (train.HardwareConfig.allow_unfit=True trains anyway; make plan shows the plan)"
    return ""


def check_fits(config: Config) -> None:
    """Refuses, before anything compiles, a config the planner says cannot fit its hardware."""
    p = planner.plan(config)
    if not p.fits and not config.hardware.allow_unfit:
        raise ValueError(f"{p.render()}\nRefusing to train a config that does not fit; set "
                         "train.HardwareConfig.allow_unfit=True to try anyway.")


def summary(out) -> str:
    """One line for the run summary, from a committed training run (`pipeline.cache.Committed`)."""
    s = storage.read_json(out.file("summary.json"))
    return (f"{s['params']:,} params, {s['steps']} steps, final loss {s['final_loss']:.3f}, "
            f"eval loss {s.get('eval_loss', float('nan')):.3f}, {s['tokens_per_s']:,.0f} tokens/s")
