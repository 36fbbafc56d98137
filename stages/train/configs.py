"""Training's configs as plain dataclasses: what gin binds and what planning reads, without JAX.

    from stages.train.configs import MeshConfig, ModelConfig, OptimizerConfig
    cfg = ModelConfig(vocab_size=32_000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8)
    sum(param_counts(cfg).values())          # parameters in closed form
    flops_per_token(cfg, seq_len=4096)       # training FLOPs per token, for MFU and planning

Gin binds them as `train.ModelConfig.<field>` (gin/model/*.gin), `train.OptimizerConfig.<field>` and
`train.MeshConfig.<field>`. Each validates itself and names the bad field and the valid choices. The
modules that use them (model.py, optimizer.py, sharding.py) import JAX; this one must not (the
import-light rule in docs/ARCHITECTURE.md), so `make plan` and a cached rerun stay fast.
"""

from __future__ import annotations

import dataclasses
import math

ROPE_SCALINGS = ("none", "linear", "ntk", "yarn", "llama3")
REMAT_NAMES = ("none", "full", "minimal", "save_qkv_proj", "dots_no_batch", "save_dots")
DTYPES = ("float32", "bfloat16", "float16")
# The same names as stages.train.attention.IMPLS (a test checks); written here so the config imports no JAX.
ATTENTION_IMPLS = ("xla", "blockwise", "cudnn", "splash", "auto")
NAN_POLICIES = ("stop", "skip")      # train.Config.nan_policy: fail naming the step, or drop that update
OPTIMIZERS = ("adamw", "lion", "adafactor", "muon")
SCHEDULES = ("cosine", "linear", "wsd", "constant")
AXES = ("data", "fsdp", "tensor")    # the mesh's named axes, in order


# ---------------------------------------------------------------------------------------------- model

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape and numerics. Gin binds it as `train.ModelConfig.<field>` (gin/model/*.gin)."""

    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    head_dim: int = 0                    # 0: d_model // n_heads
    mlp_dim: int = 0                     # 0: Llama's rule, 8/3 * d_model rounded up to a multiple of 256
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    rope_scaling: str = "none"           # one of ROPE_SCALINGS
    rope_factor: float = 1.0             # context extension factor for the scalings
    rope_original_max_len: int = 0       # the pre-extension context (yarn, llama3); 0: max_seq_len / factor
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"              # activations and matmul inputs
    param_dtype: str = "float32"
    attention_impl: str = "auto"         # stages.train.attention.IMPLS
    remat: str = "none"                  # one of REMAT_NAMES
    scan_layers: bool = True             # False: a Python loop over the layers (debugging)
    init_std: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be >= 1")
        for name in ("head_dim", "mlp_dim", "rope_original_max_len"):
            if getattr(self, name) < 0:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be >= 0 (0 = derived)")
        if self.head_dim == 0 and self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig: n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                             f"pick n_heads dividing d_model or set head_dim explicitly")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelConfig: n_kv_heads={self.n_kv_heads} does not divide "
                             f"n_heads={self.n_heads} (grouped-query attention shares each kv head among "
                             f"n_heads / n_kv_heads query heads)")
        if self.effective_head_dim % 2:
            raise ValueError(f"ModelConfig: head dim {self.effective_head_dim} must be even for RoPE "
                             f"(head_dim={self.head_dim}, d_model={self.d_model}, n_heads={self.n_heads})")
        choices = {"rope_scaling": ROPE_SCALINGS, "remat": REMAT_NAMES, "dtype": DTYPES,
                   "param_dtype": DTYPES, "attention_impl": ATTENTION_IMPLS}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is not one of {valid}")
        if self.rope_factor < 1.0:
            raise ValueError(f"ModelConfig.rope_factor={self.rope_factor!r} must be >= 1.0")
        for name in ("rope_theta", "norm_eps", "init_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be > 0")

    @property
    def effective_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def effective_mlp_dim(self) -> int:
        """mlp_dim, or Llama's rule: SwiGLU's three matrices at 8/3 * D cost what a 4 * D two-matrix MLP
        does; rounded up to a multiple of 256 so the matmuls tile well."""
        return self.mlp_dim or 256 * math.ceil(int(8 * self.d_model / 3) / 256)

    @property
    def original_max_len(self) -> int:
        """The context length the RoPE frequencies were made for, before the scaling stretched them."""
        return self.rope_original_max_len or max(1, int(self.max_seq_len / self.rope_factor))


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by part, in closed form (no JAX): embed, unembed (0 when tied), layers, final_norm."""
    D, H, F, L = cfg.d_model, cfg.effective_head_dim, cfg.effective_mlp_dim, cfg.n_layers
    attn = D * cfg.n_heads * H * 2 + D * cfg.n_kv_heads * H * 2          # q, o and k, v
    layer = attn + 3 * D * F + 2 * D                                     # + SwiGLU, + two norm scales
    return {"embed": cfg.vocab_size * D, "unembed": 0 if cfg.tie_embeddings else D * cfg.vocab_size,
            "layers": L * layer, "final_norm": D}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) for MFU, PaLM's convention (Chowdhery et al. 2022,
    appendix B): 6 * N_matmul + 12 * L * n_heads * head_dim * seq_len.

    N_matmul counts the parameters that take part in matmuls: everything but the embedding lookup table
    (kept when tied, since it is then the unembedding) and the norm scales. The attention term counts the
    full T x T score and value matmuls, as PaLM does, though a causal kernel skips about half of them.
    """
    c = param_counts(cfg)
    n_matmul = c["layers"] - cfg.n_layers * 2 * cfg.d_model + (c["unembed"] or c["embed"])
    return 6.0 * n_matmul + 12.0 * cfg.n_layers * cfg.n_heads * cfg.effective_head_dim * seq_len


# ------------------------------------------------------------------------------------------ optimizer

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


# ----------------------------------------------------------------------------------------------- mesh

@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes; their product must be the device count. Gin: `train.MeshConfig.<field>`."""

    data: int = -1         # -1: all devices that fsdp and tensor leave
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        for name in AXES:
            size = getattr(self, name)
            if size == 0 or size < -1:
                raise ValueError(f"MeshConfig.{name}={size} must be >= 1 (or -1 for data: the rest)")
        if self.fsdp == -1 or self.tensor == -1:
            raise ValueError(f"MeshConfig: only data may be -1 (fsdp={self.fsdp}, tensor={self.tensor})")

    def shape(self, n_devices: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) for `n_devices`; ValueError naming the sizes when they do not fit."""
        other = self.fsdp * self.tensor
        data = self.data if self.data != -1 else n_devices // other
        if self.data == -1 and n_devices % other:
            data = 0
        if data * other != n_devices:
            raise ValueError(f"mesh data={self.data} x fsdp={self.fsdp} x tensor={self.tensor} does not "
                             f"match the {n_devices} devices; the product must equal the device count "
                             f"(data=-1 takes the rest, and needs fsdp x tensor = {other} to divide "
                             f"{n_devices})")
        return data, self.fsdp, self.tensor
