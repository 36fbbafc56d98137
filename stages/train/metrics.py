"""Training metrics: metrics.jsonl, TensorBoard events, a console progress line, MFU and the NaN guard.

    name, peak = metrics.published_peak_flops(jax.devices()[0])      # ("H100", 989e12); ("cpu", None)
    writer = metrics.MetricsWriter(out_dir, total_steps=1000, enabled=jax.process_index() == 0)
    ...                                                    # every logging step (loop.intervals decides which)
    writer.write({"step": step + 1, "loss": 2.31, "learning_rate": 3e-4, "tokens_per_s": tps,
                  "mfu": metrics.mfu(flops_per_token, tps, jax.device_count(), peak), ...})   # if peak
    writer.close()

metrics.jsonl holds one JSON object per logged step (written and flushed at once, so a crash keeps
every line logged before it); non-finite numbers appear as NaN/Infinity, which Python's json reads.
MFU is logged only where the device's peak is published (TPU, GPU): on a CPU the rows have no "mfu" key,
summary.json has `"mfu": null`, and one INFO line says why.
TensorBoard events go to `out_dir/tensorboard/`. Everything is written locally; the training stage
copies the files to gs:// at the end.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence

from stages.io import storage
from stages.train import tfevents
from stages.train.planning import devices
from stages.train.stage_config import NAN_POLICIES

log = logging.getLogger(__name__)

def device_peak_flops(device) -> tuple[str, float]:
    """(name, peak bf16 FLOP/s) for a jax device, from its `device_kind` (`devices.for_kind`). For a CPU
    (and a device kind the table does not know) the peak is the table's rough stand-in: use
    `published_peak_flops` for MFU."""
    d = devices.for_kind(device)
    return d.label, d.peak_flops


def published_peak_flops(device) -> tuple[str, float | None]:
    """(name, peak bf16 FLOP/s) where its vendor publishes one (TPUs, GPUs), else (name, None) and one INFO
    line saying why MFU is not shown: a CPU's peak depends on its cores, clock and vector units, and the
    devices table holds only a stand-in for the planner's time estimate; MFU against it would be made up."""
    d = devices.for_kind(device)
    if d.name == "cpu":
        log.info("MFU not shown: %s has no published peak FLOP/s (the device table's %.0e for a CPU is a "
                 "stand-in for plan estimates, not a measured peak)", getattr(device, "device_kind", device),
                 d.peak_flops)
        return d.label, None
    return d.label, d.peak_flops


