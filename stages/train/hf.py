"""The decoder as Hugging Face transformers sees it, both ways, without JAX or torch: its config.json, and
each of its tensors as a function of one of ours. A dense model is `LlamaForCausalLM`; a mixture of experts
is `MixtralForCausalLM` (softmax routing over every expert, top-k renormalised) or `Glm4MoeForCausalLM`
(DeepSeek-V3's routing: sigmoid scores, a selection-only bias, group-limited top-k, shared experts, leading
dense layers), whichever holds it exactly (`architecture`). A model with multi-head latent attention
(ModelConfig.attention_kind "mla") is `DeepseekV3ForCausalLM`, whose MoE block is GLM-4-MoE's (the same
tensors) and whose dense model is all leading dense layers (first_k_dense_replace = num_hidden_layers).

    from stages.train import hf
    hf.problem(model_config)                     # "" or one line naming a setting no class can express
    hf.architecture(model_config)                # "LlamaForCausalLM", "MixtralForCausalLM", ...
    hf.config_json(model_config, bos_id=1, eos_id=2, dtype="float32")     # what config.json holds
    for t in hf.tensors(model_config):           # in transformers' order
        t.name, t.param, t.index                 # "model.layers.3.self_attn.q_proj.weight", "layers.wq", (3,)
        t.to_hf(ours[3])                         # (D, N, H) -> (N * H, D)
        t.from_hf(theirs)                        # and back
    hf.model_fields(json.load(open("config.json")))   # ModelConfig fields, or ValueError naming the setting

The layouts. Ours keeps heads as their own axis and the input dimension first (einsum "btd,dnh->btnh");
torch's Linear stores (out, in). RoPE needs no permutation: both rotate the pairs (i, i + H/2) (the
"rotate_half" layout; the permutation in Meta's conversion script is for the interleaved layout of Meta's
original checkpoints). The layers are stacked on a leading axis in our checkpoint and numbered in theirs;
an MoE layer's experts are stacked on the next axis in ours and numbered in theirs (`experts.{e}.`), the
per-expert layout the hub, vLLM and llama.cpp read (transformers 5 fuses them on load). A tensor's `index`
is where it sits in our stacked parameter: (layer,) or (layer, expert).

RoPE parameters are written twice: `rope_parameters` (what transformers 5 reads, rope_theta inside) and the
older `rope_scaling` + `rope_theta` (transformers 4). transformers 5 prefers `rope_scaling` when present, so
the two hold the same dict. DeepSeek-V3 rotates only the qk_rope_head_dim tail of each query head and the
shared key, in the rotate_half layout when `rope_interleave` is false, which the export writes (its
default, true, would read the pairs (2i, 2i + 1)); its latent norms' epsilon is 1e-6 as ours
(model.MLA_NORM_EPS). Our "ntk" scaling (a stretched base, applied at every length) is transformers'
default RoPE with that base as rope_theta; transformers' "dynamic" NTK, which changes the base only past
max_position_embeddings, is not the same model and is refused on import. GLM-4-MoE rotates only part of
each head unless told otherwise (`partial_rotary_factor`, 0.5 by default): the export writes 1.0 at the top
level and in both rope dicts, where transformers, vLLM and llama.cpp each look for it.

A capacity factor is a training setting: Refinery's own forward pass drops the assignments past an expert's
capacity, the exported classes (and vLLM, llama.cpp) drop none. The two are the same model wherever no
buffer overflows; `notes` says so, and the model card carries it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from stages.train.model_config import ModelConfig

if TYPE_CHECKING:        # numpy only names the conversions' types: planning imports this (export's check)
    import numpy as np

ARCHITECTURE = "LlamaForCausalLM"         # a dense model
MIXTRAL, GLM4_MOE = "MixtralForCausalLM", "Glm4MoeForCausalLM"
DEEPSEEK_V3 = "DeepseekV3ForCausalLM"     # multi-head latent attention, dense or with GLM-4-MoE's MoE block
MODEL_TYPES = {ARCHITECTURE: "llama", MIXTRAL: "mixtral", GLM4_MOE: "glm4_moe", DEEPSEEK_V3: "deepseek_v3"}
# Llama 3's fixed llama3-scaling shape and YaRN's default ramp: the only values model.rope_inv_freq uses.
LLAMA3_FREQ_FACTORS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
YARN_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}
# ModelConfig fields that say how the model computes, not what: no transformers setting is needed for them.
NUMERICS = ("dtype", "param_dtype", "attention_impl", "attention_block_q", "attention_block_k", "remat",
            "scan_layers", "init_std", "moe_impl", "moe_tile_rows", "sequence_parallel")
# ModelConfig fields config.json expresses (`config_json`, `model_fields`).
EXPRESSED = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim",
             "max_seq_len", "rope_theta", "rope_scaling", "rope_factor", "rope_original_max_len",
             "tie_embeddings", "norm_eps")
# What the MoE classes add (config_json writes them; `_moe_problem` says which values each can hold), and the
# MoE fields that only change training: the balancing losses, the bias's update rule, the capacity (`notes`).
MOE_EXPRESSED = ("n_experts", "n_experts_per_token", "n_shared_experts", "moe_mlp_dim", "n_dense_layers",
                 "router_score", "router_norm_topk", "router_scale", "router_groups", "router_topk_groups")
MOE_TRAINING = ("moe_capacity_factor", "moe_aux_loss", "moe_aux_scope", "moe_router_z_loss",
                "moe_bias_update_rate")
# What DeepseekV3ForCausalLM adds: multi-head latent attention's kind and sizes.
MLA_EXPRESSED = ("attention_kind", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                 "v_head_dim")


def architecture(cfg: ModelConfig) -> str:
    """The transformers class that holds `cfg`: Llama for a dense model; for an MoE, Mixtral's softmax router
    or GLM-4-MoE's sigmoid one; DeepSeek-V3 for multi-head latent attention (`problem` says whether it holds
    every setting)."""
    if cfg.mla:
        return DEEPSEEK_V3
    if not cfg.n_experts:
        return ARCHITECTURE
    return MIXTRAL if cfg.router_score == "softmax" else GLM4_MOE


def problem(cfg: ModelConfig) -> str:
    """Why `cfg` cannot be exported as `architecture(cfg)`, in one line, or "". A ModelConfig field that is
    neither expressed by its config.json nor numerics only (a layer kind the class lacks) fails when set
    away from its default: the export never writes a silently different model."""
    defaults, arch = ModelConfig(), architecture(cfg)
    moe = MOE_EXPRESSED + MOE_TRAINING if cfg.n_experts else ()
    moe += MLA_EXPRESSED if cfg.mla else ()
    for f in dataclasses.fields(ModelConfig):
        if f.name in EXPRESSED or f.name in NUMERICS or f.name in moe:
            continue
        if getattr(cfg, f.name) != getattr(defaults, f.name):
            return (f"train.ModelConfig.{f.name}={getattr(cfg, f.name)!r} has no equivalent in transformers' "
                    f"{arch}; the export would be a different model (unset it to export)")
    return _moe_problem(cfg, arch) if cfg.n_experts else ""


def _moe_problem(cfg: ModelConfig, arch: str) -> str:
    """What of an MoE `arch` cannot hold: Mixtral has no bias, groups, scale, shared or dense layers and
    always renormalises; GLM-4-MoE (and DeepSeek-V3, the same block) scores each group by its best two
    experts and always has shared ones, and DeepSeek-V3 routes by sigmoid scores only."""
    if arch == DEEPSEEK_V3 and cfg.router_score != "sigmoid":
        return (f"train.ModelConfig.router_score={cfg.router_score!r}: transformers' {DEEPSEEK_V3} "
                "(multi-head latent attention) routes by sigmoid scores; export needs router_score='sigmoid'")
    if arch == MIXTRAL:
        fixed = (("router_norm_topk", True, "renormalises the top-k weights always"),
                 ("router_scale", 1.0, "has no routed scaling factor"),
                 ("router_groups", 1, "routes over every expert, not within groups"),
                 ("n_shared_experts", 0, "has no shared experts"),
                 ("n_dense_layers", 0, "has an MoE block in every layer"),
                 ("moe_bias_update_rate", 0.0, "has no selection bias"))
        for name, want, why in fixed:
            if name == "router_norm_topk" and cfg.n_experts_per_token == cfg.n_experts:
                continue                           # top-E of E: renormalising changes nothing
            if getattr(cfg, name) != want:
                return (f"train.ModelConfig.{name}={getattr(cfg, name)!r}: transformers' {MIXTRAL} (softmax "
                        f"routing) {why}; export needs {name}={want!r}, or the sigmoid router "
                        f"({GLM4_MOE})")
        return ""
    if cfg.n_experts // cfg.router_groups < 2:
        return (f"train.ModelConfig.router_groups={cfg.router_groups}: groups of one expert; transformers' "
                f"{GLM4_MOE} scores a group by its best two (export needs n_experts / router_groups >= 2)")
    if cfg.n_shared_experts < 1:
        return (f"train.ModelConfig.n_shared_experts=0: transformers' {arch} (sigmoid routing) always "
                "has shared experts (vLLM builds them too); export needs n_shared_experts >= 1")
    return ""


def notes(cfg: ModelConfig) -> list[str]:
    """What differs between the exported model and Refinery's forward pass where it may (the model card's)."""
    if cfg.n_experts and cfg.moe_capacity_factor:
        return [f"Trained with an expert capacity factor of {cfg.moe_capacity_factor:g}: Refinery's forward "
                "pass drops the assignments past an expert's capacity, transformers, vLLM and llama.cpp run "
                "every one (dropless). The two agree wherever no expert's buffer overflows."]
    return []


def rope_parameters(cfg: ModelConfig) -> dict:
    """transformers' rope_parameters for `cfg` (rope_theta included)."""
    H, s = cfg.rope_dim, cfg.rope_factor
    if cfg.rope_scaling == "none" or (s == 1.0 and cfg.rope_scaling != "ntk"):
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "ntk":      # model.rope_inv_freq: the base stretched by s^(H / (H - 2))
        return {"rope_type": "default", "rope_theta": cfg.rope_theta * s ** (H / (H - 2)) if H > 2
                else cfg.rope_theta}
    if cfg.rope_scaling == "linear":
        return {"rope_type": "linear", "rope_theta": cfg.rope_theta, "factor": s}
    extra = LLAMA3_FREQ_FACTORS if cfg.rope_scaling == "llama3" else {**YARN_BETAS, "truncate": True}
    return {"rope_type": cfg.rope_scaling, "rope_theta": cfg.rope_theta, "factor": s,
            "original_max_position_embeddings": cfg.original_max_len, **extra}


