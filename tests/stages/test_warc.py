"""Raw Common Crawl: WARC and WET files -> documents (stages/download/warc.py), on crawls the tests write
(tests/stages/warc_pages.py): extraction, metadata, every reason a record gives no text, hostile input,
damaged files, gs://, and the commoncrawl twin's whole DAG."""

import gzip
import io
import json
import re
from importlib import metadata

import pytest

from pipeline import __main__ as cli
from pipeline import cache, config
from stages import download
from stages.download import BadFile, Warc, warc
from stages.io import documents, storage
from tests.conftest import REPO
from tests.stages import warc_pages
from tests.stages.warc_pages import Writer, page_html
from tests.tiny_run import SCORING

PROSE = warc_pages.pages(3)
BOILERPLATE = ("Privacy policy", "uses cookies", "Subscribe to our newsletter", "Popular posts", "dataLayer",
               "font-family", "All rights reserved", "noopener", "Log in")


def _run(root, source, skip_bad_files=False):
    committed = cache.run_stage(cache_root=str(root), stage="download", key="k1",
                                config=download.Config(source=source, num_shards=2,
                                                       skip_bad_files=skip_bad_files),
                                upstream={}, fn=download.run)
    docs = [d for p in documents.shards_of(committed) for d in documents.read(p)]
    return docs, storage.read_json(committed.file("stats.json"))


def _one_page(tmp_path, html: bytes, content_type="text/html; charset=utf-8", identified="text/html", **kw):
    path = tmp_path / "one.warc.gz"
    with Writer(path) as w:
        w.response("https://example.org/p", html, content_type, identified=identified, **kw)
    docs = [d for d in warc.read(str(path), "trafilatura") if d["error"] != "not_a_response"]
    assert len(docs) == 1
    return docs[0]


# ---------------------------------------------------------------------------------------------
# Extraction and metadata

@pytest.mark.parametrize("extractor", warc.EXTRACTORS)
def test_extraction_keeps_the_main_text_and_drops_boilerplate_and_scripts(tmp_path, extractor):
    path = tmp_path / "a.warc.gz"
    with Writer(path) as w:
        for url, title, paragraphs in PROSE:
            w.page(url, page_html(title, paragraphs))
    docs = [d for d in warc.read(str(path), extractor) if d["text"]]
    assert len(docs) == 3
    for doc, (_, _, paragraphs) in zip(docs, PROSE):
        for p in paragraphs:
            assert p in doc["text"]
        for junk in BOILERPLATE:
            assert junk not in doc["text"], (extractor, junk)


def test_metadata_is_kept_and_ids_are_warc_record_ids(tmp_path):
    path = tmp_path / "a.warc.gz"
    with Writer(path) as w:
        url, title, paragraphs = PROSE[0]
        rid = w.page(url, page_html(title, paragraphs))
    wet = tmp_path / "a.warc.wet.gz"
    with Writer(wet) as w:
        wet_id = w.conversion(url, b"Plain text from the WET file.\nSecond line.")
    page = next(d for d in warc.read(str(path), "trafilatura") if d["text"])
    assert page["id"] == rid and rid.startswith("<urn:uuid:")
    assert page["url"] == url and page["source"] == "warc" and page["error"] is None
    meta = json.loads(page["metadata"])
    assert meta["date"] == warc_pages.DATE and meta["content_type"] == "text/html"
    assert meta["charset"] == "utf-8" and meta["warc_file"] == str(path)
    with open(path, "rb") as f:   # the offset is where the record's gzip member starts
        f.seek(meta["warc_offset"])
        record = gzip.GzipFile(fileobj=io.BytesIO(f.read())).read(2000)
    assert rid.encode() in record and b"WARC-Type: response" in record

    (text,) = [d for d in warc.read(str(wet), "trafilatura") if d["text"]]
    assert text["text"] == "Plain text from the WET file.\nSecond line." and text["source"] == "wet"
    assert text["id"] == wet_id and json.loads(text["metadata"])["content_type"] == "text/plain"


def test_trafilatura_forgets_repeated_segments_at_each_file_so_reads_are_deterministic(tmp_path):
    a, b = tmp_path / "a.warc.gz", tmp_path / "b.warc.gz"
    for path in (a, b):
        with Writer(path) as w:
            for url, title, paragraphs in PROSE:
                w.page(url, page_html(title, paragraphs))
    first = list(warc.read(str(a), "trafilatura"))
    list(warc.read(str(b), "trafilatura"))           # the same pages again, in another file
    assert list(warc.read(str(a), "trafilatura")) == first
    assert [d["text"] for d in warc.read(str(b), "trafilatura")] == [d["text"] for d in first]