def mfu(flops_per_token: float, tokens_per_s: float, num_devices: int, peak: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the peak of all devices.

    flops_per_token: training FLOPs per token (forward + backward, e.g. 6 * params + attention);
    tokens_per_s: tokens processed per second by the whole job; peak: one device's FLOP/s.
    """
    if num_devices < 1 or peak <= 0:
        raise ValueError(f"num_devices={num_devices} must be >= 1 and peak={peak} > 0")
    return flops_per_token * tokens_per_s / (num_devices * peak)


def check_finite(step: int, loss: float, policy: str) -> bool:
    """True when `loss` is finite; otherwise "stop" raises FloatingPointError, "skip" returns False.

    How the loop uses it: the host sees a step's loss only after the jitted step has run, so with
    "skip" the train step itself keeps the old params and optimizer state when its loss is not finite
    (`jnp.where(isfinite(loss), new, old)`), and a False here tells the loop to log that the update was
    dropped. With "stop" the run fails naming the step, and the last checkpoint is the place to resume.
    """
    if policy not in NAN_POLICIES:
        raise ValueError(f"nan policy {policy!r} is not one of {NAN_POLICIES}")
    if math.isfinite(loss):
        return True
    if policy == "stop":
        raise FloatingPointError(f"step {step}: the loss is {loss}; stopping (nan_policy='stop'; "
                                 "nan_policy='skip' drops such updates instead)")
    return False


class MetricsWriter:
    """Appends logged steps to `out_dir/metrics.jsonl`, TensorBoard (`out_dir/tensorboard/`) and the console.

    total_steps: the run length (for the ETA).
    enabled: False on every process but the first, which then writes nothing.
    """

    def __init__(self, out_dir: str, *, total_steps: int, enabled: bool = True,
                 stream=None, history: Sequence[Mapping] = ()):
        if total_steps < 1:
            raise ValueError(f"total_steps={total_steps} must be >= 1")
        self.out_dir, self.total_steps, self.enabled = out_dir, total_steps, enabled
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self._stream = stream if stream is not None else sys.stderr
        self._start: tuple[float, int] | None = None      # (time, step) of the first write, for the ETA
        self._file = self._tb = None
        if enabled:
            os.makedirs(out_dir, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open, closed in close()
            self._tb = tfevents.EventWriter(os.path.join(out_dir, "tensorboard"))
        self._rows: list[dict] = []
        for record in history:        # an earlier attempt's rows, before the checkpoint this run resumed
            self._record(dict(record))

    @property
    def rows(self) -> list[dict]:
        """Every row logged so far, history first (none when not enabled)."""
        return list(self._rows)

    def jsonl(self, upto: int) -> str:
        """The rows logged so far (history included) up to step `upto`, as metrics.jsonl text."""
        return "".join(json.dumps(r) + "\n" for r in self._rows if r["step"] <= upto)

    def write(self, row: Mapping[str, float]) -> None:
        """Logs one step: `row` needs "step"; its other numbers (loss, mfu, eval_loss, ...) are recorded."""
        if "step" not in row:
            raise ValueError(f"a metrics row needs a 'step'; got fields {sorted(row)}")
        if not self.enabled:
            return
        step = int(row["step"])
        now = time.time()
        record = {"step": step, "time": now, **{k: _number(v) for k, v in row.items() if k != "step"}}
        self._record(record)
        self._progress(step, record, now)

    def _record(self, record: dict) -> None:
        if not self.enabled:
            return
        step = record["step"]
        self._rows.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for key, value in record.items():
            if key not in ("step", "time") and isinstance(value, (int, float)):
                tag = f"eval/{key[len('eval_'):]}" if key.startswith("eval_") else f"train/{key}"
                self._tb.scalar(tag, value, step)
        self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._tb.close()
            self._file = self._tb = None
            if self._stream.isatty():
                self._stream.write("\n")

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _progress(self, step: int, record: Mapping, now: float) -> None:
        if self._start is None:
            self._start = (now, step)
        t0, s0 = self._start
        per_step = (now - t0) / (step - s0) if step > s0 else record.get("step_time_s", float("nan"))
        eta = per_step * max(0, self.total_steps - step)
        parts = [f"step {step}/{self.total_steps}"]
        parts += [f"{k} {record[k]:.4g}" for k in ("loss", "eval_loss", "learning_rate") if k in record]
        if "tokens_per_s" in record:
            parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
        if "mfu" in record:
            parts.append(f"mfu {100 * record['mfu']:.1f}%")
        parts.append(f"eta {_duration(eta)}")
        line = " | ".join(parts)
        if self._stream.isatty():   # one line rewritten in place
            self._stream.write("\r\033[K" + line)
            self._stream.flush()
        else:                       # log files get one line per logged step
            log.info("%s", line)


def read_history(path: str, *, upto: int) -> list[dict]:
    """The rows of a metrics.jsonl kept beside the checkpoints (`path`, local or gs://) up to step `upto`:
    [] when there is none; a damaged line ends the history there, with a warning."""
    if not storage.exists(path):
        return []
    rows = []
    for n, line in enumerate(storage.read_text(path).splitlines(), 1):
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (ValueError, KeyError, TypeError):
            log.warning("%s line %d is not a metrics row; the history before the resume ends there", path, n)
            break
        if step <= upto:
            rows.append(row)
    return rows


def _number(value):
    """Python numbers from numpy/jax scalars, so json and TensorBoard take them."""
    if hasattr(value, "item"):
        value = value.item()
    return value


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"
