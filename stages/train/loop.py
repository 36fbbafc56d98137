"""The training loop: one readable function, `train`, around a jitted pure `train_step`.

    from stages.train import loop
    loop.train(config, shard_committed, out_dir, work_dir)     # what worker.main calls

State is (params, opt_state, step). The batch at step s is `data.batch(s)`, a pure function of s
and the seed, so resuming from a checkpoint at step s replays exactly the batches an
uninterrupted run would see (bitwise on CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from pipeline import storage
from stages.train import checkpoint, data, loss, metrics, model, optimizer, sharding

log = logging.getLogger(__name__)


def train(cfg, shard, out_dir: str, work_dir: str, *, process_index: int = 0, process_count: int = 1) -> dict:
    manifest = storage.read_json(shard.file("manifest.json"))
    mcfg = dataclasses.replace(cfg.model, vocab_size=manifest["vocab_size"])
    ocfg = cfg.optimizer_for_run()
    mesh = sharding.make_mesh(cfg.mesh)
    local_out = out_dir if storage.is_local(out_dir) else tempfile.mkdtemp(prefix="refinery-train-")

    # Data: memory-mapped shards (copied locally once when they live on gs://).
    shard_dir = os.path.join(tempfile.gettempdir(), "refinery-shards", shard.key)
    train_files = data.local_shards(shard.paths("train-*.bin"), shard_dir)
    val_files = data.local_shards(shard.paths("val-*.bin"), shard_dir)
    batches = data.TokenData(train_files, manifest, seq_len=cfg.seq_len, global_batch=cfg.global_batch,
                             seed=cfg.seed, process_index=process_index, process_count=process_count)
    eval_data = [b for _, b in zip(range(cfg.eval_batches),
                                   data.eval_batches(val_files or train_files, manifest, seq_len=cfg.seq_len,
                                                     batch_size=cfg.global_batch,
                                                     process_index=process_index,
                                                     process_count=process_count))]

    # Model and optimizer, placed on the mesh.
    with jax.set_mesh(mesh):
        net = model.Transformer(mcfg, rngs=nnx.Rngs(cfg.seed))
        sharding.shard_model(net, mesh)
    graphdef, params = nnx.split(net, nnx.Param)
    tx = optimizer.make_optimizer(ocfg, params)
    opt_state = tx.init(params)
    lr_at = optimizer.schedule(ocfg)
    num_params = model.num_params(mcfg)
    flops_per_token = model.flops_per_token(mcfg, cfg.seq_len)

    # Resume from the last periodic checkpoint of this key, if a previous attempt left one.
    ckpt = checkpoint.Checkpointer(storage.join(work_dir, "checkpoints"), keep=cfg.keep_checkpoints,
                                   every=cfg.checkpoint_every)
    start = 0
    if ckpt.latest_step() is not None:
        restored = ckpt.restore(ckpt.latest_step(), _state(params, opt_state, 0, mesh))
        params, opt_state, start = restored["params"], restored["opt_state"], int(restored["step"])
        log.info("resumed from step %d", start)
    stop = ckpt.install_sigterm_handler()

    step_fn = jax.jit(functools.partial(train_step, graphdef, tx, cfg, manifest["eos_id"]),
                      donate_argnums=(0, 1))
    eval_fn = jax.jit(functools.partial(eval_step, graphdef, cfg, manifest["eos_id"]))
    peak_name, peak = metrics.device_peak_flops(jax.devices()[0])
    writer = metrics.MetricsWriter(local_out, every=cfg.log_every, total_steps=cfg.steps,
                                   enabled=process_index == 0)
    last, throughput, eval_loss = {}, {}, float("nan")
    tokens_per_step = cfg.global_batch * cfg.seq_len
    pending: list = []                  # (step, device outputs) since the last log: fetched together
    timer = (time.perf_counter(), start)
    for step in range(start, cfg.steps):
        batch = sharding.global_batch(batches.batch(step), mesh)
        params, opt_state, out = step_fn(params, opt_state, batch)
        pending.append((step, out))
        if step == start or writer.should_log(step + 1):
            # One device sync per logging interval: every step's loss is checked, the numbers averaged.
            fetched = [(s, jax.device_get(o)) for s, o in pending]
            pending = []
            for s, o in fetched:
                if not metrics.check_finite(s, float(o["loss"]), cfg.nan_policy):
                    log.warning("step %d: non-finite loss %s, update skipped", s, o["loss"])
            now = time.perf_counter()
            # The first step's time is mostly compilation: it gets its own interval and is not a rate.
            dt = (now - timer[0]) / (step + 1 - timer[1])
            timer = (now, step + 1)
            tps = tokens_per_step / dt
            o = fetched[-1][1]
            last = {"step": step + 1, "loss": float(np.mean([f[1]["loss"] for f in fetched])),
                    "accuracy": float(np.mean([f[1]["accuracy"] for f in fetched])),
                    "learning_rate": float(lr_at(step)), "grad_norm": float(o["grad_norm"]),
                    "param_norm": float(o["param_norm"]), "tokens_per_s": tps, "step_time_s": dt,
                    "mfu": metrics.mfu(flops_per_token, tps, jax.device_count(), peak)}
            if step == start:
                last["compile_and_first_step_s"] = last.pop("step_time_s")
                del last["tokens_per_s"], last["mfu"]
            if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
                eval_loss = evaluate(eval_fn, params, eval_data, mesh)
                last["eval_loss"] = eval_loss
                timer = (time.perf_counter(), step + 1)          # evaluation time is not training time
            writer.write(last)
            if "tokens_per_s" in last:
                throughput = last
        # A stop request at the last step just finishes: the final checkpoint follows anyway.
        stopping = step + 1 < cfg.steps and (stop.is_set() or 0 < cfg.stop_after <= step + 1)
        if stopping or (step + 1) % cfg.checkpoint_every == 0:
            ckpt.save(step + 1, _state(params, opt_state, step + 1, mesh), force=stopping)
        if stopping:
            ckpt.wait()
            writer.close()
            raise SystemExit(f"stopped at step {step + 1} ({'SIGTERM' if stop.is_set() else 'stop_after'}); "
                             "rerun to resume from the checkpoint")
    ckpt.wait()
    ckpt.close()
    writer.close()

    final = checkpoint.Checkpointer(storage.join(out_dir, "checkpoint"), keep=1, every=1, async_save=False)
    final.save(cfg.steps, _state(params, opt_state, cfg.steps, mesh), force=True)
    final.close()
    summary = {"params": num_params, "steps": cfg.steps, "final_loss": last.get("loss"),
               "eval_loss": eval_loss, "tokens_per_s": throughput.get("tokens_per_s"),
               "mfu": throughput.get("mfu"),
               "device": peak_name, "devices": jax.device_count(), "processes": process_count,
               "model": dataclasses.asdict(mcfg), "seq_len": cfg.seq_len, "global_batch": cfg.global_batch}
    if process_index == 0:
        _publish(local_out, out_dir, summary)
    return summary


def train_step(graphdef, tx, cfg, eos_id, params, opt_state, batch):
    """One optimizer step; a pure function of (params, opt_state, batch). batch: (B, T + 1) int32.

    With OptimizerConfig.grad_accum_steps = k the batch is k micro-batches of B / k rows, run one after
    another under `lax.scan` (the activation memory of one micro-batch); their mean gradient makes one
    update, the one a single big batch would make (every micro-batch has B / k * T targets).
    """
    k = cfg.optimizer.grad_accum_steps

    def grads_of(mb):
        def loss_fn(p):
            out = forward_loss(graphdef, p, cfg, eos_id, mb)
            return out["loss_with_z"], out

        (_, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return grads, out

    if k == 1:
        grads, out = grads_of(batch)
    else:
        b, t1 = batch.shape
        # Micro-batch j is rows j, j + k, j + 2k, ...: each device keeps its own rows (no resharding).
        micro = batch.reshape(b // k, k, t1).swapaxes(0, 1)                       # (k, B / k, T + 1)

        def accumulate(total, mb):
            g, o = grads_of(mb)
            return jax.tree.map(jnp.add, total, g), o

        total, outs = jax.lax.scan(accumulate, jax.tree.map(jnp.zeros_like, params), micro)
        grads = jax.tree.map(lambda g: g / k, total)
        out = jax.tree.map(lambda x: x.mean(0), outs)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    finite = jnp.isfinite(out["loss"])
    if cfg.nan_policy == "skip":   # keep the old state when the loss is not finite
        new_params = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_params, params)
        new_opt_state = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_opt_state, opt_state)
    out = dict(out, grad_norm=optax.tree.norm(grads), param_norm=optax.tree.norm(new_params))
    return new_params, new_opt_state, out


def forward_loss(graphdef, params, cfg, eos_id, batch) -> dict:
    """Mean next-token loss (+ z-loss) and accuracy over the batch. batch: (B, T + 1)."""
    net = nnx.merge(graphdef, params)
    inputs, targets = batch[:, :-1], batch[:, 1:]                            # (B, T)
    segment_ids = data.segment_ids(inputs, eos_id)
    hidden, _ = net(inputs, segment_ids=segment_ids)                         # (B, T, D)
    b, t, d = hidden.shape
    out = loss.cross_entropy(hidden.reshape(b * t, d), net.unembed(), targets.reshape(-1),
                             jnp.ones((b * t,), jnp.float32), chunk_size=cfg.loss_chunk, z_loss=cfg.z_loss)
    count = jnp.maximum(out["count"], 1.0)
    return {"loss": out["loss_sum"] / count, "z_loss": out["z_loss_sum"] / count,
            "loss_with_z": (out["loss_sum"] + out["z_loss_sum"]) / count, "accuracy": out["correct"] / count}


def eval_step(graphdef, cfg, eos_id, params, batch):
    return forward_loss(graphdef, params, cfg, eos_id, batch)["loss"]


def evaluate(eval_fn, params, batches, mesh) -> float:
    losses = [float(eval_fn(params, sharding.global_batch(b, mesh))) for b in batches]
    return float(np.mean(losses)) if losses else float("nan")


def _state(params, opt_state, step: int, mesh) -> dict:
    """What a checkpoint holds. The step is a scalar replicated over the mesh: a global array, which Orbax
    can save from many hosts (a host-local scalar it refuses in a multi-process job)."""
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return {"params": params, "opt_state": opt_state, "step": jax.device_put(np.int32(step), replicated)}


def _publish(local_out: str, out_dir: str, summary: dict) -> None:
    """summary.json next to the metrics; when out_dir is remote, copy the local files up."""
    with open(os.path.join(local_out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
    if local_out == out_dir:
        return
    for root, _, files in os.walk(local_out):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), local_out)
            storage.upload(os.path.join(root, name), storage.join(out_dir, *rel.split(os.sep)))
