"""Hostile input, generated: hypothesis feeds download, clean, tokenizer, shard and the llm.c reader random
and malformed records and damaged files, and checks what the stages promise about them.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/stages/test_hostile_input.py

The properties, each checked by the tests whose names say so:
  - every bad record becomes a document counted under its reason (download's stats.json `errors`, clean's
    `dropped`), and clean's docs_in == docs_kept + sum(dropped);
  - every damaged file is named: `BadFile` naming it, or with `skip_bad_files` listed under `bad_files`
    with the records before the damage kept; the llm.c reader's ValueError names the file and what is wrong;
  - no good record is lost: each comes out of download with its text, id and URL, and out of clean with
    its text normalized, unless a filter or deduplication gives the reason;
  - tokenizer and shard run on whatever clean kept, and the shards read back as ids below the vocab size;
  - nothing raises an exception of any other type.

Examples are derandomized and there is no example database, so CI runs the same inputs every time. A Beam
pipeline costs 1-3 s to start, so the whole-stage tests take few examples of many records each; the pure
functions (parsing, normalization, filters, the llm.c reader) take many.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gzip
import json
import os
import sys
import tempfile
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece as spm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import cache
from stages import clean, download
from stages.clean import normalize, tally
from stages.download import BadFile, Files, formats
from stages.download.document import doc_id
from stages.io import documents, llmc, storage
from tests.io.test_llmc import numpy_read
from tests.stages.test_clean import _clean
from tests.stages.test_shard import run_shard
from tests.stages.test_tokenizer import english_docs, train

# Derandomized and without an example database: the same examples on every run and machine, none replayed
# from an earlier run (hypothesis still keeps caches in a self-ignoring .hypothesis/ directory).
PURE = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
STAGES = settings(PURE, max_examples=15)

FIELDS = formats.Fields(id="id")   # what download.Files(id_field="id") reads: a record's own id, if usable
DOWNLOAD_ERRORS = ("malformed_json", "not_an_object", "invalid_utf8", "missing_text", "non_string_text")

# ---------------------------------------------------------------------------------------------
# Hostile text: mixed scripts, control characters, odd line breaks and spaces, combining marks, BOMs,
# noncharacters, the sentencepiece meta symbol, and whatever hypothesis finds (never a lone surrogate:
# those are in `lone_surrogates`, a reason of their own).

SCRIPTS = ["plain words here", "Привет, мир", "東京タワー", "مرحبا بالعالم", "שלום", "नमस्ते दुनिया",
           "🙂👩\u200d💻🏳️\u200d🌈", "ﬁne Å Å", "Ǆǅǆ", "e\u0301", "ß ẞ İ ı"]
HOSTILE = ["\x00", "\x01\x02", "\x1b[31m", "\x7f", "\x85", "\x9f", "\r", "\r\n", "\n\n\n\n", "\v", "\f",
           "\u2028", "\u2029", "\t\t", "     ", " \t \n", "\ufeff", "\u200b\u200d", "\u202e", "\ufffd",
           "\uffff", "\ue000", "\U0010ffff", "\u0301\u0308", "a\x00\u0308", "e\x07\u0301", "\u2581", "\\",
           '"', "{}", "\\u0000", "</script>", "\x1c\x1d\x1e"]
fragments = st.sampled_from(SCRIPTS) | st.sampled_from(HOSTILE) | st.text(max_size=6)
texts = st.lists(fragments, max_size=25).map("".join)
lone_surrogates = st.integers(0xD800, 0xDFFF).map(chr)
# Byte sequences that are not UTF-8: stray continuation and start bytes, an overlong "/", a surrogate
# encoded (CESU-8), a code point past U+10FFFF, latin-1 "é".
BAD_UTF8 = [b"\xff", b"\xfe", b"\x80", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"caf\xe9"]

json_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | texts
                | st.tuples(texts, lone_surrogates).map("".join))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
non_strings = json_values.filter(lambda v: not isinstance(v, str) and v is not None)
BIG_INT = "9" * 5000    # valid JSON, but more digits than Python's int() takes from a string (4300)


def deep(depth: int) -> str:
    """A JSON value nested `depth` lists deep (valid JSON; Python recursion is what it strains)."""
    return "[" * depth + "]" * depth


@contextlib.contextmanager
def default_recursion_limit():
    """Python's default recursion limit, which hypothesis raises to about 2000 while a test runs: the stages
    run under the default, so what overflows the stack there must overflow it here."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


