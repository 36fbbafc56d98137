"""MinHash near-duplicate removal, ours (stages/clean/minhash.py) vs. datatrove 0.10.1's, on one corpus.

    .venv/bin/python -m benchmarks minhash_vs_datatrove     # writes benchmarks/out/minhash_vs_datatrove.json

The corpus is the 697 real pages (`web_corpus`) plus planted near-duplicates: for `per_class` pages of at
least MIN_WORDS words each, one copy with a known share of its words replaced by other words of the corpus
(1% to 35%), and one class lowercased with 1% of words replaced and a footer added (the issue's example).
Each copy's true Jaccard similarity to its page (5-word shingle sets after `minhash.simplify`) is recorded.
Both sides use FineWeb's parameters: 5-gram shingles, 14 bands x 8 rows, 64-bit hashes.

Measured, in one run, one core each:
- ours as pure functions (`MinHasher.band_keys`, band buckets, `UnionFind`) and as the clean stage on
  FnApiRunner (minhash on, every other filter off), vs. datatrove's four steps (signatures, buckets,
  clusters, filter) under LocalPipelineExecutor with one worker: docs/s;
- the planted pairs each finds (both documents in one cluster), per similarity class, and the pairs
  of real pages each joins; how many documents each removes, and how many of those are the same.
A pair near LSH's threshold (s ~ 0.6-0.8) is found with a probability, not always: the two use different
hash functions, so they may disagree on such pairs one by one while finding the same share.
"""

from __future__ import annotations

import os
import random
import struct
import sys
import time

from benchmarks import web_corpus
from stages.clean import minhash

RATES = (0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.35)     # share of words replaced in a planted copy
MIN_WORDS = 150
FOOTER = ("Copyright 2019 All rights reserved. Privacy policy. Terms of use. Contact us. "
          "Follow us on social media.")


def measure(work_dir: str, per_class: int = 15, seed: int = 0) -> dict:
    why = web_corpus.missing()
    if why:
        print(f"minhash_vs_datatrove: {why}")
        return {"benchmark": "minhash_vs_datatrove", "skipped": why}
    from benchmarks.fineweb_filters import _quiet_datatrove

    _quiet_datatrove()
    pages = web_corpus.pages()
    docs, planted = plant(pages, per_class, seed)
    ours_pure = _ours_pure(docs)
    ours_job = _ours_job(docs, work_dir)
    theirs = _theirs(docs, work_dir)

    result = {"benchmark": "minhash_vs_datatrove", "docs": len(docs), "real_pages": len(pages),
              "planted_copies": len(planted), "datatrove": _version("datatrove"),
              "ours_pure_s": round(ours_pure["s"], 3),
              "ours_pure_docs_per_s": round(len(docs) / ours_pure["s"]),
              "ours_stage_s": round(ours_job["s"], 2),
              "ours_stage_docs_per_s": round(len(docs) / ours_job["s"]),
              "datatrove_s": round(theirs["s"], 2), "datatrove_docs_per_s": round(len(docs) / theirs["s"], 1),
              "datatrove_signature_s": round(theirs["signature_s"], 2),
              "speedup_pure": round(theirs["s"] / ours_pure["s"], 1),
              "speedup_stage": round(theirs["s"] / ours_job["s"], 1)}
    by_class: dict[str, dict] = {}
    for p in planted:
        c = by_class.setdefault(p["class"], {"pairs": 0, "jaccard_min": 1.0, "jaccard_max": 0.0,
                                            "found_ours": 0, "found_datatrove": 0, "found_by_one_only": 0})
        c["pairs"] += 1
        c["jaccard_min"] = round(min(c["jaccard_min"], p["jaccard"]), 3)
        c["jaccard_max"] = round(max(c["jaccard_max"], p["jaccard"]), 3)
        a = ours_pure["root"][p["base"]] == ours_pure["root"][p["copy"]]
        b = theirs["root"][p["base"]] == theirs["root"][p["copy"]]
        c["found_ours"] += a
        c["found_datatrove"] += b
        c["found_by_one_only"] += a != b
    result["planted"] = by_class
    copies = {p["copy"] for p in planted}
    real = range(len(docs))
    ours_real = _same_cluster_pairs(ours_pure["root"], [i for i in real if i not in copies])
    theirs_real = _same_cluster_pairs(theirs["root"], [i for i in real if i not in copies])
    result["real_page_pairs"] = {"ours": len(ours_real), "datatrove": len(theirs_real),
                                 "both": len(ours_real & theirs_real),
                                 "only_ours": sorted([docs[a]["id"], docs[b]["id"]]
                                                     for a, b in ours_real - theirs_real),
                                 "only_datatrove": sorted([docs[a]["id"], docs[b]["id"]]
                                                          for a, b in theirs_real - ours_real)}
    removed_ours = {i for i, r in ours_pure["root"].items() if r != i}
    result["removed"] = {"ours_pure": len(removed_ours), "ours_stage": ours_job["removed"],
                         "datatrove": len(theirs["removed"]), "both": len(removed_ours & theirs["removed"]),
                         "candidate_edges_ours": ours_pure["edges"],
                         "candidate_edges_datatrove": theirs["edges"]}
    return result


