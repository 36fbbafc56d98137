"""The download Beam graph: groups of units -> one parquet shard per group -> stats.json.

    Create([(shard index, [unit, ...]), ...]) -> Reshuffle -> write_shard -> sum counts -> write_stats

Imported only inside `download.run`, so importing the stage does not import Beam.
"""

import collections
import logging
import time
from collections.abc import Iterable
from typing import Any

import apache_beam as beam

from stages.download.document import SKIPPED_RECORDS, BadFile
from stages.io import documents, storage

log = logging.getLogger(__name__)
MB = 1e6


def build(p: beam.Pipeline, source: Any, groups: list[list], out_dir: str,
          skip_bad_files: bool = False, provenance: dict | None = None) -> None:
    """`provenance`: what the source resolved (FineWeb: the hub `revision`), added to stats.json."""
    n = len(groups)
    _ = (p
         | "Groups" >> beam.Create(list(enumerate(groups)))
         | "Spread" >> beam.Reshuffle()   # so a distributed runner spreads the groups over workers
         | "WriteShards" >> beam.Map(write_shard, source=source, out_dir=out_dir, num_shards=n,
                                     skip_bad_files=skip_bad_files)
         | "SumCounts" >> beam.CombineGlobally(sum_counts)
         | "WriteStats" >> beam.Map(write_stats, out_dir=out_dir, num_shards=n, provenance=provenance or {}))


def write_shard(group: tuple[int, list], *, source: Any, out_dir: str, num_shards: int,
                skip_bad_files: bool = False) -> dict:
    """Streams every document of the group's units, in order, into its shard; returns its counts.

    A damaged file (`BadFile`) fails the shard, or with `skip_bad_files` keeps the documents read before
    the damage and is counted under `bad_files` (path -> reason).
    """
    index, units = group
    counts = empty_counts() | {"units": len(units)}
    start = time.monotonic()

    def docs() -> Iterable[dict]:
        for done, unit in enumerate(units, 1):
            try:
                for doc in source.read(unit):
                    if doc["error"] in SKIPPED_RECORDS:
                        counts["skipped_records"][doc["error"]] += 1
                        continue
                    text = doc["text"]
                    counts["docs"] += 1
                    counts["bytes"] += len(text.encode("utf-8")) if text is not None else 0
                    counts["by_source"][doc["source"]] += 1
                    if doc["error"]:
                        counts["errors"][doc["error"]] += 1
                    yield doc
            except BadFile as e:
                if not skip_bad_files:
                    raise
                reason = f"{e.reason} ({e.where})" if e.where else e.reason
                log.warning("download: skipping the rest of %s: %s", e.path, reason)
                counts["bad_files"][e.path] = reason
            secs = max(time.monotonic() - start, 1e-9)
            log.info("download shard %d/%d: unit %d/%d done, %d docs, %.1f MB, %.0f docs/s, %.1f MB/s",
                     index, num_shards, done, len(units), counts["docs"], counts["bytes"] / MB,
                     counts["docs"] / secs, counts["bytes"] / MB / secs)

    documents.write(storage.join(out_dir, documents.shard_name(index, num_shards)), docs())
    return counts


def empty_counts() -> dict:
    return {"docs": 0, "bytes": 0, "units": 0,
            "errors": collections.Counter(), "by_source": collections.Counter(),
            "skipped_records": collections.Counter(), "bad_files": {}}


def sum_counts(parts: Iterable[dict]) -> dict:
    total = empty_counts()
    for part in parts:
        for name in ("docs", "bytes", "units"):
            total[name] += part[name]
        for name in ("errors", "by_source", "skipped_records"):
            total[name].update(part[name])
        for path, reason in part["bad_files"].items():   # damaged row groups of a file: same answer each run
            total["bad_files"][path] = min(reason, total["bad_files"].get(path, reason))
    return total


def write_stats(total: dict, *, out_dir: str, num_shards: int, provenance: dict | None = None) -> None:
    stats = {name: dict(v) if isinstance(v, dict) else v for name, v in total.items()}
    stats["shards"] = num_shards
    stats.update(provenance or {})
    storage.write_json(storage.join(out_dir, "stats.json"), stats)
    log.info("download: %d docs, %.1f MB, %d shards, errors %s", stats["docs"], stats["bytes"] / MB,
             num_shards, stats["errors"])
