"""WARC and WET files (raw Common Crawl) -> documents: one record, one document.

    download.Config.source = @download.Warc()
    download.Warc.paths = ["gs://bucket/CC-MAIN-2024-10/segments/*/warc/*.warc.gz"]
    download.Warc.extractor = "trafilatura"   # FineWeb's extractor; "resiliparse" is several times faster

    for doc in warc.read("crawl/CC-MAIN-...-00000.warc.gz", "trafilatura"): ...

What a record becomes (`to_document`), in this order:

    response, HTML payload    the main text, by the extractor (below)
    conversion (a WET file)   the text as it is
    not a response            `error` "not_a_response" (warcinfo, request, metadata, revisit and resource
                              records: no page of their own), which the stage counts in stats.json under
                              `skipped_records` and writes nowhere (document.SKIPPED_RECORDS)
    otherwise                 a document with no text and one of these `error` reasons, which the stage
                              counts in stats.json (`errors`) and clean counts as drops:

    non_html            a response whose payload is not HTML: an image, a PDF, JSON, plain text, ...
    undecodable         a body no charset decodes (binary data, a mislabelled or mixed encoding that
                        fits none), or an HTTP body whose chunked / gzip transfer encoding is broken
    extraction_failed   the extractor raised on the page (deeply nested or otherwise broken HTML)
    empty_extraction    the extractor found no main text (a page of links and forms), or a WET record
                        is empty

Every document keeps the record's identity: `id` is its WARC-Record-ID (as FineWeb's ids are), `url`
its WARC-Target-URI, and `metadata` (JSON) its WARC-Date (`date`), the payload's `content_type`, the
`charset` its body was decoded with, and the file and byte offset of the record (`warc_file`,
`warc_offset`: for a .gz file the offset of its gzip member, as Common Crawl's index gives it).

The payload type is the crawler's own guess (`WARC-Identified-Payload-Type`, which Common Crawl
writes), else the HTTP Content-Type, else a look at the first bytes (`<!doctype html`, `<html`).
Datatrove's reader asks libmagic in that last case and can skip real pages; this does not.

Decoding, the first that works strictly: a byte-order mark; UTF-8 (datatrove's first guess too: text
that is not UTF-8 almost never decodes as UTF-8); the charset the HTTP header or a `<meta>` tag
declares (ISO-8859-1 read as windows-1252, as browsers do); then charset_normalizer's detection
(datatrove uses cchardet). A result holding NUL characters is binary, not text: `undecodable`.

Extractors (`EXTRACTORS`):

    trafilatura   as datatrove's `Trafilatura()` extractor configures it for FineWeb: `extract(html,
                  favor_precision=True, include_comments=False, deduplicate=True)`. Deduplication
                  drops text segments already seen more than twice (site boilerplate); its memory is
                  reset for each file, so a file gives the same text whichever worker reads it (datatrove
                  keeps one memory per task, across its files). Datatrove also runs each page in a
                  child process with a 1 s time-out; here a page runs in the worker (no time-out).
    resiliparse   `extract_plain_text(main_content=True)`: much faster, a little less precise.

Damage: a .gz file is read one gzip member (one record) at a time. A member that does not
decompress, a file that ends inside a member, and a record whose content is cut short or whose
headers do not parse raise `document.BadFile` naming the file and the byte offset of the member or
record, after the documents of every record before it.
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import re
import zlib
from collections.abc import Callable, Iterator
from typing import IO

from warcio.archiveiterator import ArchiveIterator
from warcio.bufferedreaders import ChunkedDataReader

from stages.download.document import BadFile, doc_id, is_utf8, plain_str
from stages.io import storage

SUFFIXES = (".warc", ".warc.gz", ".wet", ".wet.gz")   # Common Crawl's WET files end in .warc.wet.gz
WET_SUFFIXES = (".wet", ".wet.gz")                      # their documents' `source` is "wet", else "warc"
EXTRACTORS = ("trafilatura", "resiliparse")
HTML_TYPES = ("text/html", "application/xhtml+xml")
PAGE_TYPES = ("response", "conversion")   # the record types that carry a page (WARC, WET)

READ_BYTES = 1 << 20              # compressed bytes read at a time
MAX_RECORD_BYTES = 256 << 20      # a gzip member that inflates past this is damage (or a gzip bomb)
SNIFF_BYTES = 4096                # where a <meta charset> or an <html> tag is looked for

Extract = Callable[[str], "str | None"]


def read(path: str, extractor_name: str) -> Iterator[dict]:
    """The documents of one WARC or WET file, in file order (see the module docstring)."""
    extract = extractor(extractor_name)   # one per file: trafilatura's deduplication memory starts empty
    for offset, record, body in records(path):
        yield to_document(record, body, path, offset, extract)


def check_path(path: str) -> None:
    if not path.endswith(SUFFIXES):
        raise ValueError(f"{path} is not a WARC or WET file; download.Warc reads files ending in "
                         f"{', '.join(SUFFIXES)} (Common Crawl's .warc.gz and .warc.wet.gz)")


# ---------------------------------------------------------------------------------------------
# Records out of a file

def records(path: str) -> Iterator[tuple[int, object, bytes]]:
    """(byte offset, warcio record, its content after any HTTP headers) for every record of the file.

    The content is read whole here, so a damaged file fails while reading it (`BadFile`), never later
    while a record's text is made; for a .gz file the offset is that of the record's gzip member.
    """
    with storage.open(path, "rb") as f:
        if not path.endswith(".gz"):
            yield from _parse(f, path, base=None)
            return
        for offset, member in gzip_members(f, path):
            yield from _parse(io.BytesIO(member), path, base=offset)


def gzip_members(f: IO[bytes], path: str) -> Iterator[tuple[int, bytes]]:
    """(compressed offset, inflated bytes) of each gzip member of the stream, in order."""
    pending, pos = b"", 0   # compressed bytes read but not yet inflated; the file offset of pending[0]
    while True:
        if not pending:
            pending = f.read(READ_BYTES)
            if not pending:
                return                      # the file ends between members: a whole file
        start, inflater, out, size = pos, zlib.decompressobj(wbits=31), [], 0
        where = f"the gzip member at byte {start:,}"
        full = False                        # the last call stopped at max_length: more output may wait
        while not inflater.eof:
            if not pending and not full:
                pending = f.read(READ_BYTES)
                if not pending:
                    raise BadFile(path, "the file ends inside a gzip member (truncated)", where)
            try:
                piece = inflater.decompress(pending, READ_BYTES)
            except zlib.error as e:
                raise BadFile(path, f"zlib.error: {e}", where) from e
            pos += len(pending) - len(inflater.unconsumed_tail) - len(inflater.unused_data)
            pending = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
            full = len(piece) == READ_BYTES
            size += len(piece)
            if size > MAX_RECORD_BYTES:
                raise BadFile(path, f"a gzip member inflates to more than {MAX_RECORD_BYTES >> 20} MiB "
                                    "(WARC files compress each record on its own)", where)
            out.append(piece)
        yield start, b"".join(out)


def _parse(stream: IO[bytes], path: str, base: int | None) -> Iterator[tuple[int, object, bytes]]:
    """The records of an uncompressed stream; `base` is the member's offset (None: the stream is the file)."""
    records = ArchiveIterator(stream)
    offset = 0 if base is None else base
    while True:
        # warcio reports malformed input with many exception types (ArchiveLoadFailed, AttributeError,
        # ValueError, ...): anything it raises while parsing is the file's damage, named by offset.
        try:
            record = next(records, None)
            if record is None:
                return
            body = record.raw_stream.read()
            short = getattr(record.raw_stream, "limit", 0)   # bytes the Content-Length promised, not there
            if base is None:
                offset = records.get_record_offset()
        except Exception as e:
            at = records.offset if base is None else base   # warcio's offset of the record it was reading
            raise BadFile(path, f"{_kind(e)}: {str(e)[:200]}", f"the record at byte {at:,}") from e
        if short:
            raise BadFile(path, f"the record's content is {short:,} bytes shorter than its Content-Length "
                                "(truncated)", f"the record at byte {offset:,}")
        yield offset, record, body


