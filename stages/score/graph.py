"""The score stage's Beam graph; `score.run` imports it, so Beam loads only when the stage runs.

    Create((index, download shard path)) -> Reshuffle -> ScoreShard     one element per download shard:
        writes scores-<index>-of-<count>.parquet (stages/score/table.py), rows in the shard's order;
        emits {docs, fixed: {reason: docs}}
    -> CombineGlobally(add) -> stats.json

A shard is streamed: documents are measured one at a time (`clean.document.score_document`) and the
columns computed for many at once (MinHash band keys, contamination matches, the classifier's `quality`) a
chunk of `CHUNK_DOCS` documents at a time, so a worker holds one chunk, never a shard. Each output file is
its input shard's alone, so a retried bundle rewrites the same bytes.
"""

from __future__ import annotations

import logging
import time

import apache_beam as beam

from stages import beam_runner
from stages.clean import contamination
from stages.clean.config import Config, scoring_filters
from stages.clean.document import score_document
from stages.clean.minhash import hasher
from stages.io import documents, storage
from stages.score import table

log = logging.getLogger(__name__)

CHUNK_DOCS = 256        # documents whose band keys and contamination matches are computed together


def run(config: Config, paths: list[str], out_dir: str, model=None) -> None:
    """`model`: a quality classifier's `Scorer` (stages/classifier/scoring.py), or None for no `quality`."""
    if config.minhash:
        hasher(config)   # a bad minhash_* setting fails here, naming itself, before Beam starts
    if problem := config.contamination.problem():
        raise contamination.MissingYardsticks(problem)    # one line, before Beam starts
    with beam_runner.pipeline(config.runner) as p:
        _ = (p
             | "Inputs" >> beam.Create(list(enumerate(paths)))
             | "Spread" >> beam.Reshuffle()
             | "Score" >> beam.ParDo(ScoreShard(config, out_dir, len(paths), model))
             | "Add" >> beam.CombineGlobally(add_counts)
             | "Stats" >> beam.Map(write_stats, out_dir, len(paths)))


class ScoreShard(beam.DoFn):
    """(index, download shard) -> its score table; emits the shard's counts."""

    def __init__(self, config: Config, out_dir: str, count: int, model=None):
        self.config, self.out_dir, self.count, self.model = config, out_dir, count, model

    def setup(self):
        self.filters = scoring_filters(self.config)
        self.hasher = hasher(self.config) if self.config.minhash else None
        check = self.config.contamination
        # Built here, in the worker, never pickled: its hashes are salted per process (contamination.py).
        self.index = contamination.index_for(check) if check.active else None

    def process(self, element):
        index, path = element
        start, counts = time.time(), {"docs": 0, "fixed": {}}
        out = storage.join(self.out_dir, table.shard_name(index, self.count))
        written = table.write(out, self._rows(path, counts))
        log.info("score: %s: %d docs in %.1f s", path, written, time.time() - start)
        yield counts

    def _rows(self, path: str, counts: dict):
        chunk: list[dict] = []
        for doc in documents.read(path):
            row = score_document(doc, self.config, self.filters)
            counts["docs"] += 1
            if row["fixed"]:
                counts["fixed"][row["fixed"]] = counts["fixed"].get(row["fixed"], 0) + 1
            chunk.append(row)
            if len(chunk) >= CHUNK_DOCS:
                yield from self._complete(chunk)
                chunk = []
        yield from self._complete(chunk)

    def _complete(self, chunk: list[dict]) -> list[dict]:
        """The rows of `chunk` with the columns computed for many documents at once."""
        scored = [row for row in chunk if not row["fixed"]]
        texts = [row["text"] for row in scored]
        if self.hasher is not None and scored:
            for row, keys in zip(scored, self.hasher.band_keys(texts)):
                row["bands"] = keys
        if self.index is not None and scored:
            for row, items in zip(scored, self.index.matches_many(texts)):
                row["contaminated"] = list(items)
        if self.model is not None and scored:
            for row, p in zip(scored, self.model.score_many(texts)):
                row["quality"] = float(p)
        return chunk


def add_counts(many) -> dict:
    out = {"docs": 0, "fixed": {}}
    for counts in many:
        out["docs"] += counts["docs"]
        for reason, n in counts["fixed"].items():
            out["fixed"][reason] = out["fixed"].get(reason, 0) + n
    return out


def write_stats(counts: dict, out_dir: str, shards: int) -> None:
    storage.write_json(storage.join(out_dir, "stats.json"),
                       {"docs": counts["docs"], "fixed": dict(sorted(counts["fixed"].items())),
                        "shards": shards})
