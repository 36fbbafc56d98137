"""The answer to "will it fit and how long": the `Plan` record `planner.plan` returns, and its rendering
as the text `make plan` prints (no JAX).

    p = planner.plan(train_config)          # a Plan
    p.fits, p.per_device["total"], p.days   # the verdict, bytes per device (memory.py), the run's length
    p.predicted.seconds                     # the step predicted by step_time.py
    p.goodput.share                         # the share of wall-clock time that trains (goodput.py)
    print(p.render())                       # make plan GIN=gin/600b.gin
    print(p.render(xla=aot.compile_train_step(train_config)))   # with XLA's figure beside the estimate

A plan's verdict is the estimate's (`memory.memory_bytes` against `HEADROOM` of the device's memory, and
what an offload_* policy keeps against the host's), unless XLA's figures for the compiled step are given:
where they exist they win (`Plan.fits_with`), and a compile that ran out of memory never fits.
"""

from __future__ import annotations

import dataclasses
import functools

from stages.train.mesh import AXES, Mesh
from stages.train.model_config import active_params
from stages.train.planning import devices, goodput, hlo, step_time
from stages.train.planning.figures import gib, num, param_count, token_count
from stages.train.planning.memory import ALWAYS, OFFLOAD, memory_bytes
from stages.train.planning.shards import all_to_all_bytes, moe_rows

HEADROOM = 0.9     # the share of HBM a plan may use: the runtime, XLA's buffers, fragmentation take the rest


