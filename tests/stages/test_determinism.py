"""One cache key, one output: download, clean and shard write the same bytes with one Beam worker or two.

    .venv/bin/python -m pytest -q tests/stages/test_determinism.py

A content-addressed cache promises that a key names one output; the runner is not part of the key
(`beam_runner.Runner`), so how many workers ran a stage must not show in what it wrote. The inputs are
FineWeb-like and full of ties: the same id and text in several files (as FineWeb repeats a page across
dumps) with different `metadata` (dump, date, `score`); the same text under other ids; copies whose raw
texts differ only in spacing, so they normalize to one text but count different characters; near
duplicates (one word changed) with their own metadata. Every file of each committed attempt is compared
byte for byte, stats.json and clean's report included: none of them holds a wall time (the cache's own
`_SUCCESS.json` does, and the runner's options; it lives outside the attempt and is not compared).

Two workers is FnApiRunner's `--direct_num_workers=2` in `multi_threading` mode, which splits bundles
between the workers and so changes the order in which a group's members arrive. Which order a given run
gets is luck, so the clean test also checks the choice itself against the obvious computation (the
copy first in the whole-record order): that fails on code that keeps whichever copy came first.
"""

import json
import random

import pytest

from pipeline import cache
from stages import beam_runner, clean, download, shard
from stages.clean.order import doc_order
from stages.download.sources import Files
from stages.io import documents, storage
from tests.stages.test_tokenizer import english_docs, train

ONE = beam_runner.Runner()
TWO = beam_runner.Runner(options=("--direct_num_workers=2", "--direct_running_mode=multi_threading"))
FILES = 4            # input jsonl files (and so download shards): copies of a page sit in different ones
PAGES = 48


def fineweb_like_files(root: str) -> list[str]:
    """`FILES` jsonl files of FineWeb-like records (text, id, url, and dump, date, score, token_count, which
    download keeps in `metadata`), with the ties described in the module docstring."""
    rng = random.Random(15)
    files: list[list[dict]] = [[] for _ in range(FILES)]
    for i, page in enumerate(english_docs(PAGES, seed=3)):
        text = " ".join([page["text"].replace("\n\n", " ")] * 3)        # > clean's min_chars
        uid = f"<urn:uuid:{i:08x}-0000-4000-8000-000000000000>"

        def record(text=text, uid=uid, url=page["url"]):
            return {"text": text, "id": uid, "url": url, "dump": f"CC-MAIN-2024-{rng.randrange(10, 51)}",
                    "date": f"2024-0{rng.randrange(1, 10)}-1{rng.randrange(10)}T00:00:00Z",
                    "score": round(rng.random(), 6), "token_count": len(text.split())}

        kind = i % 4
        if kind == 0:      # the same page in three dumps: same id and text, other metadata
            for f in rng.sample(range(FILES), 3):
                files[f].append(record())
        elif kind == 1:    # the same text under two ids, and one of them twice with other metadata
            for f, uid_ in zip(rng.sample(range(FILES), 3), (uid, uid, uid.replace("urn", "urm"))):
                files[f].append(record(uid=uid_))
        elif kind == 2:    # one record, its text spaced two ways: equal once normalized, chars differ
            same = record()
            a, b = rng.sample(range(FILES), 2)
            files[a].append(same)
            files[b].append(same | {"text": text.replace(" ", "  ", 3)})
        else:              # a near duplicate (one word changed) under the same id, other metadata
            a, b = rng.sample(range(FILES), 2)
            files[a].append(record())
            files[b].append(record(text=text.replace(" the ", " a ", 1).replace(" of ", " in ", 1)))
    paths = []
    for f, records in enumerate(files):
        rng.shuffle(records)
        path = storage.join(root, "input", f"part-{f}.jsonl")
        storage.write_text(path, "".join(json.dumps(r) + "\n" for r in records))
        paths.append(path)
    return paths


