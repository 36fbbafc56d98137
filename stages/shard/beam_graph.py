"""The shard stage's Beam graph: clean shards -> token chunks -> fixed-size llm.c shards.

    (i, docs path)                                      one element per clean shard
      -> Tokenize   (split, i, offset in shard i, docs, tokens)    chunks of ~CHUNK_TOKENS tokens
      -> Count      (split, i) -> (tokens, docs)  -> Layout: where each clean shard starts in each split
      -> Cut        (split, output shard) -> (offset in it, tokens)   using the layout side input
      -> GroupByKey -> Write one `<split>-XXXXX.bin` per key; Layout -> `manifest.json`
    Tokenize's "lowest": per clean shard, the (split_rule.fraction(id), tokens) of the few documents with the
      lowest fractions that hold `min_val_tokens` (split_rule.lowest) -> merged -> `work_dir/lowest.json`,
      from which the guard computes the val_fraction a too-small val split needs (scratch, not output:
      `seq_len`, which sets the target, is not in the key)

Elements are whole clean shards and chunks of millions of tokens, never single documents, and
tokens travel as numpy arrays in the shard dtype. Offsets, not arrival order, decide where tokens
land, so the output is the same however Beam bundles and orders the work. Cut needs every count
first, so the chunks are materialized once: on Dataflow on its disks; on a local runner, which would
hold them all in memory, each chunk's tokens go to a file of a scratch directory (`spill_dir`) and
the elements carry `Spilled` ranges of those files, which the writer reads a piece at a time: memory
holds about one output shard, whatever the corpus.
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
from collections.abc import Iterator

import apache_beam as beam
import numpy as np

from stages.io import documents, llmc, split_rule, storage
from stages.shard.config import SPLITS, Config

CHUNK_TOKENS = 1 << 22      # tokens a Tokenize chunk gathers before it is emitted (8 MiB as uint16)
LOWEST = "lowest.json"      # in work_dir: split_rule.lowest of every document, for the val split's guard
LOWEST_KEPT = 1 << 16       # (fraction, tokens) pairs a Tokenize worker holds before trimming them


def build(p: beam.Pipeline, config: Config, doc_shards: list[str], model: bytes, out_dir: str,
          manifest: dict, work_dir: str, spill_dir: str | None = None) -> None:
    """Adds the stage to `p`. `manifest` holds the fixed fields; the split totals are added to it. With
    `spill_dir` (a local directory) the token chunks wait there, not in memory."""
    vocab_size = manifest["vocab_size"]
    tokenize = Tokenize(config, model, llmc.dtype_for(vocab_size), spill_dir)
    tokenized = (p
                 | "CleanShards" >> beam.Create(list(enumerate(doc_shards)))
                 | "Spread" >> beam.Reshuffle()
                 | "Tokenize" >> beam.ParDo(tokenize).with_outputs("lowest", main="chunks"))
    chunks = tokenized.chunks
    _ = (tokenized.lowest
         | "AllLowest" >> beam.combiners.ToList()
         | "WriteLowest" >> beam.Map(write_lowest, config.min_val_tokens, storage.join(work_dir, LOWEST)))
    layout = (chunks
              | "Count" >> beam.Map(_count)
              | "SumPerShard" >> beam.CombinePerKey(_sum_pairs)
              | "AllCounts" >> beam.combiners.ToList()
              | "Layout" >> beam.Map(make_layout))
    _ = (chunks
         | "Cut" >> beam.FlatMap(cut, beam.pvalue.AsSingleton(layout), config.tokens_per_shard)
         | "GroupShards" >> beam.GroupByKey()
         | "Write" >> beam.Map(write_shard, beam.pvalue.AsSingleton(layout), config.tokens_per_shard,
                               vocab_size, out_dir))
    _ = layout | "Manifest" >> beam.Map(write_manifest, manifest, out_dir)


class Tokenize(beam.DoFn):
    """(i, clean shard path) -> (split, i, offset within shard i's part of split, docs, tokens (N,)), and,
    tagged "lowest", the shard's `split_rule.lowest` documents for `min_val_tokens`."""

    def __init__(self, config: Config, model: bytes, dtype: np.dtype, spill_dir: str | None = None):
        self.config, self.model, self.dtype, self.spill_dir = config, model, dtype, spill_dir

    def setup(self):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_proto=self.model)

    def process(self, element: tuple[int, str]) -> Iterator[tuple]:
        index, path = element
        pending: dict[str, list[list[int]]] = {s: [] for s in SPLITS}    # encoded docs not yet emitted
        pending_tokens = dict.fromkeys(SPLITS, 0)
        emitted = dict.fromkeys(SPLITS, 0)
        lowest: list[tuple[float, int]] = []     # (fraction(id), tokens) of documents, trimmed as it grows

        def flush(split):
            docs, offset = pending[split], emitted[split]
            tokens = np.fromiter(itertools.chain.from_iterable(docs), dtype=self.dtype,
                                 count=pending_tokens[split])
            pending[split], pending_tokens[split], emitted[split] = [], 0, offset + len(tokens)
            if self.spill_dir is not None:
                tokens = Spilled.write(self.spill_dir, tokens)
            return split, index, offset, len(docs), tokens

        for batch in _batches(documents.read(path, columns=("id", "text")), self.config.docs_per_batch):
            batch = [d for d in batch if d["text"] is not None]   # unusable records carry no text
            # One call per batch: sentencepiece's C++ loop, not Python, walks the documents.
            encoded = self.sp.encode([d["text"] for d in batch], add_bos=self.config.add_bos, add_eos=True,
                                     num_threads=1)   # Beam runs one worker per core
            for doc, ids in zip(batch, encoded):
                fraction = split_rule.fraction(doc["id"], path)
                split = "val" if fraction < self.config.val_fraction else "train"
                pending[split].append(ids)
                pending_tokens[split] += len(ids)
                lowest.append((fraction, len(ids)))
            if len(lowest) > LOWEST_KEPT:
                lowest = split_rule.lowest(lowest, self.config.min_val_tokens)
            for split in SPLITS:
                if pending_tokens[split] >= CHUNK_TOKENS:
                    yield flush(split)
        for split in SPLITS:
            if pending[split]:
                yield flush(split)
        yield beam.pvalue.TaggedOutput("lowest", split_rule.lowest(lowest, self.config.min_val_tokens))