# ---------------------------------------------------------------------------------------------
# Records of a jsonl file, each with what download must make of it

@dataclasses.dataclass(frozen=True)
class Rec:
    line: bytes                 # one jsonl line, without its line break
    reason: str | None = None   # download's error for it; None for a good record
    text: str | None = None
    id: str | None = None       # the id download keeps; None: derived from the file and line
    url: str | None = None      # likewise
    blank: bool = False         # a blank line: no document at all


def dumps(obj: dict, raw: dict[str, str] | None = None, ascii: bool = True) -> bytes:
    """`obj` as one JSON line, with the fields in `raw` spliced in as raw JSON text (what json.dumps
    refuses to write, or writes by recursion: a 5000-digit integer, lists nested hundreds deep)."""
    obj = dict(obj)
    marks = {}
    for i, (key, value) in enumerate((raw or {}).items()):
        obj[key] = f"@@raw{i}@@"
        marks[f'"@@raw{i}@@"'] = value
    try:
        line = json.dumps(obj, ensure_ascii=ascii).encode("utf-8")
    except UnicodeEncodeError:   # a lone surrogate can only be written as a \ud800 escape
        line = json.dumps(obj).encode("utf-8")
    for mark, value in marks.items():
        line = line.replace(mark.encode(), value.encode(), 1)
    return line


@st.composite
def own_ids_and_urls(draw, file: int) -> tuple[dict, dict, str | None, str | None]:
    """(fields, raw fields, kept id, kept url): a record's own id and URL, present, absent or hostile.
    A kept URL starts with `u<file>:`, so every document can be traced to its file."""
    fields, raw, own_id, own_url = {}, {}, None, None
    kind = draw(st.sampled_from(["absent", "string", "int", "hostile"]))
    if kind == "string":
        own_id = fields["id"] = f"i{file}-" + draw(texts)
    elif kind == "int":
        fields["id"] = draw(st.integers())
        own_id = str(fields["id"])
    elif kind == "hostile":   # not usable as an id: the document gets one derived from its position
        value = draw(st.sampled_from(["", "big"]) | non_strings.filter(lambda v: type(v) is not int)
                     | st.tuples(texts, lone_surrogates).map("".join))
        (raw if value == "big" else fields)["id"] = BIG_INT if value == "big" else value
    kind = draw(st.sampled_from(["absent", "string", "hostile"]))
    if kind == "string":
        own_url = fields["url"] = f"u{file}:" + draw(texts)
    elif kind == "hostile":   # an int would be kept, as its digits (like an id)
        value = st.just("") | non_strings.filter(lambda v: type(v) is not int)
        fields["url"] = draw(value | st.tuples(texts, lone_surrogates).map("".join))
    return fields, raw, own_id, own_url


@st.composite
def extra_fields(draw) -> tuple[dict, dict]:
    """(fields, raw fields) a record carries besides its text, id and URL: any JSON, huge numbers, lists
    nested up to 700 deep (json parses that, but a recursion of two frames a level overflows the stack)."""
    names = st.text(max_size=5).filter(lambda k: k not in ("text", "id", "url"))
    fields = draw(st.dictionaries(names, json_values, max_size=3))
    raw = {}
    if draw(st.booleans()):
        raw["big"] = BIG_INT
    if draw(st.booleans()):
        raw["deep"] = deep(draw(st.integers(1, 700)))
    return fields, raw