# ---------------------------------------------------------------------------------------------
# Every reason a record gives no text, counted by the stage

def test_every_reason_is_counted_in_stats_and_nothing_crashes(tmp_path):
    path = tmp_path / "mixed.warc.gz"
    with Writer(path) as w:        # + its warcinfo record
        url, title, paragraphs = PROSE[0]
        w.page(url, page_html(title, paragraphs))                                 # + request, metadata
        w.response("https://x.org/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(256), "image/png",
                   identified="image/png")
        w.response("https://x.org/api", b'{"a": 1}', "application/json", identified=None)   # HTTP header only
        w.response("https://x.org/bin", bytes(range(256)) * 8, "text/html")      # binary, labelled HTML
        w.response("https://x.org/gz", b"\x1f\x8b\x08\x00broken", "text/html",
                   http_extra=(("Content-Encoding", "gzip"),))                    # a broken content encoding
        w.response("https://x.org/links", b"<html><body><ul><li><a href='/a'>A</a></li></ul></body></html>")
    wet = tmp_path / "mixed.warc.wet.gz"
    with Writer(wet) as w:         # + its warcinfo record
        w.conversion("https://x.org/empty", b"  \n ")
        w.conversion("https://x.org/text", b"Some plain text of a page.")
    docs, stats = _run(tmp_path / "cache", Warc(paths=(str(tmp_path / "*.gz"),)))
    assert stats["errors"] == {"non_html": 2, "undecodable": 2, "empty_extraction": 2}
    # warcinfo (one per file), request and metadata records are read past, counted, and are no document
    assert stats["skipped_records"] == {"not_a_response": 4}
    assert "not_a_response" not in {d["error"] for d in docs}
    assert stats["by_source"] == {"warc": 6, "wet": 2} and stats["docs"] == 8 and stats["units"] == 2
    assert sorted(d["url"] for d in docs if d["text"]) == [PROSE[0][0], "https://x.org/text"]
    assert all(d["metadata"] and d["id"] for d in docs)


def test_an_extractor_that_raises_is_counted_as_extraction_failed(tmp_path):
    path = tmp_path / "a.warc"
    with Writer(path, gzip=False) as w:
        w.response("https://x.org/p", b"<html><body><p>text</p></body></html>")
    _, record, body = [r for r in warc.records(str(path)) if r[1].rec_type == "response"][0]

    def broken(html):
        raise RecursionError("maximum recursion depth exceeded")

    doc = warc.to_document(record, body, str(path), 0, broken)
    assert doc["error"] == "extraction_failed" and doc["text"] is None and doc["url"] == "https://x.org/p"


# ---------------------------------------------------------------------------------------------
# Hostile input: encodings, broken HTML

SENTENCES = ("The caf\u00e9 on the corner serves \u201cproper\u201d coffee to everyone who walks in. " * 3
             + "Its owner has kept the same recipe for thirty years, and the regulars would not have it any "
             "other way. Every morning the street fills with people who stop for a cup before work. ") * 2


def _html(text, charset):
    return (f'<html><head><meta charset="{charset}"><title>Caf\u00e9</title></head><body><article>'
            f"<p>{text}</p><p>{text[::-1]}</p></article></body></html>")


@pytest.mark.parametrize("body_charset, declared, decoded_as", [
    ("cp1252", "utf-8", None),                  # declared UTF-8, really windows-1252: detected (cp125x)
    ("cp1252", "iso-8859-1", "cp1252"),         # ISO-8859-1 read as windows-1252 (curly quotes), as browsers
    ("utf-8", "iso-8859-1", "utf-8"),           # declared Latin-1, really UTF-8: UTF-8 first
    ("utf-16", "utf-16", "utf-16"),             # a byte-order mark
])
def test_mislabelled_encodings_decode_to_the_right_text(tmp_path, body_charset, declared, decoded_as):
    html = _html(SENTENCES, declared).encode(body_charset)
    doc = _one_page(tmp_path, html, f"text/html; charset={declared}")
    assert doc["error"] is None and "caf\u00e9 on the corner serves \u201cproper\u201d" in doc["text"]
    charset = json.loads(doc["metadata"])["charset"]
    assert charset == decoded_as if decoded_as else charset.startswith("cp125")


