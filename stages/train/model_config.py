"""The decoder's config and what follows from it in closed form: its parameters' layout, their count and
the training FLOPs a token, without JAX.

    from stages.train.model_config import ModelConfig, flops_per_token, param_counts
    cfg = ModelConfig(vocab_size=32_000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8)
    sum(param_counts(cfg).values())          # parameters in closed form
    flops_per_token(cfg, seq_len=4096)       # training FLOPs per token, for MFU and planning
    param_layout(cfg)["layers.wq"]           # ((L, D, N, H), logical axis names): what model.py builds

Gin binds it as `train.ModelConfig.<field>` (gin/model/*.gin); it validates itself and names the bad field
and the valid choices. model.py (which imports JAX) builds the decoder from `param_layout`, and the planner
(stages/train/planning/) sizes and shards the same table, so this module must not import JAX (the
import-light rule in docs/ARCHITECTURE.md): `make plan` and a cached rerun stay fast.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

ROPE_SCALINGS = ("none", "linear", "ntk", "yarn", "llama3")
REMAT_NAMES = ("none", "full", "minimal", "save_qkv_proj", "dots_no_batch", "save_dots",
               # What the policy after "offload_" saves, kept in pinned host memory (TPU, GPU): model.py
               "offload_full", "offload_minimal", "offload_dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")
# The same names as stages.train.attention.IMPLS (a test checks); written here so the config imports no JAX.
ATTENTION_IMPLS = ("xla", "blockwise", "cudnn", "splash", "auto")
# MoE: the router's score function, and the grouped-matmul kernels of the dropless expert computation (the
# same names as stages.train.moe.GROUPED_MATMULS; a test checks).
ROUTER_SCORES = ("softmax", "sigmoid")
MOE_AUX_SCOPES = ("batch", "sequence")
MOE_IMPLS = ("auto", "ragged_dot", "megablox", "tiled")
LAYER_STACKS = ("layers", "moe_layers")        # the stacked (scanned) parameter groups, in layer order
# "mha": Llama's grouped-query attention (wq, wk, wv); "mla": DeepSeek-V2/V3's multi-head latent attention
# (compressed query and key-value latents, a decoupled RoPE key shared by the heads; `mla_layout`).
ATTENTION_KINDS = ("mha", "mla")
MLA_DIMS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


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
    # Multi-head latent attention (DeepSeek-V2/V3, `attention_kind = "mla"`; DeepSeek-V3: 1536, 512, 128,
    # 64, 128). The query is projected down to q_lora_rank, RMS-normed and up to n_heads heads of
    # qk_nope_head_dim + qk_rope_head_dim (q_lora_rank 0: projected directly, as DeepSeek-V2-Lite); keys and
    # values come from one latent of kv_lora_rank (RMS-normed, projected up to each head's qk_nope_head_dim
    # key and v_head_dim value) and a qk_rope_head_dim RoPE key shared by every head. The KV cache holds the
    # latent and the RoPE key. Scores are scaled by 1/sqrt(qk_nope_head_dim + qk_rope_head_dim). Each head
    # has its own key and value (n_kv_heads must equal n_heads); head_dim is not used.
    attention_kind: str = "mha"          # one of ATTENTION_KINDS
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
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
    # Rows a tile of the megablox grouped matmul (MaxText's tile_batch_seq, 512 there). Each expert's rows
    # start a tile, so a call does about (n_experts - 1) tiles more than its rows fill: small tiles waste
    # less on many small experts, large ones run each tile faster (the step-time model charges the first).
    moe_tile_rows: int = 128
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
        if self.attention_kind not in ATTENTION_KINDS:
            raise ValueError(f"ModelConfig.attention_kind={self.attention_kind!r} is not one of "
                             f"{ATTENTION_KINDS}")
        if self.attention_kind == "mla":
            self._check_mla()
        else:
            for name in MLA_DIMS:
                if getattr(self, name):
                    raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is a multi-head latent "
                                     f"attention size, but attention_kind={self.attention_kind!r}; set "
                                     f"attention_kind='mla' or leave {name} at 0")
        if self.head_dim == 0 and self.d_model % self.n_heads and self.attention_kind == "mha":
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

    def _check_mla(self) -> None:
        for name in MLA_DIMS[1:]:
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be >= 1 with "
                                 "attention_kind='mla' (DeepSeek-V3: kv_lora_rank 512, qk_nope_head_dim 128, "
                                 "qk_rope_head_dim 64, v_head_dim 128)")
        if self.q_lora_rank < 0:
            raise ValueError(f"ModelConfig.q_lora_rank={self.q_lora_rank!r} must be >= 0 (0 = the query "
                             "projected directly; DeepSeek-V3: 1536)")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"ModelConfig.qk_rope_head_dim={self.qk_rope_head_dim} must be even for RoPE")
        if self.v_head_dim > self.qk_nope_head_dim + self.qk_rope_head_dim:
            raise ValueError(f"ModelConfig.v_head_dim={self.v_head_dim} must be <= qk_nope_head_dim + "
                             f"qk_rope_head_dim = {self.qk_nope_head_dim + self.qk_rope_head_dim} (the "
                             "attention kernels take the values padded to the query's width)")
        if self.n_kv_heads != self.n_heads:
            raise ValueError(f"ModelConfig.n_kv_heads={self.n_kv_heads}: multi-head latent attention gives "
                             f"every head its own key and value; set n_kv_heads = n_heads = {self.n_heads}")
        if self.head_dim:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim}: attention_kind='mla' sizes its heads by "
                             "qk_nope_head_dim, qk_rope_head_dim and v_head_dim; leave head_dim at 0")

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
        if self.moe_tile_rows < 8 or self.moe_tile_rows % 8:
            raise ValueError(f"ModelConfig.moe_tile_rows={self.moe_tile_rows!r} must be a positive multiple "
                             "of 8 (a TPU tile's sublanes; 128 by default, MaxText's tile_batch_seq is 512)")

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
    def mla(self) -> bool:
        return self.attention_kind == "mla"

    @property
    def effective_head_dim(self) -> int:
        """The query's and key's width a head (what the scores contract over and are scaled by): MLA's
        qk_nope_head_dim + qk_rope_head_dim, else head_dim or d_model / n_heads."""
        if self.mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim or self.d_model // self.n_heads

    @property
    def value_head_dim(self) -> int:
        """The value's width a head (and the attention output's): MLA's v_head_dim, else the head dim."""
        return self.v_head_dim if self.mla else self.effective_head_dim

    @property
    def rope_dim(self) -> int:
        """The dims RoPE rotates a head: MLA's decoupled qk_rope_head_dim, else the whole head."""
        return self.qk_rope_head_dim if self.mla else self.effective_head_dim

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
    return dict(_param_layout(cfg))      # a copy: the caller's to change