@st.composite
def jsonl_records(draw, file: int = 0) -> Rec:
    kind = draw(st.sampled_from(["good", "good", "good", "invalid_utf8", "lone_surrogate", "non_string_text",
                                 "missing_text", "not_an_object", "malformed_json", "blank"]))
    if kind == "blank":
        return Rec(draw(st.sampled_from([b"", b"   ", b"\t", b"\r"])), blank=True)
    ids, raw_ids, own_id, own_url = draw(own_ids_and_urls(file))
    extras, raw = draw(extra_fields())
    fields, raw = {**extras, **ids}, {**raw, **raw_ids}
    ascii = draw(st.booleans())
    # A record that parses as an object keeps its own id and URL whatever its text; one that does not parse
    # gets them from its position
    if kind == "good":
        text = draw(texts)
        return Rec(dumps({**fields, "text": text}, raw, ascii), text=text, id=own_id, url=own_url)
    if kind == "invalid_utf8":
        line = dumps({**fields, "text": "@@bad@@"}, raw, ascii)
        return Rec(line.replace(b"@@bad@@", draw(st.sampled_from(BAD_UTF8)), 1), "invalid_utf8")
    if kind == "lone_surrogate":   # parses, but no UTF-8 (and so no parquet file) can hold it
        text = draw(texts) + draw(lone_surrogates) + draw(texts)
        return Rec(dumps({**fields, "text": text}, raw), "invalid_utf8", id=own_id, url=own_url)
    if kind == "non_string_text":
        value = draw(st.just("big") | non_strings)
        line = (dumps(fields, {**raw, "text": BIG_INT}, ascii) if value == "big"
                else dumps({**fields, "text": value}, raw, ascii))
        return Rec(line, "non_string_text", id=own_id, url=own_url)
    if kind == "missing_text":
        absent = draw(st.sampled_from([{}, {"text": None}]))
        return Rec(dumps({**fields, **absent}, raw, ascii), "missing_text", id=own_id, url=own_url)
    if kind == "not_an_object":
        return Rec(json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict)))).encode(),
                   "not_an_object")
    good = dumps({**fields, "text": draw(texts)}, raw)   # ASCII, so any cut falls between characters
    how = draw(st.sampled_from(["cut", "trailing", "quotes", "control", "too_deep"]))
    if how == "cut":   # every strict prefix of an object lacks its closing brace
        line = good[:draw(st.integers(1, len(good) - 1))]
    elif how == "trailing":
        line = good + b" " + draw(st.sampled_from([b"x", b"{}", b"\x00", b","]))
    elif how == "quotes":
        line = b"{'text': 'single quotes'}"
    elif how == "control":   # JSON strings cannot hold raw control characters
        line = b'{"text": "a' + draw(st.sampled_from([b"\x00", b"\x01", b"\r", b"\x1f", b"\t"])) + b'b"}'
    else:   # nesting deeper than any Python stack parses
        line = b'{"text": "fine", "m": ' + deep(5000).encode() + b"}"
    return Rec(line, "malformed_json")


def jsonl_bytes(recs: list[Rec], newline: bytes, final: bool) -> bytes:
    return newline.join(r.line for r in recs) + (newline if final and recs else b"")


def expected_jsonl(path: str, recs: list[Rec]) -> list[tuple]:
    """(id, url, text, error) of the documents download makes of `recs` in a file at `path`, in order."""
    out = []
    for line, r in enumerate(recs, 1):
        if not r.blank:
            out.append((r.id or doc_id("files", path, line), r.url or f"{path}:{line}", r.text, r.reason))
    return out


def as_tuple(doc: dict) -> tuple:
    return doc["id"], doc["url"], doc["text"], doc["error"]


# ---------------------------------------------------------------------------------------------
# Parquet and txt files

@st.composite
def parquet_columns(draw) -> tuple[str, list, list[tuple[str | None, str | None]]]:
    """(kind of text column, its values, [(text, error)] per row). "string" columns may hold bytes that are
    not UTF-8, as files from writers that do not check (or a damaged page) do."""
    kind = draw(st.sampled_from(["string", "binary", "int", "list", "struct", "null"]))
    n = draw(st.integers(1, 12))
    if kind in ("string", "binary"):
        value = st.none() | texts.map(str.encode) | st.sampled_from(BAD_UTF8).map(lambda b: b"ok " + b)
        values = draw(st.lists(value, min_size=n, max_size=n))
        expect = []
        for v in values:
            try:
                expect.append((None, "missing_text") if v is None else (v.decode("utf-8"), None))
            except UnicodeDecodeError:
                expect.append((None, "invalid_utf8"))
        return kind, values, expect
    inner = {"int": st.integers(-2**63, 2**63 - 1), "list": st.lists(texts, max_size=3),
             "struct": st.fixed_dictionaries({"a": texts}), "null": st.none()}[kind]
    values = draw(st.lists(st.none() | inner, min_size=n, max_size=n))
    return kind, values, [(None, "missing_text" if v is None else "non_string_text") for v in values]


