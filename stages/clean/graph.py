"""The clean stage's Beam graph; `clean.run` imports it, so Beam loads only when clean runs.

    Create(input shard paths) -> Reshuffle -> CleanShard      one element per input shard
        main:    (bucket, [(key, chars_in, doc, rewrites), ...])   batches of kept documents;
                 bucket = key % num_shards, key = clean.duplicate_key(normalized text),
                 rewrites = the kinds of text rewrite the document got (counted if it stays)
        "tally": that shard's Tally (docs and chars in, drops per reason, samples)
        "bands": (partition, [(band key, node), ...]), when `minhash` is on (below)
    + Create((b, []) for every bucket)                          so all N shards get written, even empty ones
    -> CoGroupByKey with the near-duplicate keys of bucket b
    -> WriteShard        dedups by key (keeping the copy first in `survivor_order`, a total order over
                         the whole record), drops near duplicates, checks the rest against the yardsticks
                         (contamination.py; drops the contaminated ones with `Contamination.drop`), sorts by
                         `order.doc_order`, writes shard b; emits a Tally of the kept documents, the
                         duplicates, the near duplicates and the contaminated, and
        "contamination": the bucket's contamination.Found (what its kept documents share with which items)
    -> Flatten(tallies) -> CombineGlobally(merge) -> stats.json and rejected/*.jsonl
    contamination -> CombineGlobally(merge) -> contamination.json

Near duplicates (`clean.Config.minhash`; the method is in minhash.py):
    CleanShard "bands": (partition, [(band key, node), ...])  every kept document's 14 LSH band keys,
                        partition = band key % num_shards; node = minhash.node(id, duplicate key)
    -> GroupByKey -> LinkBand         per partition: nodes sharing a band key are joined in a local
                                      union-find; emits its forest as [(node, smallest node of its set)]
    -> CombineGlobally(Components)    the union of the forests; Beam combines partial forests on the
                                      workers and merges them in one, which holds every document that
                                      has a candidate (not every document): O(near-duplicate documents)
    -> FlatMap(near_duplicates)       per bucket: the duplicate keys whose node is not the smallest of its
                                      cluster, so WriteShard drops them; survivors stay where they are
The one-worker merge is the part that does not scale out: at FineWeb's scale (billions of documents)
the components step would become rounds of distributed label propagation (large-star/small-star);
here it keeps every element a batch and costs one dict entry per document that has a candidate.

Elements are files and batches, never single documents (a local runner costs ~50 us per element).
An input shard is streamed one row group at a time; an output shard is held in memory once, by the
worker that sorts and writes it, so choose `num_shards` to keep shards to a few hundred MB.

Spilling (every runner but Dataflow, whose shuffle service holds the groups on its own disks): Beam's
local runner keeps a GroupByKey's whole input in memory until the step after it runs, which would make
the stage hold every kept document and every band key of the corpus at once. So CleanShard writes each
batch and each band batch to a file of its own in a scratch directory on the local disk (`spill`,
deleted when the stage ends) and the groups carry the files' paths; WriteShard and LinkBand read their
group's files. The outputs are the same bytes either way (tests/stages/test_clean.py).
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import time

import apache_beam as beam

from stages import beam_runner
from stages.clean import contamination, minhash, select
from stages.clean import tally as tally_lib
from stages.clean.config import Config, build_filters, scoring_filters
from stages.clean.document import decide_document
from stages.clean.order import doc_order
from stages.io import documents, storage

log = logging.getLogger(__name__)

BATCH_DOCS = 1024            # documents per (bucket, batch) element
BUFFER_CHARS = 64 * 2**20    # flush every bucket's batch when this much text is buffered in one worker
BAND_BATCH = 1 << 16         # (band key, node) entries per (partition, batch) element


def run(config: Config, paths: list[str], out_dir: str, work_dir: str | None = None,
        bpb_paths: list[str] | None = None) -> None:
    """`paths`: the score tables (stages/score/table.py) of one source; `bpb_paths`: the perplexity stage's
    column of each (stages/perplexity/column.py), or None when the run has no reference model."""
    bpb_paths = list(bpb_paths) if bpb_paths else [None] * len(paths)
    if len(bpb_paths) != len(paths):
        raise ValueError(f"{len(bpb_paths)} perplexity columns for {len(paths)} score tables; "
                         "rerun perplexity")
    if problem := config.contamination.problem():
        raise contamination.MissingYardsticks(problem)    # one line, before Beam starts
    cut = None
    if config.keep_top is not None and config.keep_top.keep_fraction is not None:
        start = time.time()
        ranked = select.survivors(config, paths, bpb_paths)
        cut = select.cutoff(config.keep_top, ranked)
        log.info("clean: keep_top ranks %d documents the filters kept by %s in %.1f s; keeps %d", len(ranked),
                 config.keep_top.score, time.time() - start,
                 select.count(config.keep_top.keep_fraction, len(ranked)))
    with beam_runner.spill_dir(config.runner, "clean", work_dir) as spill_dir:
        _build_and_run(config, list(zip(paths, bpb_paths)), out_dir, spill_dir, cut)


def _build_and_run(config: Config, paths: list[tuple], out_dir: str, spill_dir: str | None, cut) -> None:
    """`paths`: (score table, its perplexity column or None) pairs."""
    with beam_runner.pipeline(config.runner) as p:
        cleaned = (p
                   | "Inputs" >> beam.Create(paths)
                   | "Spread" >> beam.Reshuffle()
                   | "Clean" >> beam.ParDo(CleanShard(config, spill_dir, cut)).with_outputs(
                       "tally", "bands", main="batches"))
        every_bucket = p | "Buckets" >> beam.Create([(b, []) for b in range(config.num_shards)])
        batches = (cleaned.batches, every_bucket) | "AllBuckets" >> beam.Flatten()
        if config.minhash:
            near = (cleaned.bands
                    | "GroupBands" >> beam.GroupByKey()
                    | "LinkBands" >> beam.Map(link_band)
                    | "Components" >> beam.CombineGlobally(Components())
                    | "NearDuplicates" >> beam.FlatMap(near_duplicates, config.num_shards))
        else:
            near = p | "NoNearDuplicates" >> beam.Create([])
        written = ({"docs": batches, "near": near}
                   | "Group" >> beam.CoGroupByKey()
                   | "Write" >> beam.ParDo(WriteShard(config, out_dir)).with_outputs("contamination",
                                                                                      main="tally"))
        _ = (written.contamination
             | "MergeFound" >> beam.CombineGlobally(MergeFound())
             | "Contamination" >> beam.Map(contamination.write, out_dir, config.contamination))
        _ = ((cleaned.tally, written.tally)
             | "AllTallies" >> beam.Flatten()
             | "Merge" >> beam.CombineGlobally(MergeTallies(config.samples_per_reason))
             | "Report" >> beam.Map(tally_lib.write, out_dir, config.num_shards))


class CleanShard(beam.DoFn):
    """One score table (stages/score/table.py) -> batches of kept documents by bucket, and the shard's Tally.
    With `spill_dir`, each batch (and band batch) goes to a file there and the element carries its path
    (`spill`). It decides, never measures: every filter's attributes, the duplicate key, the band keys and
    the contamination matches are the score table's."""

    def __init__(self, config: Config, spill_dir: str | None = None, cut: tuple | None = None):
        self.config, self.spill_dir, self.cut = config, spill_dir, cut   # cut: select.cutoff's

    def setup(self):
        self.filters = build_filters(self.config)
        self.positions = {type(f).__name__: i for i, f in enumerate(scoring_filters(self.config))}

    def process(self, paths: tuple[str, str | None]):
        for tag, (key, batch) in self._process(*paths):
            if tag == "tally":
                yield beam.pvalue.TaggedOutput("tally", batch)
                continue
            if self.spill_dir is not None:
                batch = spill(self.spill_dir, batch)
            yield (key, batch) if tag == "batches" else beam.pvalue.TaggedOutput("bands", (key, batch))

    def _process(self, path: str, bpb_path: str | None = None):
        """("batches", (bucket, batch)), ("bands", (partition, batch)) and last ("tally", (None, Tally))."""
        config, start = self.config, time.time()
        tally = tally_lib.Tally(config.samples_per_reason)
        buffers: dict[int, list] = {}
        buffered = 0
        bands: dict[int, list] = {}              # partition -> [(band key, node), ...]
        for row in select.rows(path, bpb_path):
            chars = row["chars_in"]
            tally.docs_in += 1
            tally.chars_in += chars
            reason, doc = decide_document(row, self.filters, self.positions)
            if not reason and config.keep_top is not None and not select.kept(config.keep_top, row, self.cut):
                reason = config.keep_top.reason
            if reason:
                tally.drop(reason, doc, chars)
                continue
            key = row["dup_key"]
            bucket = int.from_bytes(key[:8], "big") % config.num_shards
            batch = buffers.setdefault(bucket, [])
            batch.append((key, chars, doc, tuple(row["rewrites"] or ()), row["contaminated"]))
            buffered += len(doc["text"])
            if config.minhash:
                n = minhash.node(doc.get("id"), key)
                for band_key in row["bands"] or ():
                    part = int.from_bytes(band_key[1:9], "big") % config.num_shards
                    bands.setdefault(part, []).append((band_key, n))
                    if len(bands[part]) >= BAND_BATCH:
                        yield "bands", (part, bands.pop(part))
            if len(batch) >= BATCH_DOCS:
                yield "batches", (bucket, buffers.pop(bucket))
            if buffered >= BUFFER_CHARS:
                yield from (("batches", item) for item in sorted(buffers.items()))
                buffers, buffered = {}, 0
        yield from (("batches", item) for item in sorted(buffers.items()))
        yield from (("bands", item) for item in sorted(bands.items()))
        wall = time.time() - start
        log.info("clean: %s: %d docs in %.1f s (%.0f docs/s), %d dropped before dedup", path,
                 tally.docs_in, wall, tally.docs_in / max(wall, 1e-9), sum(tally.dropped.values()))
        yield "tally", (None, tally)