@functools.lru_cache(maxsize=256)   # the layout search asks for each candidate's model ~10^5 times
def _param_layout(cfg: ModelConfig) -> tuple[tuple[str, tuple[tuple[int, ...], tuple[str, ...]]], ...]:
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.effective_head_dim, cfg.effective_mlp_dim
    attention = {"attn_norm": ((D,), ("embed",))}
    if cfg.mla:
        attention |= mla_layout(cfg)
    else:
        attention |= {
            "wq": ((D, N, H), ("embed", "heads", "head_dim")),
            "wk": ((D, K, H), ("embed", "kv_heads", "head_dim")),
            "wv": ((D, K, H), ("embed", "kv_heads", "head_dim")),
            "wo": ((N, H, D), ("heads", "head_dim", "embed")),
        }
    attention["mlp_norm"] = ((D,), ("embed",))
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
    return tuple(out.items())


def mla_layout(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """One layer's multi-head latent attention parameters (DeepSeek-V3's, in its order): the query's down
    projection (D, Rq), its RMSNorm (Rq,) and up projection (Rq, N, Hn + Hr) (or, with q_lora_rank 0, one
    (D, N, Hn + Hr) projection), the joint down projection to the key-value latent and the shared RoPE key
    (D, Rkv + Hr), the latent's RMSNorm (Rkv,), its up projection to each head's nope key and value
    (Rkv, N, Hn + Hv), and the output projection (N, Hv, D). The "latent" axis is split as "embed" is (fsdp
    x expert, stages/train/mesh.py), so the up projections are sharded and gathered per layer like wq; a
    down projection's latent output stays whole (its embed input took those axes)."""
    D, N = cfg.d_model, cfg.n_heads
    Rq, Rkv, Hn, Hr, Hv = (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                           cfg.v_head_dim)
    if Rq:
        query = {"wq_a": ((D, Rq), ("embed", "latent")), "q_norm": ((Rq,), ("latent",)),
                 "wq_b": ((Rq, N, Hn + Hr), ("latent", "heads", "head_dim"))}
    else:
        query = {"wq": ((D, N, Hn + Hr), ("embed", "heads", "head_dim"))}
    return query | {
        "wkv_a": ((D, Rkv + Hr), ("embed", "latent")),
        "kv_norm": ((Rkv,), ("latent",)),
        "wkv_b": ((Rkv, N, Hn + Hv), ("latent", "heads", "head_dim")),
        "wo": ((N, Hv, D), ("heads", "head_dim", "embed")),
    }


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

    Multi-head latent attention (attention_kind "mla") counts its down and up projections as parameters (not
    its latents' norms), and its scores and values at their own widths: 3 * L * n_heads * (qk_nope_head_dim
    + qk_rope_head_dim + v_head_dim) * seq_len (the score matmul at the query's width, the value matmul at
    the value's), which is the 6 * L * n_heads * head_dim * seq_len above when the widths are equal.
    """
    c = param_counts(cfg)
    layers = c["layers"] - (sum(c.values()) - active_params(cfg)) - cfg.n_moe_layers * cfg.n_experts
    norms = 2 * cfg.d_model + (cfg.q_lora_rank + cfg.kv_lora_rank if cfg.mla else 0)
    n_matmul = layers - cfg.n_layers * norms + (c["unembed"] or c["embed"])
    widths = cfg.effective_head_dim + cfg.value_head_dim
    return 6.0 * n_matmul + 3.0 * cfg.n_layers * cfg.n_heads * widths * seq_len
