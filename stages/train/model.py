"""A Llama-style decoder in Flax NNX: RMSNorm, RoPE (with long-context scalings), grouped-query attention,
SwiGLU, optional tied embeddings; the layers are stacked and applied with `jax.lax.scan`.

    from flax import nnx
    from stages.train.model_config import ModelConfig
    from stages.train.model import Transformer
    cfg = ModelConfig(vocab_size=4096, d_model=256, n_layers=4)
    net = Transformer(cfg, rngs=nnx.Rngs(0))
    hidden, _ = net(tokens)                                   # tokens (B, T) int32 -> (B, T, D) in cfg.dtype
    logits = net.logits(hidden)                               # (B, T, V) float32 (or hidden @ net.unembed())
    hidden, _ = net(tokens, segment_ids=doc_ids)              # packed documents never see each other

    cache = net.init_cache(batch=1, max_len=64)               # KV-cache decoding
    hidden, cache = net(prompt, cache=cache)                  # prefill (P tokens)
    hidden, cache = net(next_token, cache=cache)              # then one (or a few) tokens at a time

The config, parameter counts and FLOPs live in `model_config.py`, which imports no JAX; this module does.

Remat policies (`ModelConfig.remat`, see `REMAT_POLICIES`), applied to each scanned layer:
    none            no rematerialization: every activation is kept (fastest, most memory)
    full            save nothing but each layer's input; recompute the whole layer (least memory)
    minimal         save the attention projections (q, k, v, out); recompute attention and the MLP, whose
                    3 * F activations per token are most of a layer's memory
    save_qkv_proj   save only the q, k, v projections
    dots_no_batch   save every weight matmul's output (`dots_with_no_batch_dims_saveable`); recompute
                    attention scores and the elementwise ops
    save_dots       save every matmul, attention's batched ones included (`checkpoint_dots`)
    offload_full    what full saves (each layer's input, tagged "layer_input"), kept in pinned host memory
                    instead of HBM: the least HBM of all; each input goes to the host in the forward pass
                    and comes back for the layer's recompute
    offload_minimal what minimal saves, in host memory: about full's HBM, minimal's recompute
    offload_dots_no_batch
                    what dots_no_batch saves, in host memory (`offload_dot_with_no_batch_dims`): about
                    full's HBM, the least recompute of the offload policies and the most host memory
The offload_* policies need host memory beside the accelerator (`OFFLOAD_PLATFORMS`). Where the platform
the step is traced for has none (CPU: its "device" memory is host memory), `remat_policy` uses the policy
named after "offload_" instead (the same activations, kept on the device) and logs one warning.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from stages.train import moe
from stages.train.attention import attention
from stages.train.model_config import REMAT_NAMES, ModelConfig, mla_layout, param_layout
from stages.train.sharding import target_platform, with_logical_constraint

log = logging.getLogger(__name__)
EMPTY_SLOT = -1          # the segment id of a KV-cache slot not yet written: no query has it
MLA_NORM_EPS = 1e-6      # the epsilon of MLA's latent RMSNorms: DeepSeek's and transformers' fixed value

_cp = jax.checkpoint_policies
_PROJECTIONS = ("query_proj", "key_proj", "value_proj", "out_proj")     # what "minimal" saves
OFFLOAD = "offload_"     # an "offload_<policy>" policy keeps what <policy> saves in host memory
OFFLOAD_PLATFORMS = ("tpu", "gpu")   # platforms with pinned host memory that XLA offloads activations to


def _offload(*names):
    """Save nothing on the device; move the activations tagged `names` to pinned host memory."""
    return _cp.save_and_offload_only_these_names(names_which_can_be_saved=(),
                                                 names_which_can_be_offloaded=names,
                                                 offload_src="device", offload_dst="pinned_host")


# ModelConfig.remat -> the policy each scanned layer is checkpointed with (None: no remat). Look policies up
# with `remat_policy`, which checks that the platform can offload.
REMAT_POLICIES = {
    "none": None,
    "full": _cp.nothing_saveable,
    "minimal": _cp.save_only_these_names(*_PROJECTIONS),
    "save_qkv_proj": _cp.save_only_these_names(*_PROJECTIONS[:3]),
    "dots_no_batch": _cp.dots_with_no_batch_dims_saveable,
    "save_dots": _cp.checkpoint_dots,
    "offload_full": _offload("layer_input"),
    "offload_minimal": _offload(*_PROJECTIONS),
    "offload_dots_no_batch": _cp.offload_dot_with_no_batch_dims("device", "pinned_host"),
}
assert tuple(REMAT_POLICIES) == REMAT_NAMES
assert all(name.removeprefix(OFFLOAD) in REMAT_POLICIES for name in REMAT_POLICIES)


def remat_policy(name: str):
    """The checkpoint policy of ModelConfig.remat=`name` for the platform being traced for (the active
    mesh's: "tpu" when compiling ahead of time for a TPU topology on a CPU machine). An offload policy
    where that platform has no separate host memory becomes the policy it is named after (offload_minimal
    -> minimal: the same activations, kept on the device), with one warning per process."""
    if name not in REMAT_POLICIES:
        raise ValueError(f"remat={name!r} is not one of {tuple(REMAT_POLICIES)}")
    platform = target_platform()
    if name.startswith(OFFLOAD) and platform not in OFFLOAD_PLATFORMS:
        fallback = name.removeprefix(OFFLOAD)
        _warn_no_offload(name, platform, fallback)
        return REMAT_POLICIES[fallback]
    return REMAT_POLICIES[name]


@functools.cache
def _warn_no_offload(name: str, platform: str, fallback: str) -> None:
    log.warning("remat=%r: platform %r cannot offload activations to host memory (only %s can); using "
                "remat=%r instead, which keeps the same activations in device memory", name, platform,
                " and ".join(OFFLOAD_PLATFORMS), fallback)


class KVCache(NamedTuple):
    """Per-layer keys and values for decoding, right-aligned: the newest token is in the last slot.

    k, v (L, B, S, K, H) in cfg.dtype; segment_ids (B, S) int32, EMPTY_SLOT where nothing was written yet;
    length () int32, the tokens written so far (the default position of the next one). Keeping the newest
    token last lets the attention's causal rule (the last query sees up to the last key) hold for a chunk of
    any length without a dynamic slice; a chunk's keys are concatenated after the cache, attended, and the
    last S kept, so once more than S tokens have been written the oldest drop out (a sliding window).
    With multi-head latent attention (ModelConfig.attention_kind "mla") k holds the normed key-value latent
    (L, B, S, kv_lora_rank) and v the rotated RoPE key the heads share (L, B, S, qk_rope_head_dim): what
    DeepSeek-V3 caches, (512 + 64) numbers a token and layer where per-head keys and values take
    2 * 128 * 192.
    """

    k: Any
    v: Any
    segment_ids: Any
    length: Any


class Transformer(nnx.Module):
    """The decoder. See the module docstring for use; every parameter carries logical axis names."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        layout, pd = param_layout(cfg), jnp.dtype(cfg.param_dtype)
        self.embed = param(rngs.params(), *layout["embed"], cfg.init_std, pd)
        if cfg.n_layers > cfg.n_moe_layers:
            self.layers = Block(cfg, "layers", rngs=rngs)
        if cfg.n_moe_layers:                       # a mixture of experts: the layers after the dense ones
            self.moe_layers = Block(cfg, "moe_layers", rngs=rngs)
        self.final_norm = param(None, *layout["final_norm"], None, pd)
        if not cfg.tie_embeddings:
            self.unembedding = param(rngs.params(), *layout["unembedding"], cfg.init_std, pd)

    def __call__(self, tokens, *, segment_ids=None, positions=None, cache: KVCache | None = None,
                 with_moe_stats: bool = False):
        """tokens (B, T) int -> (hidden (B, T, D) in cfg.dtype after the final norm, cache).

        segment_ids (B, T): packed documents (a token attends only within its id; ids >= 0); positions
        (B, T): RoPE positions, by default restarting at each segment, or continuing from cache.length.
        With a cache, returns the cache with this chunk written; else returns None. with_moe_stats: also
        return the MoE layers' routing statistics, each stacked over those layers (load (L_moe, E); aux,
        z, dropped (L_moe,); see moe.balance_terms), {} for a dense model.
        """
        cfg = self.config
        B, T = tokens.shape
        x = jnp.take(self.embed[...], tokens, axis=0).astype(cfg.dtype)          # (B, T, D)
        x = with_logical_constraint(x, residual_names(cfg))
        q_seg = jnp.zeros((B, T), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
        if positions is None:
            if cache is not None:
                positions = cache.length + jnp.arange(T, dtype=jnp.int32)[None].repeat(B, 0)
            elif segment_ids is not None:
                positions = segment_positions(q_seg)
            else:
                positions = jnp.arange(T, dtype=jnp.int32)[None].repeat(B, 0)
        inv_freq, scale = rope_inv_freq(cfg)
        angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
        # angles (B, T, H/2), H = cfg.rope_dim; sin and cos are computed once and shared by all layers.
        sin, cos = jnp.sin(angles) * scale, jnp.cos(angles) * scale

        if cache is None:
            kv_seg, layer_cache = q_seg, None
        else:
            kv_seg = jnp.concatenate([cache.segment_ids, q_seg], axis=1)               # (B, S + T)
            layer_cache = (cache.k, cache.v)
        new_kv, stats = [], {}
        n_dense = cfg.n_layers - cfg.n_moe_layers
        for name, lo, hi in (("layers", 0, n_dense), ("moe_layers", n_dense, cfg.n_layers)):
            if hi > lo:
                kv = None if layer_cache is None else tuple(c[lo:hi] for c in layer_cache)
                x, kv, stats = self._layers(getattr(self, name), x, sin, cos, q_seg, kv_seg, kv)
                new_kv.append(kv)
        x = rms_norm(x, self.final_norm[...], cfg.norm_eps)
        if cache is not None:
            S = cache.k.shape[2]
            k, v = (jnp.concatenate([kv[j] for kv in new_kv]) for j in range(2))
            cache = KVCache(k, v, kv_seg[:, -S:], cache.length + T)
        return (x, cache, stats) if with_moe_stats else (x, cache)

    def _layers(self, block, x, sin, cos, q_seg, kv_seg, layer_cache):
        """Applies one stack of layers (`block`'s parameters, stacked): a scan over them (and the cache's
        layer axis) or, with scan_layers=False, a Python loop over the same per-layer function.
        Returns (x, the stack's new (k, v) or None, its MoE statistics stacked over its layers)."""
        cfg = self.config
        graphdef, stacked = nnx.split(block)
        n_layers = jax.tree.leaves(stacked)[0].shape[0]

        def one_layer(x, layer_state, kv):
            x = checkpoint_name(x, "layer_input")          # (B, T, D): what offload_full moves to the host
            x, kv, stats = nnx.merge(graphdef, layer_state)(cfg, x, sin, cos, q_seg, kv_seg, kv)
            return x, (kv, stats)

        if cfg.remat != "none":
            policy = remat_policy(cfg.remat)
            one_layer = jax.checkpoint(one_layer, policy=policy, prevent_cse=not cfg.scan_layers)

        if cfg.scan_layers:
            def body(x, xs):
                return one_layer(x, *xs)
            x, (kv, stats) = jax.lax.scan(body, x, (stacked, layer_cache))
            return x, kv, stats
        outs = []
        for i in range(n_layers):
            take = lambda a, i=i: a[i]                                             # noqa: E731
            x, out = one_layer(x, jax.tree.map(take, stacked), jax.tree.map(take, layer_cache))
            outs.append(out)
        kv, stats = jax.tree.map(lambda *a: jnp.stack(a), *outs)
        return x, kv, stats

    def unembed(self):
        """The (D, V) output matrix in cfg.dtype (the embedding transposed when tied), for a loss that
        computes logits chunk by chunk: logits = hidden @ unembed(), accumulated in float32."""
        w = self.embed[...].T if self.config.tie_embeddings else self.unembedding[...]
        return w.astype(self.config.dtype)

    def logits(self, hidden):
        """hidden (B, T, D) -> (B, T, V) float32."""
        out = jnp.einsum("btd,dv->btv", hidden.astype(self.config.dtype), self.unembed(),
                         preferred_element_type=jnp.float32)
        return with_logical_constraint(out, ("batch", "length", "vocab"))

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty cache for `batch` sequences of up to `max_len` tokens (see KVCache)."""
        cfg = self.config
        if cfg.mla:                    # the latent and the shared RoPE key, not per-head keys and values
            k_shape = (cfg.n_layers, batch, max_len, cfg.kv_lora_rank)
            v_shape = (cfg.n_layers, batch, max_len, cfg.qk_rope_head_dim)
        else:
            k_shape = v_shape = (cfg.n_layers, batch, max_len, cfg.n_kv_heads, cfg.effective_head_dim)
        return KVCache(jnp.zeros(k_shape, cfg.dtype), jnp.zeros(v_shape, cfg.dtype),
                       jnp.full((batch, max_len), EMPTY_SLOT, jnp.int32), jnp.zeros((), jnp.int32))


class Block(nnx.Module):
    """One stack of decoder layers, their parameters stacked on a leading "layers" axis (shapes and
    logical names from `model_config.param_layout` under `stack`: "layers" with the dense MLP, "moe_layers"
    with a mixture of experts, stages/train/moe.py); `__call__` applies ONE layer (its parameters sliced
    by the scan, see Transformer._layers)."""

    def __init__(self, cfg: ModelConfig, stack: str = "layers", *, rngs: nnx.Rngs):
        self.moe = stack == "moe_layers"
        layout = {name.removeprefix(f"{stack}."): v for name, v in param_layout(cfg).items()
                  if name.startswith(f"{stack}.")}
        pd, std = jnp.dtype(cfg.param_dtype), cfg.init_std
        out_std = std / math.sqrt(2 * cfg.n_layers)   # GPT-2: residual branches sum over 2L additions
        # One creation call per parameter, in this order: the random streams (and the weights) depend on it.
        self.attn_norm = param(None, *layout["attn_norm"], None, pd)
        for name in mla_layout(cfg) if cfg.mla else ("wq", "wk", "wv", "wo"):
            if name.endswith("_norm"):                         # MLA's latent norms: scales of one
                setattr(self, name, param(None, *layout[name], None, pd))
            else:
                setattr(self, name, param(rngs.params(), *layout[name], out_std if name == "wo" else std, pd))
        self.mlp_norm = param(None, *layout["mlp_norm"], None, pd)
        if not self.moe:
            self.w_gate = param(rngs.params(), *layout["w_gate"], std, pd)
            self.w_up = param(rngs.params(), *layout["w_up"], std, pd)
            self.w_down = param(rngs.params(), *layout["w_down"], out_std, pd)
            return
        self.router = param(rngs.params(), *layout["router"], std, pd)
        # The balancing bias starts at 0; the training step moves it (moe.bias_update), not the optimizer.
        self.router_bias = nnx.Param(jnp.zeros(*layout["router_bias"][:1], jnp.float32),
                                     out_sharding=layout["router_bias"][1], eager_sharding=False)
        self.experts_gate = param(rngs.params(), *layout["experts_gate"], std, pd)
        self.experts_up = param(rngs.params(), *layout["experts_up"], std, pd)
        self.experts_down = param(rngs.params(), *layout["experts_down"], out_std, pd)
        if cfg.n_shared_experts:
            self.shared_gate = param(rngs.params(), *layout["shared_gate"], std, pd)
            self.shared_up = param(rngs.params(), *layout["shared_up"], std, pd)
            self.shared_down = param(rngs.params(), *layout["shared_down"], out_std, pd)

    def __call__(self, cfg: ModelConfig, x, sin, cos, q_seg, kv_seg, cache_kv=None):
        """x (B, T, D); q_seg (B, T); kv_seg (B, S + T) with a cache, else (B, T); cache_kv: this layer's
        (k, v), each (B, S, K, H) (MLA: the latent (B, S, Rkv) and RoPE key (B, S, Hr)). Returns (x, new
        (k, v) or None, MoE statistics ({} when dense))."""
        dt = jnp.dtype(cfg.dtype)
        w = lambda p: p[...].astype(dt)                                    # noqa: E731
        h = rms_norm(x, self.attn_norm[...], cfg.norm_eps)
        if cfg.mla:
            o, new_kv = self._latent_attention(cfg, h, sin, cos, q_seg, kv_seg, cache_kv)
        else:
            o, new_kv = self._attention(cfg, h, sin, cos, q_seg, kv_seg, cache_kv)
        o = checkpoint_name(o, "attention")
        o = checkpoint_name(jnp.einsum("btnh,nhd->btd", o, w(self.wo)), "out_proj")      # (B, T, D)
        x = with_logical_constraint(x + o, residual_names(cfg))
        h = rms_norm(x, self.mlp_norm[...], cfg.norm_eps)
        stats = {}
        if self.moe:
            weights = moe.ExpertWeights(self.router[...], self.router_bias[...], self.experts_gate[...],
                                        self.experts_up[...], self.experts_down[...])
            down, stats = moe.moe_ffn(cfg, h, weights)                                  # (B, T, D)
            if cfg.n_shared_experts:
                down = down + swiglu(h, w(self.shared_gate), w(self.shared_up), w(self.shared_down))
        else:
            down = swiglu(h, w(self.w_gate), w(self.w_up), w(self.w_down))
        x = with_logical_constraint(x + down, residual_names(cfg))
        return x, new_kv, stats

    def _attention(self, cfg: ModelConfig, h, sin, cos, q_seg, kv_seg, cache_kv):
        """Grouped-query attention of the normed input h (B, T, D): (output (B, T, N, H), new (k, v) or
        None)."""
        w = lambda p: p[...].astype(cfg.dtype)                             # noqa: E731
        q = checkpoint_name(jnp.einsum("btd,dnh->btnh", h, w(self.wq)), "query_proj")   # (B, T, N, H)
        k = checkpoint_name(jnp.einsum("btd,dkh->btkh", h, w(self.wk)), "key_proj")     # (B, T, K, H)
        v = checkpoint_name(jnp.einsum("btd,dkh->btkh", h, w(self.wv)), "value_proj")   # (B, T, K, H)
        q = with_logical_constraint(apply_rope(q, sin, cos), ("batch", "length", "heads", "head_dim"))
        k = with_logical_constraint(apply_rope(k, sin, cos), ("batch", "length", "kv_heads", "head_dim"))
        new_kv = None
        if cache_kv is not None:       # attend over the cache then this chunk; keep the last S slots
            S = cache_kv[0].shape[1]
            k = jnp.concatenate([cache_kv[0], k.astype(cache_kv[0].dtype)], axis=1)   # (B, S + T, K, H)
            v = jnp.concatenate([cache_kv[1], v.astype(cache_kv[1].dtype)], axis=1)
            new_kv = (k[:, -S:], v[:, -S:])
        o = attention(q, k, v, causal=True, segment_ids=(q_seg, kv_seg), impl=cfg.attention_impl,
                      block_q=cfg.attention_block_q, block_k=cfg.attention_block_k)             # (B, T, N, H)
        return o, new_kv

    def _latent_attention(self, cfg: ModelConfig, h, sin, cos, q_seg, kv_seg, cache_kv):
        """DeepSeek-V3's multi-head latent attention of the normed input h (B, T, D) (see ModelConfig and
        `model_config.mla_layout`): (output (B, T, N, Hv), the new cache (latent (B, S, Rkv), RoPE key
        (B, S, Hr)) or None). The cache holds the normed latent and the rotated shared key, what DeepSeek
        caches; each step projects the whole window's keys and values up from it again.

        The attention kernels take one head width for q, k and v, so v (Hv) is padded with zeros to the
        query's Hn + Hr and the output cut back to Hv: the same softmax, scaled by 1/sqrt(Hn + Hr)."""
        w = lambda p: p[...].astype(cfg.dtype)                             # noqa: E731
        Rkv, Hn, Hr, Hv = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        if cfg.q_lora_rank:
            cq = jnp.einsum("btd,dr->btr", h, w(self.wq_a))                                # (B, T, Rq)
            cq = rms_norm(cq, self.q_norm[...], MLA_NORM_EPS)
            q = jnp.einsum("btr,rnh->btnh", cq, w(self.wq_b))                              # (B, T, N, Hn+Hr)
        else:
            q = jnp.einsum("btd,dnh->btnh", h, w(self.wq))
        q = checkpoint_name(q, "query_proj")
        q = jnp.concatenate([q[..., :Hn], apply_rope(q[..., Hn:], sin, cos)], axis=-1)
        q = with_logical_constraint(q, ("batch", "length", "heads", "head_dim"))
        ckv = jnp.einsum("btd,dr->btr", h, w(self.wkv_a))                                 # (B, T, Rkv + Hr)
        latent = rms_norm(ckv[..., :Rkv], self.kv_norm[...], MLA_NORM_EPS)               # (B, T, Rkv)
        k_rope = apply_rope(ckv[..., None, Rkv:], sin, cos)[:, :, 0]                       # (B, T, Hr)
        new_kv = None
        if cache_kv is not None:       # attend over the cache then this chunk; keep the last S slots
            S = cache_kv[0].shape[1]
            latent = jnp.concatenate([cache_kv[0], latent.astype(cache_kv[0].dtype)], axis=1)  # (B, S+T, Rkv)
            k_rope = jnp.concatenate([cache_kv[1], k_rope.astype(cache_kv[1].dtype)], axis=1)  # (B, S+T, Hr)
            new_kv = (latent[:, -S:], k_rope[:, -S:])
        kv = jnp.einsum("bsr,rnh->bsnh", latent, w(self.wkv_b))                          # (B, S, N, Hn + Hv)
        k_nope = checkpoint_name(kv[..., :Hn], "key_proj")                               # (B, S, N, Hn)
        v = checkpoint_name(kv[..., Hn:], "value_proj")                                  # (B, S, N, Hv)
        rope_k = jnp.broadcast_to(k_rope[:, :, None], (*k_nope.shape[:3], Hr)).astype(k_nope.dtype)
        k = with_logical_constraint(jnp.concatenate([k_nope, rope_k], axis=-1),
                                    ("batch", "length", "heads", "head_dim"))            # (B, S, N, Hn + Hr)
        v = jnp.pad(v, [(0, 0)] * 3 + [(0, Hn + Hr - Hv)]) if Hn + Hr > Hv else v
        o = attention(q, k, v, causal=True, segment_ids=(q_seg, kv_seg), impl=cfg.attention_impl,
                      block_q=cfg.attention_block_q, block_k=cfg.attention_block_k)      # (B, T, N, Hn + Hr)
        return o[..., :Hv], new_kv


def residual_names(cfg: ModelConfig) -> tuple[str, str, str]:
    """The residual stream's logical axes: its length split over the tensor axis under sequence
    parallelism (ModelConfig.sequence_parallel), else whole on every tensor-parallel device."""
    return ("batch", "sequence" if cfg.sequence_parallel else "length", "embed")


def swiglu(h, w_gate, w_up, w_down):
    """h (B, T, D) -> (B, T, D): the dense SwiGLU MLP, its activations named for the remat policies."""
    gate = checkpoint_name(jnp.einsum("btd,df->btf", h, w_gate), "mlp_gate")             # (B, T, F)
    up = checkpoint_name(jnp.einsum("btd,df->btf", h, w_up), "mlp_up")
    act = with_logical_constraint(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
    return checkpoint_name(jnp.einsum("btf,fd->btd", act, w_down), "mlp_out")


def num_params(cfg: ModelConfig) -> int:
    """Parameters of `Transformer(cfg)`, counted from abstract shapes (`jax.eval_shape`: no allocation)."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def param(key, shape, names, std, dtype):
    """A Param with its logical axis names. Placement is the caller's (`loop.init_program` creates the
    parameters in their shardings), so no eager sharding: building the model needs no mesh."""
    value = jnp.ones(shape, dtype) if std is None else std * jax.random.normal(key, shape, dtype)
    return nnx.Param(value, out_sharding=names, eager_sharding=False)


def rms_norm(x, scale, eps):
    """x (..., D) in any dtype; normalized in float32, returned in x.dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def apply_rope(x, sin, cos):
    """x (B, T, heads, H); sin, cos (B, T, H/2) float32. Rotates pairs (i, i + H/2) in float32."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    s, c = sin[:, :, None, :], cos[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """(H/2,) float64 inverse frequencies (H = cfg.rope_dim) after the configured scaling, and the factor
    cos/sin are scaled by (YaRN's attention temperature; 1 otherwise). Rotation pairs are (i, i + H/2),
    Llama/NeoX layout."""
    H, s = cfg.rope_dim, cfg.rope_factor          # the rotated dims: a whole head, or MLA's RoPE part
    base = cfg.rope_theta
    if cfg.rope_scaling == "ntk":       # "NTK-aware": stretch the base so the lowest frequency slows by s
        base = base * s ** (H / (H - 2)) if H > 2 else base
    inv = 1.0 / base ** (np.arange(0, H, 2, dtype=np.float64) / H)            # (H/2,)
    if cfg.rope_scaling == "linear":    # position interpolation: positions / s
        return inv / s, 1.0
    if cfg.rope_scaling == "llama3":    # Llama 3.1: long wavelengths / s, short kept, smooth in between
        low_freq_factor, high_freq_factor = 1.0, 4.0
        wavelen = 2 * np.pi / inv
        original = cfg.original_max_len
        low_wavelen, high_wavelen = original / low_freq_factor, original / high_freq_factor
        smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        mid = (1 - smooth) * inv / s + smooth * inv
        return np.where(wavelen > low_wavelen, inv / s, np.where(wavelen < high_wavelen, inv, mid)), 1.0
    if cfg.rope_scaling == "yarn":      # YaRN (Peng et al. 2023): interpolate by how many turns a dim makes
        beta_fast, beta_slow = 32.0, 1.0

        def dim_for(turns):             # the (fractional) dim index that makes `turns` turns in the context
            return H * math.log(cfg.original_max_len / (turns * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

        # The correction range is clipped at H - 1, as the paper's code and transformers clip it.
        lo, hi = max(math.floor(dim_for(beta_fast)), 0), min(math.ceil(dim_for(beta_slow)), H - 1)
        ramp = np.clip((np.arange(H // 2) - lo) / max(hi - lo, 1e-3), 0.0, 1.0)   # 0: extrapolate, 1: interp
        inv = inv * (1 - ramp) + inv / s * ramp
        return inv, (0.1 * math.log(s) + 1.0) if s > 1 else 1.0
    return inv, 1.0


def segment_positions(segment_ids):
    """(B, T) segment ids -> (B, T) int32 positions that restart at 0 where the segment id changes."""
    T = segment_ids.shape[1]
    idx = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), segment_ids.shape)
    changes = segment_ids[:, 1:] != segment_ids[:, :-1]                                # (B, T - 1)
    starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool), changes], axis=1)
    return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
