"""Document shards: the parquet files that download writes and clean reads and writes.

Schema (every column a nullable string):

    id      stable across runs: the same source record always gets the same id
    text    the document; null when the record had no usable text (see `error`)
    url     where it came from (a URL, or `path:line` for local files)
    source  which source produced it (`embedded`, `files`, `tfds/<name>`, `fineweb/<dump>`)
    error   null for a good record, else why it is unusable (`malformed_json`, `invalid_utf8`,
            `non_string_text`, …); clean counts these as rejections under that reason
    metadata  null, or a JSON object (sorted keys) of what else the source knows of the record, carried
            through clean unchanged except that language identification adds `language` and
            `language_score` (WARC: `{"date", "content_type", "charset", "warc_file", "warc_offset"}`,
            with `id` the WARC-Record-ID and `url` the WARC-Target-URI; jsonl and parquet files: the
            record's fields other than its text, id and URL, or those `download.Files.metadata_fields`
            names; FineWeb: its columns other than text, id and url, e.g. `dump`, `date`, `file_path`,
            `language`, `language_score`, `token_count`). Shards written before it existed read it as null.

Shards are named `docs-00003-of-00016.parquet` and written with a streaming `ParquetWriter`
through `stages.io.storage`, so a shard larger than memory is fine and `gs://` works unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from stages.io import storage

COLUMNS = ("id", "text", "url", "source", "error", "metadata")
SHARDS = "docs-*.parquet"      # the names `shard_name` gives, as a pattern for `Committed.paths`
ROWS_PER_GROUP = 2048


def shard_name(index: int, count: int, prefix: str = "docs") -> str:
    return f"{prefix}-{index:05d}-of-{count:05d}.parquet"


def shards_of(committed) -> list[str]:
    """The document shards a committed stage (download or clean) lists in its manifest, in order.

    FileNotFoundError naming the stage's output when it lists none.
    """
    paths = committed.paths(SHARDS)
    if not paths:
        raise FileNotFoundError(f"{committed.stage} output {committed.path} lists no {SHARDS} shards")
    return paths


def schema():
    import pyarrow as pa

    return pa.schema([(c, pa.string()) for c in COLUMNS])


def write(path: str, docs: Iterable[dict]) -> int:
    """Writes `docs` (dicts with the COLUMNS keys; missing ones are null) to one parquet file.

    Returns the number of rows written. An empty iterable still writes a valid, empty file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 0
    with storage.open(path, "wb") as f, pq.ParquetWriter(f, schema(), compression="zstd") as w:
        batch: list[dict] = []

        def flush():
            w.write_table(pa.Table.from_pylist(batch, schema=schema()))
            batch.clear()

        for doc in docs:
            batch.append({c: doc.get(c) for c in COLUMNS})
            rows += 1
            if len(batch) >= ROWS_PER_GROUP:
                flush()
        if batch or rows == 0:
            flush()
    return rows


def read(path: str, columns: Iterable[str] = COLUMNS) -> Iterator[dict]:
    """Yields the rows of one shard as dicts, one row group at a time (bounded memory).

    Columns absent from the file (a shard written by an older layout) come back as None.
    """
    for _, row in rows(path, columns):
        yield row


def rows(path: str, columns: Iterable[str] | None, row_group: int | None = None,
         absent_as_none: bool = True) -> Iterator[tuple[int, dict]]:
    """(row index in the file, {column: value}) for every row of any parquet file, or of one row group.

    The one parquet row reader: shards here, and the parquet sources download reads (FineWeb, files).
    Rows are decoded a batch at a time (bounded memory); columns the file lacks read as None (or, with
    `absent_as_none=False`, are left out of the dicts), and `columns=None` reads every column the file
    has (a struct column as a dict, a list as a list). A string that is not UTF-8 comes back as its bytes
    (`_values`).
    """
    import pyarrow.parquet as pq

    with storage.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        wanted = list(dict.fromkeys(pf.schema_arrow.names if columns is None else columns))
        have = [c for c in wanted if c in pf.schema_arrow.names]
        wanted = wanted if absent_as_none else have
        selection = {}
        row = 0
        if row_group is not None:
            selection = {"row_groups": [row_group]}
            row = sum(pf.metadata.row_group(g).num_rows for g in range(row_group))
        for batch in pf.iter_batches(columns=have, batch_size=ROWS_PER_GROUP, **selection):
            values = {c: _values(batch.column(c)) for c in have}
            for i in range(batch.num_rows):
                yield row, {c: values[c][i] if c in values else None for c in wanted}
                row += 1


def _values(column) -> list:
    """`column.to_pylist()`, except that a string that is not UTF-8 comes back as bytes rather than failing
    the whole batch with UnicodeDecodeError. Parquet readers do not check that a string column holds UTF-8,
    so a writer that does not check either, or a damaged page, can put any bytes there; download counts
    such a text as `invalid_utf8`, like a jsonl line's. Strings inside lists and structs are handled too."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        return [_utf8_or_bytes(v) for v in column.cast(_strings_as_binary(column.type)).to_pylist()]


def _strings_as_binary(t):
    """The arrow type `t` with every string in it (also inside lists and structs) as binary."""
    import pyarrow as pa

    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_strings_as_binary(f.type)) for f in map(t.field, range(t.num_fields))])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_strings_as_binary(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_strings_as_binary(t.value_type)))
    return t


def _utf8_or_bytes(value):
    """`value` (from `_strings_as_binary`) with every bytes value that is UTF-8 decoded back to str."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    if isinstance(value, dict):
        return {k: _utf8_or_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8_or_bytes(v) for v in value]
    return value
