"""Will this training config fit its hardware, and how long will it take? Answered from the config alone.

    make plan GIN=gin/600b.gin                      (prints `plan(config).render()` for the train stage)
    make plan GIN=gin/600b.gin DAYS=30              (and `search.smallest_slice(config, 30).render()`)
    p = planner.plan(train_config)                  # a stages.train.Config -> a plan.Plan
    p.fits, p.per_device["total"], p.days          # the verdict, bytes per device, the run's length
    print(p.render())

`plan` puts one answer together from the modules beside it, each answering one question:

    memory.py     how many bytes a device holds, by part (`memory.memory_bytes`): the parameters, optimizer
                  state, activations under the remat policy, the backward and loss phases, for the mesh
                  (`train.MeshConfig`) on the chips of `train.HardwareConfig`
    step_time.py  how long one step takes (`step_time.predict`): compute at calibrated per-operation rates,
                  each collective's bytes at its link's bandwidth, what hides behind what
    plan.py       the `Plan` record and its text, the verdict last
    advice.py     when it does not fit, the smallest single change that would (`Plan.advice`)
    goodput.py    the share of wall-clock time that trains: checkpoint saves, evaluations and restarts after
                  interruptions besides the steps (`Plan.goodput`)
    search.py     the reverse question: the smallest TPU slice that trains the tokens in N days and fits
    tpu.py        the TPU generations and slices a topology may name; devices.py each chip's figures;
                  hardware.py the hardware a run names (`train.HardwareConfig`)
    topology.py   where the mesh's devices sit on a slice's chip grid (`train.MeshConfig.device_order`),
                  and each collective group's shape, hops, ports and bisection there
    shards.py     one device's share of an array; aot.py and hlo.py XLA's own figures for the compiled step;
                  figures.py how a plan writes its sizes and counts

The run's days are its steps x the predicted step (step_time.py), or, where train.HardwareConfig.mfu
assumes a model FLOPs utilization, its FLOPs per token (`model_config.flops_per_token`) x tokens / (chips x
peak x that MFU), the prediction printed beside them; over the goodput (goodput.py): days = tokens /
(throughput x goodput). A mixture of experts (`ModelConfig.n_experts`) is
planned from the same parameter table (`model_config.param_layout`), its time from the active parameters
(`model_config.active_params`), and its plan adds the bytes the expert axis's all-to-all moves a step.

The figures are estimates from first principles, so they can be read without a compiler; `--compile`
(aot.py) puts XLA's own per-device figure for the real train step beside them, and where it exists it wins
(`Plan.fits_with`). No module of the planner but aot.py imports JAX: `make plan` runs in a second.
"""

from __future__ import annotations

import dataclasses
import math

from stages.train.model_config import flops_per_token, param_counts
from stages.train.planning import advice, devices, step_time
from stages.train.planning.memory import memory_bytes
from stages.train.planning.plan import Plan
from stages.train.planning.tpu import topology_chips


def plan(cfg, *, advise: bool = True, timed: bool = True) -> Plan:
    """The plan for `cfg` (a stages.train.Config), with advice when it does not fit (`advise`). timed=False
    leaves the step out (`predicted` None, `step_s` NaN, so its days mean nothing): the memory verdict alone,
    which a layout search weighs before it times a layout that fits."""
    hw = cfg.hardware
    device = devices.get(hw.device)
    chips = (hw.chips or topology_chips(hw.topology) or _explicit_chips(cfg.mesh)) * hw.num_slices
    mesh = cfg.mesh.for_devices(chips)
    batch_shards = mesh.batch_shards
    micro = cfg.global_batch // cfg.optimizer.grad_accum_steps
    micro_batch = max(1, micro // batch_shards)
    problem = "" if micro % batch_shards == 0 else (
        f"a micro-batch of {micro} sequences (global_batch {cfg.global_batch} / grad_accum_steps "
        f"{cfg.optimizer.grad_accum_steps}) does not split over {mesh.describe_batch()} = {batch_shards} "
        "devices")
    m = cfg.model
    per_device, host = memory_bytes(cfg, mesh, micro_batch, device)
    fpt = flops_per_token(m, cfg.seq_len)
    predicted = step_time.predict(cfg, mesh, micro_batch, host) if timed else None
    if hw.mfu:
        step_s = fpt * cfg.global_batch * cfg.seq_len / (chips * device.peak_flops * hw.mfu)
    else:
        step_s = predicted.seconds if predicted else math.nan
    result = Plan(cfg, device, chips, mesh, micro_batch, param_counts(m), per_device, fpt, step_s, problem,
                  host=host, predicted=predicted)
    if advise and not result.fits:
        result = dataclasses.replace(result, advice=advice.advice(result, try_plan))
    return result


def try_plan(cfg, *, timed: bool = True) -> Plan | None:
    """The plan of a candidate config, without advice, or None where the configs reject it (a mesh that
    does not tile the chips): what the advice and the slice search weigh (timed=False: see `plan`)."""
    try:
        return plan(cfg, advise=False, timed=timed)
    except ValueError:
        return None


def _explicit_chips(mesh) -> int:
    """A slice's chips when nothing else names them: the mesh's explicit sizes within a slice (every axis:
    an expert axis holds chips as the others do)."""
    return (mesh.data if mesh.data > 0 else 1) * mesh.fsdp * mesh.expert * mesh.tensor