def config_json(cfg: ModelConfig, *, bos_id: int, eos_id: int, dtype: str) -> dict:
    """config.json of the exported model; ValueError when `problem(cfg)`."""
    if why := problem(cfg):
        raise ValueError(why)
    arch, rope = architecture(cfg), rope_parameters(cfg)
    if arch == GLM4_MOE:                 # every head dimension rotated, wherever a reader looks for it
        rope = rope | {"partial_rotary_factor": 1.0}
    common = {
        "architectures": [arch], "model_type": MODEL_TYPES[arch],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.effective_mlp_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.effective_head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": rope["rope_theta"], "rope_parameters": rope,
        "rope_scaling": None if rope["rope_type"] == "default" else dict(rope),
        "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": dtype, "dtype": dtype,
        "use_cache": True,
    }
    if arch == ARCHITECTURE:
        return common | {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
    if arch == DEEPSEEK_V3:
        return common | _deepseek_fields(cfg)
    moe = {"num_experts_per_tok": cfg.n_experts_per_token}
    if arch == MIXTRAL:
        return common | moe | {"intermediate_size": cfg.effective_moe_mlp_dim,
                               "num_local_experts": cfg.n_experts, "sliding_window": None,
                               "router_jitter_noise": 0.0, "output_router_logits": False}
    return common | moe | {
        "moe_intermediate_size": cfg.effective_moe_mlp_dim, "n_routed_experts": cfg.n_experts,
        "n_shared_experts": cfg.n_shared_experts, "first_k_dense_replace": cfg.n_dense_layers,
        "n_group": cfg.router_groups, "topk_group": cfg.router_topk_groups,
        "norm_topk_prob": cfg.router_norm_topk, "routed_scaling_factor": cfg.router_scale,
        "use_qk_norm": False, "attention_bias": False, "partial_rotary_factor": 1.0,
        "num_nextn_predict_layers": 0}


def _deepseek_fields(cfg: ModelConfig) -> dict:
    """What DeepseekV3's config.json adds: MLA's sizes, RoPE in the rotate_half layout, and the MoE block
    as GLM-4-MoE's; a dense model is n_layers leading dense layers (the MoE sizes then unused, written as
    one expert so the file stays a valid DeepSeek-V3 config)."""
    moe = cfg.n_experts > 0
    return {
        "head_dim": cfg.qk_rope_head_dim,            # what DeepseekV3Config sets: the rotary embedding's dims
        "q_lora_rank": cfg.q_lora_rank or None, "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim, "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim, "rope_interleave": False, "attention_bias": False,
        "first_k_dense_replace": cfg.n_dense_layers if moe else cfg.n_layers,
        "n_routed_experts": cfg.n_experts if moe else 1,
        "num_experts_per_tok": cfg.n_experts_per_token if moe else 1,
        "moe_intermediate_size": cfg.effective_moe_mlp_dim, "n_shared_experts": cfg.n_shared_experts or 1,
        "n_group": cfg.router_groups if moe else 1, "topk_group": cfg.router_topk_groups if moe else 1,
        "norm_topk_prob": cfg.router_norm_topk, "routed_scaling_factor": cfg.router_scale,
        "num_nextn_predict_layers": 0, "num_mtp_layers": 0}


def model_fields(config: dict, where: str = "config.json") -> dict:
    """The ModelConfig fields a Hugging Face Llama, Mixtral, GLM-4-MoE or DeepSeek-V3 config.json describes;
    ValueError naming the setting (and `where`) for anything our decoder would compute differently."""
    arch = config.get("architectures") or []
    by_type = {t: a for a, t in MODEL_TYPES.items()}
    kind = config.get("model_type")
    if kind not in by_type or (arch and arch != [by_type[kind]]):
        raise ValueError(f"{where}: model_type={kind!r}, architectures={arch}: only model_type "
                         f"{', '.join(repr(t) for t in by_type)} ({', '.join(by_type.values())}) checkpoints "
                         "can be loaded")
    fixed = {"hidden_act": "silu", "attention_bias": False}
    fixed |= {"mlp_bias": False, "pretraining_tp": 1} if kind == "llama" else {}
    fixed |= {"sliding_window": None} if kind == "mixtral" else {}
    fixed |= {"use_qk_norm": False, "partial_rotary_factor": 1.0, "num_nextn_predict_layers": 0} \
        if kind == "glm4_moe" else {}
    fixed |= {"rope_interleave": False} if kind == "deepseek_v3" else {}
    for name, want in fixed.items():
        value = config.get(name, want)
        if name == "partial_rotary_factor":           # GLM's default, 0.5, when no file says otherwise
            rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
            value = config.get(name, rope.get(name, 0.5))
        if name == "rope_interleave":                 # DeepSeek-V3's default: the pairs (2i, 2i + 1)
            value = config.get(name, True)
        if value != want:
            raise ValueError(f"{where}: {name}={value!r}; Refinery's decoder has {name}={want!r}")
    size = {name: _count(config, name, where) for name in REQUIRED}
    heads = size["num_attention_heads"]
    optional = {name: _count(config, name, where, required=False)
                for name in ("num_key_value_heads", "head_dim")}
    fields = {"vocab_size": size["vocab_size"], "d_model": size["hidden_size"],
              "n_layers": size["num_hidden_layers"], "n_heads": heads,
              "n_kv_heads": optional["num_key_value_heads"] or heads,
              "head_dim": optional["head_dim"] or size["hidden_size"] // heads,
              "mlp_dim": size["intermediate_size"], "max_seq_len": size["max_position_embeddings"],
              "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
              "norm_eps": _number(config, "rms_norm_eps", 1e-6, where)}
    if kind == "mixtral":
        fields |= {"n_experts": _count(config, "num_local_experts", where),
                   "n_experts_per_token": _count(config, "num_experts_per_tok", where),
                   "moe_mlp_dim": size["intermediate_size"], "router_score": "softmax",
                   "router_norm_topk": True}
    elif kind == "glm4_moe":
        fields |= {"n_experts": _count(config, "n_routed_experts", where),
                   "n_experts_per_token": _count(config, "num_experts_per_tok", where),
                   "moe_mlp_dim": _count(config, "moe_intermediate_size", where),
                   "n_shared_experts": _count(config, "n_shared_experts", where),
                   "n_dense_layers": int(config.get("first_k_dense_replace", 1)),
                   "router_groups": _count(config, "n_group", where),
                   "router_topk_groups": _count(config, "topk_group", where),
                   "router_norm_topk": bool(config.get("norm_topk_prob", True)),
                   "router_scale": _number(config, "routed_scaling_factor", 1.0, where),
                   "router_score": "sigmoid"}
    elif kind == "deepseek_v3":
        fields |= _deepseek_model_fields(config, where, size)
    try:
        return fields | _rope_fields(config, where)
    except (KeyError, TypeError) as e:        # a rope setting missing or of the wrong kind
        raise ValueError(f"{where}: its rope settings cannot be read ({type(e).__name__}: {e}): "
                         f"rope_scaling={config.get('rope_scaling')!r}") from None


def _deepseek_model_fields(config: dict, where: str, size: dict) -> dict:
    """A DeepSeek-V3 config.json's MLA sizes, and its MoE block unless every layer is a leading dense one."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if rope.get("mscale_all_dim"):
        raise ValueError(f"{where}: rope mscale_all_dim={rope['mscale_all_dim']!r} scales DeepSeek-V3's "
                         "softmax by mscale^2; Refinery's decoder scales only the rotated dims (YaRN's "
                         "temperature on cos and sin)")
    fields = {"attention_kind": "mla", "head_dim": 0, "n_kv_heads": size["num_attention_heads"],
              "q_lora_rank": _count(config, "q_lora_rank", where, required=False),
              **{name: _count(config, name, where) for name in
                 ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}}
    dense = int(config.get("first_k_dense_replace", 3))
    if dense >= size["num_hidden_layers"]:
        return fields
    return fields | {"n_experts": _count(config, "n_routed_experts", where),
                     "n_experts_per_token": _count(config, "num_experts_per_tok", where),
                     "moe_mlp_dim": _count(config, "moe_intermediate_size", where),
                     "n_shared_experts": _count(config, "n_shared_experts", where), "n_dense_layers": dense,
                     "router_groups": _count(config, "n_group", where),
                     "router_topk_groups": _count(config, "topk_group", where),
                     "router_norm_topk": bool(config.get("norm_topk_prob", True)),
                     "router_scale": _number(config, "routed_scaling_factor", 1.0, where),
                     "router_score": "sigmoid"}


# The sizes every Llama config.json states (transformers' defaults for them describe a 7B model: never
# assumed). Each must be a positive integer.
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings")


def _count(config: dict, name: str, where: str, required: bool = True) -> int:
    """`config[name]` as a positive int (0 when absent or null and not `required`); ValueError naming the
    file and the setting otherwise."""
    value = config.get(name)
    if value is None and not required:
        return 0
    if name not in config:
        raise ValueError(f"{where} has no {name} (a Llama config.json states {', '.join(REQUIRED)})")
    if type(value) is not int or value < 1:
        raise ValueError(f"{where}: {name}={value!r} must be a positive integer")
    return value


def _number(config: dict, name: str, default: float, where: str) -> float:
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}: {name}={value!r} must be a positive number")
    return float(value)


def _rope_fields(config: dict, where: str) -> dict:
    rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    out = {"rope_theta": theta, "rope_scaling": "none", "rope_factor": 1.0, "rope_original_max_len": 0}
    if kind == "default":
        return out
    if kind not in ("linear", "llama3", "yarn"):
        raise ValueError(f"{where}: rope type {kind!r} is not one Refinery's decoder computes (default, "
                         "linear, llama3, yarn)")
    expected = {"llama3": LLAMA3_FREQ_FACTORS, "yarn": YARN_BETAS}.get(kind, {})
    for name, want in expected.items():
        if float(rope.get(name, want)) != want:
            raise ValueError(f"{where}: rope {kind} {name}={rope[name]!r}; Refinery's decoder uses {want}")
    for name in ("attention_factor", "mscale", "mscale_all_dim"):
        if kind == "yarn" and rope.get(name) not in (None, 1, 1.0):
            raise ValueError(f"{where}: rope yarn {name}={rope[name]!r}; Refinery's decoder derives the "
                             "attention factor from the scaling factor alone")
    if kind == "yarn" and rope.get("truncate", True) is not True:
        raise ValueError(f"{where}: rope yarn truncate={rope['truncate']!r}; Refinery's decoder truncates")
    out |= {"rope_scaling": kind, "rope_factor": float(rope["factor"])}
    if kind != "linear":
        out["rope_original_max_len"] = int(rope.get("original_max_position_embeddings")
                                           or config["max_position_embeddings"])
    return out


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One transformers tensor: its name, shape, the parameter of ours it comes from (a key of
    `model_config.param_layout`), where in that stacked parameter it sits (None: not stacked; (layer,) or
    (layer, expert)), the model layer it belongs to (for progress), and the two conversions of one array."""

    name: str
    shape: tuple[int, ...]
    param: str
    index: tuple[int, ...] | None
    to_hf: Callable[[np.ndarray], np.ndarray]
    from_hf: Callable[[np.ndarray], np.ndarray]
    layer: int | None = None
    dtype: str = ""                    # "": the export's dtype; GLM-4-MoE's router is float32 always


def tensors(cfg: ModelConfig) -> Iterator[Tensor]:
    """Every tensor of `architecture(cfg)`, in transformers' order (lm_head absent when tied)."""
    D, N, K, H, F, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.effective_head_dim,
                        cfg.effective_mlp_dim, cfg.vocab_size)
    arch = architecture(cfg)

    def heads_in(n):       # ours (D, n, H) <-> torch Linear (n * H, D)
        return (lambda a: a.reshape(D, n * H).T, lambda a: a.T.reshape(D, n, H))

    transposed = (lambda a: a.T, lambda a: a.T)
    yield Tensor("model.embed_tokens.weight", (V, D), "embed", None, _same, _same)
    grouped = (
        ("self_attn.q_proj.weight", (N * H, D), "wq", heads_in(N)),
        ("self_attn.k_proj.weight", (K * H, D), "wk", heads_in(K)),
        ("self_attn.v_proj.weight", (K * H, D), "wv", heads_in(K)),
        # ours (N, H, D) <-> torch Linear (D, N * H)
        ("self_attn.o_proj.weight", (D, N * H), "wo",
         (lambda a: a.reshape(N * H, D).T, lambda a: a.T.reshape(N, H, D))),
    )
    attention = (("input_layernorm.weight", (D,), "attn_norm", (_same, _same)),
                 *(_mla_tensors(cfg) if cfg.mla else grouped),
                 ("post_attention_layernorm.weight", (D,), "mlp_norm", (_same, _same)))
    dense_mlp = (("mlp.gate_proj.weight", (F, D), "w_gate", transposed),
                 ("mlp.up_proj.weight", (F, D), "w_up", transposed),
                 ("mlp.down_proj.weight", (D, F), "w_down", transposed))
    dense = cfg.n_layers - cfg.n_moe_layers
    for i in range(cfg.n_layers):
        stack, j = ("layers", i) if i < dense else ("moe_layers", i - dense)
        for suffix, shape, param, (to_hf, from_hf) in attention + (dense_mlp if i < dense else ()):
            yield Tensor(f"model.layers.{i}.{suffix}", shape, f"{stack}.{param}", (j,), to_hf, from_hf, i)
        if i >= dense:
            yield from _moe_block(cfg, arch, i, j, transposed)
    yield Tensor("model.norm.weight", (D,), "final_norm", None, _same, _same)
    if not cfg.tie_embeddings:
        yield Tensor("lm_head.weight", (V, D), "unembedding", None, *transposed)


