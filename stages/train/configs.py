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
from collections.abc import Mapping

from stages.train.planning import devices
from stages.train.planning.tpu import TPU_GENERATIONS, generation_problem, topology_chips, topology_problem

ROPE_SCALINGS = ("none", "linear", "ntk", "yarn", "llama3")
REMAT_NAMES = ("none", "full", "minimal", "save_qkv_proj", "dots_no_batch", "save_dots",
               # What the policy after "offload_" saves, kept in pinned host memory (TPU, GPU): model.py
               "offload_full", "offload_minimal", "offload_dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")
# The same names as stages.train.attention.IMPLS (a test checks); written here so the config imports no JAX.
ATTENTION_IMPLS = ("xla", "blockwise", "cudnn", "splash", "auto")
NAN_POLICIES = ("stop", "skip")      # train.Config.nan_policy: fail naming the step, or drop that update
OPTIMIZERS = ("adamw", "lion", "adafactor", "muon")
SCHEDULES = ("cosine", "linear", "wsd", "constant")
# MoE: the router's score function, and the grouped-matmul kernels of the dropless expert computation (the
# same names as stages.train.moe.GROUPED_MATMULS; a test checks).
ROUTER_SCORES = ("softmax", "sigmoid")
MOE_AUX_SCOPES = ("batch", "sequence")
MOE_IMPLS = ("auto", "ragged_dot", "megablox", "tiled")
AXES = ("data", "fsdp", "expert", "tensor")    # the mesh's named axes, in order
BATCH_AXES = ("data", "fsdp", "expert")        # the mesh axes a batch is split over
LAYER_STACKS = ("layers", "moe_layers")        # the stacked (scanned) parameter groups, in layer order
# Logical axis -> mesh axes (None: replicated). A mesh axis already used by an earlier dimension of the
# same array is skipped, so ("batch", "length", "embed") shards batch over data x fsdp and leaves embed whole.
# `data` splits the batch only (parameters replicated), `fsdp` splits the batch and shards parameters
# (ZeRO-3: gathered per layer inside the scan), `tensor` splits heads and the MLP dim (Megatron), `expert`
# splits the batch and a mixture of experts' experts (each device holds E / expert of them; tokens travel
# to their experts by all-to-all, stages/train/moe.py) and, as fsdp does, every other parameter's embed
# dimension (an expert's embed is split over fsdp only: its experts dimension took the expert axis), so no
# weight or optimizer state is held whole on every device of the expert axis.
LOGICAL_RULES: dict[str, tuple[str, ...] | str | None] = {
    "batch": BATCH_AXES,
    "length": None,
    "sequence": "tensor",    # the residual stream's length under sequence parallelism (ModelConfig)
    "embed": ("fsdp", "expert"),
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "layers": None,
    "experts": "expert",
}


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
    attention_block_q: int = 512         # query and key tiles of the blockwise and splash kernels (clipped to
    attention_block_k: int = 512         # the sequence; splash needs multiples of 128)
    remat: str = "none"                  # one of REMAT_NAMES
    scan_layers: bool = True             # False: a Python loop over the layers (debugging)
    init_std: float = 0.02
    # Sequence parallelism (Megatron-SP, as MaxText): the residual stream, the norms and each layer's saved
    # input are split over the tensor axis along the sequence instead of held whole on every tensor-parallel
    # device; XLA gathers the sequence before the attention and MLP matmuls and reduce-scatters after them.
    sequence_parallel: bool = False
    # Mixture of experts (stages/train/moe.py): every layer after the first n_dense_layers has a routed MoE
    # feed-forward block instead of the dense MLP. n_experts = 0: a dense model.
    n_experts: int = 0                   # routed experts per MoE layer
    n_experts_per_token: int = 2         # top-k: the experts each token goes to
    n_shared_experts: int = 0            # experts every token goes to (one SwiGLU of their summed width)
    moe_mlp_dim: int = 0                 # each expert's hidden width; 0: the dense mlp width
    n_dense_layers: int = 0              # the first layers keep the dense MLP (DeepSeek-V3: 3)
    router_score: str = "softmax"        # ROUTER_SCORES: softmax over experts, or each expert's sigmoid
    router_norm_topk: bool = False       # rescale the top-k weights to sum to 1
    router_scale: float = 1.0            # the routed experts' weights times this (DeepSeek-V3's routed
                                         # scaling factor, 2.5), after router_norm_topk; shared experts not
    router_groups: int = 1               # group-limited routing: experts in groups, a token's top-k drawn
    router_topk_groups: int = 1          # from its best router_topk_groups groups (DeepSeek-V3: 8 and 4)
    moe_capacity_factor: float = 0.0     # 0: dropless; else each expert takes at most factor * N * k / E
    moe_impl: str = "auto"               # MOE_IMPLS: the dropless path's grouped matmul
    moe_aux_loss: float = 0.0            # weight of the switch/GShard load-balancing loss
    moe_aux_scope: str = "batch"         # MOE_AUX_SCOPES: "batch": one loss over the batch's tokens, averaged
                                         # over the MoE layers; "sequence": DeepSeek-V3's sequence-wise loss,
                                         # each sequence's, averaged over sequences, summed over the layers
    moe_router_z_loss: float = 0.0       # weight of the router's z-loss (mean squared logsumexp)
    moe_bias_update_rate: float = 0.0    # DeepSeek's auxiliary-loss-free balancing: bias step size; 0: off

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "max_seq_len",
                     "attention_block_q", "attention_block_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be >= 1")
        # What 0 means differs: a size derived from the others, or none of the thing (a dense model).
        for name, zero in (("head_dim", "derived"), ("mlp_dim", "derived"),
                           ("rope_original_max_len", "derived"), ("moe_mlp_dim", "derived"),
                           ("n_experts", "a dense model"),
                           ("n_shared_experts", "none"), ("n_dense_layers", "none")):
            if getattr(self, name) < 0:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be >= 0 (0 = {zero})")
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
                   "param_dtype": DTYPES, "attention_impl": ATTENTION_IMPLS, "router_score": ROUTER_SCORES,
                   "moe_impl": MOE_IMPLS, "moe_aux_scope": MOE_AUX_SCOPES}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is not one of {valid}")
        if self.rope_factor < 1.0:
            raise ValueError(f"ModelConfig.rope_factor={self.rope_factor!r} must be >= 1.0")
        for name in ("rope_theta", "norm_eps", "init_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be > 0")
        if self.n_experts:
            self._check_moe()

    def _check_moe(self) -> None:
        E, k = self.n_experts, self.n_experts_per_token
        if not 1 <= k <= E:
            raise ValueError(f"ModelConfig.n_experts_per_token={k} must be in [1, n_experts={E}]")
        if self.n_dense_layers >= self.n_layers:
            raise ValueError(f"ModelConfig.n_dense_layers={self.n_dense_layers} leaves no MoE layer of "
                             f"n_layers={self.n_layers}; set n_experts=0 for a dense model")
        G, g = self.router_groups, self.router_topk_groups
        if G < 1 or E % G or not 1 <= g <= G:
            raise ValueError(f"ModelConfig.router_groups={G} must divide n_experts={E} and "
                             f"router_topk_groups={g} be in [1, router_groups]")
        if g * (E // G) < k:
            raise ValueError(f"ModelConfig: router_topk_groups={g} groups of {E // G} experts hold fewer "
                             f"than n_experts_per_token={k}")
        if not self.router_scale > 0:
            raise ValueError(f"ModelConfig.router_scale={self.router_scale!r} must be > 0 (1: the weights as "
                             "routed; DeepSeek-V3: 2.5)")
        for name in ("moe_capacity_factor", "moe_aux_loss", "moe_router_z_loss", "moe_bias_update_rate"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be >= 0 (0 = off)")

    @property
    def n_moe_layers(self) -> int:
        """Layers with a routed MoE block: all after the first n_dense_layers (none in a dense model)."""
        return self.n_layers - self.n_dense_layers if self.n_experts else 0

    @property
    def effective_moe_mlp_dim(self) -> int:
        return self.moe_mlp_dim or self.effective_mlp_dim

    @classmethod
    def from_json(cls, fields: Mapping) -> ModelConfig:
        """The config as `dataclasses.asdict` wrote it to JSON (summary.json's "model"), lists as tuples."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})

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


def param_layout(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Every parameter of the decoder, in the order the model creates them: name -> (shape, logical axis
    names). The model builds its parameters from this table, and the planner sizes and shards them by it.
    The layers' parameters are stacked on a leading ("layers",) axis of size n_layers (scan); a mixture of
    experts has two stacks, "layers." (the first n_dense_layers) and "moe_layers." (the rest)."""
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.effective_head_dim, cfg.effective_mlp_dim
    attention = {
        "attn_norm": ((D,), ("embed",)),
        "wq": ((D, N, H), ("embed", "heads", "head_dim")),
        "wk": ((D, K, H), ("embed", "kv_heads", "head_dim")),
        "wv": ((D, K, H), ("embed", "kv_heads", "head_dim")),
        "wo": ((N, H, D), ("heads", "head_dim", "embed")),
        "mlp_norm": ((D,), ("embed",)),
    }
    dense = {
        "w_gate": ((D, F), ("embed", "mlp")),
        "w_up": ((D, F), ("embed", "mlp")),
        "w_down": ((F, D), ("mlp", "embed")),
    }
    out = {"embed": ((cfg.vocab_size, D), ("vocab", "embed"))}
    if cfg.n_layers > cfg.n_moe_layers:
        out |= {f"layers.{name}": ((cfg.n_layers - cfg.n_moe_layers, *shape), ("layers", *names))
                for name, (shape, names) in (attention | dense).items()}
    if cfg.n_moe_layers:
        out |= {f"moe_layers.{name}": ((cfg.n_moe_layers, *shape), ("layers", *names))
                for name, (shape, names) in (attention | moe_layout(cfg)).items()}
    out["final_norm"] = ((D,), ("embed",))
    if not cfg.tie_embeddings:
        out["unembedding"] = ((D, cfg.vocab_size), ("embed", "vocab"))
    return out


def moe_layout(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """One MoE layer's feed-forward parameters (after its attention's): the router (D, E) and its balancing
    bias (E,) (not trained by the optimizer: DeepSeek's auxiliary-loss-free update, stages/train/moe.py),
    the routed experts' SwiGLU stacked on "experts", and the shared experts as one SwiGLU."""
    D, E, Fe = cfg.d_model, cfg.n_experts, cfg.effective_moe_mlp_dim
    out = {
        "router": ((D, E), ("embed", None)),
        "router_bias": ((E,), (None,)),
        "experts_gate": ((E, D, Fe), ("experts", "embed", "mlp")),
        "experts_up": ((E, D, Fe), ("experts", "embed", "mlp")),
        "experts_down": ((E, Fe, D), ("experts", "mlp", "embed")),
    }
    if cfg.n_shared_experts:
        Fs = cfg.n_shared_experts * Fe
        out |= {"shared_gate": ((D, Fs), ("embed", "mlp")), "shared_up": ((D, Fs), ("embed", "mlp")),
                "shared_down": ((Fs, D), ("mlp", "embed"))}
    return out


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by part (no JAX): embed, unembed (0 when tied), layers (every layer, experts included),
    final_norm."""
    sizes = {name: math.prod(shape) for name, (shape, _) in param_layout(cfg).items()}
    return {"embed": sizes["embed"], "unembed": sizes.get("unembedding", 0),
            "layers": sum(n for name, n in sizes.items() if name.partition(".")[0] in LAYER_STACKS),
            "final_norm": sizes["final_norm"]}


def active_params(cfg: ModelConfig) -> int:
    """Parameters one token uses: all of a dense model's; a mixture of experts' with only its top-k
    routed experts of each MoE layer (DeepSeek-V3: 671B total, 37B active)."""
    total = sum(param_counts(cfg).values())
    if not cfg.n_experts:
        return total
    idle = cfg.n_experts - cfg.n_experts_per_token
    return total - cfg.n_moe_layers * idle * 3 * cfg.d_model * cfg.effective_moe_mlp_dim


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) for MFU and planning: 6 * N_matmul + 6 * L * n_heads *
    head_dim * seq_len, the causal count MaxText uses (`calculate_tflops_training_per_device` in
    maxtext_utils.py: the score and value matmuls, 4 * T^2 * n_heads * head_dim a layer, halved for the
    causal mask, x 3 for forward and backward).

    N_matmul counts the parameters that take part in matmuls: everything but the embedding lookup table
    (kept when tied, since it is then the unembedding) and the norm scales. PaLM's appendix B (Chowdhery et
    al. 2022) counts the full T x T matrices instead (12 * L * n_heads * head_dim * seq_len), twice what a
    causal kernel executes (splash and blockwise skip the masked blocks): up to 38% more FLOPs than run at
    9B / 32K, which would inflate the planned days and deflate the measured MFU.

    For a mixture of experts N_matmul counts the active parameters (`active_params`: the top-k routed
    experts, the shared ones, the router), as MaxText and DeepSeek count MoE FLOPs; the bias is no matmul.
    """
    c = param_counts(cfg)
    layers = c["layers"] - (sum(c.values()) - active_params(cfg)) - cfg.n_moe_layers * cfg.n_experts
    n_matmul = layers - cfg.n_layers * 2 * cfg.d_model + (c["unembed"] or c["embed"])
    return 6.0 * n_matmul + 6.0 * cfg.n_layers * cfg.n_heads * cfg.effective_head_dim * seq_len


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
    """Mesh axis sizes. Gin: `train.MeshConfig.<field>`.

    data, fsdp, expert and tensor are the sizes WITHIN one slice (ICI, the chips' own links): their product
    is a slice's device count. dcn_data, dcn_fsdp, dcn_expert and dcn_tensor split the same axes ACROSS
    slices (DCN, the data-center network between TPU slices): their product is the number of slices, and
    must equal train.HardwareConfig.num_slices. Each mesh axis is ici x dcn long, under the same name, so
    every logical rule holds unchanged: MeshConfig(fsdp=4, dcn_data=2) on 2 slices of 4 chips is the mesh
    data 2 x fsdp 4 x expert 1 x tensor 1, data crossing the slices and fsdp within each. Put the DCN split
    on data: it crosses the slow network once per step (the gradient reduction), fsdp, expert and tensor
    every layer. With every dcn_* = 1 (the default) there is one slice and the sizes are the whole mesh's.
    """

    data: int = -1         # -1: all of a slice's devices that fsdp, expert and tensor leave
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1        # expert parallelism: splits the batch and a mixture of experts' experts
    dcn_data: int = 1      # slices the data axis spans (1: it stays within a slice)
    dcn_fsdp: int = 1
    dcn_tensor: int = 1
    dcn_expert: int = 1

    def __post_init__(self):
        for name in AXES:
            size = getattr(self, name)
            if size == 0 or size < -1:
                raise ValueError(f"MeshConfig.{name}={size} must be >= 1 (or -1 for data: the rest)")
            dcn = getattr(self, f"dcn_{name}")
            if dcn < 1:
                raise ValueError(f"MeshConfig.dcn_{name}={dcn} must be >= 1 (the slices the {name} axis "
                                 "spans; 1: within one slice)")
        if -1 in (self.fsdp, self.tensor, self.expert):
            raise ValueError(f"MeshConfig: only data may be -1 (fsdp={self.fsdp}, expert={self.expert}, "
                             f"tensor={self.tensor})")

    @property
    def dcn_shape(self) -> tuple[int, ...]:
        """(data, fsdp, expert, tensor) across slices."""
        return tuple(getattr(self, f"dcn_{a}") for a in AXES)

    @property
    def num_slices(self) -> int:
        """The slices this mesh spans: the product of the dcn_* sizes."""
        return math.prod(self.dcn_shape)

    def describe_dcn(self) -> str:
        """"dcn_data=2 x dcn_fsdp=1 x dcn_tensor=1" (dcn_expert named where it is not 1)."""
        return " x ".join(f"dcn_{a}={getattr(self, f'dcn_{a}')}" for a in self._named_axes())

    def describe(self) -> str:
        """"data=-1 x fsdp=4 x tensor=2" (expert named where it is not 1)."""
        return " x ".join(f"{a}={getattr(self, a)}" for a in self._named_axes())

    def _named_axes(self) -> tuple[str, ...]:
        return tuple(a for a in AXES if a != "expert" or self.expert != 1 or self.dcn_expert != 1)

    def ici_shape(self, n_devices: int) -> tuple[int, ...]:
        """(data, fsdp, expert, tensor) within one slice, for `n_devices` over all `num_slices` slices;
        ValueError naming the sizes when they do not fit."""
        slices = self.num_slices
        dcn = self.describe_dcn()
        if n_devices % slices:
            raise ValueError(f"{n_devices} devices do not split into {slices} equal slices (mesh {dcn})")
        n = n_devices // slices
        other = self.fsdp * self.expert * self.tensor
        data = self.data if self.data != -1 else n // other
        if self.data == -1 and n % other:
            data = 0
        if data * other != n:
            sizes = self.describe()
            named = " x ".join(a for a in self._named_axes() if a != "data")
            if slices == 1:
                raise ValueError(f"mesh {sizes} does not match the {n} devices; the product must equal the "
                                 f"device count (data=-1 takes the rest, and needs {named} = {other} "
                                 f"to divide {n})")
            raise ValueError(f"mesh per slice (ICI) {sizes} does not match the {n} devices of each of "
                             f"{slices} slices ({n_devices} devices, {dcn}); the product must equal a "
                             f"slice's device count (data=-1 takes the rest, and needs {named} = "
                             f"{other} to divide {n})")
        return data, self.fsdp, self.expert, self.tensor

    def shape(self, n_devices: int) -> tuple[int, ...]:
        """The whole mesh's (data, fsdp, expert, tensor) for `n_devices`: per axis, the size within a slice
        x the slices it spans (`ici_shape` x `dcn_shape`); ValueError naming the sizes when they do not
        fit."""
        return tuple(i * d for i, d in zip(self.ici_shape(n_devices), self.dcn_shape))

    def sizes(self, n_devices: int) -> dict[str, int]:
        """{axis: size} of the whole mesh for `n_devices` (`shape` by name)."""
        return dict(zip(AXES, self.shape(n_devices)))


def expert_split_problem(model: ModelConfig, mesh: MeshConfig) -> str:
    """Why a mixture of experts' experts do not split evenly over the mesh's expert axis (its size within a
    slice x the slices it spans), or "": each device holds n_experts / expert of them (stages/train/moe.py),
    which training would find only when it starts, after the data half."""
    experts = mesh.expert * mesh.dcn_expert
    if not model.n_experts or model.n_experts % experts == 0:
        return ""
    return (f"ModelConfig.n_experts={model.n_experts} does not split over the mesh's expert axis of "
            f"{experts} (train.MeshConfig.expert={mesh.expert} x dcn_expert={mesh.dcn_expert}): each device "
            f"holds n_experts / {experts} experts; pick n_experts a multiple of {experts}, or an expert size "
            f"that divides {model.n_experts}")


def power_of_two_divisors(n: int) -> list[int]:
    """The powers of two that divide `n`, smallest first: the sizes a mesh axis over `n` devices (or slices)
    is given where layouts are searched (advice, the slice search)."""
    return [d for d in range(1, n + 1) if n % d == 0 and (d & (d - 1)) == 0]


def batch_axes_named(sizes: Mapping[str, int]) -> str:
    """"data x fsdp" (with " x expert" where the mesh has an expert axis): what a batch is split over."""
    return " x ".join(a for a in BATCH_AXES if a != "expert" or sizes.get("expert", 1) > 1)


def mesh_axes(names, shape=None, mesh_shape=None, rules=None) -> tuple[tuple[str, ...], ...]:
    """Logical axis names -> the mesh axes each dimension is split over (() = replicated), by `rules`
    (default LOGICAL_RULES). With `shape` and `mesh_shape` ({axis: size}), a mesh axis that does not divide
    its dimension is dropped (that dimension stays replicated over it) rather than failing at placement.
    `sharding.logical_to_spec` turns the result into a PartitionSpec; the planner divides sizes by it."""
    rules = LOGICAL_RULES if rules is None else rules
    used: set[str] = set()
    out = []
    for i, name in enumerate(names):
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used)
        if shape is not None and mesh_shape is not None:
            kept, size = [], 1
            for a in axes:
                if a in mesh_shape and shape[i] % (size * mesh_shape[a]) == 0:     # a mesh may lack the axis
                    kept.append(a)
                    size *= mesh_shape[a]
            axes = tuple(kept)
        used.update(axes)
        out.append(axes)
    return tuple(out)



# ------------------------------------------------------------------------------------------- hardware

@dataclasses.dataclass(frozen=True)
class HardwareConfig:
    """Where the run is meant to train: what `make plan` checks the config against and what training
    refuses to start without (see stages/train/planning/planner.py). Gin: `train.HardwareConfig.<field>`.

    device: a row of `stages.train.planning.devices.DEVICES` ("tpu-v5p", "h100", "cpu", ...).
    topology: a TPU topology ("v5p:8x8x16"); the planner compiles the real train step for it ahead of time.
        A slice of the device's generation: device "tpu-v5p" with "v5p:...", and none for a GPU or the CPU.
    chips: chips per slice; 0 = the topology's, or (no topology) the mesh's explicit sizes.
    num_slices: slices joined over the data-center network (multi-slice); all chips = chips x num_slices,
        and train.MeshConfig's dcn_data x dcn_fsdp x dcn_tensor must equal it.
    mfu: 0 (the default): the plan's days come from the predicted step (stages/train/planning/step_time.py);
        else the model FLOPs utilization the days assume instead (the prediction is printed beside them).
    allow_unfit: start training even when the plan says the state does not fit in device memory.
    """

    device: str = "cpu"
    topology: str = ""
    chips: int = 0
    num_slices: int = 1
    mfu: float = 0.0
    allow_unfit: bool = False

    def __post_init__(self):
        if self.chips < 0 or self.num_slices < 1:
            raise ValueError(f"HardwareConfig: chips={self.chips} must be >= 0 (0 = from the topology) and "
                             f"num_slices={self.num_slices} >= 1")
        if self.device not in devices.DEVICES:
            raise ValueError(f"HardwareConfig: device={self.device!r} is not one of {tuple(devices.DEVICES)}")
        if not 0 <= self.mfu <= 1:
            raise ValueError(f"HardwareConfig: mfu={self.mfu} must be in [0, 1] (0: predict the step time)")
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


# --------------------------------------------------------------------------------- devices, before a run

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
        sizes = mesh.sizes(devices)
    except ValueError as e:
        return f"train.MeshConfig: {e}; {where}"
    if cfg.global_batch % processes:
        return (f"train.Config.global_batch={cfg.global_batch} does not divide by the {processes} training "
                f"processes: use a multiple of {processes}; {where}")
    accum = cfg.optimizer.grad_accum_steps
    micro, shards = cfg.global_batch // accum, math.prod(sizes[a] for a in BATCH_AXES)
    if micro % shards:
        return (f"a micro-batch of {micro} sequences (train.Config.global_batch {cfg.global_batch} / "
                f"grad_accum_steps {accum}) does not split over {batch_axes_named(sizes)} = {shards} "
                f"devices; {where}")
    return ""
