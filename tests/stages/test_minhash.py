"""MinHash near-duplicate removal: planted Jaccard similarities, chains, survivors, and the real Beam graph.

Every text here comes from a seeded `random.Random`, and the hash functions from `minhash_seed`, so each
run computes the same signatures: a test that passes once passes always (nothing can flake). The S-curve
of 14 bands x 8 rows makes a pair at Jaccard 0.9 a candidate with p = 0.9996 and one at 0.5 with
p = 0.053; the tests assert the actual Jaccard of each planted pair, computed here from its shingles.
"""

import json
import os
import random
import statistics

import pytest

from pipeline import cache
from stages import clean
from stages.clean import minhash
from stages.io import documents, storage

LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = 300                                    # per document: 296 five-word shingles
HIGH = {"hi-0": 2, "hi-1": 2, "hi-2": 3, "hi-3": 3}          # words replaced -> Jaccard 0.935 / 0.904
LOW = {"lo-0": 20, "lo-1": 25, "lo-2": 30}                   # -> Jaccard 0.495 / 0.40 / 0.33
CHAIN = 12                                     # documents, each 3 words away from the one before
CHAIN_IDS = [f"chain-{i:02d}" for i in (5, 7, 9, 11, 3, 0, 1, 2, 4, 6, 8, 10)]   # smallest in the middle


def _word(rng):
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 9)))


def _mutate(words, k, rng, offset=None):
    """`words` with k of them, evenly spaced from `offset`, replaced by new words (letters only, so
    `simplify` keeps them)."""
    out = list(words)
    step = len(words) // k
    for i in range(k):
        out[i * step + (step // 2 if offset is None else offset)] = "q" + _word(rng)   # never in a base text
    return out


def _shingles(words, n=5):
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: str, b: str) -> float:
    sa, sb = _shingles(a.split()), _shingles(b.split())
    return len(sa & sb) / len(sa | sb)


def corpus():
    """{id: text}: pairs at planted similarities (ids ...-a and ...-b), a chain, an exact copy of a near
    duplicate, and unrelated documents."""
    rng = random.Random(20240601)
    docs = {}
    for name, k in {**HIGH, **LOW}.items():
        base = [_word(rng) for _ in range(WORDS)]
        docs[f"{name}-a"], docs[f"{name}-b"] = " ".join(base), " ".join(_mutate(base, k, rng))
    docs["hi-0-c"] = docs["hi-0-b"]            # exact copy of a near duplicate: dropped as duplicate
    words = [_word(rng) for _ in range(WORDS)]
    for t, doc_id in enumerate(CHAIN_IDS):     # each step changes 3 words the steps before did not
        docs[doc_id] = " ".join(words)
        words = _mutate(words, 3, rng, offset=7 * t + 3)
    for i in range(4):
        docs[f"other-{i}"] = " ".join(_word(rng) for _ in range(WORDS))
    return docs


DOCS = corpus()
HASHER = minhash.MinHasher(bands=14, rows=8, ngram=5, seed=1)


def _shares_a_band(a: str, b: str) -> bool:
    ka, kb = HASHER.band_keys([a, b])
    return bool(set(ka) & set(kb))


def test_planted_similarities_above_0_9_are_candidates_and_below_0_5_are_not():
    for name in HIGH:
        j = jaccard(DOCS[f"{name}-a"], DOCS[f"{name}-b"])
        assert 0.9 < j < 0.94, (name, j)
        assert _shares_a_band(DOCS[f"{name}-a"], DOCS[f"{name}-b"]), (name, j)
    for name in LOW:
        j = jaccard(DOCS[f"{name}-a"], DOCS[f"{name}-b"])
        assert 0.3 < j < 0.5, (name, j)
        assert not _shares_a_band(DOCS[f"{name}-a"], DOCS[f"{name}-b"]), (name, j)


def test_chain_ends_are_not_candidates_but_neighbours_are():
    texts = [DOCS[i] for i in CHAIN_IDS]
    assert jaccard(texts[0], texts[-1]) < 0.5
    assert not _shares_a_band(texts[0], texts[-1])
    assert all(jaccard(a, b) > 0.85 for a, b in zip(texts, texts[1:]))


def test_signature_agreement_estimates_jaccard_without_bias():
    rng = random.Random(7)
    errors = []
    for k in range(5, 45):
        base = [_word(rng) for _ in range(WORDS)]
        a, b = " ".join(base), " ".join(_mutate(base, k, rng))
        sigs, has = HASHER.signatures([a, b])
        assert has.all()
        errors.append((sigs[0] == sigs[1]).mean() - jaccard(a, b))
    # 112 hashes: one estimate's standard deviation is at most 0.047; the mean of 40 about 0.007
    assert abs(statistics.mean(errors)) < 0.025 and max(map(abs, errors)) < 0.16, errors


def test_simplify_and_short_texts():
    assert minhash.simplify("Héllo,  WORLD!\n3.14 x_y naïve 1,000") == \
        [b"hello", b"world", b"0", b"x", b"y", b"naive", b"0"]
    assert HASHER.band_keys(["one two three four", "Hello, World!"]) == [None, None]   # < 5 words
    same = ["Hello, world: one two three!", "hello world one two three"]
    assert HASHER.band_keys(same[:1]) == HASHER.band_keys(same[1:])


def test_union_find_names_each_cluster_by_its_smallest_node_whatever_the_edge_order():
    edges = [("d", "e"), ("b", "c"), ("e", "f"), ("c", "d"), ("x", "z"), ("y", "z")]
    want = dict.fromkeys("bcdef", "b") | dict.fromkeys("xyz", "x")
    for order in (edges, edges[::-1], sorted(edges), edges[2:] + edges[:2]):
        uf = minhash.UnionFind()
        uf.union_all(order)
        assert uf.components() == want
        forest = minhash.UnionFind()
        forest.union_all(uf.edges())
        assert forest.components() == want


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match=r"clean.Config.minhash_rows=0 must be an int >= 1"):
        minhash.MinHasher(bands=14, rows=0)
    with pytest.raises(ValueError, match=r"clean.Config.minhash_bands=300 must be <= 255"):
        clean.Config(minhash_bands=300)                          # when the config is made, before any run