def _kind(e: BaseException) -> str:
    kind = type(e).__qualname__
    return kind if type(e).__module__ == "builtins" else f"{type(e).__module__}.{kind}"


# ---------------------------------------------------------------------------------------------
# A record -> a document

def to_document(record, body: bytes, path: str, offset: int, extract: Extract) -> dict:
    headers, kind = record.rec_headers, record.rec_type
    meta = {"date": plain_str(headers.get_header("WARC-Date")), "warc_file": path, "warc_offset": offset}
    doc = {"id": plain_str(headers.get_header("WARC-Record-ID")) or doc_id("warc", path, offset),
           "url": plain_str(headers.get_header("WARC-Target-URI")) or f"{path}@{offset}",
           "source": "wet" if path.endswith(WET_SUFFIXES) else "warc", "text": None, "error": None}

    def done(error: str | None = None, text: str | None = None) -> dict:
        return doc | {"text": text, "error": error, "metadata": _json(meta)}

    if kind not in PAGE_TYPES:
        return done("not_a_response")
    if kind == "conversion":
        meta["content_type"] = _media_type(headers.get_header("Content-Type")) or "text/plain"
        text, meta["charset"] = decode(body, None)
        if text is None:
            return done("undecodable")
        return done(None, text) if text.strip() else done("empty_extraction")

    http = record.http_headers
    content_type = http.get_header("Content-Type") if http else None
    meta["content_type"] = (_media_type(headers.get_header("WARC-Identified-Payload-Type"))
                            or _media_type(content_type) or ("text/html" if looks_like_html(body) else None))
    if meta["content_type"] not in HTML_TYPES:
        return done("non_html")
    payload = http_payload(record, body)
    if payload is None:
        return done("undecodable")
    html, meta["charset"] = decode(payload, declared_charset(content_type, payload))
    if html is None:
        return done("undecodable")
    try:
        text = extract(html)
    except Exception:   # the extractor's failure on one page is that page's, never the file's
        return done("extraction_failed")
    if not text or not text.strip():
        return done("empty_extraction")
    return done(None, text)