def text_array(kind: str, values: list) -> pa.Array:
    if kind not in ("string", "binary"):
        return pa.array(values, {"null": pa.null()}.get(kind))
    array = pa.array(values, pa.binary())
    if kind == "binary":
        return array
    # A string column written without checking UTF-8, as pyarrow's own writer never would
    return pa.Array.from_buffers(pa.string(), len(array), array.buffers(), array.null_count)


def parquet_bytes(kind: str, values: list, row_group_size: int, compression: str = "snappy") -> bytes:
    """A parquet file of the text column and two more (an int, binary) that go into `metadata`."""
    columns = {"text": text_array(kind, values), "n": list(range(len(values))),
               "blob": [bytes([i % 256]) * (i % 5) for i in range(len(values))]}
    out = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), out, row_group_size=row_group_size, compression=compression)
    return out.getvalue().to_pybytes()


def expected_parquet(path: str, rows: list[tuple]) -> list[tuple]:
    """(id, url, text, error) of the documents download makes of `rows` ((text, error) each) at `path`."""
    return [(doc_id("files", path, row), f"{path}:{row}", text, error) for row, (text, error) in
            enumerate(rows)]


def expected_txt(path: str, text: str | None, error: str | None) -> list[tuple]:
    return [(doc_id("files", path), path, text, error)]


def expected_own(path: str, docs: list[dict]) -> list[tuple]:
    """Good jsonl records with their own ids and URLs."""
    return [(d["id"], d["url"], d["text"], None) for d in docs]


@st.composite
def txt_contents(draw) -> tuple[bytes, str | None, str | None]:
    """(file bytes, text, error) of a .txt file read as one document."""
    text = draw(texts)
    if draw(st.integers(0, 3)) == 0:
        return text.encode() + draw(st.sampled_from(BAD_UTF8)), None, "invalid_utf8"
    return text.encode(), text, None


# ---------------------------------------------------------------------------------------------
# Pure functions: many examples

@PURE
@given(recs=st.lists(jsonl_records(), max_size=30), newline=st.sampled_from([b"\n", b"\r\n"]),
       final=st.booleans(), gz=st.booleans())
def test_every_jsonl_line_becomes_one_document_with_its_text_or_its_reason(recs, newline, final, gz):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.jsonl" + (".gz" if gz else ""))
        data = jsonl_bytes(recs, newline, final)
        with open(path, "wb") as f:
            f.write(gzip.compress(data) if gz else data)
        with default_recursion_limit():
            docs = list(formats.read(path, 0, FIELDS))
    assert [as_tuple(doc) for doc in docs] == expected_jsonl(path, recs)
    for doc in docs:   # what else a good record holds is kept as a JSON object (in UTF-8), whatever it was
        metadata = doc.get("metadata")
        assert metadata is None or isinstance(json.loads(metadata), dict) and metadata.encode("utf-8")


@PURE
@given(columns=parquet_columns(), row_group_size=st.integers(1, 5),
       compression=st.sampled_from(["snappy", "none", "zstd"]))
