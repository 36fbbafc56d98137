"""The download stage, run for real (Beam, FnApiRunner) into a tmp cache on small data: every source,
every bad-record reason, stable ids and bytes, shard counts, and the errors a user sees."""

import gzip
import json
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow_datasets as tfds

from pipeline import cache
from stages import download
from stages.download import Embedded, Files, FineWeb, Tfds, formats
from stages.io import documents, storage
from tests.conftest import REPO

pytestmark = pytest.mark.filterwarnings("ignore:label\\(\\) is deprecated:DeprecationWarning")   # inside TFDS


def _run(root, source, num_shards=2):
    """Runs the stage into the cache at `root`; returns (Committed, docs in shard order, stats)."""
    committed = cache.run_stage(cache_root=str(root), stage="download", key="k1",
                                config=download.Config(source=source, num_shards=num_shards),
                                upstream={}, fn=download.run)
    docs = [d for p in documents.shards_of(committed) for d in documents.read(p)]
    return committed, docs, storage.read_json(committed.file("stats.json"))


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _parquet(path, columns, row_group_size=2):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)


@pytest.fixture
def mixed(tmp_path):
    """One file of each format: 3 + 2 + 5 + 1 = 11 documents in 6 units."""
    d = tmp_path / "data"
    d.mkdir()
    _jsonl(d / "a.jsonl", [{"text": "alpha one", "id": "rec-1", "url": "https://a.example/1"},
                           {"text": "alpha two"},
                           {"text": "alpha three", "id": 7}])
    with gzip.open(d / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "beta one"}) + "\n\n" + json.dumps({"text": "beta two"}) + "\n")
    _parquet(d / "c.parquet", {"text": [f"gamma {i}" for i in range(5)],
                               "url": ["https://c.example/0", None, None, None, None]})   # 3 row groups
    (d / "d.txt").write_text("Delta first paragraph.\n\nDelta second paragraph.\n")
    paths = tuple(str(d / p) for p in ("*.jsonl", "*.jsonl.gz", "*.parquet", "*.txt"))
    return Files(paths=paths, id_field="id")


# ---------------------------------------------------------------------------------------------
# Files

def test_files_reads_every_format_into_the_requested_shards(tmp_path, mixed):
    committed, docs, stats = _run(tmp_path / "cache", mixed, num_shards=2)

    expected = ["alpha one", "alpha two", "alpha three", "beta one", "beta two",
                *(f"gamma {i}" for i in range(5)), "Delta first paragraph.\n\nDelta second paragraph.\n"]
    assert sorted(d["text"] for d in docs) == sorted(expected)
    assert sorted(committed.files) == ["docs-00000-of-00002.parquet", "docs-00001-of-00002.parquet",
                                       "stats.json"]
    assert stats == {"docs": 11, "bytes": sum(len(t.encode()) for t in expected), "shards": 2, "units": 6,
                     "errors": {}, "by_source": {"files": 11}, "skipped_records": {},
                     "bad_files": {}}
    by_text = {d["text"]: d for d in docs}
    data = tmp_path / "data"
    assert by_text["alpha one"]["id"] == "rec-1" and by_text["alpha one"]["url"] == "https://a.example/1"
    assert by_text["alpha three"]["id"] == "7"                                   # an int id, as a string
    assert by_text["alpha two"]["id"].startswith("files/")                      # derived from file and line
    assert by_text["alpha two"]["url"] == f"{data}/a.jsonl:2"
    assert by_text["beta two"]["url"] == f"{data}/b.jsonl.gz:3"                  # the blank line 2 is skipped
    assert by_text["gamma 0"]["url"] == "https://c.example/0"
    assert by_text["gamma 4"]["url"] == f"{data}/c.parquet:4"                    # row 4: the third row group
    assert all(d["source"] == "files" and d["error"] is None for d in docs)
    assert len({d["id"] for d in docs}) == 11


