"""The MoE layer's forward+backward tokens/s per expert computation, against a dense all-experts baseline.

    .venv/bin/python -m benchmarks moe_layer      # writes benchmarks/out/moe_layer.json, prints the table

When a GPU is lent: `.venv/bin/python -m benchmarks moe_layer` on it, unchanged (`auto` picks ragged_dot
there, and the inputs become bfloat16 and the batch larger).

For each (E experts, top-k) in `shapes`: one MoE layer (`stages.train.moe.moe_ffn`, softmax router, D =
`d_model`, each expert a SwiGLU of width `expert_dim`) on `tokens` tokens, jitted as the gradient of
sum(y * r) (r a fixed random (B, T, D)) w.r.t. h and all the layer's weights. Timed per path:

    dense      the baseline: every token through every expert (einsums over all E), the hidden activations
               weighted by the router's top-k weights (0 for the other experts) before the down projection;
               written here, sharing only `moe.route` with the layer so both pick the same experts
    tiled      dropless, the tiled scan grouped matmul (what `auto` picks on CPU)
    ragged     dropless, `jax.lax.ragged_dot` (what `auto` picks on GPU; on CPU it lowers to a dense masked
               product over every expert, so it costs about what `dense` costs)
    capacity   moe_capacity_factor `capacity_factor`: (E, C, D) buffers, einsums over them, overflow dropped

`<E>x<k>_<path>_s` is the median of `repeats` runs after one warm-up run (compile excluded),
`_tokens_per_s` tokens / s, `_ratio` tokens/s over dense's in the same run (> 1: faster than dense),
`_temp_mib` XLA's compiled scratch (`memory_analysis().temp_size_in_bytes`). A path whose scratch exceeds
`max_run_gib` (default 4 on CPU, 40 on an accelerator) is compiled but not run (its time, ratio and error
are null; dense always runs): on CPU that is ragged_dot at 64 experts (about 20 GiB, the (rows, E, F)
products of its dense lowering).
Correctness is checked once per shape, on the warm-up run's outputs: both dropless paths' y and gradients
must match dense's within `tol` (relative to the largest reference value; `_err` is the figure), else the
benchmark fails, so a fast but wrong path cannot look good. Capacity drops assignments by design, so its
`_err` is reported, with `_dropped` (the share of assignments dropped), but not asserted.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from stages.train import moe
from stages.train.model_config import ModelConfig

PATHS = ("dense", "tiled", "ragged", "capacity")


def measure(work_dir: str, shapes: tuple[tuple[int, int], ...] = ((8, 2), (64, 8)), tokens: int = 0,
            d_model: int = 512, expert_dim: int = 256, capacity_factor: float = 1.25,
            repeats: int = 3, max_run_gib: float = 0.0) -> dict:
    del work_dir                                              # nothing is written to disk
    backend = jax.default_backend()
    accelerator = backend != "cpu"
    dtype = "bfloat16" if accelerator else "float32"
    tokens = tokens or (32768 if accelerator else 4096)
    tol = 5e-2 if accelerator else 1e-4                      # bfloat16's 8e-3 ulp; a wrong path is off by ~1
    max_run_gib = max_run_gib or (40.0 if accelerator else 4.0)
    batch = 4
    seq = tokens // batch
    result = {
        "benchmark": "moe_layer",
        "backend": backend,
        "device": jax.devices()[0].device_kind,
        "dtype": dtype,
        "shape": f"tokens={batch * seq} (B={batch} T={seq}) D={d_model} F={expert_dim}, softmax top-k router",
        "auto_impl": moe.resolve_impl("auto"),
        "capacity_factor": capacity_factor,
        "repeats": repeats,
        "tolerance": tol,
    }
    for E, k in shapes:
        base = ModelConfig(d_model=d_model, n_experts=E, n_experts_per_token=k, moe_mlp_dim=expert_dim,
                           dtype=dtype)
        configs = {"dense": base, "tiled": dataclasses.replace(base, moe_impl="tiled"),
                   "ragged": dataclasses.replace(base, moe_impl="ragged_dot"),
                   "capacity": dataclasses.replace(base, moe_capacity_factor=capacity_factor)}
        h, weights, r = _inputs(E, batch, seq, d_model, expert_dim, dtype)
        name = f"{E}x{k}"
        reference = None                                      # dense's (y, grads), from its warm-up run
        for path, cfg in configs.items():
            ffn = _dense_ffn if path == "dense" else _moe_ffn
            compiled = jax.jit(_grads(ffn, cfg, r)).lower(h, weights).compile()
            temp = compiled.memory_analysis().temp_size_in_bytes
            result[f"{name}_{path}_temp_mib"] = round(temp / 2**20, 1)
            if temp > max_run_gib * 2**30 and path != "dense":    # ragged_dot on CPU at 64 experts
                result[f"{name}_{path}_s"] = result[f"{name}_{path}_tokens_per_s"] = None
                result[f"{name}_{path}_err"] = None
                continue
            seconds, outs = _time(compiled, (h, weights), repeats)
            result[f"{name}_{path}_s"] = round(seconds, 4)
            result[f"{name}_{path}_tokens_per_s"] = round(batch * seq / seconds, 1)
            reference = outs if path == "dense" else reference
            result[f"{name}_{path}_err"] = _rel_err(outs[:2], reference[:2])
            if path in ("tiled", "ragged"):
                _check(name, path, result[f"{name}_{path}_err"], tol)
            if path == "capacity":
                result[f"{name}_capacity_dropped"] = round(float(outs[2]), 4)
        for path in PATHS:
            seconds = result[f"{name}_{path}_s"]
            result[f"{name}_{path}_ratio"] = seconds and round(result[f"{name}_dense_s"] / seconds, 3)
    return result


def _inputs(E: int, batch: int, seq: int, D: int, F: int, dtype: str):
    """h (B, T, D) in the compute dtype, float32 weights at a trained-like scale, r (B, T, D) float32."""
    keys = jax.random.split(jax.random.key(E), 6)
    h = jax.random.normal(keys[0], (batch, seq, D), jnp.float32).astype(dtype)
    weights = moe.ExpertWeights(
        router=jax.random.normal(keys[1], (D, E), jnp.float32) * D ** -0.5,
        bias=jnp.zeros((E,), jnp.float32),
        gate=jax.random.normal(keys[2], (E, D, F), jnp.float32) * D ** -0.5,
        up=jax.random.normal(keys[3], (E, D, F), jnp.float32) * D ** -0.5,
        down=jax.random.normal(keys[4], (E, F, D), jnp.float32) * F ** -0.5)
    r = jax.random.normal(keys[5], (batch, seq, D), jnp.float32)
    return h, weights, r


def _moe_ffn(cfg: ModelConfig, h, w: moe.ExpertWeights):
    """-> (y (B, T, D), the share of assignments dropped)."""
    y, stats = moe.moe_ffn(cfg, h, w)
    return y, stats["dropped"]


def _dense_ffn(cfg: ModelConfig, h, w: moe.ExpertWeights):
    """The baseline: all E experts on every token, the hidden activations weighted by the router's top-k
    weights (zero for unchosen experts), then one down-projection einsum summing over experts."""
    B, T, D = h.shape
    x = h.reshape(B * T, D)
    routing = moe.route(cfg, x, w.router, w.bias)
    n = x.shape[0]
    combine = jnp.zeros((n, cfg.n_experts), jnp.float32).at[jnp.arange(n)[:, None], routing.experts].set(
        routing.weights)                                                                  # (N, E)
    gate, up, down = (a.astype(h.dtype) for a in (w.gate, w.up, w.down))
    g = jnp.einsum("nd,edf->nef", x, gate)                                                # (N, E, F)
    u = jnp.einsum("nd,edf->nef", x, up)
    hidden = (jax.nn.silu(g) * u).astype(jnp.float32) * combine[:, :, None]
    y = jnp.einsum("nef,efd->nd", hidden.astype(h.dtype), down)                           # (N, D)
    return y.reshape(B, T, D), jnp.float32(0.0)


def _grads(ffn, cfg: ModelConfig, r):
    """(h, weights) -> (y, (dL/dh, dL/dweights), dropped) for L = sum(y * r)."""
    def loss(h, w):
        y, dropped = ffn(cfg, h, w)
        return jnp.sum(y.astype(jnp.float32) * r), (y, dropped)

    def run(h, w):
        (_, (y, dropped)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(h, w)
        return y, grads, dropped

    return run


def _time(compiled, args, repeats: int):
    """(median seconds of `repeats` runs after one warm-up run, the warm-up's outputs)."""
    outs = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), outs


def _rel_err(a, b) -> float:
    """max |a - b| over every leaf, each relative to its reference leaf's largest |value|."""
    errs = []
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
        errs.append(float(np.max(np.abs(x - y))) / max(float(np.max(np.abs(y))), 1e-30))
    return float(f"{max(errs):.3g}")


def _check(name: str, path: str, err: float, tol: float) -> None:
    if not err <= tol:
        raise AssertionError(f"moe_layer {name}: the dropless {path!r} path's output or gradients differ "
                             f"from the dense baseline's by {err:.3g} (relative), more than tol={tol:g}")


if __name__ == "__main__":
    import sys

    from benchmarks.__main__ import main  # writes the JSON and prints the table

    sys.exit(main(["moe_layer"]))
