"""How many bytes one device holds to train a config: the planner's memory model (no JAX).

    parts, host = memory.memory_bytes(train_config, mesh, micro_batch, devices.get("tpu-v5p"))
    parts["total"]                 # bytes per device at the step's peak; parts["params"], ... its parts
    host                           # bytes of activations an offload_* policy keeps in host memory
    memory.activation_bytes(model_config, batch=1, seq_len=8192, tensor=1)   # one part on its own

`planner.plan` calls it (`Plan.per_device`); `make plan` prints the parts. Per device, in bytes, under the
configured mesh (`train.MeshConfig`) on the configured hardware (`train.HardwareConfig`), held for the
whole step:

    params       every parameter, sharded by its logical axes exactly as training places it
                 (`model_config.param_layout`, `mesh.mesh_axes`), in `param_dtype`
    optimizer    AdamW and muon's fallback 2 moments, lion and muon 1, adafactor factored row/column
                 statistics
    activations  what one micro-batch keeps in device memory for the backward pass under the remat policy
                 (`activation_bytes`; an offload_* policy keeps it in host memory instead: `Plan.host`), an
                 MoE layer's routing and dispatch buffers with it (`moe_buffers`, `MOE_KEPT`)
    weights      the compute-dtype copy of this device's shard of the matmul weights (XLA casts the stacked
                 layers once, before the scan, and gathers the cast copy layer by layer)
    accumulated  with gradient accumulation, the running sum of the micro-batches' gradients

and then the larger of two phases that never overlap (the loss, forward and backward, runs before the
layers' backward pass begins):

    backward     grads (every parameter's gradient, in the parameters' layout and dtype), gathered (with
                 FSDP, one layer's parameters gathered whole and their gradient before it is reduce-
                 scattered) and recompute (the layer being recomputed: its activations and their gradients;
                 an MoE layer's with its dispatch buffers, the (E, C, D) capacity buffers sent to the experts,
                 their (E, C, F) hidden activations and the outputs returned)
    loss         one chunk of logits and what the chunked cross entropy holds with it (`loss_bytes`),
                 and with a data axis across slices what XLA gathers for it: the whole micro-batch's
                 hidden states and a receive buffer for the logits' cross-slice sum
                 (`across_slices_bytes`)

XLA:CPU (the "cpu" device: a laptop, CI, simulated devices) holds more than the TPU compiler, measured
from its compiled step: through the loss, the layers' zero-filled gradient stacks and two transposed
copies of the output matrix (`xla_cpu_bytes`); and a third phase, the optimizer update, where every
parameter's update is computed before any is applied (grads + updates, one more copy of the parameters,
held with the state but not the activations, which the backward pass has freed).

A mixture of experts (`ModelConfig.n_experts`) is sized from the same table (`model_config.param_layout`: its
"moe_layers" stack, the experts split over the mesh's expert axis).

The figures are estimates from first principles, checked against XLA's own for the compiled step to within
10% (benchmarks/plan_vs_xla.py: seven TPU topologies, three of 8 simulated CPU devices); `--compile`
(planning/aot.py) prints XLA's beside them.
"""

from __future__ import annotations

import dataclasses
import math

from stages.train.mesh import Mesh, MeshConfig
from stages.train.model_config import LAYER_STACKS, REMAT_NAMES, ModelConfig, param_layout
from stages.train.planning import devices
from stages.train.planning.shards import (
    DTYPE_BYTES,
    capacity_path,
    gathered_shape,
    moe_rows,
    param_bytes,
    shard_size,
)

