"""What to change when a plan does not fit: the smallest single change that makes it fit, as the gin binding
to set (no JAX).

    p = planner.plan(train_config)          # advice is filled in when p does not fit
    p.advice                                # "It would fit with train.MeshConfig.fsdp=256 (61.2 GiB ...)."
    advice.advice(p, planner.try_plan)      # the same, for a plan made with advise=False

Each candidate is planned in full (`replan`: `planner.try_plan`, the plan without advice), so the advice
never names a change that the planner would refuse.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from stages.train.mesh import power_of_two_divisors
from stages.train.planning.figures import gib
from stages.train.planning.memory import OFFLOAD, OFFLOAD_ORDER, REMAT_ORDER
from stages.train.planning.plan import Plan


def advice(failed: Plan, replan: Callable[[object], Plan | None]) -> str:
    """The smallest single change that makes a plan that does not fit fit, tried in this order: more FSDP
    (taken from the data axis), a heavier remat policy, more gradient accumulation (a smaller
    micro-batch), host offload (where the device has host memory: an offload_* policy); then a mesh
    layout; else more chips. Each candidate config is planned by `replan` (`planner.try_plan`: its plan
    without advice, or None where the configs reject it). A micro-batch that does not split over the batch
    shards is never told to use more chips (`_unsplit_tries`)."""
    cfg, mesh = failed.config, failed.config.mesh
    # The candidates bind MeshConfig's sizes within a slice; the split across slices (dcn_*) stays. A new
    # mesh is laid as jax lays it: a run file's device order no longer tiles it.
    unorder = ' train.MeshConfig.device_order=""' if mesh.device_order else ""
    data, fsdp, _, tensor = mesh.ici_shape(failed.chips)
    tries = []
    f = fsdp * 2
    while data * fsdp % f == 0 and f <= data * fsdp:
        wider = dataclasses.replace(mesh, fsdp=f, data=-1, device_order="")
        tries.append((f"train.MeshConfig.fsdp={f}{unorder}", dataclasses.replace(cfg, mesh=wider)))
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
        p = replan(candidate)
        if p is not None and p.fits:
            host = f", {gib(p.host)} of activations in host memory" if p.host else ""
            return f"It would fit with {binding} ({gib(p.per_device['total'])} per device{host})."
    # No single change: the mesh layout that fits with the least tensor parallelism (it costs the most
    # communication), then the least FSDP.
    n = data * fsdp * tensor
    for t in (d for d in power_of_two_divisors(n) if d >= tensor):
        for f in power_of_two_divisors(n // t):
            layout = dataclasses.replace(mesh, data=-1, fsdp=f, tensor=t, device_order="")
            p = replan(dataclasses.replace(cfg, mesh=layout))
            if p is not None and p.fits:
                return (f"It would fit with train.MeshConfig.fsdp={f} train.MeshConfig.tensor={t}{unorder} "
                        f"({gib(p.per_device['total'])} per device).")
    for binding, candidate in unsplit_last:
        p = replan(candidate)
        if p is not None and p.fits:
            return f"It would fit with {binding} ({gib(p.per_device['total'])} per device)."
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
    accum, shards = cfg.optimizer.grad_accum_steps, failed.mesh.data * failed.mesh.fsdp
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
        for s in (d for d in reversed(power_of_two_divisors(hw.num_slices)) if d < hw.num_slices):
            unorder = ' train.MeshConfig.device_order=""' if mesh.device_order else ""
            last.append((f"train.HardwareConfig.num_slices={s} train.MeshConfig.dcn_data={s}{unorder}",
                         dataclasses.replace(cfg, hardware=dataclasses.replace(hw, num_slices=s),
                                             mesh=dataclasses.replace(mesh, dcn_data=s, device_order=""))))
    return first, last