def test_every_parquet_row_becomes_one_document_with_its_text_or_its_reason(columns, row_group_size,
                                                                            compression):
    kind, values, expect = columns
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.parquet")
        with open(path, "wb") as f:
            f.write(parquet_bytes(kind, values, row_group_size, compression))
        units = formats.units([path], "text")
        docs = [doc for unit in units for doc in formats.read(*unit, FIELDS)]
    assert len(units) == -(-len(values) // row_group_size)
    assert [as_tuple(doc) for doc in docs] == expected_parquet(path, expect)
    assert all(isinstance(json.loads(doc["metadata"]), dict) for doc in docs)


@st.composite
def damaged_files(draw) -> tuple[str, bytes, bytes, functools.partial, str]:
    """(file name, good bytes, damaged bytes, expect(path) -> the good file's documents, how it was
    damaged): a gzipped jsonl or txt file, or a parquet file, truncated, with bytes flipped, or with a run
    of garbage."""
    fmt = draw(st.sampled_from(["jsonl.gz", "txt.gz", "parquet"]))
    if fmt == "jsonl.gz":
        recs = draw(st.lists(jsonl_records(), min_size=1, max_size=30))
        good = gzip.compress(jsonl_bytes(recs, b"\n", True))
        expect = functools.partial(expected_jsonl, recs=recs)
    elif fmt == "txt.gz":
        data, text, error = draw(txt_contents())
        good = gzip.compress(data)
        expect = functools.partial(expected_txt, text=text, error=error)
    else:
        kind, values, rows = draw(parquet_columns())
        good = parquet_bytes(kind, values, draw(st.integers(1, 5)), draw(st.sampled_from(["snappy", "none",
                                                                                          "zstd"])))
        expect = functools.partial(expected_parquet, rows=rows)
    how = draw(st.sampled_from(["truncate", "flip", "garbage"]))
    bad = bytearray(good)
    if how == "truncate":   # at least one byte kept: Python reads an empty .gz file as an empty stream
        bad = bad[:draw(st.integers(1, len(good) - 1))]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            bad[draw(st.integers(0, len(bad) - 1))] ^= draw(st.integers(1, 255))
    else:
        start = draw(st.integers(0, len(bad) - 1))
        bad[start:start + draw(st.integers(1, 64))] = draw(st.binary(min_size=1, max_size=64))
    return "f." + fmt, good, bytes(bad), expect, how


def read_file(path: str) -> tuple[list[dict], BadFile | None]:
    """Every document `formats` reads from `path`, and the BadFile that stopped it, if one did."""
    docs = []
    try:
        with default_recursion_limit():
            for unit in formats.units([path], None):
                docs.extend(formats.read(*unit, FIELDS))
    except BadFile as e:
        return docs, e
    return docs, None


@PURE
@given(damaged=damaged_files())
def test_a_damaged_file_raises_bad_file_naming_it_after_a_prefix_of_its_records(damaged):
    name, good, bad, expect, how = damaged
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(bad)
        docs, error = read_file(path)
    expect = expect(path)
    got = [as_tuple(doc) for doc in docs]
    if error is not None:
        assert error.path == path and path in str(error) and "skip_bad_files" in str(error)
    if how == "truncate":   # a cut file always fails, after exactly the records before the cut
        assert error is not None
        assert got == expect[:len(got)]
        return
    # gzip checks a CRC of what it decompressed, so a .gz file read without error reads as written. A
    # flipped byte can change what a parquet page decodes to without any check noticing (pages carry no
    # checksum), so there only the shape is promised: each document has a text or a known reason.
    if error is None and (bad == good or name.endswith(".gz")):
        assert got == expect
    for doc in docs:
        assert (doc["text"] is None) == (doc["error"] is not None)
        assert doc["error"] is None or doc["error"] in DOWNLOAD_ERRORS
        assert doc["text"] is None or isinstance(doc["text"].encode("utf-8"), bytes)


@PURE
@given(text=texts | st.text())
def test_normalize_is_idempotent_and_leaves_nfc_text_without_control_characters(text):
    out = normalize.normalize(text)
    assert normalize.normalize(out) == out, ascii(out)
    assert unicodedata.is_normalized("NFC", out), ascii(out)
    assert not any(unicodedata.category(c) == "Cc" and c not in "\n\t" for c in out), ascii(out)
    assert not any(c in out for c in "\u2028\u2029"), ascii(out)   # line breaks are "\n"
    assert "  " not in out and "\n\n\n" not in out and " \n" not in out and "\t\n" not in out
    assert out == out.strip()


# Every filter and rewriter switched on (their parameters at their defaults)
ALL_FILTERS = clean.Config(min_chars=1, **{name: cls() for name, cls in clean.FILTERS.items()})
urls = (st.none() | texts | st.from_regex(r"https?://[a-z0-9.\-\[\]:@%]{0,30}/[ -~]{0,20}", fullmatch=True)
        | st.sampled_from(["http://[::1", "http://a..b/", "http://xn--/", "//", "http://", "mailto:x@y"]))


@PURE
@given(text=texts, url=urls)
def test_every_filter_returns_one_of_its_reasons_on_any_normalized_text(text, url):
    doc = {"id": "x", "text": normalize.normalize(text), "url": url, "source": "s", "metadata": None}
    filters = clean.build_filters(ALL_FILTERS)
    if doc["text"]:
        for f in filters:
            assert f.check(doc) in (None, *f.reasons()), type(f).__name__
    reason, out = clean.clean_document(doc, ALL_FILTERS, filters, [])
    assert reason is None or reason == "empty" or any(reason in f.reasons() for f in filters)
    assert isinstance(out["text"], str)


# ---------------------------------------------------------------------------------------------
# The llm.c reader

@st.composite
def shard_files(draw) -> tuple[bytes, str | None]:
    """(file bytes, what is wrong with it as words its error must use, or None for a good shard)."""
    vocab = draw(st.sampled_from([500, 2**16, 2**16 + 1]))
    tokens = np.array(draw(st.lists(st.integers(0, vocab - 1), max_size=50)), dtype=llmc.dtype_for(vocab))
    header = np.frombuffer(llmc.header(len(tokens), vocab), dtype="<i4").copy()
    body = tokens.tobytes()
    how = draw(st.sampled_from(["good", "magic", "version", "count", "truncated", "extra", "odd", "header",
                                "random"]))
    if how == "magic":
        header[0] = draw(st.integers(-2**31, 2**31 - 1).filter(lambda m: m not in llmc.FORMATS))
    elif how == "version":
        version = llmc.FORMATS[int(header[0])][0]
        header[1] = draw(st.integers(-2**31, 2**31 - 1).filter(lambda v: v != version))
    elif how == "count":
        header[2] = draw(st.integers(-2**31, 2**31 - 1).filter(lambda n: n != len(tokens)))
    data = header.tobytes() + body
    if how == "truncated":   # anywhere: inside the header or the tokens
        data = data[:draw(st.integers(0, len(data) - 1))] if data else data
    elif how == "extra":
        data += draw(st.binary(min_size=1, max_size=9))
    elif how == "odd":   # a byte short of a whole token
        data = data[:-1] if tokens.size else data + b"\0"
    elif how == "header":   # a file shorter than the 1024-byte header
        data = data[:draw(st.integers(0, llmc.HEADER_BYTES - 1))]
    elif how == "random":
        data = draw(st.binary(max_size=2048))
    words = {"good": None, "magic": "not an llm.c shard", "version": "not an llm.c shard",
             "count": "header promises", "truncated": "bytes", "extra": "header promises",
             "odd": "header promises", "header": "bytes", "random": ""}[how]
    return data, words


@PURE
@given(shard=shard_files(), mmap=st.booleans())
def test_the_llmc_reader_returns_the_tokens_its_header_promises_or_names_the_file_and_what_is_wrong(shard,
                                                                                                mmap):
    data, words = shard
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "train-00000.bin")
        with open(path, "wb") as f:
            f.write(data)
        try:
            tokens = llmc.read(path, mmap=mmap)
        except ValueError as e:
            assert words is not None, f"a good shard was refused: {e}"
            assert str(e).startswith(path) and words in str(e), str(e)
            return
        header = np.frombuffer(data[:llmc.HEADER_BYTES], dtype="<i4")
        assert words in (None, ""), f"read a shard that is wrong ({words}): header {header[:3]}"
        assert len(tokens) == header[2] and tokens.tobytes() == data[llmc.HEADER_BYTES:]
        del tokens   # a memory map holds the file open


