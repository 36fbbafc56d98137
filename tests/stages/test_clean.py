"""The clean stage end to end: Beam over real parquet shards in a real cache directory."""

import dataclasses
import functools
import json
import subprocess
import sys

import pytest

from pipeline import cache
from stages import clean
from stages.clean import gopher
from stages.io import documents, storage
from tests.conftest import REPO

GOOD = "A plain sentence with plenty of letters in it, enough to pass. " * 5   # 320 chars
BIG_LINE = "word" * 2_500_000                                                    # 10 MB, one line

# Two input shards holding every reason. Duplicates differ only in whitespace, so they are equal
# after normalization, and they sit in different input shards. The good documents are near duplicates
# of each other, so these tests run with MinHash off; tests/stages/test_minhash.py covers it.
SHARDS = [
    [
        {"id": "good-1", "text": GOOD, "url": "http://a/1", "source": "test"},
        {"id": "good-2", "text": "  Para one.\r\n\r\n\r\n\r\nPara  two\t\there. \x00 " + GOOD,
         "source": "test"},
        {"id": "dup-b", "text": "Same  text " + GOOD, "url": "http://a/dup-b"},
        {"id": "short-c", "text": "tiny c"},
        {"id": "short-a", "text": "tiny a"},
        {"id": "err-json", "text": None, "error": "malformed_json", "url": "f.jsonl:3"},
        {"id": "err-utf8", "text": None, "error": "invalid_utf8", "url": "f.jsonl:4"},
        {"id": "null", "text": None},
        {"id": "blank", "text": " \t\n\x00\x01 \r\n "},
        {"id": "long", "text": BIG_LINE},
        {"id": "digits", "text": "1234 5678 " * 40},
    ],
    [
        {"id": "dup-a", "text": "Same text " + GOOD + "\n\n\n"},
        {"id": "dup-c", "text": "Same  \ttext " + GOOD},
        {"id": "short-b", "text": "tiny b"},
        {"id": "err-nonstr", "text": None, "error": "non_string_text"},
        {"id": "err-missing", "text": None, "error": "missing_text"},
        {"id": "good-3", "text": "Cafe\u0301 " + GOOD, "error": ""},
    ],
]
KEPT = {"good-1": GOOD.strip(), "good-2": "Para one.\n\nPara two here. " + GOOD.strip(),
        "good-3": "Caf\u00e9 " + GOOD.strip(), "dup-a": "Same text " + GOOD.strip()}
DROPPED = {"duplicate": ["dup-b", "dup-c"], "too_short": ["short-a", "short-b", "short-c"],
           "malformed_json": ["err-json"], "invalid_utf8": ["err-utf8"], "non_string_text": ["err-nonstr"],
           "missing_text": ["err-missing"], "null_text": ["null"], "empty": ["blank"], "too_long": ["long"],
           "too_few_alpha": ["digits"]}


def _download(root, shards, key="d"):
    def write(config, inputs, out_dir, work_dir):
        for i, docs in enumerate(shards):
            documents.write(storage.join(out_dir, documents.shard_name(i, len(shards))), docs)
    return cache.run_stage(cache_root=root, stage="download", key=key, config=clean.Config(), upstream={},
                           fn=write)


def _clean(root, download, key="c", **kwargs):
    return cache.run_stage(cache_root=root, stage="clean", key=key, config=clean.Config(**kwargs),
                           upstream={"download": download}, fn=clean.run)


def _docs(done):
    return {path.rsplit("/", 1)[1]: list(documents.read(path)) for path in documents.shards_of(done)}


def _rejected(done, reason):
    lines = storage.read_text(done.file(f"rejected/{reason}.jsonl")).splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache"))
    return root, _clean(root, _download(root, SHARDS), num_shards=3, samples_per_reason=2, minhash=False)


def test_kept_documents_are_normalized_sorted_and_in_their_bucket(cleaned):
    _, done = cleaned
    shards = _docs(done)
    assert sorted(shards) == [documents.shard_name(i, 3) for i in range(3)]
    got = {}
    for name, docs in shards.items():
        bucket = int(name.split("-")[1])
        assert [d["id"] for d in docs] == sorted(d["id"] for d in docs), name
        for d in docs:
            assert d["error"] is None
            assert int.from_bytes(clean.duplicate_key(d["text"])[:8], "big") % 3 == bucket
            got[d["id"]] = d["text"]
    assert got == KEPT
    assert {d["id"]: (d["url"], d["source"]) for docs in shards.values() for d in docs}["good-1"] == \
        ("http://a/1", "test")


