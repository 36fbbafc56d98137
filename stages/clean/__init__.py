"""The clean stage: normalize download's documents, filter them, and drop exact duplicates.

    make stage STAGE=clean OVERRIDES='clean.Config.min_chars=100'
    clean.run(clean.Config(min_chars=100), {"download": downloaded}, out_dir, work_dir)   # on its own

Reads download's `docs-*.parquet` (`documents.shards_of`) and writes into `out_dir`:

    docs-XXXXX-of-YYYYY.parquet  kept documents (`stages.io.documents` schema, `error` null), sorted by id;
                                 shard b holds the texts whose hash % num_shards == b
    stats.json                   {docs_in, chars_in, docs_kept, chars_kept, dropped: {reason: docs},
                                  dropped_chars: {reason: chars}, shards}
    rejected/<reason>.jsonl      up to `samples_per_reason` dropped documents per reason, smallest ids
                                 first: {id, url, source, reason, text (first 500 chars)}

Every document gets the first reason that applies, so docs_in == docs_kept + sum(dropped):
    <error>       download's `error` for the record (malformed_json, invalid_utf8, missing_text, ...)
    null_text     text is null or not a string
    empty         nothing left after normalization (normalize.py)
    too_short, too_long, too_few_alpha, ...   the filters of `build_filters`, cheapest first (filters.py)
    duplicate     the same normalized text as a document with a smaller id
chars_in and dropped_chars count the text as downloaded and chars_kept the normalized text, so
chars_in - chars_kept - sum(dropped_chars) is what normalization removed from the kept documents.

The Beam graph is in graph.py. Deduplication groups documents by a duplicate key (`duplicate_key`:
a 128-bit hash of the normalized text) and keeps the smallest id in each group; the bucket (output
shard) is derived from the key, so duplicates always meet in one worker. Near-duplicate removal
(MinHash) plugs in at the same place: it gives each document several keys (one per LSH band), adds
a step that joins documents sharing any key into clusters and names each cluster's survivor, and
then buckets by the survivor's key instead; the filters, counts and writing stay as they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping

from stages import beam_runner
from stages.clean import filters, normalize
from stages.io import documents, storage

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    min_chars: int = 200                # normalized documents shorter than this are dropped (too_short)
    max_chars: int = 100_000            # ... and longer than this (too_long)
    min_alpha_fraction: float = 0.5     # letters / non-whitespace chars below this: too_few_alpha; 0 = off
    dedup: bool = True                  # drop exact duplicates of the normalized text (keep the smallest id)
    num_shards: int = 8                 # output shards; one worker holds one shard in memory to sort it
    samples_per_reason: int = 5         # dropped documents kept per reason in rejected/<reason>.jsonl
    unicode_nfc: bool = True            # normalization steps that can be switched off (normalize.py)
    remove_control_chars: bool = True
    tidy_whitespace: bool = True
    runner: beam_runner.Runner = dataclasses.field(default_factory=beam_runner.Runner,
                                                   metadata={"key": False})

    def __post_init__(self):
        for name, low in (("min_chars", 0), ("num_shards", 1), ("samples_per_reason", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= {low}")
        if self.max_chars < max(self.min_chars, 1):
            raise ValueError(f"max_chars={self.max_chars!r} must be >= min_chars={self.min_chars!r} and >= 1")
        if not 0.0 <= self.min_alpha_fraction <= 1.0:
            raise ValueError(f"min_alpha_fraction={self.min_alpha_fraction!r} must be in [0, 1]")


CONFIGURABLES = (Config,)
VERSION = "1"


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.clean import graph  # Beam loads only when the stage actually runs

    paths = documents.shards_of(inputs["download"])
    log.info("clean: %d input shards -> %d output shards in %s", len(paths), config.num_shards, out_dir)
    start = time.time()
    graph.run(config, paths, out_dir)
    stats = storage.read_json(storage.join(out_dir, "stats.json"))
    wall = time.time() - start
    log.info("clean: %d docs in %.1f s (%.0f docs/s); kept %d (%.1f%%); dropped %s",
             stats["docs_in"], wall, stats["docs_in"] / max(wall, 1e-9), stats["docs_kept"],
             100 * stats["docs_kept"] / max(stats["docs_in"], 1), stats["dropped"])


def summary(out) -> str:
    """One line for the run summary, from a committed clean (`pipeline.cache.Committed`)."""
    s = storage.read_json(out.file("stats.json"))
    dropped = ", ".join(f"{k} {v:,}" for k, v in sorted(s["dropped"].items(), key=lambda kv: -kv[1]))
    return (f"kept {s['docs_kept']:,} of {s['docs_in']:,} docs ({s['chars_kept'] / 1e6:.1f}M chars); "
            f"dropped: {dropped or 'none'}")


# ---------------------------------------------------------------------------------------------
# One document (pure; graph.py calls these inside the Beam workers)

def build_filters(config: Config) -> tuple[filters.Filter, ...]:
    """The filters to run, cheapest first: a document stops at the first one that rejects it."""
    out: list[filters.Filter] = [filters.Length(config.min_chars, config.max_chars)]
    if config.min_alpha_fraction > 0:
        out.append(filters.AlphaFraction(config.min_alpha_fraction))
    return tuple(out)


def clean_document(doc: dict, config: Config,
                   doc_filters: tuple[filters.Filter, ...]) -> tuple[str | None, dict]:
    """(reason to drop it or None to keep it, the document with its text normalized where it has one)."""
    if doc.get("error"):
        return doc["error"], doc
    text = doc.get("text")
    if not isinstance(text, str):
        return "null_text", doc
    text = normalize.normalize(text, nfc=config.unicode_nfc, control=config.remove_control_chars,
                               whitespace=config.tidy_whitespace)
    doc = {**doc, "text": text}
    if not text:
        return "empty", doc
    for f in doc_filters:
        reason = f.check(doc)
        if reason:
            return reason, doc
    return None, doc


def duplicate_key(text: str) -> bytes:
    """Documents with equal keys are duplicates: 16 bytes of blake2b, so an accidental collision among
    1e9 documents has odds of about 1e-21."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def doc_order(doc: dict) -> tuple:
    """Sort key: by id, then by the other fields so that equal ids still sort the same way every run."""
    return tuple((doc.get(c) is not None, doc.get(c) or "") for c in ("id", "text", "url", "source"))
