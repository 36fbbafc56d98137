"""Documents out of files: jsonl and txt (optionally gzipped) and parquet, through `stages.io.storage`.

A unit of work is `(path, part)`: `part` is a parquet row group, or 0 for a file read whole
(gzip cannot be split). Ids and URLs fall back to the position in the file when a record
carries none: `path:line` (1-based) for jsonl and paragraphs, `path:row` (0-based) for parquet.

`Fields` names a record's text, id and URL by path (`text`, or `metadata.url` in a nested object or a
parquet struct column: `document.field`). A jsonl or parquet record's other fields go into the
`metadata` column as a JSON object (`Fields.metadata`: ("*",) all of them, () none, or the paths to
keep); with a `Fields.template`, instruction-tuning records are rendered into the text (`templates.py`).

A UTF-8 byte-order mark at the start of a jsonl or txt file is dropped (`BOM`).

A damaged file (a corrupt or truncated gzip stream, a broken parquet footer or page) raises
`document.BadFile` naming it and how far reading got, after the records before the damage: jsonl
keeps every line before it, parquet every batch before it, a txt file nothing (it is one read).

    units = formats.units(["data/a.jsonl.gz", "data/b.parquet"], text_field="text")
    for doc in formats.read(*units[0], fields=formats.Fields(text="text")): ...
"""

from __future__ import annotations

import codecs
import concurrent.futures
import contextlib
import dataclasses
import decimal
import io
import json
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO

from stages.download import templates
from stages.download.document import (
    MISSING,
    BadFile,
    doc_id,
    field,
    metadata_json,
    plain_str,
    present,
    text_or_error,
    without,
)
from stages.io import documents, storage

ALL = "*"               # Fields.metadata: every field not taken for the id, text or URL
SUFFIXES = {".jsonl": "jsonl", ".jsonl.gz": "jsonl", ".txt": "txt", ".txt.gz": "txt", ".parquet": "parquet"}
BATCH_ROWS = 1024       # records read at a time
FOOTER_READERS = 16     # parquet footers are small, remote reads are latency-bound: read them in parallel
# A UTF-8 byte-order mark some editors (Notepad, Excel exports) put first in a file: not part of the first
# record, which would otherwise fail as malformed_json (jsonl) or start with U+FEFF (txt). Stripped once,
# at the start of the (decompressed) file.
BOM = codecs.BOM_UTF8


@dataclasses.dataclass(frozen=True)
class Fields:
    """Where a record keeps its parts, as paths (`document.field`); "" for id/url means derive them from
    the position."""

    text: str = "text"
    id: str = ""
    url: str = "url"
    txt_unit: str = "file"     # "file" or "paragraph"
    source: str = "files"      # the `source` column of every document
    metadata: tuple[str, ...] = (ALL,)             # into `metadata`: (ALL,) every other field, () none, paths
    template: templates.Template | None = None     # render instruction-tuning records; None: the text field

    def columns(self) -> list[str] | None:
        """The parquet columns a record needs (a path's whole name and its first part), None for all."""
        if ALL in self.metadata:
            return None
        paths = [self.id, self.url, *self.metadata]
        paths += list(templates.INSTRUCTION_FIELDS) + [templates.MESSAGES] if self.template else [self.text]
        return list(dict.fromkeys(c for p in paths if p for c in (p, p.split(".")[0])))


def file_format(path: str) -> str:
    for suffix, fmt in SUFFIXES.items():
        if path.endswith(suffix):
            return fmt
    raise ValueError(f"{path} has an unsupported extension; supported are {', '.join(SUFFIXES)}")


def units(paths: Sequence[str], text_field: str | None, hint: str = "") -> list[tuple[str, int]]:
    """(path, part) for every file, one per row group for parquet (whose footers are read here, and
    checked for `text_field`'s column unless it is None)."""
    formats = [file_format(p) for p in paths]
    parquet = [p for p, fmt in zip(paths, formats) if fmt == "parquet"]
    row_groups = dict(zip(parquet, parquet_row_groups(parquet, text_field, hint)))
    out = []
    for path, fmt in zip(paths, formats):
        out += [(path, g) for g in range(row_groups[path])] if fmt == "parquet" else [(path, 0)]
    return sorted(out)


