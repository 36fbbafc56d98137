"""Bits per byte of documents under the reference model: the perplexity stage's numbers.

    from stages.perplexity import Config, measure
    model = measure.load(committed_train)              # Reference(net, seq_len, key)
    sp = measure.tokenizer(committed_tokenizer)        # its SentencePieceProcessor
    measure.bits_per_byte(["A text.", ""], model, sp, Config())      # array([2.31, nan]): (N,) float64

A document's bits are evaluation's (`reference.document_bits`, what eval.json's reference_bpb sums over a
set), divided by the UTF-8 bytes of its own text. Documents are scored a group at a time (about
GROUP_BATCHES batches of tokens per scorer call, every window of the group packed together), so memory is
bounded by the group, never by the shard, and few batches run half empty.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from stages.io import documents, storage
from stages.perplexity import column
from stages.train import scoring, trained
from stages.yardstick_data import reference

log = logging.getLogger(__name__)

GROUP_BATCHES = 16      # (batch_size, window) batches of tokens per scorer call, about


@dataclasses.dataclass(frozen=True)
class Reference:
    """The reference model as the stage scores with it."""

    net: Any                    # the restored `model.Transformer` (`trained.restore`)
    seq_len: int                # training's sequence length: the window evaluation scores reference text in
    key: str | None = None      # the train output's cache key, when its manifest names one


def load(train) -> Reference:
    """The model of a committed train output (`stages.io.committed.Committed`), as evaluation restores it
    (its final checkpoint; a mixture of experts dropless, as evaluate.Config's default scores it)."""
    summary = storage.read_json(train.file("summary.json"))
    net, _, _ = trained.restore(train, summary)
    return Reference(net, summary["seq_len"], train.manifest.get("key"))


def tokenizer(committed):
    """The SentencePieceProcessor of a committed tokenizer output; its EOS is the first window's prefix."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(committed.file("tokenizer.model")))
    if sp.eos_id() < 0:
        raise ValueError(f"tokenizer {committed.path}: its model has no EOS piece (eos_id={sp.eos_id()}); a "
                         f"document's first window is conditioned on EOS, as in training and evaluation")
    return sp


def window(config, model: Reference) -> int:
    """Tokens per scored window: config.max_length, or training's seq_len for 0."""
    length = config.max_length or model.seq_len
    if length > model.net.config.max_seq_len:
        raise ValueError(f"perplexity.Config.max_length={config.max_length}: longer than the reference "
                         f"model's max_seq_len={model.net.config.max_seq_len}; set it to at most that, or 0 "
                         f"for training's seq_len ({model.seq_len})")
    return length


def scorer(model: Reference, sp, config) -> scoring.Scorer:
    """The packed scorer: rows of `config.batch_size`, rolling windows of `window` tokens after EOS."""
    return scoring.Scorer(model.net, prefix_id=sp.eos_id(), rows=config.batch_size,
                          length=window(config, model))


def bits_per_byte(texts: Sequence, model: Reference, tokenizer, config) -> np.ndarray:
    """(N,) float64: each text's bits per byte under `model` (a `Reference`), tokenized with `tokenizer` (its
    SentencePieceProcessor) and scored with `config` (a `perplexity.Config`'s batch_size and max_length);
    NaN for a text with nothing to score (None, "", bytes, or no token). The stage's column, in-process."""
    found = list(document_bits(scorer(model, tokenizer, config), tokenizer, texts))
    bits = np.asarray([b for b, _ in found], np.float64).reshape(len(found))                   # (N,)
    nbytes = np.asarray([n for _, n in found], np.float64).reshape(len(found))                 # (N,)
    with np.errstate(invalid="ignore", divide="ignore"):
        return bits / nbytes


def document_bits(scorer, sp, texts: Iterable) -> Iterator[tuple[float, int]]:
    """(bits, UTF-8 bytes) of each text in order, a group of about GROUP_BATCHES batches of tokens at a time
    (`reference.document_bits`); (NaN, 0) for a text with nothing to score: not a string (a null, or a shard
    value that is not UTF-8 and reads back as bytes), empty, or encoding to no token (whitespace)."""
    budget = GROUP_BATCHES * scorer.rows * scorer.length
    group: list[tuple[list[int], int]] = []        # (ids, bytes) of each document; ([], 0) for one not scored
    held = 0
    for text in texts:
        ids = sp.encode(text) if isinstance(text, str) and text else []
        group.append((ids, len(text.encode("utf-8")) if ids else 0))
        held += len(ids)
        if held >= budget:
            yield from _scored(scorer, group)
            group, held = [], 0
    yield from _scored(scorer, group)


def _scored(scorer, group: list[tuple[list[int], int]]) -> Iterator[tuple[float, int]]:
    bits = iter(reference.document_bits(scorer, [ids for ids, _ in group if ids]))
    for ids, nbytes in group:
        yield (float(next(bits)) if ids else math.nan), nbytes


def score_shards(paths: Sequence[str], model: Reference, sp, config, out_dir: str) -> dict:
    """Writes `bpb-XXXXX-of-YYYYY.parquet` (`column.write`) into `out_dir` for each shard of `paths` (an `id`
    and a `text` column each), and returns stats.json's dict."""
    s = scorer(model, sp, config)
    values: list[np.ndarray] = []                   # each shard's bpb column
    total = {"documents": 0, "scored": 0, "bytes": 0, "bits": 0.0}
    progress = _Progress(config.log_every, len(paths))
    for i, path in enumerate(paths):
        ids: list[str | None] = []
        bits, nbytes = [], []
        for b, n in document_bits(s, sp, _texts(path, ids)):
            bits.append(b)
            nbytes.append(n)
            progress.step(i)
        bits_a, bytes_a = np.asarray(bits, np.float64), np.asarray(nbytes, np.int64)     # (D,) each
        with np.errstate(invalid="ignore", divide="ignore"):
            bpb = bits_a / bytes_a                                                   # (D,), NaN unscored
        column.write(storage.join(out_dir, column.shard_name(i, len(paths))), ids, bpb)
        scored = ~np.isnan(bpb)
        values.append(bpb[scored])
        total["documents"] += len(bpb)
        total["scored"] += int(scored.sum())
        total["bytes"] += int(bytes_a[scored].sum())
        total["bits"] += float(bits_a[scored].sum())
    progress.done()
    every = np.concatenate(values) if values else np.zeros(0)
    stats = {"documents": total["documents"], "scored": total["scored"], "bytes": total["bytes"],
             "bits_per_byte": total["bits"] / total["bytes"] if total["bytes"] else None,
             "mean_bpb": float(every.mean()) if len(every) else None,
             "median_bpb": float(np.median(every)) if len(every) else None,
             "window": s.length, "batch_size": config.batch_size}
    if model.key:
        stats["reference_key"] = model.key
    return stats


def _texts(path: str, ids: list) -> Iterator:
    """The `text` of each row of a document shard, in order (a row group at a time), its `id` appended to
    `ids` as it is read."""
    for row in documents.read(path, ("id", "text")):
        ids.append(row["id"])
        yield row["text"]


class _Progress:
    """A log line every `every` documents: how many, in which shard, how fast."""

    def __init__(self, every: int, shards: int):
        self.every, self.shards, self.count, self.start = every, shards, 0, time.perf_counter()

    def step(self, shard: int) -> None:
        self.count += 1
        if self.count % self.every == 0:
            seconds = time.perf_counter() - self.start
            log.info("perplexity: %d documents scored (shard %d of %d), %.0f documents/s", self.count,
                     shard + 1, self.shards, self.count / max(seconds, 1e-9))

    def done(self) -> None:
        log.info("perplexity: %d documents in %d shards scored in %.1f s", self.count, self.shards,
                 time.perf_counter() - self.start)
