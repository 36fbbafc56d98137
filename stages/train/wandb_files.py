"""W&B's run files (`run-<id>.wandb`), read with no network: what a killed training's W&B run holds.

    for record in wandb_files.records(path):      # each wandb_internal_pb2.Record, in order
        ...
    wandb_files.last_step([path, ...])            # the largest history step the files hold (0: none)

A training that resumes after a hard kill (tracking.py) asks `last_step` what its earlier segments'
files hold and sends the rest again; tests/wandb_files.py reads the whole run through `records`.

wandb 0.31's Python package has no reader of its own (its core is a Go binary), so this one reads the
format: a 7-byte header (":W&B", 0xBEE1 little-endian, version 0), then a LevelDB-style log of 32 KiB blocks,
each record `<crc32 u32><length u16><type u8>` + data (FULL 1, FIRST 2, MIDDLE 3, LAST 4; the checksum is
zlib's crc32 of the data seeded with the crc32 of the type byte), each whole record a
`wandb_internal_pb2.Record`. A file is complete once the process that wrote it has exited (or called
`wandb.teardown()`); one whose writer was killed ends in a truncated record, which `wandb sync` skips too.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK, RECORD_HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str) -> Iterator:
    """Each protobuf Record of a .wandb file, in order; a truncated tail ends it (a killed writer). A file
    that is not a W&B run file, or a record whose checksum is wrong, raises ValueError naming the file."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        data = f.read()
    if data[:len(HEADER)] != HEADER:
        raise ValueError(f"{path} is not a W&B run file (header {data[:7]!r})")
    pos, pending = len(HEADER), b""
    while pos + RECORD_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER:             # a block's end too short for a header is padding
            pos += left
            continue
        crc, n, kind = struct.unpack("<IHB", data[pos:pos + RECORD_HEADER])
        chunk = data[pos + RECORD_HEADER:pos + RECORD_HEADER + n]
        if (kind == 0 and n == 0) or len(chunk) < n:
            break
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: bad checksum at byte {pos}")
        pos += RECORD_HEADER + n
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def last_step(paths: Iterable[str]) -> int:
    """The largest history step (`_step`) any of the run files `paths` holds, 0 when none holds a row. A
    missing file holds nothing; a damaged one (a machine lost mid-write: zeros or garbage in its tail) holds
    the rows before the damage, as W&B's own reader (`wandb sync`) would send them."""
    last = 0
    for path in paths:
        if not os.path.exists(path):
            continue
        try:
            for record in records(path):
                if record.WhichOneof("record_type") == "history":
                    last = max(last, _step(record))
        except ValueError:
            continue
    return last


def _step(record) -> int:
    """The `_step` of a history record: its `_step` item (what `wandb sync` sends), else the record's step."""
    steps = [int(float(i.value_json)) for i in record.history.item if i.key == "_step"]
    return steps[0] if steps else int(record.history.step.num)