@dataclasses.dataclass(frozen=True)
class Plan:
    config: object                    # the stages.train.Config planned
    device: devices.Device
    chips: int                        # all chips, every slice
    mesh: Mesh                        # the whole mesh: data, fsdp, expert and tensor over every slice
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

    @functools.cached_property
    def goodput(self) -> goodput.Goodput:
        """What checkpoints, evaluations and restarts take besides the steps (goodput.py), computed when first
        asked (the slice search asks only of the layouts that fit)."""
        return goodput.estimate(self)

    @property
    def train_days(self) -> float:
        """The steps alone: steps x the step."""
        return self.config.steps * self.step_s / 86400

    @property
    def days(self) -> float:
        """The run's wall-clock days: the steps over the goodput's share (inf where it never finishes)."""
        share = self.goodput.share
        return self.train_days / share if share else float("inf")

    def render(self, xla: dict[str, int] | None = None, xla_note: str = "", collectives=None) -> str:
        """The plan as text, its verdict last; `xla` (aot.compile_train_step's figures) adds XLA's own
        per-device total for the real train step beside the estimate, `xla_note` why it is not there, and
        `collectives` (the compiled step's, `hlo.collectives`) what it moves beside what the model says."""
        cfg, m = self.config, self.config.model
        hw = cfg.hardware
        total_params = sum(self.params.values())
        where = f"{self.chips:,} x {self.device.label} ({gib(self.device.hbm_bytes)} each)"
        slices = f" x {hw.num_slices} slices" if hw.num_slices > 1 else ""
        if hw.topology:
            where += f", topology {hw.topology}{slices}"
        moe = m.n_experts > 0
        active = (f"; active {param_count(active_params(m))} of {param_count(total_params)} a token (top-"
                  f"{m.n_experts_per_token} of {m.n_experts} routed experts"
                  + (f" + {m.n_shared_experts} shared" if m.n_shared_experts else "")
                  + f" in {m.n_moe_layers} of {m.n_layers} layers)") if moe else ""
        rows = [
            f"train plan: {total_params / 1e9:,.3g}B parameters on {where}",
            "  parameters: " + ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in self.params.items() if v)
            + active,
            f"  FLOPs per token: {self.flops_per_token / 1e9:,.3g} GFLOP "
            f"({'6 x active N' if moe else '6N'} + causal attention at T={cfg.seq_len})",
            f"  mesh: {self.mesh.describe()}"
            f"{_slices(cfg.mesh, self.chips)}; "
            f"micro-batch {self.micro_batch} x {cfg.seq_len} tokens per device "
            f"(x {cfg.optimizer.grad_accum_steps} accumulated); remat {m.remat}; "
            f"{m.dtype} compute, {m.param_dtype} params; attention {m.attention_impl}",
            _render_memory(self.per_device) + f" = {gib(self.per_device['total'])} of "
            f"{gib(self.budget)} usable ({HEADROOM:.0%} of {gib(self.device.hbm_bytes)})",
        ]
        if self.host:
            rows.append(f"  host memory per device: {gib(self.host)} of activations offloaded by remat "
                        f"{m.remat} (not in the device total) of {gib(self.host_budget)} usable "
                        f"({HEADROOM:.0%} of {gib(self.device.host_bytes)}, less the checkpoint's copy of "
                        "the state)")
        elif m.remat.startswith(OFFLOAD):
            rows.append(f"  host memory: {self.device.label} has none to offload to; remat {m.remat} runs "
                        f"as {m.remat.removeprefix(OFFLOAD)} (training logs the same)")
        rows += _order_row(self)
        if moved := self.all_to_all_row():
            rows.append(moved)
        rows += self.time_rows()
        rows += self.goodput.rows(cfg, self.device, self.chips)
        if collectives:
            rows.append(self.collectives_row(collectives))
        oom = xla is not None and "hbm" in xla          # the compile ran out of memory (aot.OutOfMemory)
        needs = "at least " if oom else ""
        if oom:
            rows.append(f"  XLA, compiled for {hw.topology}{slices}: out of memory, needs {needs}"
                        f"{gib(xla['total'])} per device of {gib(xla['hbm'])}; libtpu: {xla_note}")
        elif xla is not None:
            rows.append(f"  XLA, compiled for {hw.topology}{slices}: {gib(xla['total'])} per device "
                        f"(arguments {gib(xla['argument'])}, scratch {gib(xla['temp'])}); the estimate is "
                        f"{self.per_device['total'] / max(xla['total'], 1):.0%} of it")
        elif xla_note:
            rows.append(f"  XLA: not compiled: {xla_note}")
        if self.fits_with(xla):
            rows.append(f"  verdict: fits on {where}")
        elif self.problem:
            rows.append(f"  verdict: does NOT fit: {self.problem}. {self.advice}")
        elif oom or (xla is not None and xla["total"] > self.budget):
            limit = f"the {gib(xla['hbm'])} it had" if oom else f"{gib(self.budget)} usable"
            rows.append(f"  verdict: does NOT fit: XLA's compile for {hw.topology}{slices} needs {needs}"
                        f"{gib(xla['total'])} per device > {limit} (XLA's figure wins over the estimate, "
                        f"{gib(self.per_device['total'])}). {self.advice or _XLA_ADVICE}")
        elif self.per_device["total"] <= self.budget:
            rows.append(f"  verdict: does NOT fit: {gib(self.host)} of offloaded activations per device > "
                        f"{gib(self.host_budget)} of host memory usable. {self.advice}")
        else:
            rows.append(f"  verdict: does NOT fit: {gib(self.per_device['total'])} per device > "
                        f"{gib(self.budget)} usable. {self.advice}")
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
        rows = [f"  time, predicted: {num(t.seconds)} s/step ({t.mfu:.1%} MFU), "
                f"{token_count(self.config.global_batch * self.config.seq_len / t.seconds)} tokens/s, "
                f"{num(steps * t.seconds / 86400)} days for {token_count(self.tokens)} tokens{borrowed}",
                f"    largest terms: {t.largest(3)}"]
        if hw.mfu:
            rows.append(f"  time at the assumed {hw.mfu:.0%} MFU (train.HardwareConfig.mfu, which sets the "
                        "days): "
                        f"{num(self.step_s)} s/step, {num(self.train_days)} days of steps")
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
        # One chunk a micro-batch leaves the mesh, the micro-batch and what is offloaded as they are: only the
        # loss's bytes and the logits' collectives change, as `planner.plan` would count them.
        whole = dataclasses.replace(cfg, loss_chunk=micro)
        total = memory_bytes(whole, self.mesh, self.micro_batch, self.device)[0]["total"]
        seconds = step_time.predict(whole, self.mesh, self.micro_batch, self.host).seconds
        chunks = -(-micro // cfg.loss_chunk)
        return [f"    hint: train.Config.loss_chunk={cfg.loss_chunk:,} splits each micro-batch of {micro:,} "
                f"tokens into {chunks:,} chunks whose partial logits every chip computes and all-reduces "
                f"({num(logits.exposed)} s a step); train.Config.loss_chunk={micro} predicts "
                f"{num(seconds)} s/step at {gib(total)} per device"]

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
                + ", ".join(f"{k} {gib(xla[k])} ({gib(model[k])})" for k in kinds))

    def all_to_all_row(self) -> str:
        """What an MoE model's expert axis moves per step (`all_to_all_bytes`), and the least time that takes
        at the chips' ICI bandwidth (a device keeps 1 / expert of each buffer and sends and receives the
        rest); "" without an expert axis."""
        buffer, count = all_to_all_bytes(self.config, self.mesh, self.micro_batch)
        t = self.predicted
        if not count or t is None:
            return ""
        m, ep = self.config.model, self.mesh.expert
        rows = moe_rows(m, self.micro_batch * self.config.seq_len, ep) // m.n_experts
        passes = "forward, backward" + ("" if m.remat == "none" else " and the remat's recompute")
        accum = self.config.optimizer.grad_accum_steps
        term = self.predicted.term("all-to-all")
        if term.note:           # placed on the topology's grid: the group's shape, hops and ports
            links = term.note.removeprefix("; ")
        else:
            hops = step_time.all_to_all_hops(self.device, ep)
            links = (f"each byte {hops:,.2g} link{'s' if hops != 1 else ''} on average at "
                     f"{self.device.label}'s {self.device.ici_bytes_per_s / 1e9:,.0f} GB/s ICI")
        return (f"  all-to-all over expert {ep}: {gib(count * buffer)} per device per step, {count:,} of "
                f"the (E, C, D) = ({m.n_experts}, {rows:,}, {m.d_model:,}) capacity buffer ({gib(buffer)}): "
                f"{m.n_moe_layers} MoE layers x {accum} micro-batch{'es' if accum > 1 else ''} x to the "
                f"experts and back x {passes}; {num(term.seconds)} s of the predicted {num(t.seconds)} s "
                f"step ({links}, on the critical path)")


