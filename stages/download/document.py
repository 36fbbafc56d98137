"""How a record becomes a document: stable ids, and the reasons a record has no usable text.

Every source yields dicts with the `stages.io.documents` columns. A record that cannot be used still
becomes a document, with `text=None` and `error` set to one of the reasons below, so a bad
record is counted (by this stage's stats and by clean) instead of crashing the run:

    malformed_json    a jsonl line that does not parse (or nests deeper than Python's stack can parse)
    not_an_object     a jsonl line that parses but is not a JSON object
    invalid_utf8      bytes that are not UTF-8 (or a string with lone surrogates, e.g. "\\ud800")
    missing_text      the text field is absent or null
    non_string_text   the text field is a number, list, object, ...
    syntax_error      an embedded standard-library file that does not parse

and, for instruction-tuning records rendered through a template (`templates.py`):

    missing_instruction   neither an `instruction` nor a `messages` field
    missing_output        an `instruction` without an `output`
    non_string_field      `instruction`, `input` or `output` is not a string
    malformed_messages    `messages` is not a non-empty list of {"role": str, "content": str} objects
    unknown_role          a message whose role has no format (and the formats have no "*")

A record's fields are addressed by paths (`field`): `text`, or `metadata.url` for a nested object. What a
record holds besides its id, text and URL can go into the document's `metadata` column (`metadata_json`),
converted to JSON deterministically (`jsonable`; what lies more than `MAX_DEPTH` levels deep becomes the
string `TOO_DEEP`, and an integer too long for Python's int(), a string of its digits).

A file that cannot be read to its end (a corrupt or truncated gzip stream, a broken parquet file) is
not a bad record: reading it raises `BadFile`, which names the file, what the library said and how far
reading got. The stage fails with it, or with `download.Config.skip_bad_files` keeps the records read
before the damage and lists the file under `bad_files` in stats.json.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

ID_HEX_CHARS = 24   # 96 bits: no collision in practice even at 10^10 documents
# Metadata nested deeper is cut (`jsonable`): JSON parses a few hundred levels, but converting them by
# recursion ran out of Python's stack (RecursionError, failing the stage), and sooner inside a Beam worker.
MAX_DEPTH = 64
TOO_DEEP = f"<nested more than {MAX_DEPTH} levels deep>"
# Records a source reads past without making a document of them (a WARC file's request, metadata and
# warcinfo records: two of every three records in a Common Crawl WARC): counted in stats.json under
# `skipped_records`, never written, so they are not "removed documents" in the clean report.
SKIPPED_RECORDS = frozenset({"not_a_response"})


class BadFile(Exception):
    """A corrupt or truncated file: `path`, the library's complaint (`reason`) and `where` it stopped."""

    def __init__(self, path: str, reason: str, where: str = ""):
        super().__init__(path, reason, where)   # all in args, so the exception pickles (Beam workers)
        self.path, self.reason, self.where = path, reason, where

    def __str__(self) -> str:
        where = f" ({self.where})" if self.where else ""
        return (f"{self.path} is corrupt or truncated{where}: {self.reason}; replace the file, or set "
                f"download.Config.skip_bad_files = True to keep what can be read and list it in stats.json")


def doc_id(source: str, *position: Any) -> str:
    """A stable id: `<source>/<hash of the position>`, e.g. `files/3f9a…` for (path, line)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in position).encode("utf-8", "surrogatepass"))
    return f"{source}/{digest.hexdigest()[:ID_HEX_CHARS]}"


def text_or_error(value: Any) -> tuple[str | None, str | None]:
    """(text, None) for a usable text value, else (None, reason)."""
    if value is None:
        return None, "missing_text"
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError:
            return None, "invalid_utf8"
    if not isinstance(value, str):
        return None, "non_string_text"
    if not is_utf8(value):
        return None, "invalid_utf8"
    return value, None


def plain_str(value: Any) -> str | None:
    """`value` as a string fit for a metadata column (an id or URL), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value and is_utf8(value):
        return value
    return None


def is_utf8(text: str) -> bool:
    """False for strings parquet cannot store: lone surrogates, which JSON's \\uXXXX escapes allow."""
    if text.isascii():   # O(1) in CPython: the common case costs nothing
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True



# ---------------------------------------------------------------------------------------------
# Field paths and metadata

MISSING = object()   # what `field` returns for a path the record does not have


def field(record: Any, path: str) -> Any:
    """The value at `path` in a record: the key `path` itself when the record has it (a key may hold a
    dot), else the dotted path through nested objects (`metadata.url`); MISSING when neither exists."""
    if not isinstance(record, Mapping):
        return MISSING
    if path in record:
        return record[path]
    value = record
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def present(value: Any) -> Any:
    """`value`, with MISSING as None (an absent field reads as a null one)."""
    return None if value is MISSING else value


def without(record: Mapping, paths: Iterable[str]) -> dict:
    """A copy of `record` without the fields at `paths` (as `field` finds them); an object left empty by
    a removal is removed too, so mapping `metadata.url` to the URL leaves no `{"metadata": {}}` behind."""
    out = dict(record)
    for path in paths:
        if path in out:
            del out[path]
            continue
        parts = path.split(".")
        chain = [out]   # the objects along the path, copied before they change
        for part in parts[:-1]:
            child = chain[-1].get(part)
            if not isinstance(child, Mapping):
                break
            chain[-1][part] = child = dict(child)
            chain.append(child)
        else:
            if parts[-1] in chain[-1]:
                del chain[-1][parts[-1]]
                for parent, part in zip(reversed(chain[:-1]), reversed(parts[:-1])):
                    if parent[part]:
                        break
                    del parent[part]
    return out


def jsonable(value: Any, depth: int = 0) -> Any:
    """`value` as plain JSON values, the same way every run: bytes as UTF-8 text (else "base64:<b64>"),
    dates and times as ISO 8601, durations as seconds, decimals as strings, numpy scalars and arrays as
    numbers and lists, NaN and infinities as the strings "NaN", "Infinity", "-Infinity", tuples as lists,
    sets as sorted lists, mapping keys as strings, anything else as `str(value)`; what lies more than
    MAX_DEPTH lists or objects deep as the string TOO_DEEP."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, (Mapping, list, tuple, set, frozenset)) and depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [jsonable(v, depth + 1) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(data).decode("ascii")
    if isinstance(value, (datetime.date, datetime.time)):   # datetime (and pandas' Timestamp) is a date
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if hasattr(value, "tolist") and callable(value.tolist):   # numpy scalars and arrays, without numpy
        return jsonable(value.tolist(), depth)
    return str(value)


def metadata_json(fields: Mapping | None) -> str | None:
    """The `metadata` column: `fields` as a JSON object with sorted keys (None for no or no fields), its
    values through `jsonable`; a string with lone surrogates stays escaped so parquet can store it."""
    if not fields:
        return None
    value = jsonable(fields)
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if is_utf8(text) else json.dumps(value, sort_keys=True)
