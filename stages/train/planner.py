"""Will this training config fit its hardware, and how long will it take? Answered from the config alone.

    make plan GIN=gin/600b.gin                      (prints `plan(config).render()` for the train stage)
    make plan GIN=gin/600b.gin DAYS=30              (and `smallest_slice(config, 30).render()`)
    p = planner.plan(train_config)                  # a stages.train.Config
    p.fits, p.per_device["total"], p.days          # the verdict, bytes per device, the run's length
    print(p.render())
    planner.smallest_slice(train_config, 30).found # the smallest TPU slice that trains it in 30 days, or None

Per device, in bytes, under the configured mesh (`train.MeshConfig`) on the configured hardware
(`train.HardwareConfig`), held for the whole step:

    params       every parameter, sharded by its logical axes exactly as training places it
                 (`configs.param_layout`, `configs.mesh_axes`), in `param_dtype`
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

A mixture of experts (`ModelConfig.n_experts`) is planned from the same table (`configs.param_layout`: its
"moe_layers" stack, the experts split over the mesh's expert axis), its time from the active parameters
(`configs.active_params`), and its plan adds the bytes the expert axis's all-to-all moves a step
(`all_to_all_bytes`).

The reverse question, which slice trains the configured tokens in N days and fits, is `smallest_slice`: the
documented slices of the configured TPU generation (`SLICES`), smallest first, the mesh's tensor and expert
sizes kept and FSDP grown until it fits.

The figures are estimates from first principles, so they can be read without a compiler; `--compile`
(stages/train/aot.py) puts XLA's own per-device figure for the real train step beside them, and where it
exists it wins: a compile that runs out of memory (`aot.OutOfMemory`) or needs more than the usable HBM
makes the verdict "does NOT fit", quoting XLA (`Plan.fits_with`)
(benchmarks/plan_vs_xla.py checks ten configurations: seven TPU topologies, three of 8 simulated CPU
devices). The time estimate is FLOPs per token
(`configs.flops_per_token`) x tokens per step / (chips x peak x the assumed MFU). This module imports no
JAX: `make plan` runs in a second.
"""

from __future__ import annotations

import dataclasses
import math

from stages.train import devices, hlo, step_time
from stages.train.configs import (
    AXES,
    BATCH_AXES,
    LAYER_STACKS,
    REMAT_NAMES,
    TPU_GENERATIONS,
    MeshConfig,
    ModelConfig,
    active_params,
    batch_axes_named,
    flops_per_token,
    param_counts,
    param_layout,
    topology_chips,
)
from stages.train.shards import (  # noqa: F401 - re-exported: the planner's sizes, as callers know them
    DTYPE_BYTES,
    all_to_all_bytes,
    capacity_path,
    gathered_mesh,
    moe_rows,
    param_bytes,
    shard_size,
)

