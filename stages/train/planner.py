"""Will this training config fit its hardware, and how long will it take? Answered from the config alone.

    make plan GIN=gin/600b.gin                      (prints `plan(config).render()` for the train stage)
    p = planner.plan(train_config)                  # a stages.train.Config
    p.fits, p.per_device["total"], p.days          # the verdict, bytes per device, the run's length
    print(p.render())

Per device, in bytes, under the configured mesh (`train.MeshConfig`) on the configured hardware
(`train.HardwareConfig`):

    params       every parameter, sharded by its logical axes exactly as training places it
                 (`configs.param_layout`, `configs.mesh_axes`), in `param_dtype`
    grads        the same layout and dtype (JAX's gradients of float32 parameters are float32)
    optimizer    AdamW and muon's fallback 2 moments, lion and muon 1, adafactor factored row/column
                 statistics
    gathered     with FSDP, one layer's parameters gathered whole (and their gradient before it is
                 reduce-scattered)
    activations  what one micro-batch keeps for the backward pass under the remat policy (see
                 `activation_bytes`), plus the working set of one layer recomputed in the backward pass
                 and one chunk of logits

The figures are estimates from first principles, so they can be read without a compiler; `--compile`
(stages/train/aot.py) puts XLA's own per-device figure for the real train step beside them. The time
estimate is FLOPs per token (`configs.flops_per_token`) x tokens per step / (chips x peak x the assumed
MFU). This module imports no JAX: `make plan` runs in a second.
"""

from __future__ import annotations

import dataclasses
import math

from stages.train import devices
from stages.train.configs import (
    BATCH_AXES,
    REMAT_NAMES,
    ModelConfig,
    flops_per_token,
    mesh_axes,
    param_counts,
    param_layout,
    topology_chips,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
HEADROOM = 0.9     # the share of HBM a plan may use: the runtime, XLA's buffers, fragmentation take the rest
# From the lightest to the heaviest rematerialization: what the planner suggests, in order, when short.
REMAT_ORDER = ("none", "save_dots", "dots_no_batch", "minimal", "save_qkv_proj", "full")
assert set(REMAT_ORDER) == set(REMAT_NAMES)


@dataclasses.dataclass(frozen=True)
class Plan:
    config: object                    # the stages.train.Config planned
    device: devices.Device
    chips: int                        # all chips, every slice
    mesh: dict[str, int]              # {"data": d, "fsdp": f, "tensor": t}
    micro_batch: int                  # sequences per device per micro-batch
    params: dict[str, int]            # parameters by part
    per_device: dict[str, int]        # bytes: params, grads, optimizer, activations, gathered, total
    flops_per_token: float
    step_s: float
    problem: str = ""                 # a layout that cannot run at all (the batch does not split), else ""
    advice: str = ""                  # "" when it fits; else the smallest change that would fit

    @property
    def budget(self) -> int:
        """Usable bytes per device."""
        return int(self.device.hbm_bytes * HEADROOM)

    @property
    def fits(self) -> bool:
        return not self.problem and self.per_device["total"] <= self.budget

    @property
    def tokens(self) -> int:
        """The run's token budget: steps x global batch x sequence length."""
        return self.config.steps * self.config.global_batch * self.config.seq_len

    @property
    def days(self) -> float:
        return self.config.steps * self.step_s / 86400

    def render(self, xla: dict[str, int] | None = None) -> str:
        """The plan as text, its verdict last; `xla` (aot.compile_train_step's figures) adds XLA's own
        per-device total for the real train step beside the estimate."""
        cfg, m = self.config, self.config.model
        hw = cfg.hardware
        total_params = sum(self.params.values())
        where = f"{self.chips:,} x {self.device.label} ({_gib(self.device.hbm_bytes)} each)"
        slices = f" x {hw.num_slices} slices" if hw.num_slices > 1 else ""
        if hw.topology:
            where += f", topology {hw.topology}{slices}"
        rows = [
            f"train plan: {total_params / 1e9:,.3g}B parameters on {where}",
            "  parameters: " + ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in self.params.items() if v),
            f"  FLOPs per token: {self.flops_per_token / 1e9:,.3g} GFLOP (6N + attention at T={cfg.seq_len})",
            f"  mesh: data {self.mesh['data']} x fsdp {self.mesh['fsdp']} x tensor {self.mesh['tensor']}"
            f"{_slices(cfg.mesh, self.chips)}; "
            f"micro-batch {self.micro_batch} x {cfg.seq_len} tokens per device "
            f"(x {cfg.optimizer.grad_accum_steps} accumulated); remat {m.remat}; "
            f"{m.dtype} compute, {m.param_dtype} params; attention {m.attention_impl}",
            "  per device: " + ", ".join(f"{k} {_gib(v)}" for k, v in self.per_device.items()
                                         if k != "total")
            + f" = {_gib(self.per_device['total'])} of {_gib(self.budget)} usable "
              f"({HEADROOM:.0%} of {_gib(self.device.hbm_bytes)})",
            f"  time: {self.step_s:,.3g} s/step, {_tokens(self.tokens_per_s)}/s, "
            f"{self.days:,.3g} days for {_tokens(self.tokens)} tokens at {hw.mfu:.0%} MFU",
        ]
        if xla is not None:
            rows.append(f"  XLA, compiled for {hw.topology}{slices}: {_gib(xla['total'])} per device "
                        f"(arguments {_gib(xla['argument'])}, scratch {_gib(xla['temp'])}); the estimate is "
                        f"{self.per_device['total'] / max(xla['total'], 1):.0%} of it")
        if self.fits:
            rows.append(f"  verdict: fits on {where}")
        elif self.problem:
            rows.append(f"  verdict: does NOT fit: {self.problem}. {self.advice}")
        else:
            rows.append(f"  verdict: does NOT fit: {_gib(self.per_device['total'])} per device > "
                        f"{_gib(self.budget)} usable. {self.advice}")
        return "\n".join(rows)

    @property
    def tokens_per_s(self) -> float:
        return self.config.global_batch * self.config.seq_len / self.step_s


