"""How long one training step takes, predicted from the config: compute at per-operation rates, each
collective's bytes at its link's bandwidth, and a stated rule for what hides behind what. No JAX.

    t = planner.plan(train_config).predicted   # a stages.train.Config; a StepTime (step_time.predict)
    t.seconds, t.mfu                           # the step, and the model FLOPs utilization it implies
    t.largest(3)                               # the terms that cost the most, in words
    make plan GIN=gin/600b.gin                 # prints the prediction beside the memory figures

The model, per device and per step (every micro-batch of gradient accumulation):

  compute (serial on the chip; each term alone)
    matmuls      the dense matmuls' FLOPs (attention projections, MLP, shared experts, router, output
                 matrix) forward, twice that backward, and again what the remat policy recomputes
                 (`RECOMPUTED`), at `Efficiency.matmul` of the chip's peak. A capacity-buffer MoE's
                 experts run here too, padding rows included (a dense einsum over (E, C, D)).
    experts      a dropless MoE's routed experts (a grouped matmul over the assignments sorted by
                 expert), at `Efficiency.grouped` of peak, over the tiles the megablox kernel visits
                 (`grouped_tiles`: each expert's rows start a tile, ~E - 1 tiles more than the rows fill)
    attention    causal attention (half the T x T scores): forward, a flash backward at 2.5x the forward
                 (it recomputes the scores: 5 matmuls to the forward's 2), and the forward again where
                 the policy recomputes it, at `Efficiency.attention` of peak
    memory       what no matmul hides: normalizations, RoPE, SwiGLU, residual sums, the loss's logits
                 and softmax, the optimizer's update of this device's shard (`memory_bytes_per_step`),
                 at `Efficiency.memory` of the chip's HBM bandwidth

  communication (each term's bytes per device over the links its group spans, `Links`: on a TPU slice
  with a topology the group's shape on the chip grid by train.MeshConfig.device_order (planning/topology.py)
  at one port's bandwidth each way x `Efficiency.ici`; across slices the DCN x `.dcn`)
    fsdp         every layer's matrices all-gathered forward and again backward (a third time for the
                 attention projections under full remat), their gradients reduce-scattered (`collectives`
                 says each one, as the compiled TPU step runs it): prefetched, so a layer's collectives run
                 while the previous layer computes; exposed only where they take longer than it (per layer)
    logits       with FSDP, the loss sums each chunk's float32 partial logits over fsdp (all-reduce,
                 stages/train/loss.py): on the critical path
    tensor       Megatron's two all-reduces of the (tokens, D) activations a layer forward, two
                 backward, and the attention's again where the remat recomputes its output projection:
                 on the critical path
    all-to-all   an MoE layer's capacity buffers to the experts and back (`shards.all_to_all_bytes`):
                 on the critical path (what is sent depends on the routing just computed)
    ring collectives (all-gather, reduce-scatter; an all-reduce is both) move (g - 1) / g of the array
                 through each chip at the group's ring ports x a port's rate: 2 ports a side the group
                 wraps, 1 a side it spans without wraparound (topology.Group.ring_ports)
    an all-to-all of B bytes a chip over a group of N moves (N - 1) / N of B, each byte `hops` links on
                 average, over the chip's link-directions along the group's sides, or the group's
                 bisection if that is slower: t = max(B (N - 1) / N x hops / (links x r),
                 B n s / (4 w r)) for the worst side (n chips, stride s, w = 2 wrapped, else 1), r a port's
                 rate each way x Efficiency.ici. By hand, the flagship's expert group of 16 as a wrapped
                 ring along z of v5p:8x8x16: hops = (16 / 4) x 16 / 15 = 4.267 (mean ring distance to the
                 15 others), links = 2, so the spread bound is B x 15 / 16 x 4.267 / (2 r) = 2 B / r, and
                 the bisection (the ring cut twice, 16 B / 4 each way over 2 links) is 2 B / r too: with
                 r = 100 GB/s x 0.7, 28.6 ms a GB. As a 4x4 plane (no wraparound, a part of the 8-long
                 sides) or a 2x2x4 block the bisection gives B / r, half the ring's
    data         the gradients' all-reduce over the data axis (ICI) and across slices (DCN), once a step
                 after the last micro-batch: hidden behind that micro-batch's backward pass where shorter
    offload      an offload_* policy's activations to host memory and back over the host link: hidden
                 behind compute where shorter
    HBM passes   what the hidden collectives (fsdp, data) still cost: each byte of their arrays crosses the
                 chip's HBM `HBM_PASSES` times (written as received, read to forward or to add), at the
                 memory term's rate, on the critical path. Without it the published rows' ratio grew
                 with their FSDP traffic (v6e: 0.98 at 2% of the step, 1.10 at 9%, 1.16 at 11%)

  step = compute + every exposed communication

The efficiencies (`EFFICIENCY`, per platform) are constants of this model, set from published training
throughputs and checked against others held out (benchmarks/step_time.py, benchmarks/RESULTS.md); the
bandwidths are the vendors' (devices.py: ICI per port each way, with its source). What it leaves out:
stragglers, input pipelines, checkpointing, and compiler choices that differ from the rule above (XLA may
fuse, reorder or overlap more or less than it says).
"""

