"""The decoder as Hugging Face transformers' `LlamaForCausalLM` sees it, both ways, without JAX or torch:
its config.json, and each of its tensors as a function of one of ours.

    from stages.train import hf
    hf.problem(model_config)                     # "" or one line naming a setting Llama cannot express
    hf.config_json(model_config, bos_id=1, eos_id=2, dtype="float32")     # what config.json holds
    for t in hf.tensors(model_config):           # in transformers' order
        t.name, t.param, t.layer                 # "model.layers.3.self_attn.q_proj.weight", "layers.wq", 3
        t.to_hf(ours[3])                         # (D, N, H) -> (N * H, D)
        t.from_hf(theirs)                        # and back
    hf.model_fields(json.load(open("config.json")))   # ModelConfig fields, or ValueError naming the setting

The layouts. Ours keeps heads as their own axis and the input dimension first (einsum "btd,dnh->btnh");
torch's Linear stores (out, in). RoPE needs no permutation: both rotate the pairs (i, i + H/2) (the
"rotate_half" layout; the permutation in Meta's conversion script is for the interleaved layout of Meta's
original checkpoints). The layers are stacked on a leading axis in our checkpoint and numbered in theirs.

RoPE parameters are written twice: `rope_parameters` (what transformers 5 reads, rope_theta inside) and the
older `rope_scaling` + `rope_theta` (transformers 4). transformers 5 prefers `rope_scaling` when present, so
the two hold the same dict. Our "ntk" scaling (a stretched base, applied at every length) is transformers'
default RoPE with that base as rope_theta; transformers' "dynamic" NTK, which changes the base only past
max_position_embeddings, is not the same model and is refused on import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from stages.train.configs import ModelConfig

ARCHITECTURE = "LlamaForCausalLM"
# Llama 3's fixed llama3-scaling shape and YaRN's default ramp: the only values model.rope_inv_freq uses.
LLAMA3_FREQ_FACTORS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
YARN_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}
# ModelConfig fields that say how the model computes, not what: no transformers setting is needed for them.
NUMERICS = ("dtype", "param_dtype", "attention_impl", "attention_block_q", "attention_block_k", "remat",
            "scan_layers", "init_std", "moe_impl", "sequence_parallel")
# ModelConfig fields config.json expresses (`config_json`, `model_fields`).
EXPRESSED = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim",
             "max_seq_len", "rope_theta", "rope_scaling", "rope_factor", "rope_original_max_len",
             "tie_embeddings", "norm_eps")


def problem(cfg: ModelConfig) -> str:
    """Why `cfg` cannot be exported as a LlamaForCausalLM, in one line, or "". A ModelConfig field that is
    neither expressed by config.json nor numerics only (a layer kind transformers' Llama lacks) fails when
    set away from its default: the export never writes a silently different model."""
    defaults = ModelConfig()
    for f in dataclasses.fields(ModelConfig):
        if f.name in EXPRESSED or f.name in NUMERICS:
            continue
        if getattr(cfg, f.name) != getattr(defaults, f.name):
            return (f"train.ModelConfig.{f.name}={getattr(cfg, f.name)!r} has no equivalent in transformers' "
                    f"{ARCHITECTURE}; the export would be a different model (unset it to export)")
    return ""


def rope_parameters(cfg: ModelConfig) -> dict:
    """transformers' rope_parameters for `cfg` (rope_theta included)."""
    H, s = cfg.effective_head_dim, cfg.rope_factor
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
    rope = rope_parameters(cfg)
    return {
        "architectures": [ARCHITECTURE], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.effective_mlp_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.effective_head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": rope["rope_theta"], "rope_parameters": rope,
        "rope_scaling": None if rope["rope_type"] == "default" else dict(rope),
        "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "pretraining_tp": 1, "initializer_range": cfg.init_std,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": dtype, "dtype": dtype,
        "use_cache": True,
    }


def model_fields(config: dict, where: str = "config.json") -> dict:
    """The ModelConfig fields a Hugging Face Llama config.json describes; ValueError naming the setting
    (and `where`) for anything our decoder would compute differently."""
    arch = config.get("architectures") or []
    if config.get("model_type") != "llama" or (arch and arch != [ARCHITECTURE]):
        raise ValueError(f"{where}: model_type={config.get('model_type')!r}, architectures={arch}: only "
                         f"model_type 'llama' ({ARCHITECTURE}) checkpoints can be loaded")
    fixed = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
    for name, want in fixed.items():
        if config.get(name, want) != want:
            raise ValueError(f"{where}: {name}={config[name]!r}; Refinery's decoder has {name}={want!r}")
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
    try:
        return fields | _rope_fields(config, where)
    except (KeyError, TypeError) as e:        # a rope setting missing or of the wrong kind
        raise ValueError(f"{where}: its rope settings cannot be read ({type(e).__name__}: {e}): "
                         f"rope_scaling={config.get('rope_scaling')!r}") from None


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
    `configs.param_layout`), the layer it is in (None: not stacked), and the two conversions of one
    (unstacked) array."""

    name: str
    shape: tuple[int, ...]
    param: str
    layer: int | None
    to_hf: Callable[[np.ndarray], np.ndarray]
    from_hf: Callable[[np.ndarray], np.ndarray]


def tensors(cfg: ModelConfig) -> Iterator[Tensor]:
    """Every tensor of the LlamaForCausalLM, in transformers' order (lm_head absent when tied)."""
    D, N, K, H, F, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.effective_head_dim,
                        cfg.effective_mlp_dim, cfg.vocab_size)
    def heads_in(n):       # ours (D, n, H) <-> torch Linear (n * H, D)
        return (lambda a: a.reshape(D, n * H).T, lambda a: a.T.reshape(D, n, H))

    transposed = (lambda a: a.T, lambda a: a.T)
    yield Tensor("model.embed_tokens.weight", (V, D), "embed", None, _same, _same)
    per_layer = (
        ("input_layernorm.weight", (D,), "attn_norm", (_same, _same)),
        ("self_attn.q_proj.weight", (N * H, D), "wq", heads_in(N)),
        ("self_attn.k_proj.weight", (K * H, D), "wk", heads_in(K)),
        ("self_attn.v_proj.weight", (K * H, D), "wv", heads_in(K)),
        # ours (N, H, D) <-> torch Linear (D, N * H)
        ("self_attn.o_proj.weight", (D, N * H), "wo",
         (lambda a: a.reshape(N * H, D).T, lambda a: a.T.reshape(N, H, D))),
        ("post_attention_layernorm.weight", (D,), "mlp_norm", (_same, _same)),
        ("mlp.gate_proj.weight", (F, D), "w_gate", transposed),
        ("mlp.up_proj.weight", (F, D), "w_up", transposed),
        ("mlp.down_proj.weight", (D, F), "w_down", transposed),
    )
    for i in range(cfg.n_layers):
        for suffix, shape, param, (to_hf, from_hf) in per_layer:
            yield Tensor(f"model.layers.{i}.{suffix}", shape, f"layers.{param}", i, to_hf, from_hf)
    yield Tensor("model.norm.weight", (D,), "final_norm", None, _same, _same)
    if not cfg.tie_embeddings:
        yield Tensor("lm_head.weight", (V, D), "unembedding", None, *transposed)


def _same(a: np.ndarray) -> np.ndarray:
    return a