# ---------------------------------------------------------------------------------------------
# The whole clean stage, real Beam graph

def _run(root, shards, key, **kwargs):
    def write(config, inputs, out_dir, work_dir):
        for i, docs in enumerate(shards):
            documents.write(storage.join(out_dir, documents.shard_name(i, len(shards))), docs)
    download = cache.run_stage(cache_root=root, stage="download", key=f"d-{key}", config=clean.Config(),
                               upstream={}, fn=write)
    config = clean.Config(**kwargs)
    return cache.run_stage(cache_root=root, stage="clean", key=f"c-{key}", config=config,
                           upstream={"download": download}, fn=clean.run)


def _kept(done):
    return {d["id"]: d["text"] for path in documents.shards_of(done) for d in documents.read(path)}


NEAR = sorted([f"{n}-b" for n in HIGH] + [i for i in CHAIN_IDS if i != "chain-00"])   # hi-0-c: duplicate


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache"))
    docs = [{"id": i, "text": t, "source": "test"} for i, t in DOCS.items()]
    random.Random(1).shuffle(docs)
    one = _run(root, [docs], "one", num_shards=1, samples_per_reason=3)
    three = _run(root, [docs[0::3], docs[1::3], docs[2::3]], "three", num_shards=3, samples_per_reason=3)
    again = _run(root, [docs[::-1][0::2], docs[::-1][1::2]], "again", num_shards=3, samples_per_reason=3)
    return one, three, again