# What to try when XLA's figure, not the estimate, is over: the changes that shrink what XLA holds most.
_XLA_ADVICE = ("Try more FSDP or tensor parallelism, a heavier remat policy or more gradient accumulation "
               "(train.OptimizerConfig.grad_accum_steps), and compare XLA's figure again.")


def _order_row(p) -> list[str]:
    """["  device order ... on <topology> (...)"] where the plan lays the mesh on a TPU grid, else []."""
    said = step_time.Links.of(p.config, p.mesh, p.device, step_time.efficiency(p.device)[0]).describe()
    return [f"  {said}"] if said else []


def _slices(mesh, chips: int) -> str:
    """A multi-slice mesh's split, for the mesh row: within each slice (ICI) x across slices (DCN)."""
    if mesh.num_slices == 1:
        return ""
    named = [i for i, a in enumerate(AXES) if a != "expert" or mesh.expert * mesh.dcn_expert > 1]
    ici, dcn = ("x".join(str(s[i]) for i in named) for s in (mesh.ici_shape(chips), mesh.dcn_shape))
    return f" = ICI {ici} within each slice x DCN {dcn} across {mesh.num_slices} slices"


def _render_memory(parts: dict[str, int]) -> str:
    held = ", ".join(f"{k} {gib(parts[k])}" for k in ALWAYS if parts[k] or k != "accumulated")
    backward = " + ".join(f"{k} {gib(parts[k])}" for k in ("grads", "gathered", "recompute"))
    loss = gib(parts["loss"])
    if parts["across_slices"]:
        loss += f" + what XLA gathers across slices for it {gib(parts['across_slices'])}"
    if not parts["xla_cpu"]:
        return f"  per device: {held}, then the larger of backward ({backward}) and loss {loss}"
    return (f"  per device: {held}, then the largest of backward ({backward}), loss ({loss} + "
            f"XLA:CPU's copies {gib(parts['xla_cpu'])}) and update (grads {gib(parts['grads'])} + "
            f"updates {gib(parts['updates'])}, once the activations are freed)")
