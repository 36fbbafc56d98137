"""The optimizer: learning-rate schedule, weight-decay mask, global-norm clipping and gradient accumulation.

    cfg = OptimizerConfig(name="adamw", learning_rate=3e-4, total_steps=1000)     # optimizer_config.py
    tx = optimizer.make_optimizer(cfg, params)       # params: nnx.State, its to_pure_dict(), or a dict
    opt_state = tx.init(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    lr = optimizer.schedule(cfg)(step)               # for logging

Steps: the schedule counts optimizer updates. Gradient accumulation (grad_accum_steps = k) happens in the
training step (`stages.train.step.train_step`), which averages k micro-batch gradients before the one
`update` call; the transformation here sees whole-batch gradients, so clipping bounds their mean.

Weight decay is decoupled (multiplied by the scheduled learning rate, as in AdamW) and skipped for norms,
biases and scalars, chosen by parameter path name (see `decay_mask`), because scan-stacked norm scales are
2-D (L, D) and an ndim rule would decay them.

`OptimizerConfig` (the name, schedule and hyperparameters; gin binds it) lives in `optimizer_config.py`,
JAX-free.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

from stages.train import pytree
from stages.train.model_config import LAYER_STACKS
from stages.train.optimizer_config import OptimizerConfig

log = logging.getLogger(__name__)

# A parameter whose path has one of these in a key (case-insensitive) gets no weight decay.
NO_DECAY_KEYS = ("norm", "scale", "bias")
# Muon orthogonalizes hidden matrices only; these (and every non-matrix) use its AdamW fallback.
ADAM_KEYS = ("embed",) + NO_DECAY_KEYS
# Muon's update RMS is rescaled to 0.2 * sqrt(max(fan_in, fan_out)) (Liu et al. 2025), which matches
# AdamW's typical update RMS, so one `learning_rate` serves both the muon and the AdamW-fallback params.
MUON_CONSISTENT_RMS = 0.2
MUON_BETA = 0.95   # muon's momentum (Jordan et al.); b1 and b2 configure the AdamW fallback


def schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """The learning rate as a function of the optimizer step (a jnp scalar in, a float32 scalar out)."""
    if cfg.total_steps < 1:
        raise ValueError("OptimizerConfig.total_steps is 0 (unset): the schedule needs the run length; "
                         "the training stage sets it from train.Config.steps")
    peak, end = cfg.learning_rate, cfg.learning_rate * cfg.min_lr_ratio
    warmup, total = cfg.warmup_steps, cfg.total_steps
    if cfg.schedule == "wsd":
        decay_steps = cfg.wsd_decay_steps
        decay_start = total - decay_steps
    else:
        decay_start, decay_steps = warmup, total - warmup

    def lr(step):
        s = jnp.asarray(step, jnp.float32)
        warm = peak * s / max(warmup, 1)
        p = jnp.clip((s - decay_start) / max(decay_steps, 1), 0.0, 1.0)        # decay progress, 0 -> 1
        if cfg.schedule == "cosine":
            after = end + (peak - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * p))
        elif cfg.schedule in ("linear", "wsd"):
            after = peak + (end - peak) * p
        else:
            after = jnp.full_like(s, peak)
        return jnp.where(s < warmup, warm, after).astype(jnp.float32)

    return lr


def decay_mask(params):
    """A pytree like `params` (same structure; bool leaves): True where weight decay applies.

    params: a nested dict of arrays, `nnx.State.to_pure_dict()`, or an `nnx.State` (its Variables then
    hold bools). No decay where a path key contains "norm", "scale" or "bias", or for scalars; embeddings
    and kernels decay. Decided by name, not ndim: scan-stacked norm scales are (L, D)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: _ndim(x) > 0 and not any(k in name for name in _keys(path) for k in NO_DECAY_KEYS),
        params)