def test_stats_count_every_document_once(cleaned):
    _, done = cleaned
    stats = storage.read_json(done.file("stats.json"))
    assert stats["dropped"] == {reason: len(ids) for reason, ids in DROPPED.items()}
    assert stats["docs_in"] == sum(map(len, SHARDS)) == stats["docs_kept"] + sum(stats["dropped"].values())
    assert stats["docs_kept"] == len(KEPT) and stats["shards"] == 3
    raw = {d["id"]: len(d["text"]) for docs in SHARDS for d in docs if isinstance(d["text"], str)}
    assert stats["chars_in"] == sum(raw.values())
    assert stats["chars_kept"] == sum(map(len, KEPT.values()))
    assert stats["dropped_chars"] == {reason: sum(raw.get(i, 0) for i in ids)
                                      for reason, ids in DROPPED.items()}


def test_rejected_samples_are_the_smallest_ids_per_reason(cleaned):
    _, done = cleaned
    assert sorted(n for n in done.files if n.startswith("rejected/")) == \
        sorted(f"rejected/{reason}.jsonl" for reason in DROPPED)
    for reason, ids in DROPPED.items():
        samples = _rejected(done, reason)
        assert [s["id"] for s in samples] == sorted(ids)[:2], reason
        assert all(s["reason"] == reason for s in samples)
        assert all(set(s) == {"id", "url", "source", "reason", "text"} for s in samples)
    assert _rejected(done, "duplicate")[0] == {"id": "dup-b", "url": "http://a/dup-b", "source": None,
                                               "reason": "duplicate", "text": "Same text " + GOOD.strip()}
    assert _rejected(done, "too_long")[0]["text"] == BIG_LINE[:500]
    assert _rejected(done, "malformed_json")[0] == {"id": "err-json", "url": "f.jsonl:3", "source": None,
                                                    "reason": "malformed_json", "text": None}


def test_output_bytes_depend_only_on_the_documents_not_on_how_they_were_sharded(cleaned):
    root, done = cleaned
    docs = [d for shard in SHARDS for d in shard]
    reshuffled = [docs[::-1][i::3] for i in range(3)]    # other order, other shards, other shard count
    again = _clean(root, _download(root, reshuffled, key="d2"), key="c2", num_shards=3, samples_per_reason=2,
                   minhash=False)
    assert again.files == done.files
    for name in done.files:
        assert storage.read_bytes(again.file(name)) == storage.read_bytes(done.file(name)), name


def test_dedup_off_keeps_every_copy(tmp_path):
    root = str(tmp_path)
    shards = [[{"id": "b", "text": GOOD}], [{"id": "a", "text": GOOD}, {"id": "c", "text": " " + GOOD}]]
    done = _clean(root, _download(root, shards), dedup=False, num_shards=2, samples_per_reason=0)
    assert sorted(d["id"] for docs in _docs(done).values() for d in docs) == ["a", "b", "c"]
    stats = storage.read_json(done.file("stats.json"))
    assert stats["docs_kept"] == 3 and stats["dropped"] == {}
    assert not any(n.startswith("rejected/") for n in done.files)


def test_empty_input_writes_every_shard_and_zero_stats(tmp_path):
    root = str(tmp_path)
    done = _clean(root, _download(root, [[]]), num_shards=4, min_docs=0)      # allowed to be empty
    sizes = {name: len(docs) for name, docs in _docs(done).items()}
    assert sizes == {documents.shard_name(i, 4): 0 for i in range(4)}
    assert storage.read_json(done.file("stats.json")) == {
        "docs_in": 0, "chars_in": 0, "docs_kept": 0, "chars_kept": 0, "dropped": {}, "dropped_chars": {},
        "shards": 4, "rewritten": {}}


@pytest.mark.gcs
def test_runs_with_the_cache_on_gcs(gcs_bucket):
    root = gcs_bucket + "/cache"
    done = _clean(root, _download(root, SHARDS[1:]), num_shards=2, minhash=False)
    assert done.path.startswith("gs://")
    assert {d["id"] for docs in _docs(done).values() for d in docs} == {"dup-a", "good-3"}
    assert storage.read_json(done.file("stats.json"))["dropped"] == {
        "duplicate": 1, "too_short": 1, "non_string_text": 1, "missing_text": 1}
    assert [s["id"] for s in _rejected(done, "duplicate")] == ["dup-c"]


def test_importing_the_stage_does_not_import_beam():
    code = "import sys, stages.clean; assert not {'apache_beam', 'pyarrow'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_key_is_the_canonical_json_of_the_config_with_its_filters():
    on = clean.Config(gopher_quality=gopher.GopherQuality())
    as_json = cache.config_to_json(on, for_key=True)
    assert as_json["gopher_quality"] == {"@type": "GopherQuality",
                                         **dataclasses.asdict(gopher.GopherQuality())}
    assert as_json["url_filter"] is None and "runner" not in as_json
    key = functools.partial(cache.stage_key, "clean", clean.VERSION, upstream_keys={"download": "d"})
    assert key(on) == key(clean.Config(gopher_quality=gopher.GopherQuality(min_doc_words=50)))
    assert len({key(clean.Config()), key(on), key(clean.Config(gopher_quality=gopher.GopherQuality(
        min_doc_words=20))), key(clean.Config(gopher_quality=gopher.GopherQuality(splitter="nltk")))}) == 4
