"""The optimizer's config, without JAX: what gin binds as `train.OptimizerConfig.<field>` and what the
planner reads (the optimizer's state, gradient accumulation). optimizer.py builds the optax chain from it.

    from stages.train.optimizer_config import OptimizerConfig
    cfg = OptimizerConfig(name="adamw", learning_rate=3e-4, total_steps=1000)   # ValueError: a bad field
"""

from __future__ import annotations

import dataclasses
import math

OPTIMIZERS = ("adamw", "lion", "adafactor", "muon")
SCHEDULES = ("cosine", "linear", "wsd", "constant")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """name: adamw | lion (sign updates; usually wants a 3-10x smaller learning_rate and larger
    weight_decay than adamw) | adafactor (factored second moments, no momentum, its own 1 - t^-0.8
    second-moment decay; b1/b2 unused) | muon (orthogonalized momentum for hidden matrices, AdamW for
    embeddings, norms and biases). learning_rate is the peak; schedule: cosine | linear | wsd (warmup,
    stable, decay over the last wsd_decay_fraction of total_steps) | constant (after warmup); every
    schedule warms up linearly from 0 over warmup_steps and decays to min_lr_ratio * learning_rate at
    total_steps (counted in optimizer updates: see stages/train/optimizer.py). clip_norm: global-norm clipping
    of the (accumulated) gradient, 0 = off."""

    name: str = "adamw"
    learning_rate: float = 3e-4
    schedule: str = "cosine"
    warmup_steps: int = 100
    total_steps: int = 0                 # 0: the training stage sets it to train.Config.steps
    min_lr_ratio: float = 0.1
    wsd_decay_fraction: float = 0.2
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    grad_accum_steps: int = 1

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"OptimizerConfig: name={self.name!r} is not one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"OptimizerConfig: schedule={self.schedule!r} is not one of {SCHEDULES}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"OptimizerConfig: learning_rate={self.learning_rate} must be finite and > 0")
        if self.total_steps < 0:
            raise ValueError(f"OptimizerConfig: total_steps={self.total_steps} must be >= 1 (or 0: "
                             "train.Config.steps)")
        if self.warmup_steps < 0 or (self.total_steps and self.warmup_steps > self.total_steps):
            raise ValueError(f"OptimizerConfig: warmup_steps={self.warmup_steps} must be in "
                             f"[0, total_steps={self.total_steps}]")
        for field in ("min_lr_ratio", "wsd_decay_fraction"):
            if not 0 <= getattr(self, field) <= 1:
                raise ValueError(f"OptimizerConfig: {field}={getattr(self, field)} must be in [0, 1]")
        if self.schedule == "wsd":
            if self.wsd_decay_fraction <= 0:
                raise ValueError(f"OptimizerConfig: wsd_decay_fraction={self.wsd_decay_fraction} must be > 0 "
                                 "for schedule='wsd'")
            if self.total_steps and self.warmup_steps + self.wsd_decay_steps > self.total_steps:
                raise ValueError(f"OptimizerConfig: warmup_steps={self.warmup_steps} + WSD decay steps "
                                 f"{self.wsd_decay_steps} (wsd_decay_fraction={self.wsd_decay_fraction} of "
                                 f"total_steps={self.total_steps}) must be <= total_steps")
        for field in ("b1", "b2"):
            if not 0 <= getattr(self, field) < 1:
                raise ValueError(f"OptimizerConfig: {field}={getattr(self, field)} must be in [0, 1)")
        if not self.eps > 0:
            raise ValueError(f"OptimizerConfig: eps={self.eps} must be > 0")
        for field in ("weight_decay", "clip_norm"):
            if not getattr(self, field) >= 0:
                raise ValueError(f"OptimizerConfig: {field}={getattr(self, field)} must be >= 0 (0 = off)")
        if self.grad_accum_steps < 1:
            raise ValueError(f"OptimizerConfig: grad_accum_steps={self.grad_accum_steps} must be >= 1 "
                             "(1 = no accumulation)")

    @property
    def wsd_decay_steps(self) -> int:
        """The WSD schedule's decay length: wsd_decay_fraction of total_steps, at least one step."""
        return max(1, round(self.wsd_decay_fraction * self.total_steps))
