"""The mixture-of-experts feed-forward block: a router picks each token's top-k experts, the tokens go to
them (dropless by default), and the experts' SwiGLU outputs come back weighted.

    from stages.train import moe
    y, stats = moe.moe_ffn(cfg, h, weights)      # h (B, T, D) normed; weights: moe.ExpertWeights
    stats["load"]                                # (E,) the share of the k * tokens assignments per expert

Routing (`route`): float32 logits h @ router (N, E); scores softmax(logits) or sigmoid(logits)
(`ModelConfig.router_score`); the top-k are chosen by score + a balancing bias (DeepSeek-V3's
auxiliary-loss-free method: the bias only selects, it never weights; the training step moves it towards
equal load, `bias_update`), optionally only among the best `router_topk_groups` of `router_groups` expert
groups (a group scores the sum of its best two experts); the chosen scores are the weights, rescaled to sum
to 1 with `router_norm_topk`, then times `router_scale` (DeepSeek-V3's routed scaling factor).

The experts' computation, on each device's own tokens (`jax.shard_map` over the whole mesh; the batch is
split over data x fsdp x expert):

    dropless (moe_capacity_factor 0, expert axis 1): the n * k assignments sorted by expert and run through
        a grouped matmul (`grouped_matmul`: `jax.lax.ragged_dot`, the Pallas megablox kernel on TPU, or a
        tiled scan on CPU, where ragged_dot lowers to a dense masked product over every expert)
    capacity (moe_capacity_factor > 0, or an expert axis): each expert takes at most
        C = ceil(factor * n * k / E) of a device's assignments (first choices before second ones, as GShard;
        within a choice the higher router scores first, as V-MoE's batch prioritized routing), into an
        (E, C, D) buffer; the rest are dropped (their share is `stats["dropped"]`). With an expert
        axis of size ep the buffer goes to the experts' devices with one all-to-all (E, C, D) ->
        (E / ep, ep * C, D), is computed there and comes back with another. Dropless with an expert axis
        uses C = n (no assignment can be dropped; memory E * n * D per device: set a capacity factor for
        large runs). docs/ARCHITECTURE.md says why all-to-all of fixed buffers and not ragged_all_to_all.

Expert weights enter the shard_map split over "expert" (and their hidden dim over "tensor", the down
projection's partial sums added with a psum); FSDP's split of their embed dim is gathered per layer, as for
the dense layers. Load statistics and the losses are summed over the devices' tokens, so they are the
statistics of the whole batch, whatever the mesh. Activations are named for the remat policies as the
dense MLP's are: "mlp_gate", "mlp_up", "mlp_out".
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from stages.train.mesh import AXES, Mesh
from stages.train.model_config import ModelConfig
from stages.train.sharding import logical_to_spec, target_platform

GROUPED_MATMULS = ("auto", "ragged_dot", "megablox", "tiled")
P = jax.sharding.PartitionSpec


class ExpertWeights(NamedTuple):
    """One MoE layer's routed parameters (in their stored dtypes)."""

    router: jax.Array          # (D, E)
    bias: jax.Array            # (E,) selection bias, not trained by gradients
    gate: jax.Array            # (E, D, F)
    up: jax.Array              # (E, D, F)
    down: jax.Array            # (E, F, D)


class Routing(NamedTuple):
    experts: jax.Array         # (N, k) int32, each token's chosen experts
    weights: jax.Array         # (N, k) float32, their weights
    scores: jax.Array          # (N, E) float32, softmax or sigmoid of the logits
    logits: jax.Array          # (N, E) float32


