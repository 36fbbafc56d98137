"""The training stage's own configs: `Config` (what one training run is) and `LaunchConfig` (where its
processes start). The model, optimizer, mesh and hardware configs it holds are in `model_config.py`,
`optimizer_config.py`, `mesh.py` and `planning/hardware.py`.

    from stages.train.stage_config import Config        # also `stages.train.Config`
    cfg = Config(steps=1000, global_batch=64, seq_len=1024)    # ValueError naming the field if wrong

gin binds them as `train.Config.<field>` and `train.LaunchConfig.<field>` (CONFIGURABLES in the package's
`__init__`). They live here, not in the package `__init__` or `launch.py`, so that `spec.py` (the worker's
schema), `launch.py` and `worker.py` can import them without importing the package or each other: no
module of the training stage imports the package, and the imports among them have no cycle
(tests/test_import_cycles.py). Import-light: the standard library, those configs and `stages.io.storage`.
"""

from __future__ import annotations

import dataclasses

from stages.io import storage
from stages.train.mesh import MeshConfig, expert_split_problem
from stages.train.mixture import Mixture
from stages.train.model_config import ModelConfig
from stages.train.optimizer_config import OptimizerConfig
from stages.train.planning.hardware import HardwareConfig
from stages.train.tracking import Tracking

LAUNCH_KINDS = ("inprocess", "local", "tpu_vm")
NAN_POLICIES = ("stop", "skip")      # train.Config.nan_policy: fail naming the step, or drop that update


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Where the training processes start (`launch.py`): in this process, N local processes over gloo, or
    every host of a TPU VM slice."""

    kind: str = "inprocess"
    num_processes: int = 2          # local: how many processes
    tpu_name: str = ""              # tpu_vm: the slice, its zone and project
    zone: str = ""
    project: str = ""
    remote_dir: str = "~/refinery"  # tpu_vm: where this repository is checked out on every worker
    timeout_s: int = 0              # 0 = no limit

    def __post_init__(self):
        if self.kind not in LAUNCH_KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {LAUNCH_KINDS}")
        if self.kind == "local" and self.num_processes < 1:
            raise ValueError(f"num_processes={self.num_processes} must be >= 1")
        if self.kind == "tpu_vm" and not (self.tpu_name and self.zone):
            raise ValueError("kind='tpu_vm' needs tpu_name and zone (and usually project): "
                             f"got tpu_name={self.tpu_name!r}, zone={self.zone!r}")

    def unused_fields(self) -> frozenset[str]:
        """Fields this launcher kind ignores (the placeholder check skips them)."""
        slice_fields = {"tpu_name", "zone", "project", "remote_dir"}
        return frozenset() if self.kind == "tpu_vm" else frozenset(slice_fields)


@dataclasses.dataclass(frozen=True)
class Config:
    """One training run. Fields with `metadata={"key": False}` say how it runs, not what it computes, and
    stay out of the cache key."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    steps: int = 200
    global_batch: int = 16               # sequences per optimizer step, over all processes
    seq_len: int = 256                   # tokens per sequence (<= model.max_seq_len)
    seed: int = 0                        # parameter init and data order
    z_loss: float = 0.0
    loss_chunk: int = 4096               # tokens per cross-entropy chunk (bounds the logits' memory)
    eval_every: int = 50                 # held-out loss on `eval_batches` val batches at every multiple of
                                         # this and at the last step, each a metrics row of its own whatever
                                         # log_every is (loop.intervals); 0: never
    eval_batches: int = 4
    nan_policy: str = "stop"             # "stop": fail naming the step; "skip": drop that update
    # A Hugging Face Llama directory to start from (local, gs://, or hf://owner/name@<commit>): its
    # config.json gives the model config and its weights the starting point (stages/train/init_from.py)
    init_from: str = ""
    # Several sources weighted by tokens, in phases (stages/train/mixture.py); None: the run's one source.
    # The sources it names are the run's: each has its own download, clean and shard stages.
    mixture: Mixture | None = None
    log_every: int = dataclasses.field(default=10, metadata={"key": False})
    checkpoint_every: int = dataclasses.field(default=100, metadata={"key": False})
    keep_checkpoints: int = dataclasses.field(default=2, metadata={"key": False})
    launcher: LaunchConfig = dataclasses.field(default_factory=LaunchConfig, metadata={"key": False})
    hardware: HardwareConfig = dataclasses.field(default_factory=HardwareConfig, metadata={"key": False})
    stop_after: int = dataclasses.field(default=0, metadata={"key": False})   # testing: exit at this step
    # Experiment tracking (W&B: tracking.py); gin binds it as train.Tracking.<field>
    tracking: Tracking = dataclasses.field(default_factory=Tracking, metadata={"key": False})

    def __post_init__(self):
        for name in ("steps", "global_batch", "seq_len", "loss_chunk", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        # log_every and checkpoint_every divide step numbers; keep_checkpoints=0 would keep none to resume.
        for name, what in (("log_every", "a metrics row every this many steps"),
                           ("checkpoint_every", "a periodic checkpoint every this many steps"),
                           ("keep_checkpoints", "how many of the newest periodic checkpoints stay")):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1 ({what})")
        if self.eval_every < 0:
            raise ValueError(f"eval_every={self.eval_every} must be >= 0 (evaluate every this many steps "
                             "and after the last; 0: never)")
        if not 0 <= self.seed < 2**31:        # the init program takes it as an int32 (loop.init_program)
            raise ValueError(f"seed={self.seed!r} must be in [0, 2**31)")
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(f"seq_len={self.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}")
        if self.init_from and (problem := storage.read_scheme_problem(self.init_from)):
            raise ValueError(f"init_from: {problem}")
        if self.nan_policy not in NAN_POLICIES:
            raise ValueError(f"nan_policy={self.nan_policy!r} is not one of {NAN_POLICIES}")
        if self.mesh.num_slices != self.hardware.num_slices:
            m = self.mesh
            raise ValueError(f"MeshConfig {m.describe_dcn()} spans {m.num_slices} slice(s), but "
                             f"HardwareConfig.num_slices="
                             f"{self.hardware.num_slices}; the dcn sizes must multiply to the number of "
                             f"slices (e.g. train.MeshConfig.dcn_data={self.hardware.num_slices})")
        if problem := expert_split_problem(self.model, self.mesh):
            raise ValueError(problem)
        if self.global_batch % self.optimizer.grad_accum_steps:
            raise ValueError(f"global_batch={self.global_batch} must be a multiple of "
                             f"OptimizerConfig.grad_accum_steps={self.optimizer.grad_accum_steps} "
                             "(each optimizer step is that many equal micro-batches)")
        self.optimizer_for_run()   # the schedule's checks (warmup vs steps) against this run's length
        if self.mixture is not None and (problem := self.mixture.problem(steps=self.steps,
                                                                         global_batch=self.global_batch)):
            raise ValueError(problem)

    def optimizer_for_run(self) -> OptimizerConfig:
        """The optimizer config with total_steps = steps (the run length is stated once, here)."""
        if self.optimizer.total_steps not in (0, self.steps):
            raise ValueError(f"OptimizerConfig.total_steps={self.optimizer.total_steps} disagrees with "
                             f"steps={self.steps}; leave total_steps unset (0): it is train.Config.steps")
        return dataclasses.replace(self.optimizer, total_steps=self.steps)
