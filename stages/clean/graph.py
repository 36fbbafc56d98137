"""The clean stage's Beam graph; `clean.run` imports it, so Beam loads only when clean runs.

    Create(input shard paths) -> Reshuffle -> CleanShard      one element per input shard
        main:    (bucket, [(key, chars_in, doc), ...])         batches of kept documents;
                 bucket = key % num_shards, key = clean.duplicate_key(normalized text)
        "tally": that shard's Tally (docs and chars in, drops per reason, samples)
    + Create((b, []) for every bucket)                          so all N shards get written, even empty ones
    -> GroupByKey -> WriteShard                                 dedups by key, sorts by id, writes shard b
        emits a Tally of the kept documents and the duplicates
    -> Flatten(tallies) -> CombineGlobally(merge) -> stats.json and rejected/*.jsonl

Elements are files and batches, never single documents (a local runner costs ~50 us per element).
An input shard is streamed one row group at a time; an output shard is held in memory once, by the
worker that sorts and writes it, so choose `num_shards` to keep shards to a few hundred MB.
"""

from __future__ import annotations

import logging
import time

import apache_beam as beam

from stages import beam_runner, clean
from stages.clean import tally as tally_lib
from stages.io import documents, storage

log = logging.getLogger(__name__)

BATCH_DOCS = 1024            # documents per (bucket, batch) element
BUFFER_CHARS = 64 * 2**20    # flush every bucket's batch when this much text is buffered in one worker


def run(config: clean.Config, paths: list[str], out_dir: str) -> None:
    with beam_runner.pipeline(config.runner) as p:
        cleaned = (p
                   | "Inputs" >> beam.Create(paths)
                   | "Spread" >> beam.Reshuffle()
                   | "Clean" >> beam.ParDo(CleanShard(config)).with_outputs("tally", main="batches"))
        every_bucket = p | "Buckets" >> beam.Create([(b, []) for b in range(config.num_shards)])
        written = ((cleaned.batches, every_bucket)
                   | "AllBuckets" >> beam.Flatten()
                   | "Group" >> beam.GroupByKey()
                   | "Write" >> beam.ParDo(WriteShard(config, out_dir)))
        _ = ((cleaned.tally, written)
             | "AllTallies" >> beam.Flatten()
             | "Merge" >> beam.CombineGlobally(MergeTallies(config.samples_per_reason))
             | "Report" >> beam.Map(tally_lib.write, out_dir, config.num_shards))


class CleanShard(beam.DoFn):
    """One input shard -> batches of kept documents by bucket, and the shard's Tally."""

    def __init__(self, config: clean.Config):
        self.config = config

    def setup(self):
        self.filters = clean.build_filters(self.config)

    def process(self, path: str):
        config, start = self.config, time.time()
        tally = tally_lib.Tally(config.samples_per_reason)
        buffers: dict[int, list] = {}
        buffered = 0
        for doc in documents.read(path):
            raw = doc["text"]
            chars = len(raw) if isinstance(raw, str) else 0
            tally.docs_in += 1
            tally.chars_in += chars
            reason, doc = clean.clean_document(doc, config, self.filters)
            if reason:
                tally.drop(reason, doc, chars)
                continue
            key = clean.duplicate_key(doc["text"])
            bucket = int.from_bytes(key[:8], "big") % config.num_shards
            doc.pop("error", None)   # "" (falsy) came through as good; kept documents have a null error
            batch = buffers.setdefault(bucket, [])
            batch.append((key, chars, doc))
            buffered += len(doc["text"])
            if len(batch) >= BATCH_DOCS:
                yield bucket, buffers.pop(bucket)
            if buffered >= BUFFER_CHARS:
                yield from sorted(buffers.items())
                buffers, buffered = {}, 0
        yield from sorted(buffers.items())
        wall = time.time() - start
        log.info("clean: %s: %d docs in %.1f s (%.0f docs/s), %d dropped before dedup", path,
                 tally.docs_in, wall, tally.docs_in / max(wall, 1e-9), sum(tally.dropped.values()))
        yield beam.pvalue.TaggedOutput("tally", tally)


class WriteShard(beam.DoFn):
    """All kept documents of one bucket -> output shard `bucket` (duplicates dropped, sorted by id)."""

    def __init__(self, config: clean.Config, out_dir: str):
        self.config, self.out_dir = config, out_dir

    def process(self, element):
        bucket, batches = element
        tally = tally_lib.Tally(self.config.samples_per_reason)
        survivors: dict[bytes, tuple[int, dict]] = {}   # key -> (chars_in, doc) with the smallest doc_order
        kept: list[dict] = []
        for batch in batches:
            for key, chars, doc in batch:
                if not self.config.dedup:
                    kept.append(doc)
                    continue
                other = survivors.get(key)
                if other is not None and clean.doc_order(other[1]) <= clean.doc_order(doc):
                    tally.drop("duplicate", doc, chars)
                    continue
                if other is not None:
                    tally.drop("duplicate", other[1], other[0])
                survivors[key] = (chars, doc)
        kept.extend(doc for _, doc in survivors.values())
        kept.sort(key=clean.doc_order)
        for doc in kept:
            tally.keep(len(doc["text"]))
        path = storage.join(self.out_dir, documents.shard_name(bucket, self.config.num_shards))
        documents.write(path, kept)
        yield tally


class MergeTallies(beam.CombineFn):
    def __init__(self, samples_per_reason: int):
        self.samples_per_reason = samples_per_reason

    def create_accumulator(self):
        return tally_lib.Tally(self.samples_per_reason)

    def add_input(self, acc, tally):
        acc.merge(tally)
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs)
        for acc in accs:
            out.merge(acc)
        return out

    def extract_output(self, acc):
        return acc
