"""Blockwise (flash) attention vs. the xla reference: compiled scratch memory, wall time, error.

    .venv/bin/python -m benchmarks attention      # writes benchmarks/out/attention.json, prints the table

For T in `lengths` (causal self-attention, B=1, N=2 query heads sharing K=1 kv head, H=64), each
implementation is compiled twice: forward only, and forward+backward (grads of sum(out * w) w.r.t. q, k, v).
Reported per (T, impl, mode): `temp_mib`, XLA's compiled scratch (`memory_analysis().temp_size_in_bytes`);
`s`, the median wall time of `repeats` runs after a warm-up run (one run when the warm-up took over 5 s);
`err`, the max abs difference from xla (output for fwd, all three gradients for fwdbwd). A configuration
whose scratch exceeds `max_run_gib` is compiled but not run (its time and error are null). Ratios are
impl / xla. On CPU the inputs are float32; on a GPU they are bfloat16 and cuDNN joins the table.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from stages.train.attention import attention

MODES = ("fwd", "fwdbwd")


def measure(work_dir: str, lengths: tuple[int, ...] = (1024, 4096, 16384), batch: int = 1, heads: int = 2,
            kv_heads: int = 1, head_dim: int = 64, repeats: int = 3, max_run_gib: float = 8.0) -> dict:
    del work_dir                                              # nothing is written to disk
    backend = jax.default_backend()
    dtype = jnp.bfloat16 if backend == "gpu" else jnp.float32
    impls = ("xla", "blockwise", "cudnn") if backend == "gpu" else ("xla", "blockwise")
    result = {
        "benchmark": "attention",
        "backend": backend,
        "device": jax.devices()[0].device_kind,
        "dtype": jnp.dtype(dtype).name,
        "shape": f"B={batch} N={heads} K={kv_heads} H={head_dim}, causal, blocks 512x512",
        "repeats": repeats,
    }
    for T in lengths:
        kq, kk, kv, kw = jax.random.split(jax.random.key(T), 4)
        q = jax.random.normal(kq, (batch, T, heads, head_dim), jnp.float32).astype(dtype)
        k = jax.random.normal(kk, (batch, T, kv_heads, head_dim), jnp.float32).astype(dtype)
        v = jax.random.normal(kv, (batch, T, kv_heads, head_dim), jnp.float32).astype(dtype)
        w = jax.random.normal(kw, q.shape, jnp.float32)
        reference = {}
        for impl in impls:
            for mode in MODES:
                key = f"T{T}_{impl}_{mode}"
                compiled = jax.jit(_function(impl, mode, w)).lower(q, k, v).compile()
                temp = compiled.memory_analysis().temp_size_in_bytes
                result[f"{key}_temp_mib"] = round(temp / 2**20, 2)
                result[f"{key}_s"] = result[f"{key}_err"] = None
                if temp > max_run_gib * 2**30:
                    continue
                outs, seconds = _time(compiled, (q, k, v), repeats)
                result[f"{key}_s"] = round(seconds, 4)
                if impl == "xla":
                    reference[mode] = outs
                elif mode in reference:
                    result[f"{key}_err"] = _max_abs_diff(outs, reference[mode])
                del outs
        for impl in impls[1:]:
            for mode in MODES:
                ours, xla = f"T{T}_{impl}_{mode}", f"T{T}_xla_{mode}"
                result[f"{ours}_temp_ratio"] = round(result[f"{ours}_temp_mib"] /
                                                     max(result[f"{xla}_temp_mib"], 1e-9), 5)
                if result[f"{ours}_s"] is not None and result[f"{xla}_s"] is not None:
                    result[f"{ours}_time_ratio"] = round(result[f"{ours}_s"] / result[f"{xla}_s"], 4)
    return result


def _function(impl: str, mode: str, w):
    def forward(q, k, v):
        return attention(q, k, v, causal=True, impl=impl)

    def grads(q, k, v):
        return jax.grad(lambda q, k, v: jnp.sum(forward(q, k, v).astype(jnp.float32) * w), (0, 1, 2))(q, k, v)

    return forward if mode == "fwd" else grads


def _time(compiled, args, repeats: int, slow_s: float = 5.0):
    """(outputs, median seconds of `repeats` runs after one warm-up run; one run when the warm-up is slow)."""
    start = time.perf_counter()
    outs = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats if time.perf_counter() - start < slow_s else 1):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return outs, statistics.median(times)


def _max_abs_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


if __name__ == "__main__":
    import sys

    from benchmarks.__main__ import main  # writes the JSON and prints the table

    sys.exit(main(["attention"]))
