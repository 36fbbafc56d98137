"""How a record becomes a document: stable ids, and the reasons a record has no usable text.

Every source yields dicts with the `stages.io.documents` columns. A record that cannot be used still
becomes a document, with `text=None` and `error` set to one of the reasons below, so a bad
record is counted (by this stage's stats and by clean) instead of crashing the run:

    malformed_json    a jsonl line that does not parse
    not_an_object     a jsonl line that parses but is not a JSON object
    invalid_utf8      bytes that are not UTF-8 (or a string with lone surrogates, e.g. "\\ud800")
    missing_text      the text field is absent or null
    non_string_text   the text field is a number, list, object, ...
    syntax_error      an embedded standard-library file that does not parse

A file that cannot be read to its end (a corrupt or truncated gzip stream, a broken parquet file) is
not a bad record: reading it raises `BadFile`, which names the file, what the library said and how far
reading got. The stage fails with it, or with `download.Config.skip_bad_files` keeps the records read
before the damage and lists the file under `bad_files` in stats.json.
"""

from __future__ import annotations

import hashlib
from typing import Any

ID_HEX_CHARS = 24   # 96 bits: no collision in practice even at 10^10 documents


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