def test_units_are_files_and_parquet_row_groups_dealt_round_robin(mixed, tmp_path):
    data = str(tmp_path / "data")
    assert mixed.units() == [(f"{data}/a.jsonl", 0), (f"{data}/b.jsonl.gz", 0), (f"{data}/c.parquet", 0),
                             (f"{data}/c.parquet", 1), (f"{data}/c.parquet", 2), (f"{data}/d.txt", 0)]
    assert download.deal(list(range(7)), 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert download.deal(list(range(2)), 8) == [[0], [1]]
    assert download.deal([], 4) == [[]]    # an empty source still writes one (empty) shard


def test_num_shards_is_respected_and_capped_by_the_number_of_units(tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(7):
        _jsonl(tmp_path / f"in/{i}.jsonl", [{"text": f"doc {i}"}])
    source = Files(paths=(str(tmp_path / "in/*.jsonl"),))

    committed, docs, stats = _run(tmp_path / "three", source, num_shards=3)
    assert committed.paths("docs-*") == [committed.file(documents.shard_name(i, 3)) for i in range(3)]
    assert [d["text"] for d in docs] == ["doc 0", "doc 3", "doc 6", "doc 1", "doc 4", "doc 2", "doc 5"]
    assert stats["shards"] == 3 and stats["units"] == 7

    committed, _, stats = _run(tmp_path / "many", source, num_shards=20)
    assert len(committed.paths("docs-*")) == 7 and stats["shards"] == 7


def test_txt_paragraphs_split_on_blank_lines(tmp_path):
    (tmp_path / "t.txt").write_text("Para one\nline two\n\n   \nPara two\n\nPara three\n")
    (tmp_path / "u.txt.gz").write_bytes(gzip.compress(b"Zipped one\n\nZipped two"))
    _, docs, _ = _run(tmp_path / "cache", Files(paths=(str(tmp_path / "*.txt*"),), txt_unit="paragraph"),
                      num_shards=1)
    assert [(d["text"], d["url"]) for d in docs] == [
        ("Para one\nline two", f"{tmp_path}/t.txt:1"), ("Para two", f"{tmp_path}/t.txt:5"),
        ("Para three", f"{tmp_path}/t.txt:7"),
        ("Zipped one", f"{tmp_path}/u.txt.gz:1"), ("Zipped two", f"{tmp_path}/u.txt.gz:3")]
    assert list(formats.paragraphs("a\r\nb\r\n\r\nc")) == [(1, "a\nb"), (4, "c")]


def test_bad_records_become_documents_with_a_reason_and_never_crash(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    huge = "x" * 10_000_000
    lines = [
        b'{"text": "fine"}',
        b'{"text": "broken',                       # malformed_json
        b'{"text": "caf\xe9"}',                    # latin-1, not UTF-8: invalid_utf8
        b'{"title": "no text"}',                   # missing_text
        b'{"text": null}',                         # missing_text
        b'{"text": 42}',                           # non_string_text
        b'{"text": ["a", "b"]}',                   # non_string_text
        b"[1, 2]",                                 # not_an_object
        b'{"text": "lone \\ud800 surrogate"}',     # parses, but parquet cannot store it: invalid_utf8
        b"[" * 100_000,                            # RecursionError inside json: malformed_json
        b'{"text": "' + huge.encode() + b'"}',     # a 10 MB one-line document is just a document
    ]
    (d / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (d / "latin1.txt").write_bytes("na\xefve".encode("latin-1"))                         # invalid_utf8
    _parquet(d / "nulls.parquet", {"text": pa.array([None, "ok"], pa.string())})      # missing_text
    _parquet(d / "ints.parquet", {"text": [1, 2]})                                    # non_string_text x2

    _, docs, stats = _run(tmp_path / "cache", Files(paths=(str(d / "*"),)))

    assert stats["errors"] == {"malformed_json": 2, "invalid_utf8": 3, "missing_text": 3,
                               "non_string_text": 4, "not_an_object": 1}
    assert stats["docs"] == 11 + 1 + 2 + 2
    assert stats["bytes"] == len("fine") + len(huge) + len("ok")
    errors = {d["url"]: d["error"] for d in docs if d["error"]}
    assert errors[f"{d}/bad.jsonl:2"] == "malformed_json" and errors[f"{d}/bad.jsonl:3"] == "invalid_utf8"
    assert errors[f"{d}/bad.jsonl:8"] == "not_an_object" and errors[f"{d}/bad.jsonl:9"] == "invalid_utf8"
    assert errors[f"{d}/latin1.txt"] == "invalid_utf8" and errors[f"{d}/ints.parquet:1"] == "non_string_text"
    assert all(doc["text"] is None for doc in docs if doc["error"])
    assert sorted(len(doc["text"]) for doc in docs if not doc["error"]) == [2, 4, 10_000_000]


def test_a_utf8_byte_order_mark_does_not_cost_the_first_record(tmp_path):
    bom = b"\xef\xbb\xbf"
    jsonl = bom + b'{"text": "first"}\n' + bom + b'{"text": "second"}\n'   # only a leading BOM is one
    (tmp_path / "a.jsonl").write_bytes(jsonl)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(jsonl))
    (tmp_path / "c.txt").write_bytes(bom + b"Para one\n\nPara two \xef\xbb\xbf kept")
    for name in ("a.jsonl", "b.jsonl.gz"):
        docs = list(formats.read(str(tmp_path / name), 0, formats.Fields()))
        assert [(d["text"], d["error"]) for d in docs] == [("first", None), (None, "malformed_json")], name
    split = {"file": ["Para one\n\nPara two \ufeff kept"], "paragraph": ["Para one", "Para two \ufeff kept"]}
    for unit, texts in split.items():
        docs = list(formats.read(str(tmp_path / "c.txt"), 0, formats.Fields(txt_unit=unit)))
        assert [d["text"] for d in docs] == texts and not any(d["error"] for d in docs)


def test_ids_and_bytes_are_identical_across_runs(tmp_path, mixed):
    first, docs1, _ = _run(tmp_path / "one", mixed, num_shards=3)
    second, docs2, _ = _run(tmp_path / "two", mixed, num_shards=3)
    assert [d["id"] for d in docs1] == [d["id"] for d in docs2]
    assert first.files == second.files
    for name in first.files:
        assert storage.read_bytes(first.file(name)) == storage.read_bytes(second.file(name)), name


@pytest.mark.gcs
def test_files_on_gcs_into_a_gcs_cache(gcs_bucket):
    storage.write_bytes(f"{gcs_bucket}/in/part-0.jsonl.gz", gzip.compress(b'{"text": "from the bucket"}\n'))
    committed, docs, stats = _run(f"{gcs_bucket}/cache", Files(paths=(f"{gcs_bucket}/in/*.jsonl.gz",)))
    assert committed.path.startswith(f"{gcs_bucket}/cache/download/k1/attempt-")
    assert [(d["text"], d["url"]) for d in docs] == [
        ("from the bucket", f"{gcs_bucket}/in/part-0.jsonl.gz:1")]
    assert stats["docs"] == 1


# ---------------------------------------------------------------------------------------------
# Tfds, FineWeb, Embedded

class DownloadTestText(tfds.core.GeneratorBasedBuilder):
    """A 20-record text dataset the Tfds source prepares (array_record, no TensorFlow) and reads."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = tfds.features.FeaturesDict({"body": tfds.features.Text()})
        return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(20):
            yield i, {"body": f"record {i} caf\u00e9"}


def test_tfds_prepares_a_missing_dataset_and_reads_it_without_tensorflow(tmp_path):
    source = Tfds(name="download_test_text", data_dir=str(tmp_path / "tfds"), text_key="body",
                  records_per_unit=7)
    assert source.units() == [(0, 7), (7, 14), (14, 20)]   # prepares the dataset on first use
    assert tfds.builder("download_test_text", data_dir=str(tmp_path / "tfds")).is_prepared()

    _, docs, stats = _run(tmp_path / "cache", source, num_shards=2)
    assert sorted(d["text"] for d in docs) == sorted(f"record {i} caf\u00e9" for i in range(20))
    assert stats["by_source"] == {"tfds/download_test_text": 20} and stats["units"] == 3
    assert docs[0]["url"] == "tfds:download_test_text:train:0"
    assert "tensorflow" not in sys.modules

    _, docs, _ = _run(tmp_path / "cache5", Tfds(name="download_test_text", data_dir=str(tmp_path / "tfds"),
                                                 split="train[:5]", text_key="body"))
    assert len(docs) == 5


def test_fineweb_reads_a_hub_like_directory_with_dataset_ids(tmp_path):
    root = tmp_path / "datasets/HuggingFaceFW/fineweb"
    for f in range(2):
        n = 5
        _parquet(root / f"sample/10BT/00{f}_00000.parquet", {
            "text": [f"web page {f}.{i}" for i in range(n)],
            "id": [f"<urn:uuid:{f}-{i}>" for i in range(n)],
            "dump": ["CC-MAIN-2024-10"] * n,
            "url": [f"https://site{f}.example/{i}" for i in range(n)],
            "date": ["2024-02-21T00:00:00Z"] * n,
            "file_path": ["s3://commoncrawl/x.warc.gz"] * n,
            "language": ["en"] * n,
            "language_score": [0.9] * n,
            "token_count": [3] * n,
        })
    source = FineWeb(root=str(root))
    assert len(source.units()) == 6   # 2 files x 3 row groups

    _, docs, stats = _run(tmp_path / "cache", source, num_shards=4)
    assert sorted(d["id"] for d in docs) == sorted(f"<urn:uuid:{f}-{i}>" for f in range(2) for i in range(5))
    by_id = {d["id"]: d for d in docs}
    assert (by_id["<urn:uuid:1-3>"]["text"], by_id["<urn:uuid:1-3>"]["url"]) == (
        "web page 1.3", "https://site1.example/3")
    assert stats["by_source"] == {"fineweb/CC-MAIN-2024-10": 10} and stats["shards"] == 4

    _, docs, _ = _run(tmp_path / "one", FineWeb(root=str(root), max_files=1))
    assert sorted(d["text"] for d in docs) == [f"web page 0.{i}" for i in range(5)]


def test_embedded_reads_stdlib_docstrings_and_help_topics(tmp_path):
    source = Embedded(max_files=3)
    files = [f for unit in source.units() for f in unit]
    assert len(files) == 4 and files[-1] == "pydoc_data/topics.py"
    assert len([f for unit in Embedded(include_topics=False).units() for f in unit]) > 300

    _, docs, stats = _run(tmp_path / "cache", source)
    topics = [d for d in docs if d["url"].startswith("pydoc_data/topics.py#")]
    docstrings = [d for d in docs if d not in topics]
    assert len(topics) > 50 and any(d["url"] == "pydoc_data/topics.py#assert" for d in topics)
    assert docstrings and all(d["url"].split(":")[0] in files[:3] for d in docstrings)
    assert stats["errors"] == {} and stats["by_source"] == {"embedded": len(docs)}
    assert all(d["text"] and d["text"] == d["text"].strip() for d in docs)


# ---------------------------------------------------------------------------------------------
# Errors a user sees, and a cheap import

def test_a_glob_that_matches_nothing_is_named(tmp_path):
    pattern = str(tmp_path / "nothing/*.jsonl")
    with pytest.raises(ValueError, match=re.escape(f"download.Files.paths: '{pattern}' matches no files")):
        Files(paths=(pattern,)).units()
    with pytest.raises(ValueError, match="matches no files"):
        FineWeb(root=str(tmp_path)).units()


def test_unsupported_files_and_missing_columns_are_named(tmp_path):
    (tmp_path / "table.csv").write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"table.csv has an unsupported extension; supported are .jsonl, "):
        Files(paths=(str(tmp_path / "*.csv"),)).units()
    _parquet(tmp_path / "p.parquet", {"body": ["hello"]})
    with pytest.raises(ValueError, match=r"p.parquet has no column 'text'; its columns are \['body'\]"):
        Files(paths=(str(tmp_path / "*.parquet"),)).units()


@pytest.mark.parametrize("make, message", [
    (lambda: download.Config(num_shards=0), "num_shards=0 must be >= 1"),
    (lambda: download.Config(source="files"), "source='files' is not one of @download.Embedded(), "),
    (lambda: Files(), "Files.paths is empty"),
    (lambda: Files(paths="data/*.jsonl"), "is one string; expected a list of globs: ['data/*.jsonl']"),
    (lambda: Files(paths=("x",), txt_unit="line"), "txt_unit='line' is not one of ('file', 'paragraph')"),
    (lambda: Files(paths=("x",), text_field=""), "Files.text_field is empty"),
    (lambda: Tfds(), "Tfds.name is empty"),
    (lambda: Tfds(name="x", records_per_unit=0), "Tfds.records_per_unit=0 must be >= 1"),
    (lambda: Embedded(max_files=-1), "Embedded.max_files=-1 must be >= 0"),
    (lambda: FineWeb(max_files=-2), "FineWeb.max_files=-2 must be >= 0"),
])
def test_bad_config_values_are_named(make, message):
    with pytest.raises((ValueError, TypeError)) as e:
        make()
    assert message in str(e.value)


def test_lists_from_gin_become_tuples():
    assert Files(paths=["a/*.jsonl"]).paths == ("a/*.jsonl",)


def test_importing_the_stage_imports_neither_beam_nor_pyarrow():
    code = ("import sys, stages.download; "
            "print(sorted(m for m in ('apache_beam', 'pyarrow', 'tensorflow_datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_an_embedded_file_that_does_not_parse_is_a_syntax_error_record_and_the_next_file_is_read(tmp_path,
                                                                                                monkeypatch):
    """A standard-library file that does not parse (some builds ship test data written as .py) is one
    `syntax_error` record, and reading goes on."""
    from stages.download import embedded

    (tmp_path / "broken.py").write_text("def (:\n")
    (tmp_path / "fine.py").write_text('"""A module docstring."""\n')
    monkeypatch.setattr(embedded, "_stdlib", lambda: str(tmp_path))
    docs = list(embedded.read(("broken.py", "fine.py")))
    assert [(d["url"], d["error"]) for d in docs] == [("broken.py", "syntax_error"), ("fine.py:1", None)]
    assert docs[0]["text"] is None and docs[1]["text"] == "A module docstring."


def test_the_embedded_corpus_reads_the_same_from_several_threads():
    """Beam's multi-threaded runner reads units from several threads; CPython 3.11's `ast.parse` is not
    thread-safe (it failed once there with "AST constructor recursion depth mismatch"), so embedded.py
    parses under a lock. Every unit read from four threads at once must equal reading them in turn."""
    from concurrent.futures import ThreadPoolExecutor

    from stages.download import embedded

    units = embedded.units(120)
    in_turn = [list(embedded.read(u)) for u in units]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda u: list(embedded.read(u)), units)) == in_turn