def muon_dimension_numbers(params):
    """Which parameters muon orthogonalizes, and how: a pytree like `params` of `MuonDimensionNumbers`
    (muon) or None (AdamW fallback).

    Embeddings (the unembedding too), norms, biases and anything with fewer than two matrix axes use
    AdamW. Under a "layers" (or "moe_layers") key the leading (L,) scan axis is a batch axis, and so is a
    MoE layer's experts axis after it: optax vmaps the Newton-Schulz iteration over them, so each layer's
    (and each expert's) matrix is orthogonalized on its own. Of the remaining axes, an
    output projection (key starting with "wo" or containing "out", e.g. (N, H, D)) reduces over all but
    the last axis; other kernels ((D, F), (D, N, H)) reduce over the first axis and output the rest."""
    def dims(path, x):
        names = _keys(path)
        # Stacked layers' leading axis, and a MoE layer's experts axis after it, are batch axes.
        batch = int(any(stack in names for stack in LAYER_STACKS))
        batch += any(name.startswith("experts_") for name in names)
        k = _ndim(x) - batch
        if k < 2 or any(key in name for name in names for key in ADAM_KEYS):
            return None
        leaf = names[-1] if names else ""
        if k > 2 and (leaf.startswith("wo") or "out" in leaf):
            reduction = tuple(range(batch, _ndim(x) - 1))
            output = (_ndim(x) - 1,)
        else:
            reduction = (batch,)
            output = tuple(range(batch + 1, _ndim(x)))
        return MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)

    return jax.tree_util.tree_map_with_path(dims, params)


def make_optimizer(cfg: OptimizerConfig, params) -> optax.GradientTransformation:
    """Global-norm clipping, then `cfg.name` with the schedule and decoupled, masked weight decay (one update
    per optimizer step; accumulation is the training step's job). `params` (any of the forms `decay_mask`
    takes) is only inspected: the masks are callables, evaluated on whatever tree init/update receive."""
    mask = decay_mask(params)
    leaves = jax.tree.leaves(mask)
    if not leaves:
        raise ValueError("make_optimizer: params has no array leaves; pass the model's parameters "
                         "(e.g. nnx.state(model, nnx.Param))")
    lr = schedule(cfg)
    if cfg.name == "adamw":
        tx = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                         mask=decay_mask)
    elif cfg.name == "lion":
        tx = optax.lion(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask)
    elif cfg.name == "adafactor":
        # multiply_by_parameter_scale=False: learning_rate is an absolute step size, as for the others.
        tx = optax.adafactor(lr, multiply_by_parameter_scale=False, weight_decay_rate=cfg.weight_decay,
                             weight_decay_mask=decay_mask)
    else:
        tx = _muon(cfg, lr)
        is_dims = lambda d: d is None or isinstance(d, MuonDimensionNumbers)             # noqa: E731
        n_muon = sum(d is not None for d in jax.tree.leaves(muon_dimension_numbers(params), is_leaf=is_dims))
        log.info("muon: %d of %d parameter arrays orthogonalized, the rest use AdamW", n_muon, len(leaves))
    log.info("optimizer %s: weight decay on %d of %d parameter arrays", cfg.name, sum(leaves), len(leaves))
    if cfg.clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
    return tx


def _muon(cfg: OptimizerConfig, lr: optax.Schedule) -> optax.GradientTransformation:
    """optax.contrib.muon for the direction, then one masked decoupled weight decay and the schedule for
    every parameter. muon's own decay options cannot express our mask: `adam_weight_decay` would decay
    the norms it falls back on, so both of its decays are 0 and its learning rates -1 (a unit step with
    the descent sign undone), and the decay and the scheduled rate follow, as in optax.adamw."""
    direction = optax.contrib.muon(
        learning_rate=-1.0, adam_learning_rate=-1.0, beta=MUON_BETA, eps=cfg.eps, weight_decay=0.0,
        adam_b1=cfg.b1, adam_b2=cfg.b2, adam_weight_decay=0.0,
        muon_weight_dimension_numbers=muon_dimension_numbers, consistent_rms=MUON_CONSISTENT_RMS)
    return optax.chain(direction, optax.add_decayed_weights(cfg.weight_decay, decay_mask),
                       optax.scale_by_learning_rate(lr))


def _keys(path) -> list[str]:
    """Lower-cased names along a pytree path, without the `.value` that nnx Variables add."""
    return [pytree.entry_name(e).lower() for e in path
            if not (isinstance(e, jax.tree_util.GetAttrKey) and e.name == "value")]


def _ndim(x) -> int:
    return len(getattr(x, "shape", ()))