def plant(pages: list[dict], per_class: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(pages + planted copies, [{class, base, copy, jaccard}] by index into the returned list)."""
    rng = random.Random(seed)
    docs = [dict(p) for p in pages]
    vocab = sorted({w for p in pages for w in p["text"].split() if w.isalpha() and len(w) > 3})
    long_pages = [i for i, p in enumerate(pages) if len(minhash.simplify(p["text"])) >= MIN_WORDS]
    classes = [f"replace_{r:.0%}" for r in RATES] + ["lower_1%_footer"]
    bases = rng.sample(long_pages, min(len(long_pages), per_class * len(classes)))
    planted = []
    for k, base in enumerate(bases):
        name = classes[k % len(classes)]
        rate = 0.01 if name == "lower_1%_footer" else RATES[k % len(classes)]
        tokens = pages[base]["text"].split(" ")
        for j in rng.sample(range(len(tokens)), max(1, round(rate * len(tokens)))):
            tokens[j] = rng.choice(vocab)
        text = " ".join(tokens)
        if name == "lower_1%_footer":
            text = text.lower() + "\n\n" + FOOTER
        docs.append({"id": f"{pages[base]['id']}-near-{name}", "text": text, "url": pages[base]["url"]})
        planted.append({"class": name, "base": base, "copy": len(docs) - 1,
                        "jaccard": _jaccard(pages[base]["text"], text)})
    return docs, planted


def _jaccard(a: str, b: str) -> float:
    def shingles(t):
        w = minhash.simplify(t)
        return set(zip(*(w[i:] for i in range(5))))
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / max(len(sa | sb), 1)


def _ours_pure(docs: list[dict]) -> dict:
    hasher = minhash.MinHasher(bands=14, rows=8, ngram=5, seed=1)
    start = time.perf_counter()
    first: dict[bytes, int] = {}
    forest = minhash.UnionFind()
    edges = 0
    for i, keys in enumerate(hasher.band_keys([d["text"] for d in docs])):
        for key in keys or ():
            other = first.setdefault(key, i)
            if other != i:
                edges += 1
                forest.union(other, i)
    seconds = time.perf_counter() - start
    return {"s": seconds, "root": {i: forest.find(i) for i in range(len(docs))}, "edges": edges}


def _ours_job(docs: list[dict], work_dir: str) -> dict:
    from stages import beam_runner, clean
    from stages.clean import graph
    from stages.io import documents, storage

    src = os.path.join(work_dir, "ours-in", documents.shard_name(0, 1))
    documents.write(src, [{"id": d["id"], "text": d["text"], "url": d["url"], "source": "cc"} for d in docs])
    config = clean.Config(min_chars=0, max_chars=10**9, min_alpha_fraction=0, dedup=True, minhash=True,
                          num_shards=1, runner=beam_runner.Runner(options=("--direct_num_workers=1",)))
    out = os.path.join(work_dir, "ours-out")
    start = time.perf_counter()
    graph.run(config, [src], out)
    seconds = time.perf_counter() - start
    stats = storage.read_json(storage.join(out, "stats.json"))
    return {"s": seconds, "removed": stats["dropped"].get("near_duplicate", 0)}


def _theirs(docs: list[dict], work_dir: str) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    base = os.path.join(work_dir, "dt")
    src = os.path.join(base, "in")
    web_corpus.write_jsonl(os.path.join(src, "docs.jsonl"), docs)     # one file: doc index = position
    config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8,
                           hash_config=HashConfig(precision=64))      # FineWeb's
    steps = [
        ([JsonlReader(src), MinhashDedupSignature(output_folder=f"{base}/sigs", config=config)], 1),
        ([MinhashDedupBuckets(input_folder=f"{base}/sigs", output_folder=f"{base}/buckets", config=config)],
         config.num_buckets),
        ([MinhashDedupCluster(input_folder=f"{base}/buckets", output_folder=f"{base}/remove", config=config)],
         1),
        ([JsonlReader(src), MinhashDedupFilter(input_folder=f"{base}/remove"), JsonlWriter(f"{base}/out")],
         1),
    ]
    times = []
    for n, (pipeline, tasks) in enumerate(steps):
        executor = LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1,
                                         logging_dir=f"{base}/logs-{n}")
        start = time.perf_counter()
        executor.run()
        times.append(time.perf_counter() - start)
    forest = minhash.UnionFind()
    edges = 0
    for name in sorted(os.listdir(f"{base}/buckets")):
        with open(os.path.join(base, "buckets", name), "rb") as f:
            raw = f.read()
        for _, d1, _, d2 in struct.iter_unpack("<4I", raw):
            edges += 1
            forest.union(d1, d2)     # one input file: its documents are numbered in order
    removed = set()
    path = os.path.join(base, "remove", "000000.remove")
    if os.path.exists(path):
        with open(path, "rb") as f:
            removed = {d for (d,) in struct.iter_unpack("<I", f.read())}
    return {"s": sum(times), "signature_s": times[0], "edges": edges, "removed": removed,
            "root": {i: forest.find(i) for i in range(len(docs))}}


def _same_cluster_pairs(root: dict, nodes: list[int]) -> set[tuple[int, int]]:
    groups: dict[int, list[int]] = {}
    for i in nodes:
        groups.setdefault(root[i], []).append(i)
    return {(a, b) for g in groups.values() for k, a in enumerate(g) for b in g[k + 1:]}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    from benchmarks.__main__ import main  # writes the JSON and prints the table

    sys.exit(main(["minhash_vs_datatrove"]))
