"""The training sampler's window order at 2T and 15T tokens, memory and time per batch: the permutation
drawn whole per epoch (train VERSION 4 and before) against the stateless Feistel order (window_order.py).

    .venv/bin/python -m benchmarks window_order             # writes benchmarks/out/window_order.json
    .venv/bin/python -m benchmarks.window_order --old-15t   # the old order at 15T too (needs ~23 GB free)

Simulated shard manifests, no data: a source is its token count alone, cut into M = (tokens - 1) // 8,192
windows (the flagship's sequence; its global batch of 1,024 rows), with no shard behind it. Only the order is
computed; no token is read. 2T tokens is M = 244,140,624 windows, 15T is 1,831,054,687.
- layouts: `single`, one source (TokenData: example g of the run is window `order.windows(g)`); `mixture`,
  three sources, web 60%, code 30%, math 10% of the tokens, weighted by their tokens (so all three end
  their first epoch at about the same step), read by the real `data.MixedTokenData.windows(step)` over the
  simulated sources (the mixture's rows of the step, then each source's windows).
- orders: `new`, `window_order.WindowOrder`; `old`, data.py's order until train VERSION 5, restated here
  (`Materialised`): `np.random.default_rng([*key, epoch]).permutation(np.arange(M))` in int32, the two newest
  epochs of a source kept.

Each (order, tokens, layout) runs in a child process of its own, on a clean heap. Memory: the peak resident
memory (VmHWM, reset after set-up) less the resident memory before the first batch, over the first batch and
over the batches that cross the first epoch's end; and what is still held after them. Time: the first batch,
the median of 200 batches at random steps inside the first epoch, the epoch-crossing batch (its slowest,
in a mixture), and `epoch_batch_ms`, the median batch plus the epoch end spread over the epoch's batches.
tracemalloc's peak and held bytes (`traced_*`) count the sampler's own allocations, numpy's arrays included,
where resident memory also counts the interpreter's first use of code and caches (about 1 MB).
Ratios new / old come from the same run, at 2T. The old order at 15T holds two 7.3 GB epochs and shuffles a
third 7.3 GB array at the epoch's end (~22 GB, more than the CI machine kind's 23.5 GB leave free): it runs
only with --old-15t, and the JSON gives its arithmetic (`old_15t_arithmetic`) instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ_LEN, GLOBAL_BATCH, SEED = 8192, 1024, 0
TOKENS = {"2T": 2 * 10**12, "15T": 15 * 10**12}
SHARES = {"web": 0.6, "code": 0.3, "math": 0.1}       # of the tokens, and the mixture's weights
STEADY_BATCHES = 200


def measure(work_dir: str, old_15t: bool = False) -> dict:
    del work_dir
    cases = [(order, tokens, layout) for tokens in TOKENS for layout in ("single", "mixture")
             for order in ("old", "new") if order == "new" or tokens == "2T" or old_15t]
    rows = []
    for order, tokens, layout in cases:
        row = _child(order, tokens, layout)
        rows.append(row)
        print(f"window_order: {order} {tokens} {layout}: first batch {row['first_batch_s']:.3g} s, "
              f"{row['batch_ms']:.3g} ms a batch, epoch end {row['epoch_end_s']:.3g} s, peak "
              f"{row['peak_mb']:,.1f} MB, held {row['held_mb']:,.1f} MB", flush=True)
    by = {(r["order"], r["tokens"], r["layout"]): r for r in rows}
    ratios = {}
    for tokens in TOKENS:
        for layout in ("single", "mixture"):
            old, new = by.get(("old", tokens, layout)), by[("new", tokens, layout)]
            if old:
                ratios[f"{tokens}_{layout}"] = {
                    "peak_mb_new_over_old": new["peak_mb"] / old["peak_mb"],
                    "held_mb_new_over_old": new["held_mb"] / old["held_mb"],
                    "traced_peak_new_over_old": new["traced_peak_mb"] / old["traced_peak_mb"],
                    "batch_ms_new_over_old": new["batch_ms"] / old["batch_ms"],
                    "epoch_batch_ms_new_over_old": new["epoch_batch_ms"] / old["epoch_batch_ms"],
                    "first_batch_new_over_old": new["first_batch_s"] / old["first_batch_s"],
                    "epoch_end_new_over_old": new["epoch_end_s"] / old["epoch_end_s"]}
    windows_15t = _num_windows(TOKENS["15T"])
    return {"benchmark": "window_order", "seq_len": SEQ_LEN, "global_batch": GLOBAL_BATCH,
            "windows": {t: _num_windows(n) for t, n in TOKENS.items()}, "rows": rows, "ratios": ratios,
            "old_15t_run": old_15t,
            "old_15t_arithmetic": {"epoch_gb": 4 * windows_15t / 1e9,             # int32 a window
                                   "held_two_epochs_gb": 8 * windows_15t / 1e9,
                                   "epoch_end_peak_gb": 12 * windows_15t / 1e9},     # + the shuffled copy
            "memory_total_gb": round(_meminfo("MemTotal") / 2**20, 1), "cpu": _cpu_model()}


def _child(order: str, tokens: str, layout: str) -> dict:
    argv = [sys.executable, "-m", "benchmarks.window_order", "--case", order, tokens, layout]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"window_order: case {order} {tokens} {layout} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_case(order: str, tokens: str, layout: str) -> dict:
    """One case in this process: builds the sampler, times its batches and measures its memory; then builds
    it again under tracemalloc for the bytes it allocates itself (numpy's arrays are traced)."""
    batch, ends = _sampler(order, tokens, layout)
    steady = np.random.default_rng(1).integers(1, min(ends), STEADY_BATCHES)
    _reset_peak()
    base = _status("VmRSS")
    start = time.perf_counter()
    batch(0)
    first_s = time.perf_counter() - start
    peak_first, held_first = _status("VmHWM") - base, _status("VmRSS") - base
    times = []
    for step in steady:
        start = time.perf_counter()
        batch(int(step))
        times.append(time.perf_counter() - start)
    _reset_peak()
    end_s = 0.0
    for step in ends:
        start = time.perf_counter()
        batch(step)
        end_s = max(end_s, time.perf_counter() - start)
    peak_end, held_end = _status("VmHWM") - base, _status("VmRSS") - base
    del batch
    gc.collect()

    tracemalloc.start()
    batch, ends = _sampler(order, tokens, layout)
    for step in [0, *ends]:
        batch(step)
    traced_held, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kb = 1024 / 1e6          # kB to MB
    return {"order": order, "tokens": tokens, "layout": layout, "epoch_end_steps": ends,
            "first_batch_s": first_s, "batch_ms": 1e3 * statistics.median(times), "epoch_end_s": end_s,
            # a batch's time over a whole epoch: the median batch, plus the epoch end's cost spread over the
            # epoch's batches (the old order draws the next permutation there)
            "epoch_batch_ms": 1e3 * (statistics.median(times) + end_s / ends[0]),
            "peak_mb": kb * max(peak_first, peak_end), "held_mb": kb * held_end,
            "first_batch_peak_mb": kb * peak_first, "first_batch_held_mb": kb * held_first,
            "epoch_end_peak_mb": kb * peak_end,
            "traced_peak_mb": traced_peak / 1e6, "traced_held_mb": traced_held / 1e6}


def _sampler(order: str, tokens: str, layout: str):
    """(batch(step) -> the step's windows, the steps whose batches cross a source's first epoch end)."""
    from stages.train import data
    from stages.train.mixture import Mixture
    from stages.train.window_order import WindowOrder

    total = TOKENS[tokens]
    if layout == "single":
        m = _num_windows(total)
        order_of = WindowOrder(m, key=(SEED,)) if order == "new" else Materialised(m, key=(SEED,))

        def batch(step):                    # TokenData.windows: the global batch's examples, their windows
            return order_of.windows(step * GLOBAL_BATCH + np.arange(GLOBAL_BATCH, dtype=np.int64))
        return batch, [m // GLOBAL_BATCH]   # the step whose batch holds example M, the first of epoch 1
    mix = Mixture(phases=((0, SHARES),), max_epochs=1e9)
    streams = {name: SimulatedSource(round(total * share)) for name, share in SHARES.items()}
    sampler = data.MixedTokenData(streams, mix, seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH, seed=SEED)
    if order == "old":
        sampler.orders = {name: Materialised(o.num_windows, o.key) for name, o in sampler.orders.items()}
    ends = sorted({_first_step_past(mix, name, m) for name, m in sampler.num_windows.items()})
    return sampler.windows, ends


class Materialised:
    """data.py's window order until train VERSION 5: each epoch's permutation drawn whole (int32 below 2^31
    windows), seeded by (*key, epoch); a source keeps its two newest epochs."""

    def __init__(self, num_windows: int, key: tuple[int, ...]):
        self.num_windows, self.key, self.perms = num_windows, tuple(key), {}

    def windows(self, examples) -> np.ndarray:
        k = np.asarray(examples, dtype=np.int64)
        epochs, positions = np.divmod(k, self.num_windows)
        out = np.empty(k.shape, dtype=np.int64)
        for epoch in np.unique(epochs):
            at = epochs == epoch
            out[at] = self.permutation(int(epoch))[positions[at]]
        return out

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self.perms:
            for old in [e for e in self.perms if e < epoch - 1]:
                del self.perms[old]
            dtype = np.int32 if self.num_windows < 2**31 else np.int64
            rng = np.random.default_rng([*self.key, epoch])
            self.perms[epoch] = rng.permutation(np.arange(self.num_windows, dtype=dtype))
        return self.perms[epoch]


class SimulatedSource:
    """A source as its shard manifest's token count: windows are counted, never read."""

    def __init__(self, total_tokens: int):
        self.total_tokens = total_tokens

    def num_windows(self, seq_len: int) -> int:
        return max(0, (self.total_tokens - 1) // seq_len)

    def window(self, w: int, seq_len: int) -> np.ndarray:
        raise NotImplementedError("a simulated source has no tokens: the benchmark reads window numbers only")


def _num_windows(tokens: int) -> int:
    return (tokens - 1) // SEQ_LEN


def _first_step_past(mix, name: str, m: int) -> int:
    """The step whose batch takes source `name`'s example m (the first of its epoch 1): bisection on the
    rows the steps before each step took (Mixture.rows_before, O(phases) a step)."""
    lo, hi = 0, 1
    while mix.rows_before(hi, GLOBAL_BATCH)[name] <= m:
        hi *= 2
    while hi - lo > 1:                       # rows_before(lo) <= m < rows_before(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if mix.rows_before(mid, GLOBAL_BATCH)[name] <= m else (lo, mid)
    return lo


def _reset_peak() -> None:
    """VmHWM back to the current resident memory (Linux's clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _meminfo(field: str, path: str = "/proc/meminfo") -> int:
    """A kB figure of /proc/meminfo or /proc/self/status."""
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(f"{field} is not in {path}")


def _status(field: str) -> int:
    """This process's VmRSS or VmHWM, kB."""
    return _meminfo(field, "/proc/self/status")


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-15t", action="store_true", help="run the old order at 15T too (~23 GB)")
    parser.add_argument("--case", nargs=3, metavar=("ORDER", "TOKENS", "LAYOUT"),
                        help="one case in this process (old|new, 2T|15T, single|mixture); prints its JSON")
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(*args.case)))
        return 0
    result = measure("", old_15t=args.old_15t)
    os.makedirs(os.path.join(REPO, "benchmarks", "out"), exist_ok=True)
    with open(os.path.join(REPO, "benchmarks", "out", "window_order.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result["ratios"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