def spill(directory: str, batch: list) -> str:
    """`batch` pickled into a new file of `directory`; its path, which `unspilled` reads back."""
    fd, path = tempfile.mkstemp(suffix=".pkl", dir=directory)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def unspilled(batch: list | str) -> list:
    """A group's batch: as it came, or read back from the file `spill` wrote (kept until the stage ends,
    so that a retried bundle reads it again)."""
    if not isinstance(batch, str):
        return batch
    with open(batch, "rb") as f:
        return pickle.load(f)


def link_band(element) -> list[tuple]:
    """(partition, batches of (band key, node)) -> the forest joining nodes that share a band key."""
    _, batches = element
    first: dict[bytes, tuple] = {}   # band key -> the first node seen with it
    forest = minhash.UnionFind()
    for batch in batches:
        for band_key, n in unspilled(batch):
            other = first.setdefault(band_key, n)
            if other != n:
                forest.union(other, n)
    return forest.edges()


class Components(beam.CombineFn):
    """Forests of candidate edges -> one UnionFind: the clusters, each named by its smallest node."""

    def create_accumulator(self):
        return minhash.UnionFind()

    def add_input(self, acc, edges):
        acc.union_all(edges)
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs)
        for acc in accs:
            out.union_all(acc.edges())
        return out

    def extract_output(self, acc):
        return acc


