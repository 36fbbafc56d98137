"""The download stage: reads one source and writes its documents as parquet shards.

    make stage STAGE=download                    (gin/tiny.gin: the embedded corpus)
    python -m pipeline run --gin gin/data/fineweb.gin

Writes into `out_dir`:
    docs-00000-of-0000N.parquet   columns id, text, url, source, error (see `stages.io.documents`)
    stats.json                    {"docs", "bytes" (UTF-8 bytes of text), "shards", "units",
                                   "errors": {reason: docs}, "by_source": {source: docs}}

A source lists its work as units (a batch of files, a parquet row group, a range of records,
see `sources.py`). The driver deals them round-robin into `min(num_shards, len(units))` groups;
a Beam worker streams each group's units, in order, into one shard. Elements are groups, never
documents, and the same source and config always give the same bytes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from stages import beam_runner
from stages.download.sources import SOURCES, Embedded, Files, FineWeb, Tfds

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    """What to download and into how many shards; `runner` says where Beam runs (not in the key)."""

    source: Embedded | Files | Tfds | FineWeb = dataclasses.field(default_factory=Embedded)
    num_shards: int = 8   # output shards; fewer when the source has fewer units
    runner: beam_runner.Runner = dataclasses.field(default_factory=beam_runner.Runner,
                                                   metadata={"key": False})

    def __post_init__(self):
        if not isinstance(self.source, SOURCES):
            raise TypeError(f"source={self.source!r} is not one of "
                             f"{', '.join('@download.' + s.__name__ + '()' for s in SOURCES)}")
        if isinstance(self.num_shards, int) and self.num_shards < 1:
            raise ValueError(f"num_shards={self.num_shards!r} must be >= 1")


CONFIGURABLES = (Config, *SOURCES)
VERSION = "1"


def run(config: Config, inputs: Mapping[str, Any], out_dir: str, work_dir: str) -> None:
    from stages.download import beam_graph

    units = config.source.units()
    groups = deal(units, config.num_shards)
    log.info("download: %d units from %s -> %d shards in %s", len(units), type(config.source).__name__,
             len(groups), out_dir)
    with beam_runner.pipeline(config.runner) as p:
        beam_graph.build(p, config.source, groups, out_dir)


def summary(out) -> str:
    """One line for the run summary, from a committed download (`pipeline.cache.Committed`)."""
    from stages.io import storage

    s = storage.read_json(out.file("stats.json"))
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "none"
    return f"{s['docs']:,} docs, {s['bytes'] / 1e6:.1f} MB in {s['shards']} shards; bad records: {errors}"


def deal(units: Sequence, num_shards: int) -> list[list]:
    """Units dealt round-robin into `min(num_shards, len(units))` groups (at least one, maybe empty)."""
    n = max(1, min(num_shards, len(units)))
    return [list(units[i::n]) for i in range(n)]
