"""The score table: what the score stage writes and clean's selection reads, one row per downloaded document.

    table.write(path, rows)                 # rows: dicts with COLUMNS' keys (missing ones null)
    for row in table.read(path): ...        # one row group at a time
    table.read_column(path, "quality")      # one column, no text (make plan's keep-fraction ladder)

One file per download shard, `scores-00003-of-00016.parquet`, its rows in that shard's order:

    id, url, source, metadata  the document's (metadata with language id's `language`, `language_score`)
    text            the text clean would write: normalized, then rewritten by every rewriter (C4's lines, PII
                    masks); for a document dropped before any filter (`fixed`), the text its rejected sample
                    shows (download's text, or "" for `empty`, null for `null_text`)
    chars_in        characters of the text as downloaded (0 when it had none): stats.json's chars_in
    chars           characters of `text` (what a kept document adds to chars_kept; make plan's ladder)
    fixed           the reason no threshold can change: download's error, `null_text`, `empty`; else null
    attrs           JSON {filter class: its `filters.measure` attributes}, every filter scoring measured
    before          JSON [[filter position, the first 500 characters before that filter rewrote the text],
                    ...] (null when nothing rewrote it): the text a rejected sample shows when an earlier
                    filter drops the document
    rewrites        the kinds of rewrite the text got (`filters.Rewriter`), in filter order
    dup_key         `clean.duplicate_key` of `text` (16 bytes)
    bands           its MinHash LSH band keys (null: no shingle, or minhash off)
    contaminated    the yardstick item numbers it shares an n-gram with (contamination.Index order; null: off)
    quality         the quality classifier's probability of its positive label (null: no classifier)

A document's row depends only on the document and the scoring configuration, never on the others, which
is what lets selection change a threshold without scoring again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from stages.io import documents, storage

SHARDS = "scores-*.parquet"
PREFIX = "scores"
REJECTED_TEXT_CHARS = 500    # what a rejected sample shows (clean/tally.py's REJECTED_TEXT_CHARS)
# The columns and their arrow types (`schema`), in order.
TYPES = {"id": "string", "text": "string", "url": "string", "source": "string", "metadata": "string",
         "chars_in": "int64", "chars": "int64", "fixed": "string", "attrs": "string", "before": "string",
         "rewrites": "list<string>", "dup_key": "binary", "bands": "list<binary>",
         "contaminated": "list<int32>", "quality": "float64"}
COLUMNS = tuple(TYPES)
MODEL_SCORES = ("quality",)          # the score columns a model computes (clean.ScoreFilter's `score`)


def shards_of(committed) -> list[str]:
    """The score tables a committed score stage lists, in download's shard order."""
    paths = committed.paths(SHARDS)
    if not paths:
        raise FileNotFoundError(f"{committed.stage} output {committed.path} lists no {SHARDS} shards")
    return paths


def shard_name(index: int, count: int) -> str:
    return documents.shard_name(index, count, PREFIX)


def schema():
    import pyarrow as pa

    simple = {"string": pa.string(), "int64": pa.int64(), "binary": pa.binary(), "float64": pa.float64(),
              "int32": pa.int32()}
    def arrow(t: str):
        return pa.list_(simple[t[5:-1]]) if t.startswith("list<") else simple[t]
    return pa.schema([(name, arrow(t)) for name, t in TYPES.items()])


def write(path: str, rows: Iterable[dict]) -> int:
    """Writes `rows` to one parquet file (a row group per `documents.ROWS_PER_GROUP` rows); the number of
    rows. An empty iterable writes a valid, empty file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    written, batch = 0, []
    with storage.open(path, "wb") as f, pq.ParquetWriter(f, schema(), compression="zstd") as w:
        for row in rows:
            batch.append({c: row.get(c) for c in COLUMNS})
            written += 1
            if len(batch) >= documents.ROWS_PER_GROUP:
                w.write_table(pa.Table.from_pylist(batch, schema=schema()))
                batch.clear()
        if batch or written == 0:
            w.write_table(pa.Table.from_pylist(batch, schema=schema()))
    return written


def read(path: str, columns: Iterable[str] = COLUMNS) -> Iterator[dict]:
    """The rows of one score shard, one row group at a time (bounded memory)."""
    for _, row in documents.rows(path, columns):
        yield row


def read_column(path: str, column: str) -> list:
    """One column of one score shard, whole (a float column of a shard is 8 bytes a document)."""
    import pyarrow.parquet as pq

    with storage.open(path, "rb") as f:
        return pq.ParquetFile(f).read(columns=[column]).column(column).to_pylist()