def _mla_tensors(cfg: ModelConfig) -> tuple:
    """One layer's multi-head latent attention as DeepseekV3Attention holds it: (suffix, torch shape, our
    parameter, (to_hf, from_hf)). torch's Linear stores (out, in); a head's query is its Hn nope dims then
    its Hr rope dims, a head's kv_b rows its Hn key dims then its Hv value dims, as ours."""
    D, N, Rq, Rkv = cfg.d_model, cfg.n_heads, cfg.q_lora_rank, cfg.kv_lora_rank
    Hqk, Hr, Hkv, Hv = cfg.effective_head_dim, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim + cfg.v_head_dim, \
        cfg.v_head_dim
    transposed = (lambda a: a.T, lambda a: a.T)

    def heads_out(rows, n, h):     # ours (rows, n, h) <-> torch Linear (n * h, rows)
        return (lambda a: a.reshape(rows, n * h).T, lambda a: a.T.reshape(rows, n, h))

    query = ((("self_attn.q_a_proj.weight", (Rq, D), "wq_a", transposed),
              ("self_attn.q_a_layernorm.weight", (Rq,), "q_norm", (_same, _same)),
              ("self_attn.q_b_proj.weight", (N * Hqk, Rq), "wq_b", heads_out(Rq, N, Hqk))) if Rq else
             (("self_attn.q_proj.weight", (N * Hqk, D), "wq", heads_out(D, N, Hqk)),))
    return query + (
        ("self_attn.kv_a_proj_with_mqa.weight", (Rkv + Hr, D), "wkv_a", transposed),
        ("self_attn.kv_a_layernorm.weight", (Rkv,), "kv_norm", (_same, _same)),
        ("self_attn.kv_b_proj.weight", (N * Hkv, Rkv), "wkv_b", heads_out(Rkv, N, Hkv)),
        # ours (N, Hv, D) <-> torch Linear (D, N * Hv)
        ("self_attn.o_proj.weight", (D, N * Hv), "wo",
         (lambda a: a.reshape(N * Hv, D).T, lambda a: a.T.reshape(N, Hv, D))),
    )


