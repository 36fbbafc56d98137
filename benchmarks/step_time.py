"""The step-time model (stages/train/planning/step_time.py) against published training throughputs.

    .venv/bin/python -m benchmarks step_time          # or `make bench` for every benchmark

    .venv/bin/python -m benchmarks.step_time --calibrate    # refit the constants the calibration rows set

Each run file in benchmarks/published/ reproduces one published training configuration (hardware, mesh,
per-device batch, sequence length, remat as published; its source in its header, quoted in
throughput_sources.md) and states what was published (`# published: N tokens/s per chip`) and its role:
`calibrates <device> <constant>, ...` (the row that sets one of stages/train/planning/step_time.py's
EFFICIENCY constants: fitted so that row's prediction equals it), `held out` (set nothing: the test of
the model), or `reference, outside the bar: <why>` (printed, not judged: hardware the device table does
not describe). The benchmark predicts each step from the config alone and prints published and predicted
tokens/s per chip and their ratio; the bar is 0.85-1.15 for every calibration and held-out row. No JAX, no
compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import os
import re
import sys

from pipeline import config

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published")
BAR = (0.85, 1.15)


def run_files() -> list[str]:
    """Every published configuration's run file (base.gin and models/ are what they include)."""
    return sorted(p for p in glob.glob(os.path.join(HERE, "*.gin")) if os.path.basename(p) != "base.gin")


def published(path: str) -> tuple[float, str]:
    """(tokens/s per chip, role) from a run file's `# published:` and `# role:` lines."""
    with open(path) as f:
        text = f.read()
    rate = re.search(r"^# published: ([\d.]+) tokens/s per chip$", text, re.M)
    role = re.search(r"^# role: (.+)$", text, re.M)
    if not rate or not role:
        raise ValueError(f"{path}: needs '# published: N tokens/s per chip' and '# role: ...' lines")
    return float(rate.group(1)), role.group(1)


def row(path: str) -> dict:
    """One published configuration's prediction against its figure; ValueError (config.ConfigError among
    them) naming what in the file cannot be planned, e.g. a device the table lacks."""
    from stages.train.planning import planner

    cfg = _config(path)
    p = planner.plan(cfg, advise=False)
    t = p.predicted
    rate, role = published(path)
    predicted = cfg.global_batch * cfg.seq_len / t.seconds / p.chips
    return {"published_tokens_per_s_per_chip": rate, "predicted_tokens_per_s_per_chip": round(predicted, 1),
            "ratio": round(predicted / rate, 3), "role": role, "step_s": round(t.seconds, 3),
            "mfu": round(t.mfu, 3), "device": p.device.label, "chips": p.chips,
            "largest": t.largest(3)}


@functools.cache
def _config(path: str):
    return config.load([path]).stages["train"].config


def measure(work_dir: str, files: list[str] | None = None) -> dict:
    """Every run file's row (`files`: these instead of benchmarks/published/'s). A file that cannot be
    planned is one row naming the file and why (`{"error": ...}`), printed as one line and counted in
    `failed`; the other rows are computed and judged as ever."""
    rows = {os.path.basename(p).removesuffix(".gin"): _row_or_error(p) for p in files or run_files()}
    width = max(map(len, rows))
    print(f"{'configuration':<{width}}  {'published':>10}  {'predicted':>10}  ratio  role")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<{width}}  error: {r['error']}")
            continue
        print(f"{name:<{width}}  {r['published_tokens_per_s_per_chip']:>10,.0f}  "
              f"{r['predicted_tokens_per_s_per_chip']:>10,.0f}  {r['ratio']:.3f}  {r['role']}")
    judged = [r for r in rows.values() if "error" not in r and not r["role"].startswith("reference")]
    ratios = [r["ratio"] for r in judged]
    return {"benchmark": "step_time", "rows": rows, "judged": len(judged),
            "held_out": sum(r["role"] == "held out" for r in judged),
            "within_bar": sum(BAR[0] <= x <= BAR[1] for x in ratios),
            "worst_ratio_off": round(max(abs(x - 1) for x in ratios), 3) if ratios else None,
            "failed": sorted(name for name, r in rows.items() if "error" in r)}


def _row_or_error(path: str) -> dict:
    """`row(path)`, or {"error": one line naming the file and what in it cannot be planned}: one bad file
    (a device the table lacks) must not cost the other rows."""
    try:
        return row(path)
    except ValueError as e:              # config.ConfigError is one: the gin value, its file, the valid ones
        why = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        return {"error": why if path in why else f"{path}: {why}"}


def calibrations() -> list[tuple[str, list[tuple[str, str]]]]:
    """(run file, [(device, constant), ...]) of every calibration row, the matmul rows first (a grouped
    matmul's constant is relative to the matmul's)."""
    out = []
    for path in run_files():
        _, role = published(path)
        if role.startswith("calibrates "):
            targets = [tuple(t.split()) for t in role.removeprefix("calibrates ").split(",")]
            out.append((path, targets))
    return sorted(out, key=lambda c: c[1][0][1] != "matmul")


def calibrate() -> dict[str, dict[str, float]]:
    """Refit each calibration row's constants (bisection: the prediction grows with every efficiency) so
    that its predicted tokens/s equal the published; returns {device: {constant: value}}, the fitted
    values applied in turn (later rows see earlier fits)."""
    from stages.train.planning import step_time

    fitted: dict[str, dict[str, float]] = {}
    saved = dict(step_time.EFFICIENCY)
    try:
        for path, targets in calibrations():
            fit(step_time, path, targets, fitted)
    finally:
        step_time.EFFICIENCY.clear()
        step_time.EFFICIENCY.update(saved)
    return fitted


def fit(step_time, path, targets, fitted) -> None:
    """Bisect the constants `targets` name until `path`'s prediction equals its published figure, record
    them in `fitted` and keep them in step_time.EFFICIENCY for the rows after it."""
    lo, hi = 0.05, 1.5
    for _ in range(40):
        mid = (lo + hi) / 2
        with _constants(step_time, targets, mid):
            ratio = row(path)["ratio"]
        lo, hi = (mid, hi) if ratio < 1 else (lo, mid)
    for device, name in targets:
        fitted.setdefault(device, {})[name] = round(mid, 3)
        step_time.EFFICIENCY[device] = dataclasses.replace(step_time.EFFICIENCY[device], **{name: mid})
    print(f"{os.path.basename(path)}: " + ", ".join(f"{d} {n} = {mid:.3f}" for d, n in targets))


@contextlib.contextmanager
def _constants(step_time, targets, value: float):
    saved = dict(step_time.EFFICIENCY)
    for device, name in targets:
        step_time.EFFICIENCY[device] = dataclasses.replace(step_time.EFFICIENCY[device], **{name: value})
    try:
        yield
    finally:
        step_time.EFFICIENCY.clear()
        step_time.EFFICIENCY.update(saved)


if __name__ == "__main__":
    if "--calibrate" in sys.argv:
        calibrate()
    else:
        measure("")
