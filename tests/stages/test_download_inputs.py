"""What the download stage reads, and what it does when that is wrong: the inputs' fingerprint in the
cache key (add, remove, rewrite change it; nothing else does; --force reads again), damaged files named
or skipped and counted, and an output with no documents (download, clean) failing with the inputs named."""

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stages.clean
from pipeline import cache, config, tasks
from stages import download
from stages.download import BadFile, Embedded, Files, FineWeb, Tfds
from stages.io import documents, storage
from tests.conftest import REPO

pytestmark = pytest.mark.filterwarnings("ignore:label\\(\\) is deprecated:DeprecationWarning")


def _records(name, n):
    return b"".join(json.dumps({"text": f"{name} record {i}"}).encode() + b"\n" for i in range(n))


def _keys(data_glob, *params, cache_root="cache"):
    plan = _plan(data_glob, *params, cache_root=cache_root)
    return {name: sp.key for name, sp in plan.stages.items()}


def _plan(data_glob, *params, cache_root="cache"):
    return config.load([f"{REPO}/gin/tiny.gin"], [
        "download.Config.source = @download.Files()", f'download.Files.paths = ["{data_glob}"]',
        f'pipeline.Settings.cache_root = "{cache_root}"', *params])


def _run(root, source, **kw):
    committed = cache.run_stage(cache_root=str(root), stage="download", key="k",
                                config=download.Config(source=source, num_shards=2, **kw), upstream={},
                                fn=download.run)
    docs = [d for p in documents.shards_of(committed) for d in documents.read(p)]
    return docs, storage.read_json(committed.file("stats.json"))


# ---------------------------------------------------------------------------------------------
# The inputs' fingerprint is part of the key