def _moe_block(cfg: ModelConfig, arch: str, i: int, j: int, transposed) -> Iterator[Tensor]:
    """Model layer i's MoE block (our moe_layers[j]), per expert: Mixtral's `block_sparse_moe.` (w1 gate,
    w3 up, w2 down) or GLM-4-MoE's `mlp.` (gate_proj, up_proj, down_proj, the selection bias and the shared
    experts as one MLP of n_shared x the expert width)."""
    D, E, Fe = cfg.d_model, cfg.n_experts, cfg.effective_moe_mlp_dim
    block = f"model.layers.{i}.block_sparse_moe." if arch == MIXTRAL else f"model.layers.{i}.mlp."
    sigmoid = arch in (GLM4_MOE, DEEPSEEK_V3)              # the same MoE block and tensor names
    router_dtype = "float32" if sigmoid else ""
    yield Tensor(block + "gate.weight", (E, D), "moe_layers.router", (j,), *transposed, i, router_dtype)
    if sigmoid:
        yield Tensor(block + "gate.e_score_correction_bias", (E,), "moe_layers.router_bias", (j,), _same,
                     _same, i, "float32")
    names = {"experts_gate": "w1", "experts_down": "w2", "experts_up": "w3"} if arch == MIXTRAL else \
        {"experts_gate": "gate_proj", "experts_up": "up_proj", "experts_down": "down_proj"}
    for e in range(E):
        for param, name in names.items():
            shape = (D, Fe) if param == "experts_down" else (Fe, D)
            yield Tensor(f"{block}experts.{e}.{name}.weight", shape, f"moe_layers.{param}", (j, e),
                         *transposed, i)
    if sigmoid:
        S = cfg.n_shared_experts * Fe
        for param, name, shape in (("shared_gate", "gate_proj", (S, D)), ("shared_up", "up_proj", (S, D)),
                                   ("shared_down", "down_proj", (D, S))):
            yield Tensor(f"{block}shared_experts.{name}.weight", shape, f"moe_layers.{param}", (j,),
                         *transposed, i)


def implied_zero(cfg: ModelConfig) -> frozenset[str]:
    """Our parameters the class holds no tensor for, as it fixes them at zero: Mixtral's selection bias."""
    return frozenset({"moe_layers.router_bias"}) if architecture(cfg) == MIXTRAL else frozenset()


def _same(a: np.ndarray) -> np.ndarray:
    return a