from __future__ import annotations

import dataclasses
import math

from stages.train.mesh import Mesh
from stages.train.model_config import LAYER_STACKS, flops_per_token, param_layout
from stages.train.planning import devices, hlo, shards, topology
from stages.train.planning.shards import DTYPE_BYTES

FLASH_BACKWARD = 2.5     # a flash attention backward's FLOPs over its forward's (5 T x T matmuls to 2)
# The matmul groups a remat policy recomputes in the backward pass (the down projections never: their
# outputs only feed the residual sum). "attention" is the T x T core; "experts_in" the routed experts' gate
# and up (a dropless grouped matmul is no dot_general, so save_dots cannot keep it: `_recomputed`).
# The HBM passes a collective makes over each byte of its array on a device (a ring's received chunk is
# written, then read to forward it; a reduction also reads the local partial sum to add): what a collective
# hidden behind compute still takes from it, since both share the chip's HBM.
HBM_PASSES = {"all-gather": 2, "reduce-scatter": 3, "all-reduce": 5}

RECOMPUTED = {
    "none": frozenset(),
    "save_dots": frozenset(),
    "dots_no_batch": frozenset({"attention", "experts_in"}),
    "minimal": frozenset({"attention", "mlp_in", "router", "experts_in"}),
    "save_qkv_proj": frozenset({"attention", "out", "mlp_in", "router", "experts_in"}),
    "full": frozenset({"qkv", "attention", "out", "mlp_in", "router", "experts_in"}),
}


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """The share of a peak rate each kind of work reaches on a device."""

    matmul: float       # dense matmuls, of peak FLOP/s
    grouped: float      # a dropless MoE's grouped matmul, of the dense matmuls' rate
    attention: float    # the flash / splash attention kernels, of the dense matmuls' rate
    memory: float       # elementwise work, of HBM bandwidth
    ici: float          # collectives within a slice (ICI, NVLink), of the link bandwidth
    dcn: float          # collectives across slices or nodes, of the data-center network bandwidth
    host: float         # host offload transfers, of the host link


# `matmul` and the TPU's `grouped` are fitted to the calibration rows of benchmarks/step_time.py (each run
# file there says which constant it sets; `python -m benchmarks.step_time --calibrate` refits them); every
# other row is held out (the H100's grouped figure is the TPUs': no published GPU MoE row here). The rest
# are assumed, neither fitted nor measured here: attention kernels at 70% of the dense matmuls' rate,
# elementwise work at 70% of HBM bandwidth, collectives at 70% of the ICI figure of devices.py (on a TPU
# slice with a topology, of one port's rate each way, `Links`; 40% of NVLink's bidirectional 900 GB/s, a
# ring's one direction less its overhead), host offload at 70% of the host link. No published row here
# exposes its collectives, so none of these has been checked against a throughput. A device without a row
# of its own borrows its platform's (`efficiency`); the plan says so.
EFFICIENCY = {
    "tpu-v5p": Efficiency(matmul=0.841, grouped=0.808, attention=0.7, memory=0.7, ici=0.7, dcn=0.7, host=0.7),
    "tpu-v6e": Efficiency(matmul=0.681, grouped=0.808, attention=0.7, memory=0.7, ici=0.7, dcn=0.7, host=0.7),
    "h100": Efficiency(matmul=0.634, grouped=0.808, attention=0.7, memory=0.7, ici=0.4, dcn=0.7, host=0.7),
    "cpu": Efficiency(matmul=0.5, grouped=0.6, attention=0.6, memory=0.5, ici=0.5, dcn=0.5, host=0.5),
}
PLATFORM_ROW = {"tpu": "tpu-v5p", "gpu": "h100", "cpu": "cpu"}


