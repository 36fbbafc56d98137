"""Wall time of a fully cached `python -m pipeline run` (the no-op rerun users hit all day).

    .venv/bin/python -m benchmarks cached_rerun        # or `make bench` for every benchmark

Builds the tiny pipeline once into a scratch cache (with 40 training steps instead of 300: the rerun
reads the same manifests either way), then times several reruns that must do no stage work, against the
baseline of starting the same interpreter and doing nothing. On a busy machine wall time says little, so it
also reports each rerun's CPU time (user + sys, from the OS), the 1-minute load average while it ran, and
the import time the rerun's own `-X importtime` adds up (the modules' self times), and it lists the
libraries the no-op path must not import (numpy, Luigi, JAX, Beam, ...) that it did.
"""

from __future__ import annotations

import ast
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What deciding "nothing to do" must not import (tests/test_layers.py asserts the same on a stand-in cache).
NOT_ON_THE_NOOP_PATH = ("numpy", "pyarrow", "luigi", "fsspec", "jax", "flax", "optax", "orbax", "apache_beam",
                        "tensorflow", "tensorflow_datasets", "sentencepiece", "matplotlib")


def measure(work_dir: str, gin: str = "gin/tiny.gin", repeats: int = 5) -> dict:
    cache_root = os.path.join(work_dir, "cache")
    argv = ["run", "--gin", gin, "--gin-param", f'pipeline.Settings.cache_root = "{cache_root}"',
            "--gin-param", "train.Config.steps = 40"]
    cmd = [sys.executable, "-m", "pipeline", *argv]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)     # the real build, untimed
    load = os.getloadavg()[0]
    rerun, rerun_cpu = _times(cmd, repeats)
    baseline, _ = _times([sys.executable, "-c", "pass"], repeats)
    return {
        "benchmark": "cached_rerun",
        "gin": gin,
        "rerun_s": statistics.median(rerun),
        "rerun_cpu_s": statistics.median(rerun_cpu),
        "python_startup_s": statistics.median(baseline),
        "ratio_vs_python_startup": statistics.median(rerun) / statistics.median(baseline),
        "imports_self_s": _import_time(cmd),
        "noop_imports": _imported(argv),
        "load_average_1m": round(max(load, os.getloadavg()[0]), 2),
        "cpus": os.cpu_count(),
        "repeats": repeats,
        "target_s": 0.5,
    }


def _times(cmd: list[str], repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + sys) seconds of each of `repeats` runs of `cmd`."""
    wall, cpu = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        if " 0 stage(s) ran" not in proc.stdout and "pass" not in cmd:
            raise RuntimeError(f"the rerun did stage work:\n{proc.stdout}")
    return wall, cpu


def _import_time(cmd: list[str]) -> float:
    """Seconds the rerun spends importing modules: the sum of `-X importtime`'s self times."""
    proc = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=REPO, capture_output=True, text=True,
                          check=True)
    return sum(int(us) for us in re.findall(r"^import time:\s+(\d+) \|", proc.stderr, re.M)) / 1e6


def _imported(argv: list[str]) -> list[str]:
    """The libraries in NOT_ON_THE_NOOP_PATH that a fully cached run imported (none, when all is well)."""
    code = (f"import sys; from pipeline.__main__ import main; rc = main({argv!r}); "
            f"print(sorted(m for m in {NOT_ON_THE_NOOP_PATH!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(measure(tmp))