# ---------------------------------------------------------------------------------------------
# Whole stages: few examples, many records each

@st.composite
def corpora(draw, damaged: bool = False) -> list[tuple[str, bytes, functools.partial, str | None]]:
    """Input files for download: [(name, bytes, expect(path) -> its documents, damage)]. Damage is None,
    "truncate" (a gzip or parquet file cut short) or "magic" (a parquet footer whose magic is wrong); with
    `damaged`, at least one file is. Every corpus holds one file of ordinary English besides, so that
    tokenizer has text to learn from."""
    files = []
    count = draw(st.integers(1, 4))
    for i in range(count):
        fmt = draw(st.sampled_from(["jsonl", "jsonl.gz", "parquet", "txt"]))
        name = f"f{i}.{fmt}"
        if fmt.startswith("jsonl"):
            recs = draw(st.lists(jsonl_records(i), max_size=40))
            if draw(st.integers(0, 3)) == 0:   # a giant one-line document, kept or too long for clean
                text = "giant line " * draw(st.sampled_from([12_000, 100_000]))
                recs.insert(draw(st.integers(0, len(recs))), Rec(dumps({"text": text}), text=text))
            if draw(st.integers(0, 3)) == 0 and any(r.text for r in recs):   # duplicates after normalization
                text = next(r.text for r in recs if r.text)
                copy = " " + text.replace(" ", "  ") + "\r\n\r\n\r\n"
                recs.append(Rec(dumps({"text": copy}), text=copy))
            data = jsonl_bytes(recs, draw(st.sampled_from([b"\n", b"\r\n"])), draw(st.booleans()))
            expect = functools.partial(expected_jsonl, recs=recs)
            if fmt == "jsonl.gz":
                data = gzip.compress(data)
        elif fmt == "parquet":
            kind, values, rows = draw(parquet_columns())
            data = parquet_bytes(kind, values, draw(st.integers(1, 5)))
            expect = functools.partial(expected_parquet, rows=rows)
        else:
            data, text, error = draw(txt_contents())
            expect = functools.partial(expected_txt, text=text, error=error)
        damage = None
        if fmt in ("jsonl.gz", "parquet") and draw(st.integers(0, 2)) == 0:
            damage = draw(st.sampled_from(["truncate", "magic"] if fmt == "parquet" else ["truncate"]))
            data = data[:draw(st.integers(1, len(data) - 1))] if damage == "truncate" else data[:-4] + b"PAR0"
        files.append((name, data, expect, damage))
    if damaged and not any(how for *_, how in files):
        recs = draw(st.lists(jsonl_records(count), min_size=1, max_size=20))
        data = gzip.compress(jsonl_bytes(recs, b"\n", True))
        files.append((f"f{count}.jsonl.gz", data[:draw(st.integers(1, len(data) - 1))],
                      functools.partial(expected_jsonl, recs=recs), "truncate"))
    base = [dict(d, id=f"base-{d['id']}") for d in english_docs(80, seed=draw(st.integers(0, 3)))]
    data = b"".join(json.dumps(d).encode() + b"\n" for d in base)
    files.append(("base.jsonl", data, functools.partial(expected_own, docs=base), None))
    return files