def test_stage_drops_near_duplicates_and_keeps_each_clusters_smallest_id(runs):
    one, _, _ = runs
    kept = _kept(one)
    assert sorted(set(DOCS) - set(kept)) == sorted(NEAR + ["hi-0-c"])
    assert "chain-00" in kept and all(f"{n}-a" in kept for n in HIGH)
    assert all(f"{n}-a" in kept and f"{n}-b" in kept for n in LOW)
    stats = storage.read_json(one.file("stats.json"))
    assert stats["dropped"] == {"duplicate": 1, "near_duplicate": len(NEAR)}
    assert stats["docs_kept"] == len(DOCS) - 1 - len(NEAR)
    assert stats["dropped_chars"]["near_duplicate"] == sum(len(DOCS[i]) for i in NEAR)
    lines = storage.read_text(one.file("rejected/near_duplicate.jsonl")).splitlines()
    samples = [json.loads(line) for line in lines]
    assert [s["id"] for s in samples] == NEAR[:3] and samples[0]["reason"] == "near_duplicate"
    assert [json.loads(line)["id"] for line in
            storage.read_text(one.file("rejected/duplicate.jsonl")).splitlines()] == ["hi-0-c"]


def test_stage_result_is_the_same_for_any_sharding(runs):
    one, three, again = runs
    assert _kept(one) == _kept(three) == _kept(again)
    s1, s3 = storage.read_json(one.file("stats.json")), storage.read_json(three.file("stats.json"))
    assert {**s1, "shards": 3} == s3
    assert three.files == again.files
    for name in three.files:      # other input sharding and order, same output bytes
        assert storage.read_bytes(three.file(name)) == storage.read_bytes(again.file(name)), name


def test_stage_with_minhash_off_keeps_near_duplicates(tmp_path):
    docs = [{"id": i, "text": DOCS[i]} for i in ("hi-0-a", "hi-0-b", "hi-0-c")]
    done = _run(str(tmp_path), [docs], "off", num_shards=2, minhash=False)
    assert sorted(_kept(done)) == ["hi-0-a", "hi-0-b"]
    assert storage.read_json(done.file("stats.json"))["dropped"] == {"duplicate": 1}


def test_spilled_groups_give_the_bytes_of_groups_held_in_memory(runs, tmp_path, monkeypatch):
    """Locally the stage spills each batch and band batch to a file and groups their paths (graph.py); the
    in-memory groups (Dataflow's way) write the same bytes. The spill files were written, under the stage's
    work directory on the cache's disk, and are gone with the stage."""
    from stages.clean import graph

    three = runs[1]
    spills, dirs, built = [], [], graph._build_and_run

    def watched(config, paths, out_dir, spill_dir, cut):
        built(config, paths, out_dir, spill_dir, cut)
        spills.append(sorted(os.listdir(spill_dir)))
        dirs.append(spill_dir)
    monkeypatch.setattr(graph, "_build_and_run", watched)
    docs = [{"id": i, "text": t, "source": "test"} for i, t in DOCS.items()]
    random.Random(1).shuffle(docs)
    spilled = _run(str(tmp_path), [docs[0::3], docs[1::3], docs[2::3]], "three", num_shards=3,
                   samples_per_reason=3)
    assert spills and len(spills[0]) >= 6 and all(name.endswith(".pkl") for name in spills[0])
    assert not os.path.exists(dirs[0])
    assert dirs[0].startswith(os.path.join(str(tmp_path), "clean"))     # in the stage's work dir, not /tmp
    monkeypatch.setattr(graph, "_build_and_run", lambda config, paths, out_dir, spill_dir, cut: built(
        config, paths, out_dir, None, cut))
    held = _run(str(tmp_path / "held"), [docs[0::3], docs[1::3], docs[2::3]], "three", num_shards=3,
                samples_per_reason=3)
    assert spilled.files == held.files == three.files
    for name in held.files:
        assert storage.read_bytes(spilled.file(name)) == storage.read_bytes(held.file(name)), name
