"""One training step and the loss it differentiates: pure functions of arrays, which `loop.py` jits.

    from stages.train.step import forward_loss, train_step
    step = jax.jit(functools.partial(train_step, graphdef, tx, **loop.step_options(cfg, eos_id)))
    params, opt_state, outputs = step(params, opt_state, batch)         # batch: (B, T + 1) int32
    forward_loss(graphdef, params, batch, eos_id=2, loss_chunk=1024, z_loss=1e-4)["loss"]

    train_step          one optimizer step: the gradient (accumulated over micro-batches), the update, the
                        MoE router bias, a non-finite step skipped
    forward_loss        the mean next-token loss, z-loss, accuracy and the MoE balancing losses of a batch
    eval_step           the held-out loss of a batch
    moe_outputs         the MoE layers' statistics as step outputs (`loop.moe_row` averages them per row)
    update_router_bias  DeepSeek-V3's auxiliary-loss-free balancing, after the optimizer

Nothing here reads a `stages.train.Config`: `loop.step_options` turns one into these keyword arguments, and
`loop.jit_steps` binds them and the shardings (so evaluation's `measure.py` and the benchmarks call the same
functions with plain numbers).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from stages.train import data, loss, moe, pytree


def train_step(graphdef, tx, params, opt_state, batch, *, eos_id: int, loss_chunk: int, z_loss: float,
               grad_accum_steps: int, skip_nonfinite: bool, bias_rate: float = 0.0, grad_shardings=None):
    """One optimizer step; a pure function of (params, opt_state, batch). batch: (B, T + 1) int32.

    With grad_accum_steps = k the batch is k micro-batches of B / k rows, run one after another under
    `lax.scan` (the activation memory of one micro-batch); their mean gradient makes one update, the one a
    single big batch would make (every micro-batch has B / k * T targets). With skip_nonfinite a step whose
    loss is not finite keeps the old params and optimizer state. `grad_shardings` (the parameters'
    shardings) keeps each gradient split like its parameter: FSDP reduce-scatters gradients instead of
    holding whole ones on every device. A mixture of experts' router bias then moves by `bias_rate` towards
    equal load over the whole step's tokens (`update_router_bias`).
    """
    k = grad_accum_steps

    def grads_of(mb):
        def loss_fn(p):
            out = forward_loss(graphdef, p, mb, eos_id=eos_id, loss_chunk=loss_chunk, z_loss=z_loss)
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
    if grad_shardings is not None:
        grads = jax.lax.with_sharding_constraint(grads, grad_shardings)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    if "moe/load" in out:
        new_params = update_router_bias(params, new_params, out["moe/load"], bias_rate)
    if skip_nonfinite:
        finite = jnp.isfinite(out["loss"])
        new_params = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_params, params)
        new_opt_state = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_opt_state, opt_state)
    out = dict(out, grad_norm=optax.tree.norm(grads), param_norm=optax.tree.norm(new_params))
    return new_params, new_opt_state, out


def forward_loss(graphdef, params, batch, *, eos_id: int, loss_chunk: int, z_loss: float) -> dict:
    """Mean next-token loss (+ z-loss) and accuracy over the batch. batch: (B, T + 1).

    Documents packed into a row are separated by `eos_id` and never attend to each other; the logits are
    computed `loss_chunk` tokens at a time (`loss.cross_entropy`).
    A mixture of experts adds its balancing losses to "loss_with_z" (what is differentiated), weighted by
    ModelConfig.moe_aux_loss and moe_router_z_loss and averaged over the MoE layers (the sequence-wise
    balancing loss, moe_aux_scope "sequence", summed over them), and returns its
    statistics under "moe/..." (`moe_outputs`).
    """
    net = nnx.merge(graphdef, params)
    inputs, targets = batch[:, :-1], batch[:, 1:]                            # (B, T)
    segment_ids = data.segment_ids(inputs, eos_id)
    hidden, _, stats = net(inputs, segment_ids=segment_ids, with_moe_stats=True)   # (B, T, D)
    b, t, d = hidden.shape
    out = loss.cross_entropy(hidden.reshape(b * t, d), net.unembed(), targets.reshape(-1),
                             jnp.ones((b * t,), jnp.float32), chunk_size=loss_chunk, z_loss=z_loss)
    count = jnp.maximum(out["count"], 1.0)
    result = {"loss": out["loss_sum"] / count, "z_loss": out["z_loss_sum"] / count,
              "loss_with_z": (out["loss_sum"] + out["z_loss_sum"]) / count,
              "accuracy": out["correct"] / count}
    if stats:
        cfg = net.config
        # DeepSeek-V3's sequence-wise loss weighs each layer's by alpha (a sum over layers); the batch-wise
        # one, as it always has, their mean.
        aux = stats["aux"].sum() if cfg.moe_aux_scope == "sequence" else stats["aux"].mean()
        balance = cfg.moe_aux_loss * aux + cfg.moe_router_z_loss * stats["z"].mean()
        result = dict(result, loss_with_z=result["loss_with_z"] + balance, **moe_outputs(stats))
    return result


def moe_outputs(stats: dict) -> dict:
    """The MoE layers' statistics as step outputs: moe/load (L_moe, E), moe/aux_loss, moe/router_z_loss,
    moe/dropped (means over the layers), moe/dropped_worst_sequence (the worst layer's worst sequence)."""
    return {"moe/load": stats["load"], "moe/aux_loss": stats["aux"].mean(),
            "moe/router_z_loss": stats["z"].mean(), "moe/dropped": stats["dropped"].mean(),
            "moe/dropped_worst_sequence": stats["dropped_worst"].max()}


ROUTER_BIAS = ("moe_layers", "router_bias")      # the path of the MoE layers' stacked (L_moe, E) bias


def update_router_bias(old_params, new_params, load, rate: float):
    """DeepSeek-V3's auxiliary-loss-free balancing: each MoE layer's router_bias becomes its value before
    the step moved by `rate` (ModelConfig.moe_bias_update_rate) towards equal load (moe.bias_update);
    load (L_moe, E). What the optimizer made of the bias (its gradient is 0, but weight decay or momentum
    could move it) is discarded, so the bias is exactly the sum of these steps (and with rate 0 stays)."""
    def one(path, old, new):
        if tuple(pytree.names(path)[:2]) != ROUTER_BIAS:
            return new
        return moe.bias_update(old, load, rate) if rate else old

    return jax.tree_util.tree_map_with_path(one, old_params, new_params)


def eval_step(graphdef, params, batch, **options):
    """A batch's mean next-token loss (`forward_loss`'s "loss"); the in-loop held-out loss averages it."""
    return forward_loss(graphdef, params, batch, **options)["loss"]