def test_adding_removing_or_rewriting_an_input_changes_the_key_and_nothing_else_does(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(_records("a", 3))
    (data / "b.jsonl").write_bytes(_records("b", 3))
    glob = f"{data}/*.jsonl"
    before = _keys(glob)

    # Nothing else: a rerun, another cache root, a file the glob does not match, reading the inputs.
    assert _keys(glob) == before
    assert _keys(glob, cache_root=str(tmp_path / "elsewhere")) == before
    (data / "notes.txt").write_text("not an input")
    (tmp_path / "c.jsonl").write_bytes(_records("c", 1))
    Files(paths=(glob,)).units()
    assert _keys(glob) == before

    def changed():
        after = _keys(glob)
        return [s for s in before if before[s] != after[s]]

    everything = [s for s in before if s != "classifier"]    # all but the classifier, which reads no download
    (data / "c.jsonl").write_bytes(_records("c", 1))                      # added
    assert changed() == everything
    (data / "c.jsonl").unlink()                                           # removed again: the old key
    assert changed() == []
    stat = os.stat(data / "a.jsonl")
    (data / "a.jsonl").write_bytes(_records("A", 3))                      # rewritten (same size)
    os.utime(data / "a.jsonl", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert changed() == everything
    before = _keys(glob)
    os.utime(data / "a.jsonl", ns=(stat.st_atime_ns, stat.st_mtime_ns + 2))   # touched: content not read,
    assert changed() == everything                                            # so it counts as a rewrite

    inputs = _plan(glob).stages["download"].inputs
    assert list(inputs) == [f"{data}/a.jsonl", f"{data}/b.jsonl"]
    assert inputs[f"{data}/a.jsonl"] == f"size={stat.st_size},mtime_ns={stat.st_mtime_ns + 2}"


def test_force_reads_the_inputs_again(tmp_path):
    """A rewrite that keeps size and modification time is invisible to the key (the content is not read);
    `--force` reruns download into the same key and reads the files as they are now."""
    (tmp_path / "a.jsonl").write_bytes(_records("old", 2))
    plan = _plan(f"{tmp_path}/*.jsonl", cache_root=str(tmp_path / "cache"))
    assert tasks.build([plan], ["download"]).ran == ["download"]
    stat = os.stat(tmp_path / "a.jsonl")
    (tmp_path / "a.jsonl").write_bytes(_records("new", 2))
    os.utime(tmp_path / "a.jsonl", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    plan = _plan(f"{tmp_path}/*.jsonl", cache_root=str(tmp_path / "cache"))
    assert tasks.build([plan], ["download"]).ran == []
    result = tasks.build([plan], ["download"], force=["download"])
    assert result.ok and result.ran == ["download"]
    done = cache.load(plan.cache_root, "download", plan.stages["download"].key)
    texts = sorted(d["text"] for p in documents.shards_of(done) for d in documents.read(p))
    assert texts == ["new record 0", "new record 1"]


@pytest.mark.gcs
def test_rewriting_a_gcs_object_changes_its_generation_and_the_key(gcs_bucket):
    storage.write_bytes(f"{gcs_bucket}/in/a.jsonl", _records("a", 2))
    glob = f"{gcs_bucket}/in/*.jsonl"
    before = _keys(glob)["download"]
    assert _keys(glob)["download"] == before
    inputs = _plan(glob).stages["download"].inputs
    assert list(inputs) == [f"{gcs_bucket}/in/a.jsonl"] and inputs[f"{gcs_bucket}/in/a.jsonl"].startswith(
        "generation=")
    storage.write_bytes(f"{gcs_bucket}/in/a.jsonl", _records("a", 2))      # the same bytes, a new upload
    assert _keys(glob)["download"] != before
    before = _keys(glob)["download"]
    storage.write_bytes(f"{gcs_bucket}/other/b.jsonl", _records("b", 1))   # not matched
    assert _keys(glob)["download"] == before
    storage.write_bytes(f"{gcs_bucket}/in/b.jsonl", _records("b", 1))      # added
    assert _keys(glob)["download"] != before


def test_every_source_states_a_fingerprint_without_reading(tmp_path):
    for f in range(3):
        pq.write_table(pa.table({"text": [f"page {f}"]}), tmp_path / f"00{f}.parquet")
    fineweb = FineWeb(root=str(tmp_path), pattern="*.parquet", max_files=2).fingerprint()
    assert list(fineweb) == [f"{tmp_path}/000.parquet", f"{tmp_path}/001.parquet"]
    assert Embedded().fingerprint() == Embedded(max_files=3).fingerprint()   # max_files is in the config
    assert Embedded().fingerprint()["corpus"].startswith("cpython-3.")
    assert Tfds(name="imdb_reviews").fingerprint()["dataset"] == "imdb_reviews"
    assert "tensorflow-datasets" in Tfds(name="imdb_reviews").fingerprint()
    # A hub listing names each file's git blob id, a hash of its content: another commit to the
    # repository that leaves the file alone leaves its version alone.
    hub = {"name": "datasets/HuggingFaceFW/fineweb/sample/000.parquet", "size": 9, "type": "file",
           "blob_id": "3f9a", "lfs": {"sha256": "ab"}, "last_commit": None}
    assert storage._version("hf://x", hub) == "blob_id=3f9a"
    with pytest.raises(ValueError, match="cannot tell whether memory://x changed without reading it"):
        storage._version("memory://x", {"name": "x", "size": 3, "type": "file"})


# ---------------------------------------------------------------------------------------------
# Damaged files are named, or skipped and counted

@pytest.fixture
def three_gz(tmp_path):
    """Three .jsonl.gz files of two gzip members (~50 records each); b's second member is corrupt."""
    d = tmp_path / "gz"
    d.mkdir()
    for name in "abc":
        body = _records(name, 100)
        half = body.index(b"\n", len(body) // 2) + 1
        first = gzip.compress(body[:half])
        data = bytearray(first + gzip.compress(body[half:]))
        if name == "b":
            for i in range(len(first) + 20, len(first) + 60):
                data[i] ^= 0xFF
        (d / f"{name}.jsonl.gz").write_bytes(bytes(data))
    return d, body[:half].count(b"\n")


def test_a_corrupt_gzip_member_fails_the_stage_naming_the_file(tmp_path, three_gz):
    d, first_member = three_gz
    with pytest.raises(BadFile) as e:
        _run(tmp_path / "cache", Files(paths=(f"{d}/*.jsonl.gz",)))
    assert e.value.path == f"{d}/b.jsonl.gz"
    where = f"(after line {first_member}, byte "
    assert str(e.value).startswith(f"{d}/b.jsonl.gz is corrupt or truncated {where}")
    assert "zlib.error: Error -3 while decompressing data" in str(e.value)
    assert "download.Config.skip_bad_files = True" in str(e.value)
    assert cache.load(str(tmp_path / "cache"), "download", "k") is None       # nothing committed


def test_skip_bad_files_keeps_what_was_read_and_counts_the_file(tmp_path, three_gz):
    d, first_member = three_gz
    docs, stats = _run(tmp_path / "cache", Files(paths=(f"{d}/*.jsonl.gz",)), skip_bad_files=True)
    texts = {doc["text"] for doc in docs}
    assert {f"a record {i}" for i in range(100)} | {f"c record {i}" for i in range(100)} <= texts
    assert {t for t in texts if t.startswith("b ")} == {f"b record {i}" for i in range(first_member)}
    assert stats["docs"] == 200 + first_member
    assert list(stats["bad_files"]) == [f"{d}/b.jsonl.gz"]
    assert stats["bad_files"][f"{d}/b.jsonl.gz"].startswith("zlib.error: Error -3 while decompressing")


def test_truncated_and_broken_files_of_every_format_are_named(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "good.jsonl").write_bytes(_records("good", 2))
    (d / "truncated.jsonl.gz").write_bytes(gzip.compress(_records("t", 1000))[:-200])
    (d / "not-gzip.txt.gz").write_bytes(b"plain text, not gzip")
    table = pa.table({"text": [f"row {i} " * 40 for i in range(400)]})
    pq.write_table(table, d / "whole.parquet", row_group_size=200, compression="zstd")
    data = (d / "whole.parquet").read_bytes()
    (d / "cut.parquet").write_bytes(data[:len(data) // 2])                  # no footer
    corrupt = bytearray(data)
    for i in range(len(data) // 2 + 10, len(data) // 2 + 400):             # inside the second row group
        corrupt[i] ^= 0x5A
    (d / "whole.parquet").write_bytes(bytes(corrupt))

    docs, stats = _run(tmp_path / "cache", Files(paths=(f"{d}/*",)), skip_bad_files=True)
    bad = stats["bad_files"]
    assert sorted(bad) == [f"{d}/{n}" for n in ("cut.parquet", "not-gzip.txt.gz", "truncated.jsonl.gz",
                                                "whole.parquet")]
    assert bad[f"{d}/truncated.jsonl.gz"].startswith("EOFError: Compressed file ended before the end")
    assert "of the decompressed text)" in bad[f"{d}/truncated.jsonl.gz"]
    assert bad[f"{d}/not-gzip.txt.gz"].startswith("gzip.BadGzipFile: Not a gzipped file")
    assert bad[f"{d}/cut.parquet"].startswith("pyarrow.lib.ArrowInvalid: Parquet magic bytes not found")
    assert "(row group 1" in bad[f"{d}/whole.parquet"]
    texts = [doc["text"] for doc in docs]
    assert {"good record 0", "good record 1"} <= set(texts)
    assert sum(t.startswith("row ") for t in texts) == 200                  # the first row group, intact
    assert 0 < sum(t.startswith("t record") for t in texts) < 1000          # the truncated file, to the cut


# ---------------------------------------------------------------------------------------------
# No documents

def test_an_output_without_documents_fails_naming_the_inputs_unless_allowed(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text('{"text": 1}\n')
    source = Files(paths=(f"{tmp_path}/*.jsonl",))
    with pytest.raises(ValueError) as e:
        _run(tmp_path / "cache", source)
    message = str(e.value)
    assert message.startswith("download: 0 documents with text (min_docs=1) from 2 units of Files(paths=(")
    assert f"{tmp_path}/*.jsonl" in message and "{'non_string_text': 1}" in message
    assert "download.Config.min_docs = 0" in message
    docs, stats = _run(tmp_path / "cache", source, min_docs=0)
    assert stats["docs"] == 1 and docs[0]["error"] == "non_string_text"


def test_clean_that_removes_everything_fails_naming_the_input_and_the_filter(tmp_path):
    (tmp_path / "short.jsonl").write_bytes(_records("tiny", 3))   # each far below min_chars
    source = Files(paths=(f"{tmp_path}/*.jsonl",))
    downloaded = cache.run_stage(cache_root=str(tmp_path / "cache"), stage="download", key="k",
                                 config=download.Config(source=source, num_shards=1), upstream={},
                                 fn=download.run)
    out = tmp_path / "clean-out"
    with pytest.raises(ValueError) as e:
        stages.clean.run(stages.clean.Config(), {"download": downloaded}, str(out), str(tmp_path / "work"))
    message = str(e.value)
    assert message.startswith("clean kept 0 of 3 documents (min_docs=1) from 1 score tables of "
                              f"{downloaded.path}; dropped: {{'too_short': 3}}")
    assert "the filter that removed the most: too_short (3 docs" in message
    stages.clean.run(stages.clean.Config(min_docs=0), {"download": downloaded}, str(out), str(tmp_path / "w"))
    assert storage.read_json(str(out / "stats.json"))["docs_kept"] == 0                # allowed when asked