TPU_LANES = 128    # a TPU tiles an array's minor dimension to 128 lanes: a 64-wide head takes 128
# From the lightest to the heaviest rematerialization: what the planner suggests, in order, when short.
REMAT_ORDER = ("none", "save_dots", "dots_no_batch", "minimal", "save_qkv_proj", "full")
OFFLOAD = "offload_"    # offload_<policy>: what <policy> keeps, in host memory (stages/train/model.py)
# The offload policies from the least recompute to the least device memory, suggested after REMAT_ORDER.
OFFLOAD_ORDER = ("offload_dots_no_batch", "offload_minimal", "offload_full")
assert sorted(REMAT_ORDER + OFFLOAD_ORDER) == sorted(REMAT_NAMES)
# What each policy keeps of a layer for the backward pass (rows of `layer_activations`). The down
# projection is never kept: it only feeds the residual sum, whose gradient needs no operand.
# Multi-head latent attention's down projections ("latent") are matmuls without a batch dimension, kept by
# the policies that keep such dots; the projections it tags (query_proj, key_proj, value_proj) are q, k, v.
KEPT = {
    "none": {"input", "normed", "latent", "q", "k", "v", "attention", "out", "residual", "normed2", "gate",
             "up", "act"},
    "save_dots": {"input", "latent", "q", "k", "v", "attention", "out", "gate", "up"},
    "dots_no_batch": {"input", "latent", "q", "k", "v", "out", "gate", "up"},
    "minimal": {"input", "q", "k", "v", "out"},
    "save_qkv_proj": {"input", "q", "k", "v"},
    "full": {"input"},
}
assert set(KEPT) == set(REMAT_ORDER)
# What each policy keeps of an MoE layer's routing and dispatch (rows of `moe_buffers`; the attention's and
# the shared experts' activations are `KEPT`'s). Only the router's matmul has no batch dimension (the
# experts' einsums batch over the experts), and no policy names the dispatch buffers; save_dots keeps the
# experts' einsums of the capacity path, not a dropless grouped matmul (no dot_general: `_MOE_DOTS`).
# Without remat, what the backward pass reads: the experts' input (what the all-to-all received, else what
# was sent), gate, up and their product, and the k outputs the combine weights; not the down projection
# or what the all-to-alls and gathers move (their transposes read only indices). XLA also keeps three
# more (rows, Fe) arrays for SiLU's gradient (`MOE_SILU_KEPT`; seen in TPU buffer assignment, 124M-MoE).
MOE_KEPT = {
    "none": {"logits", "scores", "sent", "received", "gate", "up", "act", "combined"},
    "save_dots": {"logits", "gate", "up", "down"},
    "dots_no_batch": {"logits"},
    "minimal": set(), "save_qkv_proj": set(), "full": set(),
}
assert set(MOE_KEPT) == set(REMAT_ORDER)
_MOE_DOTS = {"gate", "up", "down"}      # the experts' einsums: save_dots keeps them on the capacity path only
MOE_SILU_KEPT = 3                       # (rows, Fe) arrays beyond MOE_KEPT["none"] for SiLU's gradient
ALWAYS = ("params", "optimizer", "activations", "weights", "accumulated")    # held through the whole step


def memory_bytes(cfg, mesh: Mesh, micro_batch: int, device: devices.Device) -> tuple[dict, int]:
    """(per-device bytes by part, with their "total"; host bytes of offloaded activations) for `cfg` (a
    stages.train.Config) with `micro_batch` sequences per device: see the module docstring."""
    m = cfg.model
    micro = cfg.global_batch // cfg.optimizer.grad_accum_steps      # sequences a micro-batch, all devices
    pbytes = DTYPE_BYTES[m.param_dtype]
    params = param_bytes(m, mesh, pbytes)
    tpu, cpu = device.name.startswith("tpu-"), device.name == "cpu"
    lanes, splash = (TPU_LANES if tpu else 1), tpu and m.attention_impl in ("auto", "splash")
    # A platform without host memory of its own (CPU) runs an offload policy as the one it is named after.
    m = dataclasses.replace(m, remat=m.remat if device.host_bytes else m.remat.removeprefix(OFFLOAD))
    kept, host = activation_bytes(m, micro_batch, cfg.seq_len, mesh.tensor, lanes=lanes, splash=splash,
                                  expert=mesh.expert)
    out = {"params": params, "optimizer": optimizer_bytes(m, mesh, pbytes, cfg.optimizer.name),
           "activations": kept, "weights": cast_bytes(m, mesh),
           "accumulated": params if cfg.optimizer.grad_accum_steps > 1 else 0,
           "grads": params, "gathered": gathered_bytes(m, mesh),
           "recompute": recompute_bytes(m, micro_batch, cfg.seq_len, mesh.tensor, lanes=lanes,
                                        splash=splash, expert=mesh.expert),
           "loss": loss_bytes(m, micro_batch * cfg.seq_len, cfg.loss_chunk, mesh),
           "xla_cpu": xla_cpu_bytes(m, mesh, pbytes) if cpu else 0,
           "updates": params if cpu else 0,
           "across_slices": across_slices_bytes(m, cfg.mesh, micro * cfg.seq_len, micro_batch * cfg.seq_len,
                                                cfg.loss_chunk, mesh.tensor)}
    backward = out["grads"] + out["gathered"] + out["recompute"]
    held = sum(out[k] for k in ALWAYS)
    # The update runs after the backward pass has freed the activations.
    update = held - out["activations"] + out["grads"] + out["updates"]
    loss = out["loss"] + out["xla_cpu"] + out["across_slices"]
    out["total"] = max(held + max(backward, loss), update)
    return out, host


