"""TensorBoard event files, written directly: the scalars training logs, without tensorboardX or TensorFlow.

    with tfevents.EventWriter(f"{out_dir}/tensorboard") as tb:
        tb.scalar("train/loss", 2.31, step=10)

    tensorboard --logdir cache/train

A file is TensorBoard's `events.out.tfevents.<seconds>.<host>`: TFRecord framing (each record its length as
a little-endian uint64, that length's masked CRC-32C, the bytes, their masked CRC-32C) around serialized
`tensorflow.Event` protos: the first names the format ("brain.Event:2"), each later one holds one scalar.
The protos are encoded here by hand (four fields; see `_event`), so that the training process does not
import tensorboardX, which imports torch wherever torch is installed (1.9 s of every training's start on
the dev VM, for a writer of floats). tests/train/test_metrics.py decodes what this writes with the protos
tensorboardX ships and checks every CRC.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time

import google_crc32c

FILE_VERSION = "brain.Event:2"
FLOAT32_MAX = 3.4028234663852886e38


class EventWriter:
    """Appends scalar events to a new event file in `directory` (created if missing)."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        now = time.time()
        self.path = os.path.join(directory, f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}")
        self._file = open(self.path, "ab")      # noqa: SIM115 - kept open, closed in close()
        self._write(_event(now, file_version=FILE_VERSION))

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One value at `step`, stored as a float32 (TensorBoard's simple_value): beyond its range, +-inf."""
        value = float(value)
        if math.isfinite(value) and abs(value) > FLOAT32_MAX:
            value = math.copysign(math.inf, value)
        self._write(_event(time.time(), step=step, tag=tag, value=value))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self, data: bytes) -> None:
        length = struct.pack("<Q", len(data))
        self._file.write(length + struct.pack("<I", masked_crc(length)) + data
                         + struct.pack("<I", masked_crc(data)))


def masked_crc(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant (mod 2^32)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ------------------------------------------------------------------------------- protobuf, by hand
# tensorflow/core/util/event.proto and framework/summary.proto, the fields used:
#   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
#   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _event(wall_time: float, *, step: int = 0, file_version: str = "", tag: str = "",
           value: float = 0.0) -> bytes:
    out = _key(1, _FIXED64) + struct.pack("<d", wall_time)
    if step:
        out += _key(2, _VARINT) + _varint(step)
    if file_version:
        out += _bytes_field(3, file_version.encode())
    if tag:
        summary_value = _bytes_field(1, tag.encode()) + _key(2, _FIXED32) + struct.pack("<f", value)
        out += _bytes_field(5, _bytes_field(1, summary_value))
    return out


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, _BYTES) + _varint(len(data)) + data


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1               # a negative int64 is its two's complement, ten bytes
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)