class Spilled:
    """Tokens [start, stop) of a file of raw tokens that `write` made: what a chunk or a piece of one is
    while it waits for the writer, instead of the array. Sliced like the array; `array()` reads it."""

    def __init__(self, path: str, dtype: str, start: int, stop: int):
        self.path, self.dtype, self.start, self.stop = path, dtype, start, stop

    @classmethod
    def write(cls, directory: str, tokens: np.ndarray) -> Spilled:
        fd, path = tempfile.mkstemp(suffix=".tokens", dir=directory)
        with os.fdopen(fd, "wb") as f:
            tokens.tofile(f)
        return cls(path, tokens.dtype.name, 0, len(tokens))

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, where: slice) -> Spilled:
        start, stop, step = where.indices(len(self))
        if step != 1:
            raise ValueError("a spilled range slices with step 1 only")
        return Spilled(self.path, self.dtype, self.start + start, self.start + max(start, stop))

    def array(self) -> np.ndarray:
        dtype = np.dtype(self.dtype)
        return np.fromfile(self.path, dtype=dtype, count=len(self), offset=self.start * dtype.itemsize)


def make_layout(counts: list[tuple[tuple[str, int], tuple[int, int]]]) -> dict:
    """Per clean shard (tokens, docs) -> where each starts in its split, and the split totals.

    {"start": {(split, i): first token of shard i in split}, "tokens": {split: n}, "docs": {split: n}}
    """
    layout = {"start": {}, "tokens": dict.fromkeys(SPLITS, 0), "docs": dict.fromkeys(SPLITS, 0)}
    for (split, index), (tokens, docs) in sorted(counts):
        layout["start"][split, index] = layout["tokens"][split]
        layout["tokens"][split] += tokens
        layout["docs"][split] += docs
    return layout


def cut(chunk: tuple, layout: dict, tokens_per_shard: int) -> Iterator[tuple[tuple[str, int], tuple]]:
    """A chunk -> its pieces, keyed by (split, output shard), each with its offset in that shard."""
    split, index, offset, _, tokens = chunk
    start = layout["start"][split, index] + offset      # the chunk's first token in the split's stream
    pos = 0
    while pos < len(tokens):
        shard, within = divmod(start + pos, tokens_per_shard)
        end = min(len(tokens), pos + tokens_per_shard - within)
        yield (split, shard), (within, tokens[pos:end])
        pos = end


def write_shard(keyed: tuple[tuple[str, int], list], layout: dict, tokens_per_shard: int, vocab_size: int,
                out_dir: str) -> None:
    (split, shard), pieces = keyed
    pieces = sorted(pieces, key=lambda piece: piece[0])
    want = min(tokens_per_shard, layout["tokens"][split] - shard * tokens_per_shard)
    at = 0
    for offset, tokens in pieces:
        if offset != at:
            raise RuntimeError(f"{split} shard {shard}: a piece starts at token {offset}, expected {at}")
        at += len(tokens)
    if at != want:
        raise RuntimeError(f"{split} shard {shard}: pieces hold {at} tokens, the layout says {want}")
    arrays = [t.array() if isinstance(t, Spilled) else t for _, t in pieces]
    llmc.write(storage.join(out_dir, shard_name(split, shard)), arrays, vocab_size)


def write_manifest(layout: dict, manifest: dict, out_dir: str) -> None:
    tokens_per_shard = manifest["tokens_per_shard"]
    splits = {}
    for split in SPLITS:
        total = layout["tokens"][split]
        count = math.ceil(total / tokens_per_shard)
        splits[split] = {
            "tokens": total,
            "docs": layout["docs"][split],
            "shards": [{"file": shard_name(split, i),
                        "tokens": min(tokens_per_shard, total - i * tokens_per_shard)} for i in range(count)],
        }
    storage.write_json(storage.join(out_dir, "manifest.json"), manifest | {"splits": splits})


def write_lowest(lists: list[list[tuple[float, int]]], tokens: int, path: str) -> None:
    """Every clean shard's `split_rule.lowest` documents -> the corpus's: JSON [[fraction, tokens], ...]."""
    storage.write_json(path, split_rule.lowest(itertools.chain.from_iterable(lists), tokens))


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def _count(chunk: tuple) -> tuple[tuple[str, int], tuple[int, int]]:
    split, index, _, docs, tokens = chunk
    return (split, index), (len(tokens), docs)


def _sum_pairs(pairs) -> tuple[int, int]:
    tokens = docs = 0
    for t, d in pairs:
        tokens, docs = tokens + t, docs + d
    return tokens, docs


def _batches(items, size: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(itertools.islice(it, size)):
        yield batch