def test_mixed_encodings_and_broken_html_are_text_or_counted_never_a_crash(tmp_path):
    mixed = (_html(SENTENCES, "utf-8").encode("utf-8")
             + "<p>d\u00e9j\u00e0 \u201cvu\u201d</p>".encode("cp1252"))
    doc = _one_page(tmp_path, mixed)
    assert doc["error"] in (None, "undecodable")
    broken = ("<html><body><div><p>" + SENTENCES + "<p><b><i>" + SENTENCES[::-1] + "</div></span></td>"
              "<script>var x = '<p>not text</p>';</script><p>" + "<div>" * 2000 + "deep").encode()
    doc = _one_page(tmp_path, broken, content_type=None, identified=None)   # no type at all: sniffed as HTML
    assert doc["error"] is None and "caf\u00e9 on the corner" in doc["text"] and "not text" not in doc["text"]
    nul = _one_page(tmp_path, b"<html><body>\x00\x00\x00" + bytes(range(1, 40)) * 50 + b"</body></html>")
    assert nul["error"] == "undecodable"


# ---------------------------------------------------------------------------------------------
# Damaged files: named with the byte offset, or skipped and counted

def _three_pages(path, gzip=True):
    with Writer(path, gzip=gzip) as w:
        for url, title, paragraphs in PROSE:
            w.response(url, page_html(title, paragraphs).encode(), identified="text/html")
    return [offset for offset, _, _ in warc.records(str(path))]   # warcinfo + 3 responses


def test_a_corrupt_gzip_member_is_named_with_its_offset_and_skipping_keeps_the_records_before(tmp_path):
    path = tmp_path / "in" / "bad.warc.gz"
    path.parent.mkdir()
    offsets = _three_pages(path)
    data = bytearray(path.read_bytes())
    for i in range(offsets[3] + 40, offsets[3] + 80):   # the last response's deflate stream
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(BadFile, match=rf"{re.escape(str(path))} is corrupt or truncated \(the gzip member "
                                      rf"at byte {offsets[3]:,}\): zlib.error"):
        _run(tmp_path / "cache", Warc(paths=(str(path),)))
    docs, stats = _run(tmp_path / "cache2", Warc(paths=(str(path),)), skip_bad_files=True)
    assert [d["url"] for d in docs if d["text"]] == [PROSE[0][0], PROSE[1][0]]
    assert list(stats["bad_files"]) == [str(path)] and f"byte {offsets[3]:,}" in stats["bad_files"][str(path)]


@pytest.mark.parametrize("damage, message", [
    (lambda d, offs: d[:offs[2] + 100], "the file ends inside a gzip member"),
    (lambda d, offs: d + b"this is not gzip at all", "zlib.error"),
    (lambda d, offs: d[:offs[2]] + gzip.compress(b"<html>not a WARC record</html>\r\n\r\n") + d[offs[2]:],
     "the record at byte"),
])
def test_truncated_and_garbled_gzip_files_are_named(tmp_path, damage, message):
    path = tmp_path / "x.warc.gz"
    offsets = _three_pages(path)
    path.write_bytes(damage(path.read_bytes(), offsets))
    with pytest.raises(BadFile, match=re.escape(message)):
        list(warc.read(str(path), "trafilatura"))


def test_a_truncated_uncompressed_warc_is_named(tmp_path):
    path = tmp_path / "x.warc"
    offsets = _three_pages(path, gzip=False)
    path.write_bytes(path.read_bytes()[:offsets[3] + 600])
    docs = []
    with pytest.raises(BadFile, match=rf"record at byte {offsets[3]:,}\): .*shorter than its Content-Length"):
        docs.extend(warc.read(str(path), "trafilatura"))
    assert len([d for d in docs if d["text"]]) == 2     # the two whole pages came before the damage


# ---------------------------------------------------------------------------------------------
# The source: config, listing, fingerprint, gs://

def test_the_source_names_bad_config_and_files_it_cannot_read(tmp_path):
    with pytest.raises(ValueError, match=r"Warc.extractor='lynx' is not one of \('trafilatura', 're"):
        Warc(paths=("x/*.warc.gz",), extractor="lynx")
    with pytest.raises(TypeError, match="Warc.paths='x.warc.gz' is one string"):
        Warc(paths="x.warc.gz")
    with pytest.raises(ValueError, match="Warc.paths is empty"):
        Warc()
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"notes.txt is not a WARC or WET file.*\.warc\.gz"):
        Warc(paths=(str(tmp_path / "*"),)).units()
    with pytest.raises(ValueError, match="download.Warc.paths: .* matches no files"):
        Warc(paths=(str(tmp_path / "*.warc.gz"),)).fingerprint()
    assert Warc(paths=["a/*.warc.gz"]).paths == ("a/*.warc.gz",)   # gin's lists