def plan(cfg, *, advise: bool = True) -> Plan:
    """The plan for `cfg` (a stages.train.Config), with advice when it does not fit."""
    hw = cfg.hardware
    device = devices.get(hw.device)
    chips = (hw.chips or topology_chips(hw.topology) or _explicit_chips(cfg.mesh)) * hw.num_slices
    data, fsdp, tensor = cfg.mesh.shape(chips)
    mesh = {"data": data, "fsdp": fsdp, "tensor": tensor}
    batch_shards = math.prod(mesh[a] for a in BATCH_AXES)
    micro = cfg.global_batch // cfg.optimizer.grad_accum_steps
    micro_batch = max(1, micro // batch_shards)
    problem = "" if micro % batch_shards == 0 else (
        f"a micro-batch of {micro} sequences (global_batch {cfg.global_batch} / grad_accum_steps "
        f"{cfg.optimizer.grad_accum_steps}) does not split over data x fsdp = {batch_shards} devices")
    m = cfg.model
    pbytes = DTYPE_BYTES[m.param_dtype]
    params = param_bytes(m, mesh, pbytes)
    per_device = {"params": params, "grads": params,
                  "optimizer": optimizer_bytes(m, mesh, pbytes, cfg.optimizer.name),
                  "activations": activation_bytes(m, micro_batch, cfg.seq_len, mesh["tensor"],
                                                  loss_chunk=cfg.loss_chunk),
                  "gathered": gathered_bytes(m, mesh, pbytes)}
    per_device["total"] = sum(per_device.values())
    fpt = flops_per_token(m, cfg.seq_len)
    step_s = fpt * cfg.global_batch * cfg.seq_len / (chips * device.peak_flops * hw.mfu)
    result = Plan(cfg, device, chips, mesh, micro_batch, param_counts(m), per_device, fpt, step_s, problem)
    if advise and not result.fits:
        result = dataclasses.replace(result, advice=advice(result))
    return result


def param_bytes(m: ModelConfig, mesh: dict[str, int], dtype_bytes: int) -> int:
    """Bytes of one device's shards of every parameter (a dimension a mesh axis does not divide stays
    replicated over it, as in training)."""
    return sum(_shard_size(shape, names, mesh) * dtype_bytes for shape, names in param_layout(m).values())


def optimizer_bytes(m: ModelConfig, mesh: dict[str, int], dtype_bytes: int, name: str) -> int:
    """One device's optimizer state: moments in the parameters' layout and dtype."""
    total = 0
    for pname, (shape, names) in param_layout(m).items():
        local = _shard_size(shape, names, mesh)
        matrix_dims = len(shape) - (1 if pname.startswith("layers.") else 0)
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


def gathered_bytes(m: ModelConfig, mesh: dict[str, int], dtype_bytes: int) -> int:
    """FSDP's working set: the layer being computed, gathered whole over fsdp (still split over tensor),
    in its parameter dtype and its compute-dtype copy, and its gradient before it is reduce-scattered."""
    if mesh["fsdp"] == 1:
        return 0
    unsharded = dict(mesh, fsdp=1)
    layer = sum(_shard_size(shape[1:], names[1:], unsharded)
                for name, (shape, names) in param_layout(m).items() if name.startswith("layers."))
    return layer * (2 * dtype_bytes + DTYPE_BYTES[m.dtype])


def activation_bytes(m: ModelConfig, batch: int, seq_len: int, tensor: int, *, loss_chunk: int) -> int:
    """What the backward pass of one micro-batch of `batch` sequences needs on one device.

    Per layer and token the forward pass produces (elements; N, K heads of H, MLP width F, heads and F split
    over `tensor`): the layer input and its normed copy (2D), q, k, v after RoPE (NH + 2KH), attention's
    output and its projection (NH + D), the residual sum and its normed copy (2D), gate, up and their
    product (3F) and the down projection (D). The remat policy decides what the scan keeps of each layer:
    everything ("none"), the matmul outputs ("save_dots", "dots_no_batch"), the projections ("minimal":
    q, k, v, out; "save_qkv_proj": q, k, v), or only the layer input ("full"). The backward pass then
    recomputes one layer at a time (its activations and their gradients), and the loss holds one chunk
    of float32 logits and their gradient. Checked against XLA's compiled figures for six configurations
    in benchmarks/plan_vs_xla.py.
    """
    D, H, L = m.d_model, m.effective_head_dim, m.n_layers
    # Heads, MLP width and vocabulary are split over `tensor` where it divides them, as training does.
    N, K, Fl, vocab = (n // tensor if n % tensor == 0 else n
                       for n in (m.n_heads, m.n_kv_heads, m.effective_mlp_dim, m.vocab_size))
    cdt = DTYPE_BYTES[m.dtype]
    layer = {"input": D, "normed": D, "q": N * H, "k": K * H, "v": K * H, "attention": N * H, "out": D,
             "residual": D, "normed2": D, "gate": Fl, "up": Fl, "act": Fl, "down": D}
    kept = {
        "none": set(layer),
        "save_dots": {"input", "q", "k", "v", "attention", "out", "gate", "up", "down"},
        "dots_no_batch": {"input", "q", "k", "v", "out", "gate", "up", "down"},
        "minimal": {"input", "q", "k", "v", "out"},
        "save_qkv_proj": {"input", "q", "k", "v"},
        "full": {"input"},
    }[m.remat]
    tokens = batch * seq_len
    saved = L * tokens * sum(layer[k] for k in kept) * cdt
    if m.remat == "none":
        # Kept whole, a layer also keeps what its elementwise ops need for their gradients: both RMSNorms'
        # input and output in float32, and SiLU's output for the product's gradient.
        saved += L * tokens * (2 * 2 * D * 4 + Fl * cdt)
    # The layer being recomputed holds its activations and, as its backward pass runs, their gradients.
    recompute = 2 * tokens * sum(layer.values()) * cdt if m.remat != "none" else 0
    # The chunked loss holds one chunk's float32 logits (or softmax) and their gradient in the compute
    # dtype, over this device's part of the vocabulary.
    logits = min(loss_chunk, tokens) * vocab * (4 + cdt)
    # Counted together although the loss and a layer's recompute run one after the other: XLA's buffer
    # assignment overlaps them only partly (measured: adding them errs high by <= 20%, taking the larger
    # errs low by up to 18%), and for a verdict a high estimate is the safe side.
    return int(saved + recompute + logits)


def advice(failed: Plan) -> str:
    """The smallest single change that makes a plan that does not fit fit, tried in this order: more FSDP
    (taken from the data axis), a heavier remat policy, more gradient accumulation (a smaller
    micro-batch); then a mesh layout; else more chips."""
    cfg, mesh = failed.config, failed.config.mesh
    # The candidates bind MeshConfig's sizes within a slice; the split across slices (dcn_*) stays.
    data, fsdp, tensor = mesh.ici_shape(failed.chips)
    tries = []
    f = fsdp * 2
    while data * fsdp % f == 0 and f <= data * fsdp:
        wider = dataclasses.replace(mesh, fsdp=f, data=-1)
        tries.append((f"train.MeshConfig.fsdp={f}", dataclasses.replace(cfg, mesh=wider)))
        f *= 2
    for remat in REMAT_ORDER[REMAT_ORDER.index(cfg.model.remat) + 1:]:
        tries.append((f'train.ModelConfig.remat="{remat}"',
                      dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=remat))))
    k = cfg.optimizer.grad_accum_steps * 2
    while cfg.global_batch % k == 0:
        smaller = dataclasses.replace(cfg.optimizer, grad_accum_steps=k)
        tries.append((f"train.OptimizerConfig.grad_accum_steps={k}",
                      dataclasses.replace(cfg, optimizer=smaller)))
        k *= 2
    for binding, candidate in tries:
        p = _try(candidate)
        if p is not None and p.fits:
            return f"It would fit with {binding} ({_gib(p.per_device['total'])} per device)."
    # No single change: the mesh layout that fits with the least tensor parallelism (it costs the most
    # communication), then the least FSDP.
    n = data * fsdp * tensor
    for t in (d for d in _divisors(n) if d >= tensor):
        for f in _divisors(n // t):
            layout = dataclasses.replace(mesh, data=-1, fsdp=f, tensor=t)
            p = _try(dataclasses.replace(cfg, mesh=layout))
            if p is not None and p.fits:
                return (f"It would fit with train.MeshConfig.fsdp={f} train.MeshConfig.tensor={t} "
                        f"({_gib(p.per_device['total'])} per device).")
    return ("No mesh layout, remat policy or micro-batch makes it fit: use more chips "
            "(train.HardwareConfig.chips or a larger topology) or a smaller model.")


def _try(cfg) -> Plan | None:
    try:
        return plan(cfg, advise=False)
    except ValueError:           # a candidate the configs reject (a mesh that does not tile the chips)
        return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (d & (d - 1)) == 0]      # powers of two


def _shard_size(shape, names, mesh: dict[str, int]) -> int:
    axes = mesh_axes(names, shape, mesh)
    return math.prod(dim // math.prod(mesh[a] for a in dim_axes) for dim, dim_axes in zip(shape, axes))


def _slices(mesh, chips: int) -> str:
    """A multi-slice mesh's split, for the mesh row: within each slice (ICI) x across slices (DCN)."""
    if mesh.num_slices == 1:
        return ""
    ici, dcn = ("x".join(map(str, s)) for s in (mesh.ici_shape(chips), mesh.dcn_shape))
    return f" = ICI {ici} within each slice x DCN {dcn} across {mesh.num_slices} slices"


def _explicit_chips(mesh) -> int:
    """A slice's chips when nothing else names them: the mesh's explicit sizes within a slice."""
    return (mesh.data if mesh.data > 0 else 1) * mesh.fsdp * mesh.tensor


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**27 else f"{n / 2**20:,.1f} MiB"


def _tokens(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:,.3g}{unit}"
    return f"{n:,.0f}"
