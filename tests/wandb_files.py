"""Reads W&B offline run files back, with no network: what tests/train/test_tracking.py checks a run by.

    runs = wandb_files.read_all(wandb_dir, run_id)     # every offline-run-* of that id, oldest first

wandb 0.31's Python package has no reader of its own (its core is a Go binary), so this one reads the
format: a 7-byte header (":W&B", 0xBEE1 little-endian, version 0), then a LevelDB-style log of 32 KiB blocks,
each record `<crc32 u32><length u16><type u8>` + data (FULL 1, FIRST 2, MIDDLE 3, LAST 4; the checksum is
zlib's crc32 of the data seeded with the crc32 of the type byte), each whole record a
`wandb_internal_pb2.Record`. A resumed run writes a directory of its own for the same id; the file is
complete once the writing process has exited (or called `wandb.teardown()`).
"""

from __future__ import annotations

import glob
import json
import os
import struct
import zlib

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK, RECORD_HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str):
    """Each protobuf Record of a .wandb file, in order; a truncated tail ends it (a killed writer)."""
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


def read(path: str) -> dict:
    """{"run": {id, name, group, project, tags, config}, "history": [rows], "config": {updates after init},
    "summary": {merged}} of one run file."""
    out = {"run": None, "history": [], "config": {}, "summary": {}}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["run"] = {"id": r.run.run_id, "name": r.run.display_name, "group": r.run.run_group,
                          "project": r.run.project, "tags": list(r.run.tags),
                          "start_ns": r.run.start_time.ToNanoseconds(),
                          "config": {i.key: json.loads(i.value_json) for i in r.run.config.update}}
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in r.summary.update})
    return out


def read_all(wandb_dir: str, run_id: str) -> list[dict]:
    """Every offline run file of `run_id` under `wandb_dir` (W&B's `dir`), oldest first (by the start time
    the file records: two in one second are `offline-run-<second>-<id>` and `...-<id>-1`)."""
    found = glob.glob(os.path.join(wandb_dir, "wandb", f"offline-run-*-{run_id}*", f"run-{run_id}.wandb"))
    return sorted((read(path) for path in found), key=lambda run: run["run"]["start_ns"])


def _key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key