def test_the_fingerprint_lists_files_with_their_versions_and_units_are_files(tmp_path):
    _three_pages(tmp_path / "a.warc.gz")
    _three_pages(tmp_path / "b.warc.wet.gz")
    source = Warc(paths=(str(tmp_path / "*.warc.gz"), str(tmp_path / "*.wet.gz")))
    before = source.fingerprint()
    assert list(before["files"]) == [str(tmp_path / "a.warc.gz"), str(tmp_path / "b.warc.wet.gz")]
    assert all(v.startswith("size=") for v in before["files"].values())
    assert before["trafilatura"] == metadata.version("trafilatura")     # the extractor's version is keyed
    assert source.units() == [str(tmp_path / "a.warc.gz"), str(tmp_path / "b.warc.wet.gz")]
    _three_pages(tmp_path / "a.warc.gz")   # rewritten (a new mtime)
    assert source.fingerprint() != before


@pytest.mark.gcs
def test_warc_files_on_gcs(gcs_bucket, tmp_path):
    local = tmp_path / "a.warc.gz"
    _three_pages(local)
    storage.upload(str(local), f"{gcs_bucket}/crawl/a.warc.gz")
    source = Warc(paths=(f"{gcs_bucket}/crawl/*.warc.gz",))
    assert list(source.fingerprint()["files"].values())[0].startswith("generation=")
    docs, stats = _run(tmp_path / "cache", source)
    assert [d["url"] for d in docs if d["text"]] == [url for url, _, _ in PROSE]
    assert json.loads(docs[-1]["metadata"])["warc_file"] == f"{gcs_bucket}/crawl/a.warc.gz"


# ---------------------------------------------------------------------------------------------
# The commoncrawl twin: WARC -> text -> filters -> MinHash -> tokenizer -> shards -> train -> evaluate

TWIN = f"{REPO}/gin/twins/commoncrawl.gin"
SMALL_TRAINING = [
    "train.Config.steps = 8", "train.Config.global_batch = 4", "train.Config.seq_len = 64",
    "train.Config.eval_every = 4", "train.Config.log_every = 2", "train.Config.checkpoint_every = 4",
    "train.OptimizerConfig.warmup_steps = 2", *SCORING,
]


@pytest.mark.slow
@pytest.mark.optimized      # trains long enough that XLA's optimized code pays (tests/jax_env.py)
def test_the_commoncrawl_twin_runs_the_whole_dag_on_a_written_crawl(tmp_path, capsys):
    warc_pages.crawl(tmp_path / "crawl")
    params = [f'pipeline.Settings.cache_root = "{tmp_path / "cache"}"',
              f'download.Warc.paths = ["{tmp_path}/crawl/*.gz"]', *SMALL_TRAINING]
    assert cli.main(["run", "--gin", TWIN, *[a for p in params for a in ("--gin-param", p)]]) == 0
    plan = config.load([TWIN], params)
    done = {s: cache.load(plan.cache_root, s, sp.key) for s, sp in plan.stages.items()}
    assert all(done.values()), done
    got = storage.read_json(done["download"].file("stats.json"))
    assert got["units"] == 3 and got["by_source"]["wet"] > 0
    assert set(got["errors"]) == {"non_html", "undecodable", "empty_extraction"}
    assert got["skipped_records"]["not_a_response"] > got["docs"] / 2      # request + metadata per page
    cleaned = storage.read_json(done["clean"].file("stats.json"))
    assert cleaned["docs_kept"] >= 60, cleaned
    assert {"duplicate", "near_duplicate"} & set(cleaned["dropped"]), cleaned["dropped"]
    # The clean report charts every removal reason, FineWeb's filters among them.
    report = storage.read_text(done["clean"].file("report.md"))
    assert "removed.png" in report and all(reason in report for reason in cleaned["dropped"]), report[:2000]
    with storage.open(done["clean"].file("removed.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert storage.read_json(done["evaluate"].file("eval.json"))["loss"] > 0