def read(path: str, part: int, fields: Fields) -> Iterator[dict]:
    fmt = file_format(path)
    if fmt == "jsonl":
        return _jsonl(path, fields)
    if fmt == "txt":
        return _txt(path, fields)
    return _parquet(path, part, fields)


# ---------------------------------------------------------------------------------------------

def _jsonl(path: str, fields: Fields) -> Iterator[dict]:
    line, offset = 0, 0
    text = "of the decompressed text" if path.endswith(".gz") else "of the file"

    with named_damage(path, lambda: f"after line {line}, byte {offset:,} {text}"), _lines(path) as f:
        for line, raw in enumerate(f, 1):
            offset += len(raw)
            if line == 1:
                raw = raw.removeprefix(BOM)
            if not raw.strip():
                continue
            where = f"{path}:{line}"
            doc = {"id": doc_id(fields.source, path, line), "text": None, "url": where,
                   "source": fields.source, "error": None}
            try:
                record = parse_json(raw.decode("utf-8"))
            except UnicodeDecodeError:
                yield doc | {"error": "invalid_utf8"}
                continue
            except (ValueError, RecursionError):   # RecursionError: absurdly deep nesting
                yield doc | {"error": "malformed_json"}
                continue
            if not isinstance(record, dict):
                yield doc | {"error": "not_an_object"}
                continue
            yield _from_record(doc, record, fields)


def parse_json(line: str):
    """`json.loads`, except that an integer with more digits than Python converts from text (4300 by
    default, `sys.get_int_max_str_digits`) becomes a Decimal instead of failing its record as malformed_json:
    it is valid JSON, and the record's text may be fine. Only a line that fails the first parse pays for a
    second one."""
    try:
        return json.loads(line)
    except ValueError:
        return json.loads(line, parse_int=_int)


def _int(digits: str) -> int | decimal.Decimal:
    try:
        return int(digits)
    except ValueError:
        return decimal.Decimal(digits)


def _lines(path: str) -> IO[bytes]:
    """`path` opened for fast iteration over its lines (decompressed if it ends in .gz)."""
    f = storage.open(path, "rb", compression="infer")
    # fsspec's own readline copies a whole block per line: ~7 ms a line on GCS. A BufferedReader on
    # top iterates lines at C speed; gzip's reader has one inside already.
    return f if path.endswith(".gz") else io.BufferedReader(f, buffer_size=1 << 20)


def _txt(path: str, fields: Fields) -> Iterator[dict]:
    with named_damage(path), storage.open(path, "rb", compression="infer") as f:
        data = f.read()
    text, error = text_or_error(data.removeprefix(BOM))
    if error or fields.txt_unit == "file":
        yield {"id": doc_id(fields.source, path), "text": text, "url": path, "source": fields.source,
               "error": error}
        return
    for line, paragraph in paragraphs(text):
        yield {"id": doc_id(fields.source, path, line), "text": paragraph, "url": f"{path}:{line}",
               "source": fields.source, "error": None}


def paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, paragraph) for each run of non-blank lines."""
    start, block = 0, []
    for number, line in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        if line.strip():
            start = start if block else number
            block.append(line)
        elif block:
            yield start, "\n".join(block).strip()
            block = []
    if block:
        yield start, "\n".join(block).strip()


def _parquet(path: str, row_group: int, fields: Fields) -> Iterator[dict]:
    for row, record in parquet_rows(path, fields.columns(), row_group):
        doc = {"id": doc_id(fields.source, path, row), "text": None, "url": f"{path}:{row}",
               "source": fields.source, "error": None}
        yield _from_record(doc, record, fields)


def _from_record(doc: dict, record: dict, fields: Fields) -> dict:
    """`doc` (positional id and URL) completed from a record's own text (or its rendered template), id and
    URL, and its other fields as metadata."""
    if fields.template is None:
        text, error = text_or_error(present(field(record, fields.text)))
        taken = [fields.text]
    else:
        text, error = templates.render(fields.template, record)
        text, error = (None, error) if error else text_or_error(text)
        taken = [*templates.INSTRUCTION_FIELDS, templates.MESSAGES]
    own_id = plain_str(present(field(record, fields.id))) if fields.id else None
    own_url = plain_str(present(field(record, fields.url))) if fields.url else None
    taken += [path for path, value in ((fields.id, own_id), (fields.url, own_url)) if value]
    return doc | {"text": text, "error": error, "id": own_id or doc["id"], "url": own_url or doc["url"],
                  "metadata": metadata(record, taken, fields.metadata)}


def metadata(record: dict, taken: Sequence[str], wanted: Sequence[str]) -> str | None:
    """The metadata column of a record: with (ALL,), every field but those `taken` for the document's text,
    id and URL; else the fields at the `wanted` paths that the record has, by path."""
    if ALL in wanted:
        return metadata_json(without(record, taken))
    return metadata_json({path: value for path in wanted if (value := field(record, path)) is not MISSING})


# ---------------------------------------------------------------------------------------------
# Damaged files

# A missing file, a refused permission or a network failure is an OSError too, but says nothing about
# the file's bytes: it is never a bad file (a retry or a fix elsewhere is what it needs).
NOT_DAMAGE = (FileNotFoundError, PermissionError, ConnectionError, TimeoutError)


@contextlib.contextmanager
def named_damage(path: str, where: Callable[[], str] = str, parquet: bool = False) -> Iterator[None]:
    """Turns what a damaged file raises into `BadFile(path, reason, where())`: gzip's BadGzipFile (an
    OSError), zlib.error, EOFError (a stream that ends early) and, for parquet, pyarrow's ArrowException,
    the OSErrors of its decoders, and a UnicodeDecodeError from a string that is not UTF-8 in a column of
    a type `documents.rows` cannot read as bytes (a map)."""
    damage: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)
    if parquet:
        import pyarrow as pa

        damage += (pa.ArrowException, UnicodeDecodeError)
    try:
        yield
    except NOT_DAMAGE:
        raise
    except damage as e:
        kind = type(e).__qualname__
        kind = kind if type(e).__module__ == "builtins" else f"{type(e).__module__}.{kind}"
        raise BadFile(path, f"{kind}: {e}", where()) from e


def parquet_rows(path: str, columns: Sequence[str] | None, row_group: int) -> Iterator[tuple[int, dict]]:
    """`documents.rows` of one row group (`columns=None`: all), with damage named (`BadFile`) after the rows
    read before it. A column the file lacks is absent from the records (a missing field, not a null one)."""
    row = None
    with named_damage(path, lambda: f"row group {row_group}" + ("" if row is None else f", after row {row}"),
                      parquet=True):
        for row, record in documents.rows(path, columns, row_group, absent_as_none=False):
            yield row, record


# ---------------------------------------------------------------------------------------------
# Parquet footers, shared with the FineWeb source

def parquet_row_groups(paths: Sequence[str], required_column: str | None, hint: str = "") -> list[int]:
    """The row-group count of each file; a file without `required_column` (a path: the column of that
    name, or of its first part) is a ValueError; None requires nothing.

    A file whose footer is damaged counts one row group: reading that unit raises `BadFile`, so a broken
    file fails the stage, or is skipped and counted, in one place (the worker), like any other damage.
    """
    def footer(path: str) -> int:
        import pyarrow.parquet as pq

        try:
            with named_damage(path, parquet=True), storage.open(path, "rb") as f:
                meta = pq.read_metadata(f)
        except BadFile:
            return 1
        names = meta.schema.to_arrow_schema().names
        if required_column is not None and not {required_column, required_column.split(".")[0]} & set(names):
            raise ValueError(f"{path} has no column {required_column!r}; its columns are {names}{hint}")
        return meta.num_row_groups

    with concurrent.futures.ThreadPoolExecutor(FOOTER_READERS) as pool:
        return list(pool.map(footer, paths))
