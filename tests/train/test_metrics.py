import glob
import io
import json
import logging
import math
import os
import struct
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from stages.train import metrics
from stages.train.planning import devices


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _rows():
    return [{"step": s, "loss": np.float32(4.0 - s / 10), "accuracy": 0.1 * s, "learning_rate": 1e-3,
             "grad_norm": 1.5, "param_norm": 20.0, "tokens_per_s": 1000.0 + s, "step_time_s": 0.5,
             "mfu": 0.01} for s in (10, 20, 30)]


def test_jsonl_lines_parse_and_are_flushed_per_write(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path), total_steps=30, stream=io.StringIO())
    writer.write(_rows()[0])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()      # before close: already on disk
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 10
    for row in _rows()[1:]:
        writer.write(row)
    writer.write({"step": 30, "eval_loss": float("nan")})
    writer.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20, 30, 30]
    for r, row in zip(records[:3], _rows()):
        assert set(row) | {"time"} == set(r)                      # every field written, plus the time
    assert records[1]["loss"] == pytest.approx(2.0) and records[2]["tokens_per_s"] == 1030.0
    assert math.isnan(records[3]["eval_loss"])


def _records(event_file):
    """The serialized events of a TensorBoard event file (TFRecord framing), each record's two CRCs checked
    with tensorboardX's own `masked_crc32c` (a reader independent of stages/train/tfevents.py)."""
    from tensorboardX.record_writer import masked_crc32c

    out, raw = [], Path(event_file).read_bytes()
    pos = 0
    while pos < len(raw):
        header = raw[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
        data = raw[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", raw[pos + 12 + length:pos + 16 + length])
        assert (length_crc, data_crc) == (masked_crc32c(header), masked_crc32c(data)), f"bad CRC at {pos}"
        out.append(data)
        pos += 16 + length
    return out


def _events(event_file):
    """Every event of a TensorBoard event file, decoded with the protos tensorboardX ships."""
    from tensorboardX.proto import event_pb2

    return [event_pb2.Event.FromString(data) for data in _records(event_file)]


def _scalars(event_file):
    """(tag, step, value) of every scalar in a TensorBoard event file."""
    return [(v.tag, e.step, v.simple_value) for e in _events(event_file) for v in e.summary.value]


def test_tensorboard_events_are_written(tmp_path):
    with metrics.MetricsWriter(str(tmp_path), total_steps=30, stream=io.StringIO()) as writer:
        for row in _rows():
            writer.write(row)
        writer.write({"step": 30, "eval_loss": 2.5})
    files = glob.glob(os.path.join(tmp_path, "tensorboard", "events.out.tfevents.*"))
    assert len(files) == 1
    first = _events(files[0])[0]
    assert first.file_version == "brain.Event:2" and first.wall_time > 1.7e9
    scalars = _scalars(files[0])
    assert ("train/loss", 20, pytest.approx(2.0)) in scalars
    assert ("train/mfu", 30, pytest.approx(0.01)) in scalars
    assert ("eval/loss", 30, 2.5) in scalars


def test_event_files_hold_what_tensorboardxs_writer_writes(tmp_path):
    """The same scalars through tensorboardX's SummaryWriter and through tfevents are the same bytes, each
    event's wall time aside: steps 0, large and negative, values beyond float32, NaN and a long tag."""
    from tensorboardX import SummaryWriter

    from stages.train import tfevents

    cases = [("train/loss", 2.25, 0), ("train/tokens", 12_345_678.0, 2**40), ("eval/loss", float("nan"), 7),
             ("x" * 300, -1e39, 3), ("train/big", 1e39, -5), ("train/int", 3, 1)]
    with SummaryWriter(str(tmp_path / "x")) as theirs, tfevents.EventWriter(str(tmp_path / "ours")) as ours:
        for tag, value, step in cases:
            theirs.add_scalar(tag, value, step)
            ours.scalar(tag, value, step)
    (theirs_file,), (ours_file,) = (glob.glob(str(tmp_path / d / "events.out.tfevents.*"))
                                    for d in ("x", "ours"))

    def without_wall_time(path):      # each event opens with its wall time: field 1, a double (9 bytes)
        records = _records(path)
        assert all(r[0] == 0x09 for r in records)
        return [r[9:] for r in records]

    assert without_wall_time(ours_file) == without_wall_time(theirs_file)      # byte for byte
    values = [value for _, _, value in _scalars(ours_file)]
    assert math.isnan(values[2]) and values[3:5] == [-math.inf, math.inf]


def test_progress_line_and_disabled_writer(tmp_path):
    tty = _Tty()
    writer = metrics.MetricsWriter(str(tmp_path / "a"), total_steps=30, stream=tty)
    writer.write(_rows()[0])
    writer.close()
    assert tty.getvalue().startswith("\r") and "step 10/30" in tty.getvalue() and "eta" in tty.getvalue()
    off = metrics.MetricsWriter(str(tmp_path / "b"), total_steps=30, enabled=False)
    off.write(_rows()[0])
    off.close()
    assert not os.path.exists(tmp_path / "b")


def test_mfu_arithmetic():
    # 6 GFLOP/token * 100k tokens/s = 6e14 FLOP/s over 8 devices of 989 TFLOP/s.
    assert metrics.mfu(6e9, 1e5, 8, 989e12) == pytest.approx(6e14 / (8 * 989e12))
    assert metrics.mfu(1.0, 2.0, 1, 4.0) == 0.5
    with pytest.raises(ValueError):
        metrics.mfu(1.0, 1.0, 0, 1.0)


@pytest.mark.parametrize("kind, name, flops", [
    ("NVIDIA H100 80GB HBM3", "H100", 989e12), ("NVIDIA H200", "H200", 989e12), ("TPU v4", "TPU v4", 275e12),
    ("TPU v5 lite", "TPU v5e", 197e12), ("TPU v5", "TPU v5p", 459e12), ("TPU v5p", "TPU v5p", 459e12),
    ("TPU v6 lite", "TPU v6e", 918e12), ("cpu", "cpu", devices.get("cpu").peak_flops),
    ("Some Future Chip", "cpu", devices.get("cpu").peak_flops),
])
def test_peak_lookup(kind, name, flops):
    assert metrics.device_peak_flops(types.SimpleNamespace(device_kind=kind)) == (name, flops)


def test_peak_of_this_machine():
    assert metrics.device_peak_flops(jax.devices("cpu")[0])[0] == "cpu"


def test_nan_policy():
    assert metrics.check_finite(3, 2.5, "stop") and metrics.check_finite(3, 2.5, "skip")
    with pytest.raises(FloatingPointError, match="step 7: the loss is nan"):
        metrics.check_finite(7, float("nan"), "stop")
    assert metrics.check_finite(7, float("inf"), "skip") is False
    with pytest.raises(ValueError, match="'halt' is not one of"):
        metrics.check_finite(7, 1.0, "halt")


@pytest.mark.parametrize("kind, name, flops", [
    ("TPU v5p", "TPU v5p", 459e12), ("NVIDIA H100 80GB HBM3", "H100", 989e12), ("cpu", "cpu", None),
    ("Some Future Chip", "cpu", None),
])
def test_mfu_is_against_published_peaks_only(kind, name, flops, caplog):
    with caplog.at_level(logging.INFO, logger=metrics.__name__):
        assert metrics.published_peak_flops(types.SimpleNamespace(device_kind=kind)) == (name, flops)
    said = [r.getMessage() for r in caplog.records if "MFU" in r.getMessage()]
    assert said == ([] if flops else [f"MFU not shown: {kind} has no published peak FLOP/s (the device "
                                      "table's 1e+11 for a CPU is a stand-in for plan estimates, not a "
                                      "measured peak)"])


def test_a_cpu_training_run_logs_no_mfu_and_says_why(tmp_path, caplog):
    """metrics.jsonl rows without "mfu", summary.json's mfu null, no "mfu" on the progress line, and one
    INFO line saying why (a CPU has no published peak)."""
    import dataclasses

    from pipeline import cache
    from tests.train import test_loop

    root = str(tmp_path)
    shard = cache.run_stage(cache_root=root, stage="shard", key="synthetic", config={}, upstream={},
                            fn=test_loop._write_shards)
    cfg = dataclasses.replace(test_loop.CONFIG, steps=3, eval_every=0)
    with caplog.at_level(logging.INFO):
        trained = test_loop._train(root, shard, cfg)
    rows = test_loop._rows(trained)
    assert [r["step"] for r in rows] == [1, 2, 3] and all("tokens_per_s" in r for r in rows[1:])
    assert not [r for r in rows if "mfu" in r]
    summary = json.loads(Path(trained.file("summary.json")).read_text())
    assert summary["mfu"] is None and summary["device"] == "cpu" and summary["tokens_per_s"] > 0
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if m.startswith("MFU not shown: cpu has no published peak")]) == 1
    progress = [m for m in said if m.startswith("step 3/3")]
    assert progress and "tok/s" in progress[0] and "mfu" not in progress[0]