def run_twice(tmp_path, stage: str, config_for, upstream: dict, fn) -> cache.Committed:
    """Runs `stage` with one worker and with two (each in its own cache root, the same key) and asserts
    every file of the two attempts is byte-identical. Returns the one-worker commit."""
    done = {}
    for name, runner in (("one", ONE), ("two", TWO)):
        done[name] = cache.run_stage(cache_root=str(tmp_path / name), stage=stage, key="same-key",
                                     config=config_for(runner), upstream=upstream, fn=fn)
    one, two = done["one"], done["two"]
    assert sorted(one.files) == sorted(two.files)
    differ = [n for n in sorted(one.files)
              if storage.read_bytes(one.file(n)) != storage.read_bytes(two.file(n))]
    assert not differ, f"{stage}: one and two workers wrote different {differ}"
    assert one.manifest["checksums"] == two.manifest["checksums"]
    return one


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("download")
    paths = fineweb_like_files(str(tmp))

    def config(runner):
        return download.Config(source=Files(paths=tuple(paths), id_field="id"), num_shards=FILES,
                               runner=runner)

    return run_twice(tmp, "download", config, {}, download.run)


def test_download_writes_the_same_bytes_with_one_or_two_workers(downloaded):
    stats = storage.read_json(downloaded.file("stats.json"))
    assert stats["shards"] == FILES and not stats["errors"]
    docs = [d for p in documents.shards_of(downloaded) for d in documents.read(p)]
    assert len({d["id"] for d in docs}) < len(docs)                       # the ties are there
    assert all(json.loads(d["metadata"]).keys() == {"dump", "date", "score", "token_count"} for d in docs)


@pytest.mark.parametrize("dedup", [True, False])
def test_clean_writes_the_same_bytes_with_one_or_two_workers(tmp_path, downloaded, dedup):
    def config(runner):
        return clean.Config(num_shards=3, dedup=dedup, minhash=dedup, samples_per_reason=3, runner=runner)

    done = run_twice(tmp_path, "clean", config, {"download": downloaded}, clean.run)
    kept = [d for p in documents.shards_of(done) for d in documents.read(p)]
    stats = storage.read_json(done.file("stats.json"))
    if not dedup:     # every copy kept, each shard in the whole-record order
        assert stats["docs_kept"] == stats["docs_in"]
    else:
        assert {"duplicate", "near_duplicate"} <= set(stats["dropped"])
        # The copy kept of each text is the first in the whole-record order, whichever came first. These
        # texts hold no newline, so normalizing them is collapsing runs of spaces.
        copies = {}
        for path in documents.shards_of(downloaded):
            for doc in documents.read(path):
                doc = documents_row(doc | {"text": " ".join(doc["text"].split())})
                copies.setdefault(doc["text"], []).append(doc)
        for doc in kept:
            assert doc == min(copies[doc["text"]], key=doc_order), doc["id"]
        assert len({d["id"] for d in kept}) == len(kept) > PAGES / 2
    for path in documents.shards_of(done):
        rows = list(documents.read(path))
        assert rows == sorted(rows, key=doc_order)


def documents_row(doc: dict) -> dict:
    return {c: doc.get(c) for c in documents.COLUMNS}


def test_shard_writes_the_same_bytes_with_one_or_two_workers(tmp_path, downloaded):
    cleaned = cache.run_stage(cache_root=str(tmp_path), stage="clean", key="c",
                              config=clean.Config(num_shards=3, minhash=False),
                              upstream={"download": downloaded}, fn=clean.run)
    tokenizer = train(str(tmp_path), cleaned, vocab_size=400, heldout_fraction=0.2)

    def config(runner):
        return shard.Config(tokens_per_shard=3000, val_fraction=0.2, seq_len=100, runner=runner)

    done = run_twice(tmp_path, "shard", config, {"clean": cleaned, "tokenizer": tokenizer}, shard.run)
    manifest = storage.read_json(done.file("manifest.json"))
    assert len(manifest["splits"]["train"]["shards"]) > 1 and manifest["splits"]["val"]["docs"] > 0