def write_corpus(d: str, corpus) -> tuple[dict[str, list[tuple]], dict[str, str | None]]:
    """Writes the files under `d`; returns ({path: expected documents}, {path: damage})."""
    expected, damage = {}, {}
    for name, data, expect, how in corpus:
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(data)
        expected[path], damage[path] = expect(path), how
    return expected, damage


def run_download(root: str, data: str, **config) -> cache.Committed:
    config = download.Config(source=Files(paths=(f"{data}/*",), id_field="id"), num_shards=2, min_docs=0,
                             **config)
    return cache.run_stage(cache_root=root, stage="download", key="d", config=config, upstream={},
                           fn=download.run)


def file_of(doc: dict, paths: list[str]) -> str:
    """The input file a document came from: its URL is the file's own `u<i>:...` or `path:line`."""
    url = doc["url"]
    for path in paths:
        name = os.path.basename(path)
        if url == path or url.startswith(path + ":"):
            return path
        if name.startswith("f") and url.startswith(f"u{name[1:].split('.')[0]}:"):
            return path
        if name == "base.jsonl" and url.startswith("test://"):
            return path
    raise AssertionError(f"a document from no input file: {doc}")


def clean_reason(doc: dict, config: clean.Config) -> str | None:
    """Why clean drops a downloaded document, before deduplication (None: it stays), counted here the
    plain way: letters as str.isalpha counts them among the characters that are not whitespace."""
    if doc["error"]:
        return doc["error"]
    text = normalize.normalize(doc["text"])
    if not text:
        return "empty"
    if len(text) < config.min_chars:
        return "too_short"
    if len(text) > config.max_chars:
        return "too_long"
    letters, visible = sum(c.isalpha() for c in text), sum(not c.isspace() for c in text)
    return "too_few_alpha" if letters < config.min_alpha_fraction * visible else None


# Every dropped document sampled, so that what rejected/*.jsonl holds does not depend on which ids (hashes of
# the temporary directory's path) sort first
CLEAN = {"min_chars": 20, "max_chars": 1_000_000, "num_shards": 2, "samples_per_reason": 10_000}