def near_duplicates(forest: minhash.UnionFind, num_shards: int):
    """(bucket, sorted duplicate keys to drop) for the documents that are not their cluster's survivor.

    The survivor is the cluster's smallest node, (id, duplicate key) (`minhash.node`): a total order over
    the nodes, and two documents share a node only when they share the id and the normalized text, so
    the survivor depends only on which documents there are, never on the order the edges arrived in.
    Exact copies share a duplicate key and so a cluster; a key is dropped unless it is the survivor's key,
    and exact dedup (in WriteShard) keeps one copy of the survivor's key by the whole record
    (`survivor_order`), so copies that differ only in metadata are settled there."""
    drop: dict[int, set[bytes]] = {}
    for n, root in forest.components().items():
        key = minhash.node_key(n)
        if key != minhash.node_key(root):
            drop.setdefault(int.from_bytes(key[:8], "big") % num_shards, set()).add(key)
    for bucket in sorted(drop):
        yield bucket, sorted(drop[bucket])


class WriteShard(beam.DoFn):
    """All kept documents of one bucket -> output shard `bucket` (duplicates and near duplicates
    dropped, then contaminated documents when `Contamination.drop`; sorted by id)."""

    def __init__(self, config: Config, out_dir: str):
        self.config, self.out_dir = config, out_dir

    def setup(self):
        # Built here, in the worker, never pickled: its hashes are salted per process (contamination.py).
        check = self.config.contamination
        self.index = contamination.index_for(check) if check.active else None

    def process(self, element):
        bucket, grouped = element
        batches = grouped["docs"]
        near = {key for keys in grouped["near"] for key in keys}   # keys of near duplicates to drop
        tally = tally_lib.Tally(self.config.samples_per_reason)
        # key -> (order, chars_in, doc, rewrites, items) of the copy with the smallest `survivor_order`
        survivors: dict[bytes, tuple[tuple, int, dict, tuple[str, ...], list | None]] = {}
        kept: list[tuple[dict, int, tuple[str, ...], list | None]] = []   # (doc, chars_in, rewrites, items)
        for batch in batches:
            for key, chars, doc, rewrites, items in unspilled(batch):
                if not self.config.dedup:
                    if key in near:
                        tally.drop("near_duplicate", doc, chars)
                    else:
                        kept.append((doc, chars, rewrites, items))
                    continue
                order = survivor_order(doc, chars, rewrites)
                other = survivors.get(key)
                if other is not None and other[0] <= order:
                    tally.drop("duplicate", doc, chars)
                    continue
                if other is not None:
                    tally.drop("duplicate", other[2], other[1])
                survivors[key] = (order, chars, doc, rewrites, items)
        for key, (_, chars, doc, rewrites, items) in survivors.items():
            if key in near:
                tally.drop("near_duplicate", doc, chars)
            else:
                kept.append((doc, chars, rewrites, items))
        if self.index is not None:
            kept, found = self._check_contamination(kept, tally)
            yield beam.pvalue.TaggedOutput("contamination", found)
        # Rows equal under doc_order are equal in every column, so their order cannot show in the file.
        kept.sort(key=lambda kept_doc: doc_order(kept_doc[0]))
        for doc, _, rewrites, _ in kept:
            tally.keep(len(doc["text"]), rewrites)
        path = storage.join(self.out_dir, documents.shard_name(bucket, self.config.num_shards))
        documents.write(path, [doc for doc, _, _, _ in kept])
        yield tally

    def _check_contamination(self, kept: list, tally: tally_lib.Tally) -> tuple[list, contamination.Found]:
        """(the documents to write: all of `kept`, or the clean ones with `drop`; which yardstick items the
        kept documents share an n-gram with, as the score table found them)."""
        found, out = contamination.Found.of(self.index), []
        for doc, chars, rewrites, items in kept:
            if items is None:
                raise ValueError(f"the score table has no contamination matches for document "
                                 f"{doc.get('id')!r}, while clean checks the yardsticks: rerun score")
            if items:
                found.add(self.index, doc.get("id"), items)
                if self.config.contamination.drop:
                    tally.drop(contamination.REASON, doc, chars)
                    continue
            out.append((doc, chars, rewrites, items))
        return out, found


def survivor_order(doc: dict, chars: int, rewrites: tuple[str, ...]) -> tuple:
    """Which copy of a text exact dedup keeps: the smallest `doc_order` (the whole record, id first: see
    order.py), then the fewest characters as downloaded and the rewrites, which stats.json counts
    (`dropped_chars`, `rewritten`) and which can differ between copies whose written rows are equal
    (the same id and normalized text from two differently spaced originals). A total order over all
    that the stage writes, so the survivor never depends on which copy a worker met first."""
    return doc_order(doc), chars, rewrites


class MergeFound(beam.CombineFn):
    """The buckets' contamination.Found -> one (counts add; each item keeps its smallest document id)."""

    def create_accumulator(self):
        return contamination.Found()

    def add_input(self, acc, found):
        acc.merge(found)
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs)
        for acc in accs:
            out.merge(acc)
        return out

    def extract_output(self, acc):
        return acc


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