def route(cfg: ModelConfig, h, router, bias) -> Routing:
    """h (N, D) -> the top-k routing of every token (see the module docstring)."""
    logits = jnp.einsum("nd,de->ne", h.astype(jnp.float32), router.astype(jnp.float32))     # (N, E)
    scores = jax.nn.softmax(logits, -1) if cfg.router_score == "softmax" else jax.nn.sigmoid(logits)
    select = scores + jax.lax.stop_gradient(bias.astype(jnp.float32))
    if cfg.router_groups > 1:
        n, E, G = select.shape[0], cfg.n_experts, cfg.router_groups
        grouped = select.reshape(n, G, E // G)
        best = jax.lax.top_k(grouped, min(2, E // G))[0].sum(-1)                     # (N, G)
        _, keep = jax.lax.top_k(best, cfg.router_topk_groups)                          # (N, g)
        allowed = jnp.zeros((n, G), bool).at[jnp.arange(n)[:, None], keep].set(True)
        select = jnp.where(jnp.repeat(allowed, E // G, axis=1), select, -jnp.inf)
    _, experts = jax.lax.top_k(jax.lax.stop_gradient(select), cfg.n_experts_per_token)  # (N, k)
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if cfg.router_norm_topk:
        weights = weights / jnp.maximum(weights.sum(-1, keepdims=True), 1e-20)
    return Routing(experts.astype(jnp.int32), weights * cfg.router_scale, scores, logits)


def balance_terms(routing: Routing, n_experts: int, axes=(), seq_len: int = 0) -> dict:
    """The batch's load statistics and router losses, summed over the mesh `axes` the tokens are split
    over (so every device holds the whole batch's):

    load     (E,) the share of the N * k assignments each expert got (sums to 1)
    aux      the switch/GShard balancing loss E * sum_i load_i * P_i, P_i the mean over tokens of expert
             i's score normalized over experts (1 when perfectly balanced; its gradient reaches the router
             through P only). With `seq_len` (the tokens are whole sequences of seq_len, in order), DeepSeek-
             V3's sequence-wise loss instead: that sum over each sequence's own tokens (its f_i = E * its
             load_i, its P_i), averaged over the sequences, so no sequence may lean on a few experts
             however balanced the batch is
    z        the router z-loss, the mean over tokens of logsumexp(logits)^2
    """
    n, k = routing.experts.shape
    psum = (lambda x: jax.lax.psum(x, axes)) if axes else (lambda x: x)
    counts = psum(jnp.zeros((n_experts,), jnp.float32).at[routing.experts.reshape(-1)].add(1.0))
    tokens = psum(jnp.float32(n))
    load = counts / (tokens * k)
    probs = routing.scores / routing.scores.sum(-1, keepdims=True)
    if seq_len:
        s = n // seq_len
        sequence = jnp.repeat(jnp.arange(s), seq_len * k)                           # (n * k,) in token order
        hits = jnp.zeros((s, n_experts), jnp.float32).at[sequence, routing.experts.reshape(-1)].add(1.0)
        seq_load = hits / (seq_len * k)                                             # (S, E)
        seq_prob = probs.reshape(s, seq_len, n_experts).mean(1)                     # (S, E)
        per_sequence = n_experts * jnp.sum(jax.lax.stop_gradient(seq_load) * seq_prob, -1)
        aux = psum(per_sequence.sum()) / psum(jnp.float32(s))
    else:
        mean_prob = psum(probs.sum(0)) / tokens                                     # (E,)
        aux = n_experts * jnp.sum(jax.lax.stop_gradient(load) * mean_prob)
    z = psum(jnp.sum(jax.nn.logsumexp(routing.logits, axis=-1) ** 2)) / tokens
    return {"load": load, "aux": aux, "z": z}


def bias_update(bias, load, rate: float):
    """DeepSeek-V3's auxiliary-loss-free step: raise an underloaded expert's bias by `rate`, lower an
    overloaded one's. bias, load (..., E) -> the new bias (same dtype)."""
    target = 1.0 / load.shape[-1]
    return (bias + rate * jnp.sign(target - load)).astype(bias.dtype)


def capacity(cfg: ModelConfig, tokens: int) -> int:
    """Rows per expert of a device's capacity buffer for `tokens` tokens: ceil(factor * tokens * k / E), or
    `tokens` (nothing can be dropped) when dropless."""
    if not cfg.moe_capacity_factor:
        return tokens
    return min(tokens, max(1, math.ceil(cfg.moe_capacity_factor * tokens * cfg.n_experts_per_token
                                        / cfg.n_experts)))


def moe_ffn(cfg: ModelConfig, h, w: ExpertWeights):
    """h (B, T, D) in the compute dtype -> (y (B, T, D), stats: load (E,), aux, z, dropped (the share of
    the batch's assignments dropped), dropped_worst (the share of its worst sequence's); float32).

    Under a training mesh (`jax.set_mesh`), runs per device in a shard_map; else on the whole array."""
    B, T, D = h.shape
    mesh = jax.sharding.get_abstract_mesh()
    dt = h.dtype
    if mesh.empty or not set(AXES) <= set(mesh.axis_names) or mesh.size == 1:
        y, stats = _local(cfg, h.reshape(B * T, D), w, dt, batch_axes=(), expert_axis=None, seq_len=T)
        return y.reshape(B, T, D), stats
    spec = logical_to_spec(("batch", "length", "embed"), h.shape, mesh)
    batch_axes = tuple(a for a in (spec[0] if isinstance(spec[0], tuple) else (spec[0],)) if a)
    sizes = Mesh.of(mesh)
    expert_axis = "expert" if sizes.expert > 1 else None
    if expert_axis and cfg.n_experts % sizes.expert:
        raise ValueError(f"ModelConfig.n_experts={cfg.n_experts} does not split over the mesh's expert axis "
                         f"of {sizes.expert}: pick n_experts a multiple of train.MeshConfig.expert")
    tensor = "tensor" if sizes.tensor > 1 and w.gate.shape[-1] % sizes.tensor == 0 else None
    exp = expert_axis
    w_specs = ExpertWeights(P(), P(), P(exp, None, tensor), P(exp, None, tensor), P(exp, tensor, None))

    def body(x, w):
        b, t, _ = x.shape
        y, stats = _local(cfg, x.reshape(b * t, D), w, dt, batch_axes=batch_axes, expert_axis=expert_axis,
                          tensor_axis=tensor, seq_len=t)
        return y.reshape(b, t, D), stats

    stats_spec = {"load": P(), "aux": P(), "z": P(), "dropped": P(), "dropped_worst": P()}
    return jax.shard_map(body, mesh=mesh, in_specs=(P(spec[0], None, None), w_specs),
                         out_specs=(P(spec[0], None, None), stats_spec), check_vma=False)(h, w)


def _local(cfg: ModelConfig, x, w: ExpertWeights, dt, *, batch_axes, expert_axis, tensor_axis=None,
           seq_len: int = 0):
    """One device's tokens x (n, D), whole sequences of `seq_len` in order -> (y (n, D) in dt, stats)."""
    routing = route(cfg, x, w.router, w.bias)
    scope = seq_len if cfg.moe_aux_scope == "sequence" else 0
    stats = balance_terms(routing, cfg.n_experts, batch_axes, seq_len=scope)
    gate, up, down = (a.astype(dt) for a in (w.gate, w.up, w.down))
    n, k = routing.experts.shape
    if not cfg.moe_capacity_factor and expert_axis is None:
        out = _dropless(cfg, x, routing, gate, up, down, tensor_axis)                 # (n, k, D)
        stats["dropped"] = stats["dropped_worst"] = jnp.float32(0.0)
    else:
        out, kept = _with_capacity(cfg, x, routing, gate, up, down, expert_axis, tensor_axis)
        psum = (lambda v: jax.lax.psum(v, batch_axes)) if batch_axes else (lambda v: v)
        pmax = (lambda v: jax.lax.pmax(v, batch_axes)) if batch_axes else (lambda v: v)
        stats["dropped"] = 1.0 - psum(kept.sum()) / psum(jnp.float32(n * k))
        # The sequence that lost the most of its assignments (a capacity is a device's, so one sequence
        # can lose far more than the batch's share).
        t = seq_len or n
        stats["dropped_worst"] = pmax(1.0 - kept.reshape(n // t, t * k).mean(1).min())
    # The k outputs summed in float32 without a float32 copy of them (n, k, D).
    y = jnp.einsum("nkd,nk->nd", out, routing.weights.astype(dt), preferred_element_type=jnp.float32)
    return y.astype(dt), stats


def _swiglu(x, gate, up, down, matmul, tensor_axis):
    """The experts' SwiGLU with `matmul(x, w)` doing the per-expert products; partial sums over a split
    hidden dim are added across `tensor_axis`."""
    g = checkpoint_name(matmul(x, gate), "mlp_gate")
    u = checkpoint_name(matmul(x, up), "mlp_up")
    out = matmul(jax.nn.silu(g) * u, down)
    if tensor_axis:
        out = jax.lax.psum(out, tensor_axis)
    return checkpoint_name(out, "mlp_out")


def _dropless(cfg, x, routing: Routing, gate, up, down, tensor_axis):
    """Every assignment, sorted by expert, through the grouped matmul. -> (n, k, D)."""
    n, k = routing.experts.shape
    flat = routing.experts.reshape(-1)                                      # (n * k,)
    order = jnp.argsort(flat, stable=True)
    xs = jnp.take(x, order // k, axis=0)                                    # (n * k, D) sorted by expert
    sizes = jnp.bincount(flat, length=cfg.n_experts).astype(jnp.int32)      # (E,)
    impl = resolve_impl(cfg.moe_impl)
    out = _swiglu(xs, gate, up, down, lambda a, b: grouped_matmul(a, b, sizes, impl, cfg.moe_tile_rows),
                  tensor_axis)
    unsorted = _gather_rows(out, _inverse(order, n * k))                    # (n * k, D) in token order
    return unsorted.reshape(n, k, -1)


def _with_capacity(cfg, x, routing: Routing, gate, up, down, expert_axis, tensor_axis):
    """Assignments into (E, C, D) buffers (first choices first, then by score), through the experts (on
    their devices with an expert axis), and back. -> ((n, k, D), kept (n, k) float32)."""
    n, k = routing.experts.shape
    E, D = cfg.n_experts, x.shape[-1]
    C = capacity(cfg, n)
    slot_major = routing.experts.T.reshape(-1)                              # (k * n,): choice j of all first
    # Within an expert, first choices before second ones and, within a choice, the higher router score
    # first: what a full buffer drops is the assignments its expert least wanted, spread over the batch,
    # not the last tokens of the device's batch (token order left whole sequences with nothing).
    affinity = jnp.take_along_axis(routing.scores, routing.experts, 1).T.reshape(-1)     # (k * n,)
    choice = jnp.repeat(jnp.arange(k), n)
    order = jnp.lexsort((-affinity, choice, slot_major))
    sizes = jnp.bincount(slot_major, length=E)
    starts = jnp.cumsum(sizes) - sizes
    rank_sorted = jnp.arange(k * n) - starts[slot_major[order]]
    rank = jnp.zeros_like(rank_sorted).at[order].set(rank_sorted)           # place within its expert
    kept = rank < C
    slot = jnp.where(kept, slot_major * C + rank, E * C)                    # E * C: the dropped row
    filler = _inverse(slot, E * C)                                          # (E * C,) k * n: an empty row
    buffer = _gather_rows(x, jnp.where(filler < k * n, filler % n, n)).reshape(E, C, D)
    if expert_axis:
        buffer = jax.lax.all_to_all(buffer, expert_axis, 0, 1, tiled=True)   # (E / ep, ep * C, D)
    out = _swiglu(buffer, gate, up, down, lambda a, b: jnp.einsum("ecd,edf->ecf", a, b), tensor_axis)
    if expert_axis:
        out = jax.lax.all_to_all(out, expert_axis, 1, 0, tiled=True)         # (E, C, D)
    back = _gather_rows(out.reshape(E * C, D), slot).reshape(k, n, D).swapaxes(0, 1)    # (n, k, D)
    return back, kept.reshape(k, n).T.astype(jnp.float32)


def _inverse(dest, size: int):
    """dest (M,) int, where each of M rows goes (`size` or more: nowhere) -> (size,) int32, the row that
    lands at each place (M where none does). The routed tokens move by gathers through this map: a
    gather's gradient is a scatter-add that keeps nothing but the indices, where scattering the rows
    themselves (`.at[dest].set(x)`) keeps masks and copies of them for the backward pass."""
    M = dest.shape[0]
    return jnp.full((size,), M, jnp.int32).at[dest].set(jnp.arange(M, dtype=jnp.int32), mode="drop")


def _gather_rows(x, index):
    """x (M, D), index (R,) -> (R, D): x[index], zeros where index is M or more."""
    return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


# ---------------------------------------------------------------------------------------- grouped matmul

def resolve_impl(impl: str) -> str:
    """"auto" -> the grouped matmul for the platform being traced for: the Pallas megablox kernel on TPU
    (ragged_dot where jax lacks it), ragged_dot on GPU, the tiled scan on CPU."""
    if impl not in GROUPED_MATMULS:
        raise ValueError(f"moe_impl={impl!r} is not one of {GROUPED_MATMULS}")
    if impl != "auto":
        return impl
    platform = target_platform()
    if platform == "tpu":
        return "megablox" if _megablox() is not None else "ragged_dot"
    return "ragged_dot" if platform == "gpu" else "tiled"


def grouped_matmul(x, w, group_sizes, impl: str = "auto", tile_rows: int = 128):
    """x (M, K) rows grouped by expert in order (group_sizes (E,) int32, summing to at most M; rows past
    the groups give 0), w (E, K, N) -> (M, N) in x's dtype: row i times the weight of its group. tile_rows:
    the megablox kernel's rows a tile (ModelConfig.moe_tile_rows)."""
    impl = resolve_impl(impl)
    if impl == "ragged_dot":
        return jax.lax.ragged_dot(x, w, group_sizes)
    if impl == "megablox":
        return _megablox_gmm(x, w, group_sizes, tile_rows)
    return _tiled(x, w, group_sizes)


def _tile_rows(m: int, groups: int) -> int:
    """Rows per tile of the tiled grouped matmul: about the mean group size, a power of two in [8, 128]."""
    return int(min(128, max(8, 2 ** math.ceil(math.log2(max(1, -(-m // groups)))))))


def _tiled(x, w, group_sizes):
    """The grouped matmul as a scan over row tiles that each belong to one group: every group is padded
    to whole tiles (at most E extra tiles), and each tile is multiplied by its group's weight. The work is
    that of the rows, not of every expert over every row (what ragged_dot costs on CPU)."""
    M, K = x.shape
    E, _, N = w.shape
    tile = _tile_rows(M, E)
    n_tiles = -(-M // tile) + E
    sizes = group_sizes.astype(jnp.int32)
    padded = -(-sizes // tile) * tile
    ends, padded_ends = jnp.cumsum(sizes), jnp.cumsum(padded)
    row = jnp.arange(M, dtype=jnp.int32)
    group = jnp.searchsorted(ends, row, side="right")                      # (M,) E for rows past the groups
    inside = group < E
    g = jnp.minimum(group, E - 1)
    dest = jnp.where(inside, padded_ends[g] - padded[g] + row - (ends[g] - sizes[g]), n_tiles * tile)
    xp = _gather_rows(x, _inverse(dest, n_tiles * tile)).reshape(n_tiles, tile, K)
    tile_group = jnp.minimum(jnp.searchsorted(padded_ends, jnp.arange(n_tiles) * tile, side="right"), E - 1)

    # Rematerialized, so the backward pass slices w[gi] again rather than keeping every tile's (K, N) slice.
    @jax.checkpoint
    def one(_, inputs):
        xt, gi = inputs
        return None, jnp.dot(xt, w[gi], preferred_element_type=jnp.float32).astype(x.dtype)

    _, out = jax.lax.scan(one, None, (xp, tile_group))                      # (n_tiles, tile, N)
    return _gather_rows(out.reshape(n_tiles * tile, N), dest)


@functools.cache
def _megablox():
    try:
        from jax.experimental.pallas.ops.tpu.megablox import gmm
    except ImportError:
        return None
    return gmm


def _megablox_gmm(x, w, group_sizes, tile_rows: int):
    """The Pallas TPU grouped matmul; rows padded to whole tiles of tile_rows (the padding is in no group).
    Each group starts a tile of its own, sharing the one it starts in: the kernel visits about
    M / tile_rows + E - 1 tiles (step_time charges them)."""
    gmm = _megablox()
    if gmm is None:
        raise ValueError("moe_impl='megablox' needs jax.experimental.pallas.ops.tpu.megablox (a jax with "
                         "Pallas TPU); use 'ragged_dot'")
    M = x.shape[0]
    pad = -M % tile_rows
    xp = jnp.pad(x, ((0, pad), (0, 0)))
    k, n = w.shape[1:]
    tiling = (tile_rows, min(k, 512), min(n, 512))
    out = gmm(xp, w, group_sizes.astype(jnp.int32), preferred_element_type=x.dtype, tiling=tiling)
    return out[:M]