def optimizer_bytes(m: ModelConfig, mesh: Mesh, dtype_bytes: int, name: str) -> int:
    """One device's optimizer state: moments in the parameters' layout and dtype."""
    total = 0
    for pname, (shape, names) in param_layout(m).items():
        local = shard_size(shape, names, mesh)
        matrix_dims = len(shape) - (1 if _stacked(pname) else 0)
        if name == "adamw":
            total += 2 * local
        elif name == "lion":
            total += local
        elif name == "muon":             # momentum for hidden matrices; AdamW's two moments for the rest
            adam = matrix_dims < 2 or any(k in pname for k in ("embed", "norm"))
            total += (2 if adam else 1) * local
        else:                            # adafactor: a row and a column statistic per matrix
            total += local if len(shape) < 2 else local // shape[-1] + local // shape[-2]
    return total * dtype_bytes


def gathered_bytes(m: ModelConfig, mesh: Mesh) -> int:
    """FSDP's working set: the layer being computed, gathered whole over the axes its embed dimension is
    split over (`shards.gathered_shape`: still split over tensor, and an MoE layer's experts over expert:
    E / expert of them) from the compute-dtype copy (`cast_bytes`), its gradient, in the compute dtype,
    before it is reduce-scattered, and the next layer's weights, which XLA gathers while this one computes
    (the prefetch that hides the all-gathers, as `step_time` assumes); the largest layer of a dense and an
    MoE one."""
    if mesh.embed_shards == 1:        # nothing split over an axis that FSDP gathers
        return 0
    layout = param_layout(m)
    layer = max(sum(math.prod(gathered_shape(shape[1:], names[1:], mesh))
                    for name, (shape, names) in layout.items() if name.startswith(f"{stack}."))
                for stack, _ in _stacks(m))
    return layer * 3 * DTYPE_BYTES[m.dtype]


def cast_bytes(m: ModelConfig, mesh: Mesh) -> int:
    """The compute-dtype copy of this device's shard of every matmul weight (the layers, dense and MoE, and
    the output matrix), which XLA makes once per step; none when the parameters are already in the compute
    dtype. An MoE router and its bias are read in float32 (stages/train/moe.py `route`): never cast."""
    if m.param_dtype == m.dtype:
        return 0
    return sum(shard_size(shape, names, mesh) for name, (shape, names) in param_layout(m).items()
               if (_stacked(name) and not name.partition(".")[2].startswith("router"))
               or name == _output_matrix(m)) * DTYPE_BYTES[m.dtype]