def _json(meta: dict) -> str:
    text = json.dumps(meta, sort_keys=True, ensure_ascii=False)
    return text if is_utf8(text) else json.dumps(meta, sort_keys=True)


def _media_type(value: str | None) -> str | None:
    """`text/html; charset=utf-8` -> `text/html`; None for an absent or empty value."""
    media = (value or "").split(";", 1)[0].strip().lower()
    return media or None


def looks_like_html(body: bytes) -> bool:
    head = body[:SNIFF_BYTES].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith((b"<!doctype html", b"<html")) or b"<html" in head


def http_payload(record, body: bytes) -> bytes | None:
    """The HTTP body with a chunked transfer encoding and a gzip, deflate or br content encoding undone;
    None when the content encoding is broken or unknown (a browser would show nothing either).
    Common Crawl undoes both when it crawls (keeping `X-Crawler-*` headers), so its bodies are plain."""
    http = record.http_headers
    if not http:
        return body
    if (http.get_header("Transfer-Encoding") or "").strip().lower() == "chunked":
        body = ChunkedDataReader(io.BytesIO(body)).read()   # warcio's: not really chunked -> as it is
    encoding = (http.get_header("Content-Encoding") or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    try:
        if encoding in ("gzip", "x-gzip"):
            return _inflate(body, wbits=31)
        if encoding == "deflate":   # zlib-wrapped, as the RFC says, or raw deflate, as some servers send
            return _inflate(body, wbits=15) if body[:1] == b"\x78" else _inflate(body, wbits=-15)
        if encoding == "br":
            import brotli

            return brotli.decompress(body)
    except Exception:
        return None
    return None


def _inflate(data: bytes, wbits: int) -> bytes:
    inflater = zlib.decompressobj(wbits=wbits)
    out = inflater.decompress(data, MAX_RECORD_BYTES)
    if not inflater.eof:
        raise ValueError("a truncated or oversized compressed body")
    return out


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-z0-9_.:-]+)""", re.IGNORECASE)
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# What browsers read when a page declares these (WHATWG Encoding): windows-1252 is a superset.
_BROWSER_ALIASES = {"iso-8859-1": "cp1252", "latin-1": "cp1252", "latin1": "cp1252", "us-ascii": "cp1252",
                    "ascii": "cp1252"}


def declared_charset(content_type: str | None, html: bytes) -> str | None:
    """The charset the HTTP Content-Type names, else a `<meta charset>` near the top of the page."""
    match = re.search(r"charset\s*=\s*[\"']?([\w.:-]+)", content_type or "", re.IGNORECASE)
    if match:
        return match.group(1).lower()
    match = _META_CHARSET.search(html[:SNIFF_BYTES])
    return match.group(1).decode("ascii").lower() if match else None


def decode(body: bytes, declared: str | None) -> tuple[str | None, str | None]:
    """(text, the charset that decoded it), or (None, None): see the module docstring for the order."""
    candidates = [name for bom, name in _BOMS if body.startswith(bom)][:1] + ["utf-8"]
    if declared:
        candidates.append(_BROWSER_ALIASES.get(declared, declared))
    for charset in candidates:
        text = _strict(body, charset)
        if text is not None:
            return (text, charset) if "\x00" not in text else (None, None)
    import charset_normalizer  # only for bodies that none of the above decodes

    best = charset_normalizer.from_bytes(body[:1 << 20]).best()
    text = _strict(body, best.encoding) if best is not None else None
    if text is None or "\x00" in text:
        return None, None
    return text, best.encoding


def _strict(body: bytes, charset: str) -> str | None:
    try:
        return body.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return None


# ---------------------------------------------------------------------------------------------
# Extractors

def extractor(name: str) -> Extract:
    """A fresh extractor: HTML (str) -> its main text, or None/"" when it finds none."""
    if name == "trafilatura":
        from trafilatura import extract
        from trafilatura.deduplication import LRUCache
        from trafilatura.settings import LRU_SIZE

        # It logs an ERROR for every page it finds no text in; those pages are counted (empty_extraction).
        logging.getLogger("trafilatura").setLevel(logging.CRITICAL)
        seen = LRUCache(maxsize=LRU_SIZE)   # this extractor's own memory of repeated segments
        return lambda html: extract(html, favor_precision=True, include_comments=False, deduplicate=seen)
    if name == "resiliparse":
        try:
            from resiliparse.extract.html2text import extract_plain_text
        except ImportError as e:
            raise ImportError(f"download.Warc.extractor = 'resiliparse' needs the resiliparse package "
                              f"({e}); install it with `.venv/bin/pip install resiliparse`, or pick "
                              f"extractor = 'trafilatura'") from e
        return lambda html: extract_plain_text(html, main_content=True, alt_texts=False, links=False,
                                               form_fields=False, noscript=False)
    raise ValueError(f"download.Warc.extractor={name!r} is not one of {EXTRACTORS}")