@STAGES
@given(corpus=corpora())
def test_download_clean_tokenizer_and_shard_count_every_bad_record_and_keep_every_good_one(corpus):
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(data := os.path.join(d, "data"))
        expected, damage = write_corpus(data, corpus)
        root = os.path.join(d, "cache")

        # download: each file's documents, in order (a damaged file's up to the damage), each bad record
        # counted under its reason, each damaged file named
        with default_recursion_limit():
            downloaded = run_download(root, data, skip_bad_files=True)
        docs = [doc for path in documents.shards_of(downloaded) for doc in documents.read(path)]
        stats = storage.read_json(downloaded.file("stats.json"))
        by_file = collections.defaultdict(list)
        for doc in docs:
            by_file[file_of(doc, list(expected))].append(as_tuple(doc))
        for path, want in expected.items():
            got = by_file.get(path, [])
            if damage[path]:
                assert got == want[:len(got)], path
            else:
                assert sorted(got, key=repr) == sorted(want, key=repr), path
        assert sorted(stats["bad_files"]) == sorted(p for p, how in damage.items() if how)
        assert stats["docs"] == len(docs)
        assert stats["errors"] == dict(collections.Counter(doc["error"] for doc in docs if doc["error"]))
        assert set(stats["errors"]) <= set(DOWNLOAD_ERRORS)

        # clean: docs_in == docs_kept + sum(dropped); every good record kept, normalized, unless a filter or
        # deduplication says why (MinHash near duplicates, when there are any, are checked by count)
        config = clean.Config(**CLEAN)
        cleaned = _clean(root, downloaded, **CLEAN)
        stats = storage.read_json(cleaned.file("stats.json"))
        reasons = collections.Counter()
        survivors: dict[str, tuple] = {}   # normalized text -> (id, url) of the smallest
        for doc in docs:
            reason = clean_reason(doc, config)
            if reason:
                reasons[reason] += 1
                continue
            text = normalize.normalize(doc["text"])
            if text in survivors:
                reasons["duplicate"] += 1
            survivors[text] = min(survivors.get(text, (doc["id"], doc["url"])), (doc["id"], doc["url"]))
        kept = sorted((doc["id"], doc["url"], doc["text"]) for path in documents.shards_of(cleaned)
                      for doc in documents.read(path))
        want = sorted((i, u, text) for text, (i, u) in survivors.items())
        near = stats["dropped"].pop("near_duplicate", 0)
        assert stats["docs_in"] == len(docs) == stats["docs_kept"] + sum(stats["dropped"].values()) + near
        assert stats["dropped"] == dict(sorted(reasons.items()))
        assert stats["docs_kept"] == len(kept) == len(want) - near
        assert set(kept) <= set(want) if near else kept == want
        for reason in stats["dropped"]:   # each reason has its samples
            assert f"rejected/{tally.file_name(reason)}.jsonl" in cleaned.files

        # tokenizer and shard: run on whatever clean kept; the shards hold ids below the vocab size, one eos
        # per kept document
        tokenized = train(root, cleaned, character_coverage=0.99)
        sharded = run_shard(root, {"clean": cleaned, "tokenizer": tokenized}, allow_small_val=True)
        sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(tokenized.file("tokenizer.model")))
        manifest = storage.read_json(sharded.file("manifest.json"))
        assert manifest["vocab_size"] == sp.get_piece_size()
        for split, s in manifest["splits"].items():
            tokens = [llmc.read(sharded.file(f["file"]), dtype=manifest["dtype"]) for f in s["shards"]]
            assert [len(t) for t in tokens] == [f["tokens"] for f in s["shards"]]
            assert [len(t) for t in tokens] == [len(numpy_read(sharded.file(f["file"]))[1])
                                                for f in s["shards"]]
            tokens = np.concatenate(tokens) if tokens else np.zeros(0, int)
            assert (tokens < manifest["vocab_size"]).all(), split
            assert (tokens == sp.eos_id()).sum() == s["docs"]
        assert sum(s["docs"] for s in manifest["splits"].values()) == len(kept)


@STAGES
@given(corpus=corpora(damaged=True))
def test_a_damaged_file_fails_download_naming_it(corpus):
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(data := os.path.join(d, "data"))
        _, damage = write_corpus(data, corpus)
        with pytest.raises(BadFile) as e:
            run_download(os.path.join(d, "cache"), data)
    assert damage[e.value.path]
    assert str(e.value).startswith(f"{e.value.path} is corrupt or truncated")
    assert "download.Config.skip_bad_files = True" in str(e.value)