def efficiency(device: devices.Device) -> tuple[Efficiency, str]:
    """(the efficiencies for `device`, "" or the row they were borrowed from when it has none)."""
    if device.name in EFFICIENCY:
        return EFFICIENCY[device.name], ""
    row = PLATFORM_ROW[platform(device)]
    return EFFICIENCY[row], row


def platform(device: devices.Device) -> str:
    return "tpu" if device.name.startswith("tpu-") else "cpu" if device.name == "cpu" else "gpu"


@dataclasses.dataclass(frozen=True)
class Term:
    name: str          # "matmuls", "all-to-all over expert 64", ...
    seconds: float     # what it takes alone, per step
    exposed: float     # what it adds to the step (compute terms: all of it)
    note: str = ""     # how it was hidden, or what it counts


@dataclasses.dataclass(frozen=True)
class StepTime:
    terms: tuple[Term, ...]
    model_flops: float          # the step's model FLOPs on one device (flops_per_token x its tokens)
    peak: float                 # the device's peak FLOP/s

    @property
    def seconds(self) -> float:
        return sum(t.exposed for t in self.terms)

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.seconds * self.peak)

    def term(self, name: str) -> Term | None:
        return next((t for t in self.terms if t.name.startswith(name)), None)

    def largest(self, n: int = 3) -> str:
        """"matmuls 9.1 s, all-to-all over expert 64 2.1 s (60% hidden), ..." of the n longest terms."""
        out = []
        for t in sorted(self.terms, key=lambda t: -t.seconds)[:n]:
            hidden = 1 - t.exposed / t.seconds if t.seconds else 0
            shown = f" ({hidden:.0%} hidden behind compute)" if hidden > 0.005 else ""
            out.append(f"{t.name} {_s(t.seconds)}{shown}")
        return ", ".join(out)


def predict(cfg, mesh: Mesh, micro_batch: int, host_bytes: int) -> StepTime:
    """The predicted step of `cfg` (a stages.train.Config) on its hardware (see the module docstring), with
    `mesh` (the whole mesh, a `Mesh`), `micro_batch` (sequences a device a micro-batch) and `host_bytes` (what
    an offload policy keeps in host memory a micro-batch) as `planner.plan` computes them: call that, whose
    `Plan.predicted` this is."""
    m = cfg.model
    device = devices.get(cfg.hardware.device)
    eff, _ = efficiency(device)
    accum = cfg.optimizer.grad_accum_steps
    T, tensor = cfg.seq_len, mesh.tensor
    tokens = micro_batch * T * accum                       # this device's tokens a step
    recomputed = _recomputed(m, mesh.expert)

    groups = matmul_flops(m, mesh.expert, micro_batch * T)          # per token, forward, whole
    dense = sum(f * (3 + (g in recomputed)) for g, f in groups.items() if g != "experts_in" and
                g != "experts_out") / tensor
    experts = (groups["experts_in"] * (3 + ("experts_in" in recomputed)) + groups["experts_out"] * 3) / tensor
    dropless = m.n_experts and not (m.moe_capacity_factor or mesh.expert > 1)
    # Forward, per token, causal: the scores and the values at the query's width (MLA's values are padded
    # to it for the kernels, stages/train/model.py, so they cost as much as the scores).
    attention = 2 * T * m.n_heads * m.effective_head_dim * m.n_layers / tensor
    attention *= 1 + FLASH_BACKWARD + ("attention" in recomputed)
    peak = device.peak_flops
    rate = peak * eff.matmul
    compute = [Term("matmuls", tokens * (dense + (0 if dropless else experts)) / rate, 0)]
    if dropless:
        waste = grouped_tiles(m, micro_batch * T, device.name)
        compute.append(Term("experts (grouped matmul)", tokens * experts * waste / (rate * eff.grouped), 0))
    compute.append(Term("attention", tokens * attention / (rate * eff.attention), 0))
    compute.append(Term("memory-bound ops", memory_bytes_per_step(cfg, mesh, micro_batch, recomputed)
                        / (device.hbm_bytes_per_s * eff.memory), 0))
    compute = [dataclasses.replace(t, exposed=t.seconds) for t in compute]
    busy = sum(t.seconds for t in compute)
    comms = _communication(cfg, mesh, micro_batch, device, eff, busy, recomputed, host_bytes)
    model_flops = flops_per_token(m, T) * tokens / tensor
    return StepTime(tuple(compute + comms), model_flops, peak)


