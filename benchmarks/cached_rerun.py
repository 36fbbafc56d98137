"""Wall time of a fully cached `python -m pipeline run` (the no-op rerun users hit all day).

    .venv/bin/python -m benchmarks.cached_rerun        # or `make bench` for every benchmark

Builds the tiny pipeline once into a scratch cache (with 40 training steps instead of 300: the rerun
reads the same manifests either way), then times several reruns that must do no
stage work, against the baseline of starting the same interpreter and doing nothing.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(work_dir: str, gin: str = "gin/tiny.gin", repeats: int = 5) -> dict:
    cache_root = os.path.join(work_dir, "cache")
    cmd = [sys.executable, "-m", "pipeline", "run", "--gin", gin,
           "--gin-param", f'pipeline.Settings.cache_root = "{cache_root}"',
           "--gin-param", "train.Config.steps = 40"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)     # the real build, untimed
    rerun = _times(cmd, repeats)
    baseline = _times([sys.executable, "-c", "pass"], repeats)
    return {
        "benchmark": "cached_rerun",
        "gin": gin,
        "rerun_s": statistics.median(rerun),
        "python_startup_s": statistics.median(baseline),
        "ratio_vs_python_startup": statistics.median(rerun) / statistics.median(baseline),
        "repeats": repeats,
        "target_s": 3.0,
    }


def _times(cmd: list[str], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        out.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        if " 0 stage(s) ran" not in proc.stdout and "pass" not in cmd:
            raise RuntimeError(f"the rerun did stage work:\n{proc.stdout}")
    return out


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(measure(tmp))