def layer_activations(m: ModelConfig, tensor: int, lanes: int = 1, stack: str = "layers") -> dict[str, int]:
    """One layer's activations per token on one device, in elements (N, K heads of H, MLP width F; heads
    and F split over `tensor` where it divides them, as training does): the layer input and its normed copy
    (2D), q, k, v after RoPE (NH + 2KH), attention's output and its projection (NH + D), the residual sum
    and its normed copy (2D), gate, up and their product (3F) and the down projection (D). `lanes`: the
    tile of the minor dimension (TPU_LANES on a TPU), to which a per-head array's head dim is rounded up.
    `stack` "moe_layers": an MoE layer, whose F is its shared experts' width (0 without them); its routed
    experts' activations depend on the device's tokens, not per token: `moe_buffers`. With
    ModelConfig.sequence_parallel the input and the residual sum are split over `tensor` too.
    Multi-head latent attention (attention_kind "mla"): "latent" is its down projections' outputs, the
    query's (Rq) and the key-value latent with the RoPE key (Rkv + Hr), whole on every tensor device; q and k
    are N heads of qk_nope + qk_rope, v and the attention's output N heads of v_head_dim (0 for "mha")."""
    D = m.d_model
    F = m.n_shared_experts * m.effective_moe_mlp_dim if stack == "moe_layers" else m.effective_mlp_dim
    N, K, F = (n // tensor if n % tensor == 0 else n for n in (m.n_heads, m.n_kv_heads, F))
    H, Hv = (-(-h // lanes) * lanes for h in (m.effective_head_dim, m.value_head_dim))
    latent = sum(-(-r // lanes) * lanes for r in (m.q_lora_rank, m.kv_lora_rank + m.qk_rope_head_dim) if r)
    # Sequence parallelism splits the residual stream (the layer input, the residual sum) over tensor.
    R = D // tensor if m.sequence_parallel and D % tensor == 0 else D
    return {"input": R, "normed": D, "latent": latent if m.mla else 0, "q": N * H, "k": K * H, "v": K * Hv,
            "attention": N * Hv, "out": D, "residual": R, "normed2": D, "gate": F, "up": F, "act": F,
            "down": D}


def kv_cache_bytes(m: ModelConfig, batch: int, seq_len: int) -> int:
    """Bytes of a decoding KV cache (`model.Transformer.init_cache`) in the compute dtype: every layer's
    keys and values, n_kv_heads of head_dim each a token, or with multi-head latent attention the latent and
    the shared RoPE key (kv_lora_rank + qk_rope_head_dim a token: DeepSeek-V3's 576 where its 128 heads'
    keys and values would take 2 x 128 x 192 = 49,152), plus each slot's int32 segment id."""
    per_token = (m.kv_lora_rank + m.qk_rope_head_dim if m.mla else 2 * m.n_kv_heads * m.effective_head_dim)
    return batch * seq_len * (m.n_layers * per_token * DTYPE_BYTES[m.dtype] + 4)


def moe_buffers(m: ModelConfig, tokens: int, tensor: int, expert: int) -> dict[str, int]:
    """One MoE layer's routing and routed experts on one device with `tokens` (n) tokens, in bytes (R rows
    of `moe_rows`, the expert width Fe split over `tensor` where it divides it, as the shard_map does):
    the router's float32 logits and scores (n, E); the tokens dispatched (R, D) and, with an expert axis,
    the buffer the all-to-all receives; the experts' gate, up and their product (R, Fe); their down
    projection (R, D) and, with an expert axis, the buffer the all-to-all returns; each token's k outputs
    (n, k, D) before they are weighted and summed. Empty for a dense model."""
    if not m.n_experts:
        return {}
    cdt, D, E, k = DTYPE_BYTES[m.dtype], m.d_model, m.n_experts, m.n_experts_per_token
    Fe = m.effective_moe_mlp_dim
    Fe = Fe // tensor if Fe % tensor == 0 else Fe
    rows, moved = moe_rows(m, tokens, expert), expert > 1
    return {"logits": tokens * E * 4, "scores": tokens * E * 4, "sent": rows * D * cdt,
            "received": rows * D * cdt if moved else 0, "gate": rows * Fe * cdt, "up": rows * Fe * cdt,
            "act": rows * Fe * cdt, "down": rows * D * cdt, "returned": rows * D * cdt if moved else 0,
            "combined": tokens * k * D * cdt}


def moe_kept(m: ModelConfig, expert: int) -> set[str]:
    """The rows of `moe_buffers` that `m`'s remat policy (or the one its offload_* policy is named after)
    keeps for the backward pass."""
    base = m.remat.removeprefix(OFFLOAD)
    kept = MOE_KEPT[base] - (_MOE_DOTS if base == "save_dots" and not capacity_path(m, expert) else set())
    return kept - {"sent"} if expert > 1 and "received" in kept else kept


def activation_bytes(m: ModelConfig, batch: int, seq_len: int, tensor: int, *, lanes: int = 1,
                     splash: bool = False, expert: int = 1) -> tuple[int, int]:
    """(device bytes, host bytes) that one micro-batch of `batch` sequences keeps for the backward pass.

    The scan keeps, of every layer, what the remat policy saves (`KEPT`: everything but the down
    projection for "none", the matmul outputs for "save_dots" and "dots_no_batch", the projections for
    "minimal" and "save_qkv_proj", the layer input for "full"). Kept whole ("none"), a layer also keeps
    what its elementwise ops need for their gradients: both RMSNorms' input and output in float32 and
    SiLU's output. `splash` (TPU splash attention): a policy that keeps k and v also holds them in the
    kernel's (B, K, T, H) layout, the head dim minor. An offload_<policy> keeps what <policy> keeps in
    pinned host memory (unpadded), all but the layer input, which only offload_full moves there; the
    device holds two layers of it in flight (one leaving or arriving while the next is computed). An MoE
    layer also keeps what the policy keeps of its routing and dispatch (`MOE_KEPT`, `moe_buffers`, with
    `expert` the mesh's expert axis), and without remat SiLU's residuals (`MOE_SILU_KEPT`).
    """
    base = m.remat.removeprefix(OFFLOAD)
    kept = KEPT[base]
    offloaded = set() if base == m.remat else kept if base == "full" else kept - {"input"}
    cdt, tokens = DTYPE_BYTES[m.dtype], batch * seq_len
    device = host = in_flight = 0
    for stack, n_layers in _stacks(m):
        layer = layer_activations(m, tensor, lanes, stack)
        unpadded = layer_activations(m, tensor, stack=stack)
        per_layer = sum(layer[k] for k in kept - offloaded) * cdt
        if base == "none":
            per_layer += 2 * 2 * layer["input"] * 4 + layer["act"] * cdt
        if splash and {"k", "v"} <= kept - offloaded:
            per_layer += (layer["k"] + layer["v"]) * cdt
        moving = tokens * sum(layer[k] for k in offloaded) * cdt
        device += n_layers * tokens * per_layer
        host += n_layers * tokens * sum(unpadded[k] for k in offloaded) * cdt
        if stack == "moe_layers":        # routing and dispatch: per device, not per token; never lane-padded
            buffers, moe = moe_buffers(m, tokens, tensor, expert), moe_kept(m, expert)
            away = moe if offloaded else set()
            device += n_layers * (sum(buffers[k] for k in moe - away)
                                  + (MOE_SILU_KEPT * buffers["act"] if base == "none" else 0))
            host += n_layers * sum(buffers[k] for k in away)
            moving += sum(buffers[k] for k in away)
        in_flight = max(in_flight, 2 * moving)
    return device + in_flight, host


def recompute_bytes(m: ModelConfig, batch: int, seq_len: int, tensor: int, *, lanes: int = 1,
                    splash: bool = False, expert: int = 1) -> int:
    """The backward pass of one layer: the layer being recomputed, its activations and their gradients
    (none without remat: every activation is kept), an MoE layer's with its routing and dispatch buffers
    (`moe_buffers`), the larger of a dense and an MoE layer; with `splash`, the kernel's fused backward
    also writes one partial dq per key block (seq_len / attention_block_k of them, each the size of q) and
    sums them. With sequence parallelism the recomputed layer's activations are whole along the sequence
    (gathered for the matmuls), and its input and residual sum are held gathered beside their split
    copies (two more (tokens, D) arrays; measured on the dense 600B at tensor 8)."""
    tokens, cdt = batch * seq_len, DTYPE_BYTES[m.dtype]
    layer = layer_activations(m, tensor, lanes)
    sp = m.sequence_parallel and tensor > 1
    whole = dataclasses.replace(m, sequence_parallel=False)
    out = 0
    if m.remat != "none":
        out = 2 * max(tokens * sum(layer_activations(whole, tensor, stack=stack).values()) * cdt
                      + (sum(moe_buffers(m, tokens, tensor, expert).values()) if stack == "moe_layers" else 0)
                      for stack, _ in _stacks(m))
        out += 2 * tokens * m.d_model * cdt if sp else 0
    if splash:
        out += -(-seq_len // min(m.attention_block_k, seq_len)) * tokens * layer["q"] * cdt
    return out


def loss_bytes(m: ModelConfig, tokens: int, loss_chunk: int, mesh: Mesh) -> int:
    """The chunked cross entropy (stages/train/loss.py): one chunk's float32 logits over this device's
    part of the vocabulary and, with FSDP (each device computes partial logits over its slice of the
    embedding dimension), their float32 sum over the fsdp axis, else their gradient in the compute dtype;
    and the float32 gradient of the output matrix that the chunks accumulate."""
    tensor = mesh.tensor
    vocab = m.vocab_size // tensor if m.vocab_size % tensor == 0 else m.vocab_size
    per_logit = 4 + (4 if mesh.embed_shards > 1 else DTYPE_BYTES[m.dtype])
    return min(loss_chunk, tokens) * vocab * per_logit + _output_matrix_bytes(m, mesh)


def across_slices_bytes(m: ModelConfig, mesh: MeshConfig, tokens: int, device_tokens: int, loss_chunk: int,
                        tensor: int) -> int:
    """What a mesh whose data axis crosses slices (`MeshConfig.dcn_data` > 1) adds to the loss phase,
    read from the compiled step's HLO and buffer report (benchmarks/RESULTS.md):

    - the final hidden states of the whole micro-batch (`tokens`, every device's and every slice's),
      gathered in the compute dtype. The loss flattens the (batch, length) tokens and cuts them into
      chunks of `loss_chunk` over the whole batch (stages/train/loss.py); with the batch split over the
      data-center network too, XLA gathers the chunk axis before the chunk loop, keeping only the split
      within a chunk: each device holds every chunk's share, tokens / (the devices one chunk spans,
      `chunk_tokens` / this device's tokens). On two v5p-2048 slices of the 600B (one 8K sequence a
      device) `bf16[2,1048576,20480]`, 80 GiB, with 8K chunks and half that with 16K chunks. It grows
      with the global tokens and with smaller chunks, not with the layers or the attention kernel;
      Where a device holds several chunks (`loss_chunk` < its tokens) XLA gathers by all-reducing a
      zero-filled copy with its own part written in, so operand and result are both live: twice that
      (`bf16[2,256,4096,2048]` x 2 on the 1B on two v5p-128 slices, against one all-gather on the 600B);
    - a float32 receive buffer for one chunk's logits (this device's share of a chunk x its vocabulary),
      which XLA sums across slices with a send / receive pair (megascale) rather than in place;
    - three float32 copies of the embedding's gradient (its scatter-add) with the whole vocabulary and
      d_model split over tensor only (`f32[128256,2560]` on the 600B with tensor 8, `f32[128256,2048]`
      on the 1B), where one slice keeps it split over every device. These are read from the buffer
      reports; that they are live with the gathered hidden states is inferred from the totals (without
      them the four measured layouts come out 0.73-0.95 of XLA, with them 0.93-1.06).

    `device_tokens` is this device's part of the micro-batch. Not measured for dcn_fsdp or dcn_tensor
    alone (0 here)."""
    if mesh.dcn_data == 1:
        return 0
    vocab = m.vocab_size // tensor if m.vocab_size % tensor == 0 else m.vocab_size
    spans = max(1, min(loss_chunk, tokens) // device_tokens)       # the devices one chunk spans
    copies = 2 if loss_chunk < device_tokens else 1                 # all-reduce (operand + result) or gather
    hidden = copies * tokens // spans * m.d_model * DTYPE_BYTES[m.dtype]
    embed_grads = 3 * m.vocab_size * (m.d_model // tensor if m.d_model % tensor == 0 else m.d_model) * 4
    return hidden + min(loss_chunk, device_tokens) * vocab * 4 + embed_grads


def xla_cpu_bytes(m: ModelConfig, mesh: Mesh, dtype_bytes: int) -> int:
    """What XLA:CPU holds through the loss that the TPU and GPU compilers do not (read from the compiled
    step's HLO schedule and buffer report, benchmarks/RESULTS.md): its scheduler places the zero-filled
    gradient stacks of the scanned layers at the start of the step, so they are live through the loss
    (in the parameters' dtype); and it copies the output matrix into its transposed layout before the
    forward pass and accumulates that matrix's gradient in the transposed layout, then transposes it back:
    two more float32 copies of this device's shard of it."""
    layers = sum(shard_size(shape, names, mesh) for name, (shape, names) in param_layout(m).items()
                 if _stacked(name))
    return layers * dtype_bytes + 2 * _output_matrix_bytes(m, mesh)


def _output_matrix(m: ModelConfig) -> str:
    """The parameter that maps the last hidden state to logits: the embedding itself when tied."""
    return "embed" if m.tie_embeddings else "unembedding"


def _output_matrix_bytes(m: ModelConfig, mesh: Mesh) -> int:
    """This device's shard of the output matrix in float32 (the loss accumulates its gradient so)."""
    return shard_size(*param_layout(m)[_output_matrix(m)], mesh) * 4


def _stacked(name: str) -> bool:
    """Whether a `param_layout` name is a scanned layer stack's ("layers.wq", "moe_layers.experts_up")."""
    return name.partition(".")[0] in LAYER_STACKS


def _stacks(m: ModelConfig) -> list[tuple[str, int]]:
    """(stack, its layers) for each layer stack `m` has: the dense layers, then the MoE layers."""
    counts = {"layers": m.n_layers - m.n_moe_layers, "moe_layers": m.n_moe_layers}
    return [(stack, counts[stack]) for stack in LAYER_STACKS if counts[stack]]