HEADROOM = 0.9     # the share of HBM a plan may use: the runtime, XLA's buffers, fragmentation take the rest
# A layout search (`smallest_slice`) takes only layouts whose estimate fits 10% under the budget: the estimate
# is checked to within 10% of XLA's figure (benchmarks/plan_vs_xla.py), so a closer fit may not compile.
SEARCH_MARGIN = 1.1
TPU_LANES = 128    # a TPU tiles an array's minor dimension to 128 lanes: a 64-wide head takes 128
# From the lightest to the heaviest rematerialization: what the planner suggests, in order, when short.
REMAT_ORDER = ("none", "save_dots", "dots_no_batch", "minimal", "save_qkv_proj", "full")
OFFLOAD = "offload_"    # offload_<policy>: what <policy> keeps, in host memory (stages/train/model.py)
# The offload policies from the least recompute to the least device memory, suggested after REMAT_ORDER.
OFFLOAD_ORDER = ("offload_dots_no_batch", "offload_minimal", "offload_full")
assert sorted(REMAT_ORDER + OFFLOAD_ORDER) == sorted(REMAT_NAMES)
# What each policy keeps of a layer for the backward pass (rows of `layer_activations`). The down
# projection is never kept: it only feeds the residual sum, whose gradient needs no operand.
KEPT = {
    "none": {"input", "normed", "q", "k", "v", "attention", "out", "residual", "normed2", "gate", "up",
             "act"},
    "save_dots": {"input", "q", "k", "v", "attention", "out", "gate", "up"},
    "dots_no_batch": {"input", "q", "k", "v", "out", "gate", "up"},
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


@dataclasses.dataclass(frozen=True)
class Plan:
    config: object                    # the stages.train.Config planned
    device: devices.Device
    chips: int                        # all chips, every slice
    mesh: dict[str, int]              # {"data": d, "fsdp": f, "expert": e, "tensor": t}
    micro_batch: int                  # sequences per device per micro-batch
    params: dict[str, int]            # parameters by part
    per_device: dict[str, int]        # bytes in device memory: `memory_bytes`' parts and their total
    flops_per_token: float
    step_s: float
    problem: str = ""                 # a layout that cannot run at all (the batch does not split), else ""
    advice: str = ""                  # "" when it fits; else the smallest change that would fit
    host: int = 0                     # bytes of activations an offload_* policy keeps in host memory
    predicted: step_time.StepTime | None = None   # the step predicted from compute and communication

    @property
    def budget(self) -> int:
        """Usable bytes per device."""
        return int(self.device.hbm_bytes * HEADROOM)

    @property
    def host_budget(self) -> int:
        """Host memory per device that offloaded activations may use: HEADROOM of the host's RAM per chip,
        less the host copy of this device's state that an asynchronous checkpoint takes."""
        state = self.per_device["params"] + self.per_device["optimizer"]
        return max(0, int(self.device.host_bytes * HEADROOM) - state)

    @property
    def fits(self) -> bool:
        return self.fits_with(None)

    def fits_with(self, xla: dict[str, int] | None) -> bool:
        """The verdict given XLA's figures for the compiled step (`aot.compile_train_step`, or an
        `aot.OutOfMemory`'s, with the "hbm" it ran out of): where they exist, XLA's per-device total wins
        over the estimate, and a compile that ran out of memory never fits."""
        if xla is not None and "hbm" in xla:
            return False
        device = self.per_device["total"] if xla is None else xla["total"]
        return not self.problem and device <= self.budget and self.host <= self.host_budget

    @property
    def tokens(self) -> int:
        """The run's token budget: steps x global batch x sequence length."""
        return self.config.steps * self.config.global_batch * self.config.seq_len

    @property
    def days(self) -> float:
        return self.config.steps * self.step_s / 86400

    def render(self, xla: dict[str, int] | None = None, xla_note: str = "", collectives=None) -> str:
        """The plan as text, its verdict last; `xla` (aot.compile_train_step's figures) adds XLA's own
        per-device total for the real train step beside the estimate, `xla_note` why it is not there, and
        `collectives` (the compiled step's, `hlo.collectives`) what it moves beside what the model says."""
        cfg, m = self.config, self.config.model
        hw = cfg.hardware
        total_params = sum(self.params.values())
        where = f"{self.chips:,} x {self.device.label} ({_gib(self.device.hbm_bytes)} each)"
        slices = f" x {hw.num_slices} slices" if hw.num_slices > 1 else ""
        if hw.topology:
            where += f", topology {hw.topology}{slices}"
        moe = m.n_experts > 0
        active = (f"; active {_count(active_params(m))} of {_count(total_params)} a token (top-"
                  f"{m.n_experts_per_token} of {m.n_experts} routed experts"
                  + (f" + {m.n_shared_experts} shared" if m.n_shared_experts else "")
                  + f" in {m.n_moe_layers} of {m.n_layers} layers)") if moe else ""
        rows = [
            f"train plan: {total_params / 1e9:,.3g}B parameters on {where}",
            "  parameters: " + ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in self.params.items() if v)
            + active,
            f"  FLOPs per token: {self.flops_per_token / 1e9:,.3g} GFLOP "
            f"({'6 x active N' if moe else '6N'} + causal attention at T={cfg.seq_len})",
            f"  mesh: {_mesh_row(self.mesh)}"
            f"{_slices(cfg.mesh, self.chips)}; "
            f"micro-batch {self.micro_batch} x {cfg.seq_len} tokens per device "
            f"(x {cfg.optimizer.grad_accum_steps} accumulated); remat {m.remat}; "
            f"{m.dtype} compute, {m.param_dtype} params; attention {m.attention_impl}",
            _render_memory(self.per_device) + f" = {_gib(self.per_device['total'])} of "
            f"{_gib(self.budget)} usable ({HEADROOM:.0%} of {_gib(self.device.hbm_bytes)})",
        ]
        if self.host:
            rows.append(f"  host memory per device: {_gib(self.host)} of activations offloaded by remat "
                        f"{m.remat} (not in the device total) of {_gib(self.host_budget)} usable "
                        f"({HEADROOM:.0%} of {_gib(self.device.host_bytes)}, less the checkpoint's copy of "
                        "the state)")
        elif m.remat.startswith(OFFLOAD):
            rows.append(f"  host memory: {self.device.label} has none to offload to; remat {m.remat} runs "
                        f"as {m.remat.removeprefix(OFFLOAD)} (training logs the same)")
        if moved := self.all_to_all_row():
            rows.append(moved)
        rows += self.time_rows()
        if collectives:
            rows.append(self.collectives_row(collectives))
        oom = xla is not None and "hbm" in xla          # the compile ran out of memory (aot.OutOfMemory)
        needs = "at least " if oom else ""
        if oom:
            rows.append(f"  XLA, compiled for {hw.topology}{slices}: out of memory, needs {needs}"
                        f"{_gib(xla['total'])} per device of {_gib(xla['hbm'])}; libtpu: {xla_note}")
        elif xla is not None:
            rows.append(f"  XLA, compiled for {hw.topology}{slices}: {_gib(xla['total'])} per device "
                        f"(arguments {_gib(xla['argument'])}, scratch {_gib(xla['temp'])}); the estimate is "
                        f"{self.per_device['total'] / max(xla['total'], 1):.0%} of it")
        elif xla_note:
            rows.append(f"  XLA: not compiled: {xla_note}")
        if self.fits_with(xla):
            rows.append(f"  verdict: fits on {where}")
        elif self.problem:
            rows.append(f"  verdict: does NOT fit: {self.problem}. {self.advice}")
        elif oom or (xla is not None and xla["total"] > self.budget):
            limit = f"the {_gib(xla['hbm'])} it had" if oom else f"{_gib(self.budget)} usable"
            rows.append(f"  verdict: does NOT fit: XLA's compile for {hw.topology}{slices} needs {needs}"
                        f"{_gib(xla['total'])} per device > {limit} (XLA's figure wins over the estimate, "
                        f"{_gib(self.per_device['total'])}). {self.advice or _XLA_ADVICE}")
        elif self.per_device["total"] <= self.budget:
            rows.append(f"  verdict: does NOT fit: {_gib(self.host)} of offloaded activations per device > "
                        f"{_gib(self.host_budget)} of host memory usable. {self.advice}")
        else:
            rows.append(f"  verdict: does NOT fit: {_gib(self.per_device['total'])} per device > "
                        f"{_gib(self.budget)} usable. {self.advice}")
        return "\n".join(rows)

    @property
    def tokens_per_s(self) -> float:
        return self.config.global_batch * self.config.seq_len / self.step_s

    def time_rows(self) -> list[str]:
        """The predicted step (`step_time.predict`), its MFU, the run's days and its largest terms; with an
        assumed MFU (train.HardwareConfig.mfu), the days at that MFU too, which then set `days`."""
        hw, t = self.config.hardware, self.predicted
        steps = self.config.steps
        _, borrowed = step_time.efficiency(self.device)
        borrowed = f"; {self.device.label} borrows {borrowed}'s efficiencies, none calibrated for it" \
            if borrowed else ""
        rows = [f"  time, predicted: {_num(t.seconds)} s/step ({t.mfu:.1%} MFU), "
                f"{_tokens(self.config.global_batch * self.config.seq_len / t.seconds)} tokens/s, "
                f"{_num(steps * t.seconds / 86400)} days for {_tokens(self.tokens)} tokens{borrowed}",
                f"    largest terms: {t.largest(3)}"]
        if hw.mfu:
            rows.append(f"  time at the assumed {hw.mfu:.0%} MFU (train.HardwareConfig.mfu, which sets the "
                        "days): "
                        f"{_num(self.step_s)} s/step, {_num(self.days)} days")
        return rows + self._loss_chunk_hint()

    def _loss_chunk_hint(self) -> list[str]:
        """Under FSDP, loss chunks smaller than the micro-batch have every chip compute and all-reduce every
        chunk's partial logits (`step_time.collectives`); where that costs a tenth of the step, say what
        one chunk of the micro-batch would save and hold."""
        cfg, t = self.config, self.predicted
        logits = t.term("logits")
        micro = cfg.global_batch // cfg.optimizer.grad_accum_steps * cfg.seq_len
        if logits is None or cfg.loss_chunk >= micro or logits.exposed < 0.1 * t.seconds:
            return []
        p = plan(dataclasses.replace(cfg, loss_chunk=micro), advise=False)
        chunks = -(-micro // cfg.loss_chunk)
        return [f"    hint: train.Config.loss_chunk={cfg.loss_chunk:,} splits each micro-batch of {micro:,} "
                f"tokens into {chunks:,} chunks whose partial logits every chip computes and all-reduces "
                f"({_num(logits.exposed)} s a step); train.Config.loss_chunk={micro} predicts "
                f"{_num(p.predicted.seconds)} s/step at {_gib(p.per_device['total'])} per device"]

    def collectives_row(self, compiled) -> str:
        """What the compiled step's collectives move a device a step, by kind, beside the step model's
        (`step_time.collectives`): the model counts the layers' FSDP traffic, the loss's logits, tensor and
        expert axes and data-parallel gradients; XLA also moves token indices, norms, scalars and the
        embedding's reshards, which it does not."""
        xla = hlo.bytes_by_kind(compiled)
        model = dict.fromkeys(xla, 0)
        for c in step_time.collectives(self.config, self.mesh, self.micro_batch):
            model[c.kind] += c.bytes * c.count
        kinds = [k for k in xla if xla[k] or model[k]]
        return ("  collectives a device a step, XLA's compile (the step model's): "
                + ", ".join(f"{k} {_gib(xla[k])} ({_gib(model[k])})" for k in kinds))

    def all_to_all_row(self) -> str:
        """What an MoE model's expert axis moves per step (`all_to_all_bytes`), and the least time that takes
        at the chips' ICI bandwidth (a device keeps 1 / expert of each buffer and sends and receives the
        rest); "" without an expert axis."""
        buffer, count = all_to_all_bytes(self.config, self.mesh, self.micro_batch)
        t = self.predicted
        if not count or t is None:
            return ""
        m, ep = self.config.model, self.mesh["expert"]
        rows = moe_rows(m, self.micro_batch * self.config.seq_len, ep) // m.n_experts
        passes = "forward, backward" + ("" if m.remat == "none" else " and the remat's recompute")
        accum = self.config.optimizer.grad_accum_steps
        term = self.predicted.term("all-to-all")
        hops = step_time.all_to_all_hops(self.device, ep)
        return (f"  all-to-all over expert {ep}: {_gib(count * buffer)} per device per step, {count:,} of "
                f"the (E, C, D) = ({m.n_experts}, {rows:,}, {m.d_model:,}) capacity buffer ({_gib(buffer)}): "
                f"{m.n_moe_layers} MoE layers x {accum} micro-batch{'es' if accum > 1 else ''} x to the "
                f"experts and back x {passes}; {_num(term.seconds)} s of the predicted {_num(t.seconds)} s "
                f"step (each byte {hops:,.2g} link{'s' if hops != 1 else ''} on average at "
                f"{self.device.label}'s "
                f"{self.device.ici_bytes_per_s / 1e9:,.0f} GB/s ICI, on the critical path)")


# The single slices each TPU generation comes in, smallest first, from Cloud TPU's documentation (the v4 and
# v5p pages' topology tables, the v5e and v6e pages' slice shapes): power-of-two chip counts, then the
# largest a job may take (v4: the 4,096-chip pod; v5p: 16x16x24, 6,144 chips). generation -> (the
# accelerator type's prefix, TensorCores a chip: v4 and v5p name a slice by its cores, v5p-8 = 4 chips, v5e
# and v6e by their chips; the topologies).
SLICES = {
    "v4": ("v4", 2, ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
                     "8x16x16", "16x16x16")),
    "v5p": ("v5p", 2, ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
                       "8x16x16", "16x16x16", "16x16x24")),
    "v5e": ("v5litepod", 1, ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    "v6e": ("v6e", 1, ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
}
assert set(SLICES) == set(TPU_GENERATIONS)


def slice_name(topology: str) -> str:
    """"v5p:8x8x16" -> "v5p-2048" (the accelerator type Cloud TPU names it by)."""
    generation = topology.partition(":")[0]
    prefix, cores, _ = SLICES[generation]
    return f"{prefix}-{topology_chips(topology) * cores}"


@dataclasses.dataclass(frozen=True)
class SliceSearch:
    """What `smallest_slice` found: each slice of one TPU generation tried (smallest first) with its fastest
    layout or why none can run, the first slice whose fastest layout that fits trains the tokens in time
    (and that slice's runner-up), and, where none does, the smallest slice of each other generation that
    would."""

    config: object                                     # the stages.train.Config searched for
    days: float
    generation: str
    tried: tuple[tuple[str, Plan | None, str], ...]   # (topology, its fastest plan or None, why none runs)
    found: Plan | None                                 # the fastest layout on the smallest slice; None: none
    runner_up: Plan | None = None                      # the fastest that fits with another mesh there
    elsewhere: tuple[Plan, ...] = ()                   # where none does: other generations' smallest

    def render(self) -> str:
        cfg = self.config
        tokens = cfg.steps * cfg.global_batch * cfg.seq_len
        pace = f"at {cfg.hardware.mfu:.0%} MFU" if cfg.hardware.mfu else "by the predicted step time"
        rows = [f"smallest TPU {self.generation} slice that trains {_tokens(tokens)} tokens in "
                f"{self.days:,.3g} days {pace} and fits (one slice; on each, the fastest layout by the "
                "predicted step: the mesh"
                f"{', expert axis' if cfg.model.n_experts else ''} included, micro-batches, remat"
                f"{', dropless or capacity' if cfg.model.n_experts else ''}):"]
        width = max(len(slice_name(t)) for t, _, _ in self.tried)
        for topology, p, why in self.tried:
            head = f"    {slice_name(topology):<{width}} {topology_chips(topology):>6,} chips"
            if p is None:
                rows.append(f"{head}: cannot run: {why}")
                continue
            fits = (f"fits, {_layout(p)}" if _roomy(p) else
                    "fits, but not with 10% to spare" if p.fits else "does NOT fit")
            rows.append(f"{head}: {p.days:>9,.1f} days{' (too long)' if p.days > self.days else ''}; {fits}, "
                        f"{_gib(p.per_device['total'])} of {_gib(p.budget)} per chip")
        if self.found is not None:
            rows.append(f"  answer: {_slice_answer(self.found)}")
            if self.runner_up is not None:
                rows.append(f"  runner-up: {_slice_answer(self.runner_up)}")
            return "\n".join(rows)
        runnable = [(t, p) for t, p, _ in self.tried if p is not None]
        if runnable:
            topology, p = runnable[-1]
            over = [f"would need {_num(p.days)} days" if p.days > self.days else f"takes {_num(p.days)} days"]
            if not _roomy(p):
                over.append(f"does NOT fit with 10% to spare ({_gib(p.per_device['total'])} per chip with "
                            f"its best layout, of {_gib(p.budget)} usable)")
            reason = (f"the largest {self.generation} slice that can run it, {slice_name(topology)} "
                      f"({topology_chips(topology):,} chips), {' and '.join(over)}")
            larger = [(t, why) for t, p, why in self.tried if p is None and topology_chips(t) >
                      topology_chips(topology)]
            if larger:
                reason += f"; larger ones cannot run it ({slice_name(larger[0][0])}: {larger[0][1]})"
        else:
            topology, _, why = self.tried[-1]
            reason = f"no {self.generation} slice can run it: {why} ({slice_name(topology)})"
        rows.append(f"  answer: none on TPU {self.generation}: {reason}")
        for p in self.elsewhere:
            rows.append(f"  elsewhere: {_slice_answer(p, device=True)}")
        rows.append("  (not tried: several slices, train.HardwareConfig.num_slices; a larger global batch; "
                    "a smaller model or fewer tokens)")
        return "\n".join(rows)


def smallest_slice(cfg, days: float, *, elsewhere: bool = True) -> SliceSearch:
    """The smallest single slice of `cfg`'s TPU generation (its topology's, else its device's; `SLICES`)
    whose fastest layout that fits trains its tokens (steps x global batch x seq_len) in `days`:

        s = planner.smallest_slice(train_config, 30)      # make plan DAYS=30
        s.found, s.runner_up                              # that slice's fastest plan and the next, or None
        print(s.render())

    On each slice every layout is planned (`layouts`: the mesh's fsdp, expert and tensor sizes, data the
    rest; the micro-batches a step; the remat policy, host offload among them; for an MoE, dropless or
    capacity buffers) and ranked by the predicted step (`step_time`); the days are the plan's (the
    prediction's, or an assumed MFU's where train.HardwareConfig.mfu sets one). A slice is skipped, with
    why, where even its matmuls at the calibrated rate need more than `days`, or where the parameters and
    optimizer state split over every chip do not fit. Where no slice of the generation does it
    (`elsewhere`), the smallest of each other generation that would. ValueError for a device that is not
    a TPU."""
    hw = cfg.hardware
    generation = hw.topology.partition(":")[0] if hw.topology else next(
        (g for g, (device, _) in TPU_GENERATIONS.items() if device == hw.device), "")
    if generation not in SLICES:
        raise ValueError(f"train.HardwareConfig.device={hw.device!r} is not a TPU, and the smallest slice "
                         "is searched among a TPU generation's: set train.HardwareConfig.device to one of "
                         f"{', '.join(repr(d) for d, _ in TPU_GENERATIONS.values())} (or a topology such as "
                         '"v5p:2x2x1")')
    tried = []
    for grid in SLICES[generation][2]:
        topology = f"{generation}:{grid}"
        chips = topology_chips(topology)
        hardware = dataclasses.replace(hw, device=TPU_GENERATIONS[generation][0], topology=topology, chips=0,
                                       num_slices=1)
        on_slice = dataclasses.replace(cfg, hardware=hardware, mesh=MeshConfig(data=-1))
        if why := _hopeless(on_slice, chips, days):
            tried.append((topology, None, why))
            continue
        ranked, why = _fastest_layouts(on_slice, chips)
        best = ranked[0] if ranked else None
        tried.append((topology, best, why))
        if best is not None and _roomy(best) and best.days <= days:
            # The runner-up lays the mesh out differently (the same mesh with another remat is no choice
            # a user weighs: the answer already takes the fastest policy that fits).
            runner_up = next((r for r in ranked[1:] if _roomy(r) and r.mesh != best.mesh), None)
            return SliceSearch(cfg, days, generation, tuple(tried), best, runner_up)
    others = ()
    if elsewhere:
        searches = (smallest_slice(dataclasses.replace(cfg, hardware=dataclasses.replace(
            hw, device=TPU_GENERATIONS[g][0], topology="")), days, elsewhere=False)
            for g in SLICES if g != generation)
        others = tuple(found for found in (s.found for s in searches) if found is not None)
    return SliceSearch(cfg, days, generation, tuple(tried), None, None, others)


def _hopeless(cfg, chips: int, days: float) -> str:
    """Why no layout of `cfg` on `chips` chips can do it, by bounds that need no layout ("" when one may):
    the step's model FLOPs at the calibrated matmul rate alone take longer than `days` (an assumed MFU is
    not a bound: it is then what the plan says), or the parameters and optimizer state split over every
    chip exceed the usable memory of one."""
    m, device = cfg.model, devices.get(cfg.hardware.device)
    eff, _ = step_time.efficiency(device)
    tokens = cfg.steps * cfg.global_batch * cfg.seq_len
    floor = flops_per_token(m, cfg.seq_len) * tokens / (chips * device.peak_flops * eff.matmul) / 86400
    if not cfg.hardware.mfu and floor > days:
        return f"{_num(floor)} days at least (every FLOP at the calibrated matmul rate)"
    whole = {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
    pbytes = DTYPE_BYTES[m.param_dtype]
    state = (param_bytes(m, whole, pbytes) + optimizer_bytes(m, whole, pbytes, cfg.optimizer.name)) / chips
    budget = device.hbm_bytes * HEADROOM
    if state > budget:
        return (f"the parameters and optimizer state split over all {chips:,} chips, {_gib(state)} a chip, "
                f"exceed {_gib(budget)} usable")
    return ""


def layouts(cfg, chips: int):
    """Every layout `smallest_slice` tries for `cfg` on one slice of `chips`, as configs: tensor 1-8 (dividing
    the heads), for an MoE an expert axis dividing the experts (with it, capacity buffers; without, dropless
    or capacity), fsdp any power of two of the rest and data what remains, 1-8 micro-batches a step whose
    micro-batch splits over the batch shards; the remat policy is `_fastest_layouts`'."""
    m = cfg.model
    capacity = m.moe_capacity_factor or 1.25
    sides = [int(n) for n in cfg.hardware.topology.partition(":")[2].split("x")]
    for tensor in (t for t in (1, 2, 4, 8) if chips % t == 0 and m.n_heads % t == 0):
        experts = [e for e in _divisors(chips // tensor) if m.n_experts % e == 0] if m.n_experts else [1]
        for expert in experts:
            factors = ([0.0, capacity] if expert == 1 else [capacity]) if m.n_experts else [0.0]
            rest = chips // (tensor * expert)
            for fsdp in _divisors(rest):
                if not whole_sides(sides, [fsdp, expert, tensor]):
                    continue
                for k in (1, 2, 4, 8):
                    micro = cfg.global_batch // k
                    if cfg.global_batch % k or micro % (rest * expert):
                        continue
                    for factor in factors:
                        yield dataclasses.replace(
                            cfg, mesh=MeshConfig(data=-1, fsdp=fsdp, expert=expert, tensor=tensor),
                            optimizer=dataclasses.replace(cfg.optimizer, grad_accum_steps=k),
                            model=dataclasses.replace(m, moe_capacity_factor=factor))


def whole_sides(sides: list[int], sizes: list[int]) -> bool:
    """Whether mesh axes of `sizes` (the data axis taking the rest) each lie along whole sides of a TPU torus
    of `sides` ("8x8x16" -> [8, 8, 16]): every size a product of its own sides, as `jax.make_mesh` lays a
    mesh. Another size splits a side (stages/train/sharding.py warns and does so) and its collectives lose
    the torus's wrap-around links, which the step-time model does not count: a search avoids them."""
    sizes = sorted((n for n in sizes if n > 1), reverse=True)
    if not sizes:
        return True
    n, rest = sizes[0], sizes[1:]
    for chosen in range(1, 2 ** len(sides)):
        picked = [sides[i] for i in range(len(sides)) if chosen >> i & 1]
        if math.prod(picked) == n:
            left = [sides[i] for i in range(len(sides)) if not chosen >> i & 1]
            if whole_sides(left, rest):
                return True
    return False


def _fastest_layouts(cfg, chips: int) -> tuple[list[Plan], str]:
    """(every layout's fastest plan that fits with the estimate's margin (`SEARCH_MARGIN`), fastest first,
    else the one layout closest to fitting; why none can run). For each layout the lightest remat policy
    that fits (`REMAT_ORDER`), and where the device has host memory the lightest offload policy that fits
    (`OFFLOAD_ORDER`): a heavier policy only adds recompute, so these two are the layout's fastest."""
    fitting, closest = [], None
    host = devices.get(cfg.hardware.device).host_bytes
    for layout in layouts(cfg, chips):
        for order in (REMAT_ORDER, OFFLOAD_ORDER) if host else (REMAT_ORDER,):
            for remat in order:
                p = _try(dataclasses.replace(layout, model=dataclasses.replace(layout.model, remat=remat)))
                if p is None or p.problem:
                    break
                if _roomy(p):
                    fitting.append(p)
                    break
                if closest is None or p.per_device["total"] < closest.per_device["total"]:
                    closest = p
    if fitting:       # fastest first; within 0.1% of each other, the one holding less memory
        return sorted(fitting, key=lambda p: (round(math.log(p.predicted.seconds), 3),
                                              p.per_device["total"])), ""
    if closest is not None:
        return [closest], ""
    return [], (f"a global batch of {cfg.global_batch} sequences does not split over its batch shards "
                f"(data x fsdp x expert) with tensor 1-8, 1-8 micro-batches and every axis along whole "
                f"sides of the torus")


def _roomy(p: Plan) -> bool:
    """Whether `p` fits with the estimate's margin (`SEARCH_MARGIN`), as a layout search requires."""
    return p.fits and p.per_device["total"] * SEARCH_MARGIN <= p.budget


def _layout(p: Plan) -> str:
    """"data 1 x fsdp 16 x expert 64 x tensor 1, remat full, capacity 1.25"."""
    m = p.config.model
    out = f"{_mesh_row(p.mesh)}, remat {m.remat}"
    if p.config.optimizer.grad_accum_steps > 1:
        out += f", {p.config.optimizer.grad_accum_steps} micro-batches"
    if m.n_experts:
        out += f", capacity {m.moe_capacity_factor:g}" if m.moe_capacity_factor else ", dropless"
    return out


def _slice_answer(p: Plan, device: bool = False) -> str:
    """"v5p-2048 (1,024 chips, 23.8 days, 40.6% MFU, 46.0 GiB of 85.5 GiB per chip, <layout>): <bindings>"."""
    cfg, m = p.config, p.config.model
    bindings = [f'train.HardwareConfig.device="{cfg.hardware.device}"'] if device else []
    bindings += [f'train.HardwareConfig.topology="{cfg.hardware.topology}"', "train.MeshConfig.data=-1",
                 f"train.MeshConfig.fsdp={p.mesh['fsdp']}", f"train.MeshConfig.tensor={p.mesh['tensor']}"]
    if m.n_experts:
        bindings.append(f"train.MeshConfig.expert={p.mesh['expert']}")
        bindings.append(f"train.ModelConfig.moe_capacity_factor={m.moe_capacity_factor:g}")
    bindings.append(f'train.ModelConfig.remat="{m.remat}"')
    bindings.append(f"train.OptimizerConfig.grad_accum_steps={cfg.optimizer.grad_accum_steps}")
    return (f"{slice_name(cfg.hardware.topology)} ({p.chips:,} chips, {_num(p.days)} days, "
            f"{p.predicted.mfu:.1%} MFU predicted, {_gib(p.per_device['total'])} of {_gib(p.budget)} per "
            "chip, "
            f"{_layout(p)}): " + " ".join(bindings))


# What to try when XLA's figure, not the estimate, is over: the changes that shrink what XLA holds most.
_XLA_ADVICE = ("Try more FSDP or tensor parallelism, a heavier remat policy or more gradient accumulation "
               "(train.OptimizerConfig.grad_accum_steps), and compare XLA's figure again.")


def plan(cfg, *, advise: bool = True) -> Plan:
    """The plan for `cfg` (a stages.train.Config), with advice when it does not fit."""
    hw = cfg.hardware
    device = devices.get(hw.device)
    chips = (hw.chips or topology_chips(hw.topology) or _explicit_chips(cfg.mesh)) * hw.num_slices
    mesh = cfg.mesh.sizes(chips)
    batch_shards = math.prod(mesh[a] for a in BATCH_AXES)
    micro = cfg.global_batch // cfg.optimizer.grad_accum_steps
    micro_batch = max(1, micro // batch_shards)
    problem = "" if micro % batch_shards == 0 else (
        f"a micro-batch of {micro} sequences (global_batch {cfg.global_batch} / grad_accum_steps "
        f"{cfg.optimizer.grad_accum_steps}) does not split over {batch_axes_named(mesh)} = {batch_shards} "
        "devices")
    m = cfg.model
    per_device, host = memory_bytes(cfg, mesh, micro_batch, device)
    fpt = flops_per_token(m, cfg.seq_len)
    predicted = step_time.predict(cfg, mesh, micro_batch, host)
    step_s = (fpt * cfg.global_batch * cfg.seq_len / (chips * device.peak_flops * hw.mfu) if hw.mfu
              else predicted.seconds)
    result = Plan(cfg, device, chips, mesh, micro_batch, param_counts(m), per_device, fpt, step_s, problem,
                  host=host, predicted=predicted)
    if advise and not result.fits:
        result = dataclasses.replace(result, advice=advice(result))
    return result


def memory_bytes(cfg, mesh: dict[str, int], micro_batch: int, device: devices.Device) -> tuple[dict, int]:
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
    kept, host = activation_bytes(m, micro_batch, cfg.seq_len, mesh["tensor"], lanes=lanes, splash=splash,
                                  expert=mesh["expert"])
    out = {"params": params, "optimizer": optimizer_bytes(m, mesh, pbytes, cfg.optimizer.name),
           "activations": kept, "weights": cast_bytes(m, mesh),
           "accumulated": params if cfg.optimizer.grad_accum_steps > 1 else 0,
           "grads": params, "gathered": gathered_bytes(m, mesh),
           "recompute": recompute_bytes(m, micro_batch, cfg.seq_len, mesh["tensor"], lanes=lanes,
                                        splash=splash, expert=mesh["expert"]),
           "loss": loss_bytes(m, micro_batch * cfg.seq_len, cfg.loss_chunk, mesh),
           "xla_cpu": xla_cpu_bytes(m, mesh, pbytes) if cpu else 0,
           "updates": params if cpu else 0,
           "across_slices": across_slices_bytes(m, cfg.mesh, micro * cfg.seq_len, micro_batch * cfg.seq_len,
                                                cfg.loss_chunk, mesh["tensor"])}
    backward = out["grads"] + out["gathered"] + out["recompute"]
    held = sum(out[k] for k in ALWAYS)
    # The update runs after the backward pass has freed the activations.
    update = held - out["activations"] + out["grads"] + out["updates"]
    loss = out["loss"] + out["xla_cpu"] + out["across_slices"]
    out["total"] = max(held + max(backward, loss), update)
    return out, host


def optimizer_bytes(m: ModelConfig, mesh: dict[str, int], dtype_bytes: int, name: str) -> int:
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


def gathered_bytes(m: ModelConfig, mesh: dict[str, int]) -> int:
    """FSDP's working set: the layer being computed, gathered whole over the axes its embed dimension is
    split over (`gathered_mesh`: still split over tensor, and an MoE layer's experts over expert: E / expert
    of them) from the compute-dtype copy (`cast_bytes`), its
    gradient, in the compute dtype, before it is reduce-scattered, and the next layer's weights, which XLA
    gathers while this one computes (the prefetch that hides the all-gathers, as `step_time` assumes); the
    largest layer of a dense and an MoE one."""
    if mesh["fsdp"] * mesh["expert"] == 1:        # nothing split over an axis that FSDP gathers
        return 0
    layout = param_layout(m)
    layer = max(sum(shard_size(shape[1:], names[1:], gathered_mesh(shape[1:], names[1:], mesh))
                    for name, (shape, names) in layout.items() if name.startswith(f"{stack}."))
                for stack, _ in _stacks(m))
    return layer * 3 * DTYPE_BYTES[m.dtype]


def cast_bytes(m: ModelConfig, mesh: dict[str, int]) -> int:
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
    ModelConfig.sequence_parallel the input and the residual sum are split over `tensor` too."""
    D = m.d_model
    F = m.n_shared_experts * m.effective_moe_mlp_dim if stack == "moe_layers" else m.effective_mlp_dim
    N, K, F = (n // tensor if n % tensor == 0 else n for n in (m.n_heads, m.n_kv_heads, F))
    H = -(-m.effective_head_dim // lanes) * lanes
    # Sequence parallelism splits the residual stream (the layer input, the residual sum) over tensor.
    R = D // tensor if m.sequence_parallel and D % tensor == 0 else D
    return {"input": R, "normed": D, "q": N * H, "k": K * H, "v": K * H, "attention": N * H, "out": D,
            "residual": R, "normed2": D, "gate": F, "up": F, "act": F, "down": D}


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


def loss_bytes(m: ModelConfig, tokens: int, loss_chunk: int, mesh: dict[str, int]) -> int:
    """The chunked cross entropy (stages/train/loss.py): one chunk's float32 logits over this device's
    part of the vocabulary and, with FSDP (each device computes partial logits over its slice of the
    embedding dimension), their float32 sum over the fsdp axis, else their gradient in the compute dtype;
    and the float32 gradient of the output matrix that the chunks accumulate."""
    tensor = mesh["tensor"]
    vocab = m.vocab_size // tensor if m.vocab_size % tensor == 0 else m.vocab_size
    per_logit = 4 + (4 if mesh["fsdp"] * mesh["expert"] > 1 else DTYPE_BYTES[m.dtype])
    return min(loss_chunk, tokens) * vocab * per_logit + _output_matrix_bytes(m, mesh)


def across_slices_bytes(m: ModelConfig, mesh, tokens: int, device_tokens: int, loss_chunk: int,
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


def xla_cpu_bytes(m: ModelConfig, mesh: dict[str, int], dtype_bytes: int) -> int:
    """What XLA:CPU holds through the loss that the TPU and GPU compilers do not (read from the compiled
    step's HLO schedule and buffer report, benchmarks/RESULTS.md): its scheduler places the zero-filled
    gradient stacks of the scanned layers at the start of the step, so they are live through the loss
    (in the parameters' dtype); and it copies the output matrix into its transposed layout before the
    forward pass and accumulates that matrix's gradient in the transposed layout, then transposes it back:
    two more float32 copies of this device's shard of it."""
    layers = sum(shard_size(shape, names, mesh) for name, (shape, names) in param_layout(m).items()
                 if _stacked(name))
    return layers * dtype_bytes + 2 * _output_matrix_bytes(m, mesh)


def advice(failed: Plan) -> str:
    """The smallest single change that makes a plan that does not fit fit, tried in this order: more FSDP
    (taken from the data axis), a heavier remat policy, more gradient accumulation (a smaller
    micro-batch), host offload (where the device has host memory: an offload_* policy); then a mesh
    layout; else more chips. A micro-batch that does not split over the batch shards is never told to
    use more chips (`_unsplit_tries`)."""
    cfg, mesh = failed.config, failed.config.mesh
    # The candidates bind MeshConfig's sizes within a slice; the split across slices (dcn_*) stays.
    data, fsdp, _, tensor = mesh.ici_shape(failed.chips)
    tries = []
    f = fsdp * 2
    while data * fsdp % f == 0 and f <= data * fsdp:
        wider = dataclasses.replace(mesh, fsdp=f, data=-1)
        tries.append((f"train.MeshConfig.fsdp={f}", dataclasses.replace(cfg, mesh=wider)))
        f *= 2

    def with_remat(remat):
        return (f'train.ModelConfig.remat="{remat}"',
                dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=remat)))

    offloading = cfg.model.remat.startswith(OFFLOAD)
    order = OFFLOAD_ORDER if offloading else REMAT_ORDER
    tries += [with_remat(remat) for remat in order[order.index(cfg.model.remat) + 1:]]
    k = cfg.optimizer.grad_accum_steps * 2
    while cfg.global_batch % k == 0:
        smaller = dataclasses.replace(cfg.optimizer, grad_accum_steps=k)
        tries.append((f"train.OptimizerConfig.grad_accum_steps={k}",
                      dataclasses.replace(cfg, optimizer=smaller)))
        k *= 2
    if failed.device.host_bytes and not offloading:
        tries += [with_remat(remat) for remat in OFFLOAD_ORDER]
    unsplit_first, unsplit_last = _unsplit_tries(failed) if failed.problem else ([], [])
    tries += unsplit_first
    for binding, candidate in tries:
        p = _try(candidate)
        if p is not None and p.fits:
            host = f", {_gib(p.host)} of activations in host memory" if p.host else ""
            return f"It would fit with {binding} ({_gib(p.per_device['total'])} per device{host})."
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
    for binding, candidate in unsplit_last:
        p = _try(candidate)
        if p is not None and p.fits:
            return f"It would fit with {binding} ({_gib(p.per_device['total'])} per device)."
    if failed.problem:       # more chips would only add batch shards
        micro = cfg.global_batch // cfg.optimizer.grad_accum_steps
        return (f"No mesh layout, number of micro-batches, global batch or number of slices tried splits a "
                f"micro-batch of {micro} sequences over these {failed.chips:,} chips and fits: use fewer "
                f"chips (at most {micro} data x fsdp shards, each a whole sequence) or a smaller model.")
    return ("No mesh layout, remat policy, micro-batch or host offload makes it fit: use more chips "
            "(train.HardwareConfig.chips or a larger topology) or a smaller model.")


def _unsplit_tries(failed: Plan) -> tuple[list, list]:
    """For a micro-batch with fewer sequences than batch shards (data x fsdp): the changes that leave each
    shard a whole sequence, never more chips (more chips, more shards), as two lists of (binding,
    config): fewer micro-batches per step (the same global batch, tried before a mesh layout), then a
    larger global batch (a multiple of the shards x micro-batches: more tokens per step) and fewer slices
    (tried after)."""
    cfg, hw, mesh = failed.config, failed.config.hardware, failed.config.mesh
    accum, shards = cfg.optimizer.grad_accum_steps, failed.mesh["data"] * failed.mesh["fsdp"]
    first, last = [], []
    k = accum // 2
    while k >= 1:
        if cfg.global_batch % k == 0:
            fewer = dataclasses.replace(cfg.optimizer, grad_accum_steps=k)
            first.append((f"train.OptimizerConfig.grad_accum_steps={k}",
                          dataclasses.replace(cfg, optimizer=fewer)))
        k //= 2
    larger = math.ceil(cfg.global_batch / (shards * accum)) * shards * accum
    more = f"{larger / cfg.global_batch:,.3g}x the tokens per step"
    last.append((f"train.Config.global_batch={larger} ({more})",
                 dataclasses.replace(cfg, global_batch=larger)))
    if mesh.dcn_fsdp == mesh.dcn_tensor == 1:
        for s in (d for d in reversed(_divisors(hw.num_slices)) if d < hw.num_slices):
            last.append((f"train.HardwareConfig.num_slices={s} train.MeshConfig.dcn_data={s}",
                         dataclasses.replace(cfg, hardware=dataclasses.replace(hw, num_slices=s),
                                             mesh=dataclasses.replace(mesh, dcn_data=s))))
    return first, last


def _try(cfg) -> Plan | None:
    try:
        return plan(cfg, advise=False)
    except ValueError:           # a candidate the configs reject (a mesh that does not tile the chips)
        return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (d & (d - 1)) == 0]      # powers of two


def _output_matrix(m: ModelConfig) -> str:
    """The parameter that maps the last hidden state to logits: the embedding itself when tied."""
    return "embed" if m.tie_embeddings else "unembedding"


def _output_matrix_bytes(m: ModelConfig, mesh: dict[str, int]) -> int:
    """This device's shard of the output matrix in float32 (the loss accumulates its gradient so)."""
    return shard_size(*param_layout(m)[_output_matrix(m)], mesh) * 4


def _stacked(name: str) -> bool:
    """Whether a `param_layout` name is a scanned layer stack's ("layers.wq", "moe_layers.experts_up")."""
    return name.partition(".")[0] in LAYER_STACKS


def _stacks(m: ModelConfig) -> list[tuple[str, int]]:
    """(stack, its layers) for each layer stack `m` has: the dense layers, then the MoE layers."""
    counts = {"layers": m.n_layers - m.n_moe_layers, "moe_layers": m.n_moe_layers}
    return [(stack, counts[stack]) for stack in LAYER_STACKS if counts[stack]]


def _slices(mesh, chips: int) -> str:
    """A multi-slice mesh's split, for the mesh row: within each slice (ICI) x across slices (DCN)."""
    if mesh.num_slices == 1:
        return ""
    named = [i for i, a in enumerate(AXES) if a != "expert" or mesh.expert * mesh.dcn_expert > 1]
    ici, dcn = ("x".join(str(s[i]) for i in named) for s in (mesh.ici_shape(chips), mesh.dcn_shape))
    return f" = ICI {ici} within each slice x DCN {dcn} across {mesh.num_slices} slices"


def _render_memory(parts: dict[str, int]) -> str:
    held = ", ".join(f"{k} {_gib(parts[k])}" for k in ALWAYS if parts[k] or k != "accumulated")
    backward = " + ".join(f"{k} {_gib(parts[k])}" for k in ("grads", "gathered", "recompute"))
    loss = _gib(parts["loss"])
    if parts["across_slices"]:
        loss += f" + what XLA gathers across slices for it {_gib(parts['across_slices'])}"
    if not parts["xla_cpu"]:
        return f"  per device: {held}, then the larger of backward ({backward}) and loss {loss}"
    return (f"  per device: {held}, then the largest of backward ({backward}), loss ({loss} + "
            f"XLA:CPU's copies {_gib(parts['xla_cpu'])}) and update (grads {_gib(parts['grads'])} + "
            f"updates {_gib(parts['updates'])}, once the activations are freed)")


def _mesh_row(mesh: dict[str, int]) -> str:
    """"data 1 x fsdp 128 x tensor 8", the expert axis named where it is used."""
    return " x ".join(f"{a} {n}" for a, n in mesh.items() if a != "expert" or n > 1)


def _explicit_chips(mesh) -> int:
    """A slice's chips when nothing else names them: the mesh's explicit sizes within a slice (every axis:
    an expert axis holds chips as the others do)."""
    return (mesh.data if mesh.data > 0 else 1) * mesh.fsdp * mesh.expert * mesh.tensor


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**27 else f"{n / 2**20:,.1f} MiB"


def _num(x: float) -> str:
    """3 significant figures without an exponent: "0.6", "29.3", "478", "3,130"."""
    return f"{x:,.3g}" if x < 1000 else f"{float(f'{x:.3g}'):,.0f}"


def _count(n: float) -> str:
    """A parameter count: "30.2B", "2.13M"."""
    return _tokens(n) if n >= 1e9 or n < 1e6 else f"{n / 1e6:,.3g}M"


def _tokens(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:,.3g}{unit}"
    return f"{n:,.0f}"
