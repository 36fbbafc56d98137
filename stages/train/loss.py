"""Memory-efficient next-token cross entropy: logits are computed a chunk of tokens at a time.

    out = loss.cross_entropy(hidden.reshape(-1, D), net.unembed(), targets.reshape(-1), mask.reshape(-1),
                             chunk_size=4096, z_loss=1e-4)
    count = jnp.maximum(out["count"], 1.0)
    mean_loss = (out["loss_sum"] + out["z_loss_sum"]) / count      # what to differentiate
    accuracy = out["correct"] / count

The full (N, V) logits of a large vocabulary dominate a small model's activation memory (N=8192 tokens
x V=32768 is 1 GiB in float32, twice that with its gradient). Here a `jax.custom_vjp` loops over chunks
of `chunk_size` tokens in the forward pass and again in the backward pass, recomputing each chunk's
logits and softmax instead of saving them, so peak memory is O(chunk_size * V) and the only residuals
are the inputs and one logsumexp per token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def cross_entropy(hidden, unembed, targets, mask, *, chunk_size: int = 4096, z_loss: float = 0.0) -> dict:
    """Summed (not averaged) cross entropy of `targets` under logits = hidden @ unembed.

    hidden (N, D) in the compute dtype (bfloat16, float32, ...); unembed (D, V), usually float32 params,
    cast to hidden's dtype for the matmul (logits and softmax are float32); targets (N,) int; mask (N,)
    bool or float weights (0 for padding or ignored positions). `z_loss` adds z_loss * logsumexp^2 per
    token (PaLM), which keeps the softmax normalizer near 1.

    Returns float32 scalars: loss_sum = sum(mask * (logsumexp - target logit)), z_loss_sum =
    sum(mask * z_loss * logsumexp^2), correct = sum(mask * (argmax == target)), count = sum(mask).
    Gradients flow to hidden and unembed through loss_sum and z_loss_sum; N need not divide chunk_size.
    """
    if hidden.ndim != 2 or unembed.ndim != 2 or hidden.shape[1] != unembed.shape[0]:
        raise ValueError(f"cross_entropy: hidden {hidden.shape} and unembed {unembed.shape} must be (N, D) "
                         "and (D, V) with the same D")
    if targets.shape != hidden.shape[:1] or mask.shape != hidden.shape[:1]:
        raise ValueError(f"cross_entropy: targets {targets.shape} and mask {mask.shape} must both be "
                         f"(N,) = {hidden.shape[:1]}")
    if chunk_size < 1:
        raise ValueError(f"cross_entropy: chunk_size={chunk_size} must be >= 1")
    if z_loss < 0:
        raise ValueError(f"cross_entropy: z_loss={z_loss} must be >= 0")
    n = hidden.shape[0]
    chunk = min(chunk_size, max(n, 1))
    pad = -n % chunk                          # padded tokens get mask 0, so they add nothing
    weights = mask.astype(jnp.float32)
    if pad:
        hidden = jnp.pad(hidden, ((0, pad), (0, 0)))
        targets = jnp.pad(targets, (0, pad))
        weights = jnp.pad(weights, (0, pad))
    c = (n + pad) // chunk
    targets = targets.astype(jnp.int32).reshape(c, chunk)
    loss_sum, z_sum, correct = _chunked(float(z_loss), hidden.reshape(c, chunk, -1), unembed, targets,
                                        weights.reshape(c, chunk))
    return {"loss_sum": loss_sum, "z_loss_sum": z_sum, "correct": correct, "count": jnp.sum(weights)}


def _chunk_logits(h, w):
    """h (C, D), w (D, V), both in the compute dtype -> (C, V) float32 logits."""
    return jnp.einsum("cd,dv->cv", h, w, preferred_element_type=jnp.float32)


def _forward(z_loss, hidden, unembed, targets, weights):
    """hidden (K, C, D), targets/weights (K, C): K chunks of C tokens. Returns the sums and (K, C) lse."""
    w = unembed.astype(hidden.dtype)                                            # (D, V)

    def body(carry, xs):
        h, t, m = xs                                                            # (C, D), (C,), (C,)
        logits = _chunk_logits(h, w)                                            # (C, V) float32
        lse = jax.nn.logsumexp(logits, axis=-1)                                 # (C,)
        target_logit = jnp.take_along_axis(logits, t[:, None], axis=-1)[:, 0]   # (C,)
        hit = (jnp.argmax(logits, axis=-1) == t).astype(jnp.float32)
        loss_sum, z_sum, correct = carry
        carry = (loss_sum + jnp.sum(m * (lse - target_logit)), z_sum + z_loss * jnp.sum(m * lse * lse),
                 correct + jnp.sum(m * hit))
        return carry, lse

    zero = jnp.zeros((), jnp.float32)
    sums, lse = jax.lax.scan(body, (zero, zero, zero), (hidden, targets, weights))
    return sums, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked(z_loss, hidden, unembed, targets, weights):
    return _forward(z_loss, hidden, unembed, targets, weights)[0]


def _chunked_fwd(z_loss, hidden, unembed, targets, weights):
    sums, lse = _forward(z_loss, hidden, unembed, targets, weights)
    return sums, (hidden, unembed, targets, weights, lse)


def _chunked_bwd(z_loss, residuals, cotangents):
    hidden, unembed, targets, weights, lse = residuals
    g_loss, g_z, _ = cotangents                   # `correct` is a count: no gradient
    cdt = hidden.dtype
    w = unembed.astype(cdt)                                                     # (D, V)

    def body(d_unembed, xs):
        h, t, m, lse_c = xs                                                     # (C, D), (C,), (C,), (C,)
        probs = jnp.exp(_chunk_logits(h, w) - lse_c[:, None])                   # (C, V) softmax, recomputed
        onehot = jax.nn.one_hot(t, probs.shape[-1], dtype=jnp.float32)
        # d/dlogits of (lse - target) is softmax - onehot; of z * lse^2 it is 2 z lse softmax.
        coef = g_loss + g_z * 2.0 * z_loss * lse_c                              # (C,)
        d_logits = (m * coef)[:, None] * probs - (m * g_loss)[:, None] * onehot  # (C, V) float32
        d_logits = d_logits.astype(cdt)   # the matmul's own dtype, as autodiff of a cdt matmul would use
        d_h = jnp.einsum("cv,dv->cd", d_logits, w, preferred_element_type=jnp.float32)
        d_unembed = d_unembed + jnp.einsum("cd,cv->dv", h, d_logits, preferred_element_type=jnp.float32)
        return d_unembed, d_h.astype(hidden.dtype)

    d_unembed, d_hidden = jax.lax.scan(body, jnp.zeros(unembed.shape, jnp.float32),
                                       (hidden, targets, weights, lse))
    return d_hidden, d_unembed.astype(unembed.dtype), None, None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)