def grouped_tiles(m, tokens: int, device: str) -> float:
    """The work the megablox grouped matmul does over the work its rows hold, for one call on `tokens`
    tokens a device (a micro-batch; every expert local, as a dropless step has them): the kernel walks
    tiles of m.moe_tile_rows rows, and a tile an expert's rows start in is walked once for each expert in
    it, so a call visits ceil(rows / tile) + E - 1 tiles (every group boundary inside a tile, as routed
    group sizes are). DeepSeek-V3 at 6 x 8K tokens a chip, top-8 of 256, 512-row tiles: 1.33. ragged_dot
    (GPUs, or where jax lacks megablox) and the CPU's tiled scan are charged their rows (1.0)."""
    megablox = m.moe_impl == "megablox" or (m.moe_impl == "auto" and device.startswith("tpu"))
    rows = tokens * m.n_experts_per_token
    if not megablox or not rows:
        return 1.0
    tile = m.moe_tile_rows
    return (-(-rows // tile) + m.n_experts - 1) * tile / rows


def matmul_flops(m, expert: int, tokens: int) -> dict[str, float]:
    """Forward FLOPs per token of each matmul group, whole (not split over tensor): "qkv", "out", "mlp_in"
    (gate and up, the shared experts' too), "mlp_out", "router", "experts_in", "experts_out" (a capacity
    buffer's padding rows included: rows / tokens assignments a token) and "unembed". Multi-head latent
    attention's "qkv" is its down and up projections (`model_config.mla_layout`), its "out" N heads of
    v_head_dim."""
    D, N, K, H = m.d_model, m.n_heads, m.n_kv_heads, m.effective_head_dim
    dense_layers, moe_layers = m.n_layers - m.n_moe_layers, m.n_moe_layers
    F = m.effective_mlp_dim
    Fs = m.n_shared_experts * m.effective_moe_mlp_dim
    qkv = 2 * D * (N + 2 * K) * H
    if m.mla:
        Rq, Rkv, Hr = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
        query = D * Rq + Rq * N * H if Rq else D * N * H
        qkv = 2 * (query + D * (Rkv + Hr) + Rkv * N * (m.qk_nope_head_dim + m.v_head_dim))
    out = {"qkv": qkv * m.n_layers, "out": 2 * N * m.value_head_dim * D * m.n_layers,
           "mlp_in": 2 * 2 * D * (F * dense_layers + Fs * moe_layers),
           "mlp_out": 2 * D * (F * dense_layers + Fs * moe_layers),
           "router": 2 * D * m.n_experts * moe_layers, "experts_in": 0.0, "experts_out": 0.0,
           "unembed": 2 * D * m.vocab_size}
    if m.n_experts:
        rows = shards.moe_rows(m, tokens, expert) / tokens        # expert rows a token costs on its device
        Fe = m.effective_moe_mlp_dim
        out["experts_in"] = 2 * 2 * D * Fe * rows * moe_layers
        out["experts_out"] = 2 * Fe * D * rows * moe_layers
    return out


def memory_bytes_per_step(cfg, mesh: Mesh, micro_batch: int, recomputed=frozenset()) -> float:
    """HBM bytes a device reads and writes a step in work no matmul hides, in the compute dtype, per token
    and layer: two RMSNorms (read D, write D each), two residual sums (read 2D, write D each), RoPE on q and
    k (read and write (N + K) H), SwiGLU's product (read 2F, write F; an MoE layer's shared experts); an MoE
    layer's dispatch (gather its R rows of D, write them), its experts' SwiGLU product over (R, Fe) and the
    combine (read the R outputs, write and sum each token's k); twice all that backward and once more for a
    recomputed layer. The loss reads and writes each token's logits four times in float32 (the chunk's
    logits, their softmax, its gradient, the gradient in the compute dtype); the optimizer reads the
    parameters, gradients and two moments of this device's shard and writes three of them back, and the
    gradient accumulator is read and written once a micro-batch."""
    m, tensor = cfg.model, mesh.tensor
    cdt = DTYPE_BYTES[m.dtype]
    D = m.d_model / (tensor if m.sequence_parallel else 1)
    heads = (m.n_heads + m.n_kv_heads) * m.effective_head_dim / tensor
    if m.mla:   # RoPE on the query's and the shared key's rope dims, the latents' norms, the key concatenated
        # with the broadcast RoPE key and the value padded to the query's width (each written, then read)
        heads = ((m.n_heads + 1) * m.qk_rope_head_dim / tensor + m.q_lora_rank + m.kv_lora_rank
                 + 2 * m.n_heads * m.effective_head_dim / tensor)
    passes = 3 + (1 if recomputed else 0)
    accum = cfg.optimizer.grad_accum_steps
    tokens = micro_batch * cfg.seq_len                     # a micro-batch's, on this device
    per_token = 0.0
    for stack, layers in (("layers", m.n_layers - m.n_moe_layers), ("moe_layers", m.n_moe_layers)):
        F = m.effective_mlp_dim if stack == "layers" else m.n_shared_experts * m.effective_moe_mlp_dim
        layer = 10 * D + 3 * F / tensor + 2 * heads
        if stack == "moe_layers":
            rows = shards.moe_rows(m, tokens, mesh.expert) / tokens        # expert rows a token
            k = m.n_experts_per_token
            layer += (3 * rows * m.d_model + 3 * rows * m.effective_moe_mlp_dim / tensor
                      + (2 * k + 1) * m.d_model)
        per_token += layers * layer * cdt * passes
    per_token += 4 * 4 * m.vocab_size / tensor
    return tokens * accum * per_token + update_bytes(cfg, mesh)


def update_bytes(cfg, mesh: Mesh) -> float:
    """The HBM bytes of a step's optimizer update on a device (part of `memory_bytes_per_step`): it reads the
    parameters, gradients and two moments of this device's shard and writes three of them back, and with
    gradient accumulation the accumulator is read and written once a micro-batch."""
    accum = cfg.optimizer.grad_accum_steps
    shard = shards.param_bytes(cfg.model, mesh, DTYPE_BYTES[cfg.model.param_dtype])
    return 7 * shard + (2 * shard * accum if accum > 1 else 0)


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective the model says a step runs, as `hlo.collectives` reads a compiled step's."""

    kind: str                 # hlo.KINDS
    dtype: str                # "bf16", "f32" (HLO's names)
    shape: tuple[int, ...]    # of the whole array it gathers, reduces or exchanges, on one device
    count: int                # times a step
    axis: str                 # the mesh axis it runs over
    what: str                 # the parameter or activation it moves

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.elements * hlo.DTYPE_BYTES[self.dtype]


def collectives(cfg, mesh: Mesh, micro_batch: int) -> list[Collective]:
    """The collectives of one step by the model, per device (tests compare them with a compiled step's):

    - fsdp: each layer's matmul weights, whole over fsdp (split over tensor and expert as trained),
      all-gathered in the compute dtype forward and again backward (the remat's recompute uses the
      backward's), and their gradients reduce-scattered once, for every micro-batch;
    - the loss (stages/train/loss.py): with FSDP each chunk's float32 partial logits, this device's rows of
      the chunk by its vocabulary, all-reduced over fsdp forward and backward;
    - tensor: Megatron's two all-reduces of the (tokens, D) activations a layer forward and two backward,
      and the attention's again where the remat recomputes its output projection;
    - expert: the (E, C, D) capacity buffers to the experts and back (`shards.all_to_all_bytes`);
    - data: the gradients' all-reduce, float32, once a step."""
    m, accum, T = cfg.model, cfg.optimizer.grad_accum_steps, cfg.seq_len
    cdt, pdt = _HLO_DTYPE[m.dtype], _HLO_DTYPE[m.param_dtype]
    out = []
    if mesh.embed_shards > 1:
        for name, (shape, names), layers in _layer_matrices(m):
            dims = shards.gathered_shape(shape[1:], names[1:], mesh)
            if math.prod(dims) == shards.shard_size(shape[1:], names[1:], mesh):
                continue                                   # its embed is not split: nothing to gather
            axis = ",".join(shards.gathered_axes(shape[1:], names[1:], mesh))
            part = name.partition(".")[2]
            # What the compiled TPU step does (tests/train/test_aot.py): the router is read in float32
            # (stages/train/moe.py), so gathered and reduced in the parameters' dtype, and the routed experts'
            # gradients leave their shard_map in it too; a stack of one layer is no loop, and its backward
            # reuses the forward's gathered weights; under full remat the attention projections are
            # gathered a third time, for the recompute (MLA's: its query and key-value projections, not its
            # output projection).
            gathers = 1 if layers == 1 else 2 + (m.remat.removeprefix("offload_") == "full"
                                                 and part in REGATHERED[m.attention_kind])
            out.append(Collective("all-gather", pdt if part == "router" else cdt, dims,
                                  gathers * layers * accum, axis, name))
            out.append(Collective("reduce-scatter", pdt if part == "router" or part.startswith("experts_")
                                  else cdt, dims, layers * accum, axis, name))
    if mesh.fsdp > 1:
        tokens = micro_batch * T
        chunks = -(-cfg.global_batch // accum * T // cfg.loss_chunk)
        vocab = m.vocab_size // mesh.tensor if m.vocab_size % mesh.tensor == 0 else m.vocab_size
        out.append(Collective("all-reduce", "f32", (min(cfg.loss_chunk, tokens), vocab), 2 * chunks * accum,
                              "fsdp,expert" if mesh.expert > 1 else "fsdp", "logits"))
    if mesh.tensor > 1:
        # Forward: after the output projection and after the down projection; backward: their transposes
        # (before q, k, v and before gate, up); a remat that recomputes the output projection redoes its
        # all-reduce (the down projection is never recomputed).
        again = "out" in _recomputed(m, mesh.expert)
        out.append(Collective("all-reduce", cdt, (micro_batch, T, m.d_model),
                              m.n_layers * (4 + again) * accum, "tensor", "activations"))
    buffer, count = shards.all_to_all_bytes(cfg, mesh, micro_batch)
    if count:
        rows = shards.moe_rows(m, micro_batch * T, mesh.expert)
        out.append(Collective("all-to-all", cdt, (rows, m.d_model), count, "expert", "capacity buffers"))
    if mesh.data > 1:
        out.append(Collective("all-reduce", "f32", (shards.param_bytes(m, mesh, 1),), 1, "data",
                              "gradients"))
    return out


_HLO_DTYPE = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


# The attention projections the compiled TPU step gathers a third time under full remat, by attention kind
# (tests/train/test_aot.py compiles both).
REGATHERED = {"mha": ("wq", "wk", "wv", "wo"), "mla": ("wq", "wq_a", "wq_b", "wkv_a", "wkv_b")}


def _layer_matrices(m):
    """(name, (shape, logical names), layers) of each stacked layer parameter that is a matrix or more (the
    norms and the router's bias are not gathered as layers: XLA keeps such small vectors whole)."""
    counts = {"layers": m.n_layers - m.n_moe_layers, "moe_layers": m.n_moe_layers}
    return [(name, layout, counts[name.partition(".")[0]]) for name, layout in param_layout(m).items()
            if name.partition(".")[0] in LAYER_STACKS and len(layout[0]) >= 3]


def _communication(cfg, mesh, micro_batch, device, eff, busy, recomputed, host_bytes) -> list[Term]:
    """Each collective of `collectives` over the links its group spans (`Links`: a ring all-gather or
    reduce-scatter moves (g - 1) / g of the array a device, an all-reduce twice that; an all-to-all by its
    group's hops and bisection), hidden or not by the overlap rule of the module docstring."""
    m, accum = cfg.model, cfg.optimizer.grad_accum_steps
    dcn = device.dcn_bytes_per_s * eff.dcn
    links = Links.of(cfg, mesh, device, eff)
    by_what = collectives(cfg, mesh, micro_batch)
    out = []
    fsdp, slices = mesh.fsdp, Mesh.from_shape(cfg.mesh.dcn_shape)     # the slices each axis spans
    layered = [c for c in by_what if c.axis.startswith("fsdp") and c.what != "logits"
               or c.axis == "expert" and c.kind != "all-to-all"]
    if layered:
        # Per layer and micro-batch: its collectives run while the previous layer computes; the part across
        # slices (dcn_fsdp x dcn_expert of the group's) moves (dcn - 1) / group of the array over DCN
        # (gathered there first), the rest over ICI.
        per_layer_compute = busy / accum / m.n_layers
        alone = hidden = 0.0
        for stack, layers in (("layers", m.n_layers - m.n_moe_layers), ("moe_layers", m.n_moe_layers)):
            seconds = 0.0
            for c in (c for c in layered if c.what.startswith(f"{stack}.")):
                axes = c.axis.split(",")
                group, across = mesh.product(axes), slices.product(axes)
                ring = group // across
                seconds += c.bytes * c.count / (layers * accum) * ((ring - 1) / ring / links.ring_rate(axes)
                                                                   + (across - 1) / group / dcn)
            alone += layers * accum * seconds
            hidden += layers * accum * max(0.0, seconds - per_layer_compute)
        over = f"fsdp {fsdp}" + (f" (x expert {mesh.expert} for all but the experts)" if mesh.expert > 1
                                 else "")
        out.append(Term(f"fsdp all-gathers and reduce-scatters over {over}", alone, hidden,
                        "prefetched behind the previous layer's compute" + links.says(("fsdp",))))

    for c in by_what:
        axes = c.axis.split(",")
        group = mesh.product(axes)
        if c.what == "logits" or c.axis == "tensor":
            seconds = c.bytes * c.count * 2 * (group - 1) / group / links.ring_rate(axes)
            out.append(Term(f"{c.what}' all-reduce over {c.axis.replace(',', ' x ')} {group}"
                            if c.what == "logits" else
                            f"tensor all-reduces over tensor {group}", seconds, seconds, links.says(axes)))
        elif c.kind == "all-to-all":
            seconds = c.count * links.all_to_all(c.bytes, group, cfg.mesh.dcn_expert, dcn)
            out.append(Term(f"all-to-all over expert {group}", seconds, seconds, links.says(("expert",))))
        elif c.axis == "data":
            ici_data, dcn_data = group // cfg.mesh.dcn_data, cfg.mesh.dcn_data
            ring = (ici_data - 1) / ici_data / links.ring_rate(axes) + (dcn_data - 1) / dcn_data / dcn
            seconds = 2 * c.bytes * c.count * ring
            backward = busy / accum * 2 / 3
            out.append(Term(f"gradient all-reduce over data {group}", seconds, max(0.0, seconds - backward),
                            "behind the last micro-batch's backward pass" + links.says(axes)))
    behind = layered + [c for c in by_what if c.axis == "data"]
    if behind:
        seconds = sum(c.bytes * c.count * HBM_PASSES[c.kind] for c in behind) / (device.hbm_bytes_per_s
                                                                                  * eff.memory)
        out.append(Term("HBM passes of the hidden collectives", seconds, seconds,
                        "each byte written and read again, 2 passes a gather, 3 a reduction"))
    if m.remat.startswith("offload_") and device.host_bytes:
        seconds = 2 * host_bytes * accum / (device.host_link_bytes_per_s * eff.host)
        out.append(Term("host offload", seconds, max(0.0, seconds - busy), "behind compute"))
    return out


@dataclasses.dataclass(frozen=True)
class Links:
    """The links a step's collectives cross: on a TPU slice with a topology, each group's own (its shape on
    the chip grid by the mesh's device order, planning/topology.py) at one port's bandwidth each way
    (`devices.Device.ici_port_bytes_per_s`) x `Efficiency.ici`; elsewhere (a GPU's NVLink switch, a TPU
    without a topology, an order jax would split a side for) the chip's whole ICI figure x `Efficiency.ici`,
    an all-to-all crossing `all_to_all_hops`.

    Rates assumed, not measured: `Efficiency.ici` (0.7 on TPUs) of the vendor's per-port figure for every
    collective; a ring collective driving every port its group's sides give it at once (XLA's multi-
    dimensional rings); an all-to-all's traffic spread evenly over the group's links (no routing hot spot
    beyond the bisection bound)."""

    device: devices.Device
    whole: float                        # bytes/s: the chip's whole ICI figure x eff.ici
    port: float = 0.0                   # bytes/s: one port each way x eff.ici (placed)
    grid: object = None                 # topology.Grid, or None: not placed
    order: object = None                # topology.Order
    explicit: bool = False              # the order is train.MeshConfig.device_order's, not jax's
    # axes -> their group, as asked (a step's collectives ask for the same few groups hundreds of times)
    _groups: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, cfg, mesh: Mesh, device: devices.Device, eff: Efficiency) -> Links:
        """The links of `cfg`'s step on `device`; ValueError naming a device_order that does not tile the
        topology."""
        whole = cls(device, device.ici_bytes_per_s * eff.ici)
        text, topo = cfg.mesh.device_order, cfg.hardware.topology
        if not topo or not device.ici_ports:
            if text and topo:
                raise ValueError(f"train.MeshConfig.device_order={text!r} places the mesh on a TPU grid, but "
                                 f"device={device.name!r} has none")
            return whole
        g = topology.grid(topo)
        sizes = cfg.mesh.ici_shape(mesh.devices)
        if math.prod(sizes) != g.chips:
            return whole
        order = topology.device_order(g, sizes, text)
        if order is None:
            return whole
        return cls(device, whole.whole, device.ici_port_bytes_per_s * eff.ici, g, order, bool(text))

    def describe(self) -> str:
        """"device order fsdp:8x8x1,expert:1x1x16 on v5p:8x8x16 (8x8x16, every side wrapped; jax's
        placement: train.MeshConfig.device_order="")", or "" when not placed."""
        if self.grid is None:
            return ""
        whose = "train.MeshConfig.device_order's" if self.explicit else \
            'jax\'s placement: train.MeshConfig.device_order=""'
        return (f"device order {self.order.describe() or 'one chip'} on {self.grid.topology} "
                f"({self.grid.describe()}; {whose})")

    def group(self, axes) -> topology.Group | None:
        if self.grid is None:
            return None
        axes = tuple(axes)
        if axes not in self._groups:
            self._groups[axes] = topology.group(self.grid, self.order, axes)
        return self._groups[axes]

    def ring_rate(self, axes) -> float:
        """Bytes/s a ring collective over `axes` moves through a chip: its group's ring ports x a port's
        rate each way (placed), else the whole ICI rate."""
        g = self.group(axes)
        if g is None or g.chips <= 1:
            return self.whole
        return g.ring_ports * self.port

    def all_to_all(self, nbytes: float, chips: int, slices: int = 1, dcn: float = 0.0) -> float:
        """Seconds for an all-to-all of `nbytes` a device among `chips` (the expert axis) that span `slices`
        slices (MeshConfig.dcn_expert): the (slices - 1) / slices of the bytes bound for other slices cross
        the data-center network at `dcn` bytes/s a chip, then the rest moves as an all-to-all among the
        chips / slices of the device's own slice."""
        across = nbytes * (slices - 1) / slices / dcn if slices > 1 else 0.0
        local, inner = nbytes / slices, chips // slices
        if inner <= 1:
            return across
        g = self.group(("expert",))
        if g is None or g.chips != inner:        # not placed
            return across + local * (inner - 1) / inner / self.whole * all_to_all_hops(self.device, inner)
        return across + g.all_to_all_time(local, self.port)

    def says(self, axes) -> str:
        """"; expert 16 as 1x1x16 (a ring along z, wrapped): 4.27 hops, 2 ports" ("" when not placed)."""
        g = self.group(axes)
        if g is None or g.chips <= 1:
            return ""
        return (f"; {' x '.join(axes)} {g.chips} as {g.describe()}: {g.hops:.3g} hops, "
                f"{g.ring_ports:.3g} ring ports, {g.links:.3g} link-directions, "
                f"{self.device.ici_port_bytes_per_s / 1e9:,.0f} GB/s a port each way")


def all_to_all_hops(device: devices.Device, chips: int) -> float:
    """Where the placement is unknown (no topology): the links an all-to-all's byte crosses on average among
    `chips` chips: 1 through a switch (NVLink, the data-center network); on a TPU torus (v4, v5p: 3D; v5e,
    v6e: 2D) the mean ring distance n / 4 of each side, the chips taken as a cube (a square) of side n, at
    the chip's whole ICI bandwidth. With a topology, `Links` charges the group's own shape instead."""
    if platform(device) != "tpu" or chips <= 1:
        return 1.0
    dims = 3 if device.name in ("tpu-v4", "tpu-v5p") else 2
    return max(1.0, dims * chips ** (1 / dims) / 4)


def _recomputed(m, expert: int) -> frozenset:
    base = m.remat.removeprefix("offload_")
    out = RECOMPUTED[base]
    dropless = m.n_experts and not (m.moe_capacity_factor or expert > 1)
    if base == "save_dots" and dropless:
        out = out | {"experts_in"}
    return out


def _s(x: float) -> str:
    return f"{x:,.3g} s" if x >= 0.1 else f"{x * 1e3:,.3g} ms"
