"""Cleaning in two nodes: score measures every document once, clean selects by thresholds.

    .venv/bin/python -m pytest -q tests/stages/test_score.py

The split must change no output (the default thresholds give what the one-pass stage wrote, file by file:
tests/stages/clean_golden.py), a threshold must rerun clean and never score, `keep_fraction` must keep exactly
its quantile, and a scoring run killed halfway must rerun to the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from pipeline import cache
from pipeline import config as pipeline_config
from stages import clean, score
from stages.clean import graph, select
from stages.io import documents, storage
from stages.score import graph as score_graph
from stages.score import table
from tests.conftest import REPO
from tests.stages import clean_golden


def _download(root):
    parts = clean_golden.shards()

    def write(_config, _inputs, out_dir, _work_dir):
        for i, docs in enumerate(parts):
            documents.write(storage.join(out_dir, documents.shard_name(i, len(parts))), docs)
    return cache.run_stage(cache_root=root, stage="download", key="d", config=clean.Config(), upstream={},
                           fn=write)


def _followed(config: clean.Config) -> clean.Config:
    return clean.follow(config, {"yardsticks": clean_golden._yardsticks()})


def _score(root, download, config: clean.Config, key="s"):
    return cache.run_stage(cache_root=root, stage="score", key=key, config=score.Config(clean=config),
                           upstream={"download": download}, fn=score.run)


def _clean(root, scored, config: clean.Config, key):
    return cache.run_stage(cache_root=root, stage="clean", key=key, config=config, upstream={"score": scored},
                           fn=clean.run)


@pytest.fixture(scope="module")
def golden_runs(tmp_path_factory):
    """{config name: (the score output, the clean output)} of clean_golden's configs, through the two
    nodes."""
    root = str(tmp_path_factory.mktemp("cache"))
    download = _download(root)
    out = {}
    for name, config in clean_golden.configs().items():
        config = _followed(config)
        scored = _score(root, download, config, key=f"s-{name}")
        out[name] = (scored, _clean(root, scored, config, key=name))
    return root, download, out


def test_default_thresholds_write_what_the_one_pass_stage_wrote(golden_runs):
    with open(clean_golden.GOLDEN) as f:
        golden = json.load(f)
    _, _, runs = golden_runs
    for name, (_, cleaned) in runs.items():
        got = clean_golden.digests(cleaned)
        differ = sorted(k for k in set(got) | set(golden[name]) if got.get(k) != golden[name].get(k))
        assert not differ, f"{name}: these outputs differ from the one-pass clean stage's: {differ}"


def test_clean_on_its_own_scores_then_selects_to_the_same_output(golden_runs, tmp_path):
    _, download, runs = golden_runs
    config = _followed(clean_golden.configs()["fineweb"])
    alone = cache.run_stage(cache_root=str(tmp_path), stage="clean", key="alone", config=config,
                            upstream={"download": download}, fn=clean.run)
    assert clean_golden.digests(alone) == clean_golden.digests(runs["fineweb"][1])


def test_a_score_table_row_holds_the_document_as_clean_would_write_it(golden_runs):
    _, _, runs = golden_runs
    scored, cleaned = runs["fineweb"]
    rows = {r["id"]: r for path in score.shards_of(scored) for r in table.read(path)}
    assert sum(1 for _ in rows) <= json.loads(storage.read_text(scored.file("stats.json")))["docs"]
    for path in documents.shards_of(cleaned):
        for doc in documents.read(path):
            row = rows[doc["id"]]
            assert (row["text"], row["metadata"], row["chars"]) == (doc["text"], doc["metadata"],
                                                                    len(doc["text"]))
            assert row["dup_key"] == clean.duplicate_key(doc["text"]) and row["contaminated"] == []


def test_a_threshold_changes_the_clean_key_and_never_the_score_key():
    def keys(*overrides):
        plan = pipeline_config.load([f"{REPO}/gin/tiny.gin"],
                                    ["clean.Config.gopher_quality = @clean.GopherQuality()", *overrides])
        return plan.stages["score"].key, plan.stages["clean"].key
    base = keys()
    for threshold in ("clean.Config.min_chars = 100", "clean.GopherQuality.min_doc_words = 20",
                      "clean.Config.min_alpha_fraction = 0.0", "clean.Config.dedup = False",
                      "clean.Contamination.drop = True", "clean.Config.num_shards = 3",
                      "clean.Config.keep_top = @clean.KeepTop()\nclean.KeepTop.score = 'random'\n"
                      "clean.KeepTop.keep_fraction = 0.3"):
        changed = keys(*threshold.split("\n"))
        assert changed[0] == base[0] and changed[1] != base[1], threshold
    for measured in ("clean.GopherQuality.splitter = 'fast'", "clean.Config.minhash_seed = 2",
                     "clean.Config.fineweb_quality = @clean.FineWebQuality()",
                     "clean.Config.tidy_whitespace = False"):
        changed = keys(measured)
        assert changed[0] != base[0] and changed[1] != base[1], measured


def test_a_threshold_sweep_reruns_clean_and_never_score(tmp_path):
    """Counted stage runs: `--stage clean` twice, the second with another min_chars, runs score once (on
    200 files of the embedded corpus: what is counted does not need more)."""
    base = f"pipeline.Settings.cache_root = '{tmp_path}' download.Embedded.max_files = 200"

    def run(*overrides):
        env = {**os.environ, "OVERRIDES": " ".join(overrides)}
        done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--gin", f"{REPO}/gin/tiny.gin",
                               "--stage", "clean", "--overrides", f"{base} " + " ".join(overrides)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    def attempts(stage):
        return sorted(os.listdir(tmp_path / stage))
    run()
    first = {s: attempts(s) for s in ("download", "score", "clean")}
    run("clean.Config.min_chars=400")
    second = {s: attempts(s) for s in ("download", "score", "clean")}
    assert second["download"] == first["download"] and second["score"] == first["score"]
    assert len([d for d in second["clean"] if not d.startswith(".")]) == \
        len([d for d in first["clean"] if not d.startswith(".")]) + 1
    # make plan on the scored source: the documents and tokens a keep fraction would keep, from the tables
    planned = subprocess.run([sys.executable, "-m", "pipeline", "plan", "--gin", f"{REPO}/gin/tiny.gin",
                              "--overrides", f"{base} clean.Config.keep_top = @clean.KeepTop() "
                              "clean.KeepTop.score = 'random' clean.KeepTop.keep_fraction = 0.3"],
                             cwd=REPO, capture_output=True, text=True, timeout=600)
    assert planned.returncode == 0, planned.stderr[-3000:]
    table_lines = planned.stdout.split("selection (score tables of ", 1)[1].splitlines()[1:7]
    rows = {line[:22].strip(): line[22:].split() for line in table_lines}
    kept, docs = int(rows["by the filters"][0].replace(",", "")), {}
    for label in ("configured (top 30%)", "top 10% by random", "top 20% by random", "top 50% by random"):
        docs[label] = int(rows[label][0].replace(",", ""))
        assert int(rows[label][1].replace(",", "")) > 0                   # ~tokens
    assert docs["configured (top 30%)"] == select.count(0.3, kept) and docs["top 10% by random"] == \
        select.count(0.1, kept) and docs["top 50% by random"] == select.count(0.5, kept)


def test_keep_fraction_keeps_exactly_its_quantile_of_a_known_distribution(golden_runs, tmp_path):
    """Every scored document gets quality = its rank / N in a known shuffled order; the top 30% by it, of the
    documents the filters keep, is exactly what clean keeps (dedup and MinHash off, so nothing else drops)."""
    root, download, runs = golden_runs
    base = dataclasses.replace(_followed(clean_golden.configs()["loose"]), dedup=False, minhash=False,
                               contamination=clean.Contamination(drop=False))
    scored = runs["loose"][0]
    out = tmp_path / "scores"
    paths = []
    n = 0
    for i, path in enumerate(score.shards_of(scored)):
        rows = list(table.read(path))
        for row in rows:
            n += 1
            row["quality"] = ((n * 7919) % 1000) / 1000     # distinct for the first 1000 documents
        paths.append(str(out / table.shard_name(i, 3)))
        table.write(paths[-1], rows)
    qualities = {r["id"]: r["quality"] for p in paths for r in table.read(p)}
    assert len(set(qualities.values())) == len(qualities)        # no ties: the top k is one set

    def kept(fraction):
        config = dataclasses.replace(base, keep_top=clean.KeepTop(keep_fraction=fraction))
        cleaned = tmp_path / f"clean-{fraction}"
        graph.run(config, paths, str(cleaned), str(tmp_path / "work"))
        stats = json.loads((cleaned / "stats.json").read_text())
        return ({d["id"] for p in sorted(cleaned.glob("docs-*.parquet")) for d in documents.read(str(p))},
                stats)
    passed, _ = kept(1.0)              # what the filters keep: every one of them
    assert len(passed) > 20
    by_quality = sorted(passed, key=lambda i: -qualities[i])
    for fraction in (0.1, 0.3, 0.5):
        ids, stats = kept(fraction)
        k = int(fraction * len(passed) + 0.5)
        assert ids == set(by_quality[:k]), fraction
        assert stats["dropped"]["low_quality"] == len(passed) - k
    assert len(select.survivors(base, paths)) == len(passed)


def test_a_killed_scoring_run_reruns_to_identical_bytes(golden_runs, tmp_path, monkeypatch):
    _, download, runs = golden_runs
    config = _followed(clean_golden.configs()["fineweb"])
    real = score_graph.ScoreShard._complete
    calls = {"n": 0}

    def dies_on_the_third_chunk(self, chunk):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("killed mid-shard")
        return real(self, chunk)
    monkeypatch.setattr(score_graph.ScoreShard, "_complete", dies_on_the_third_chunk)
    monkeypatch.setattr(score_graph, "CHUNK_DOCS", 8)
    with pytest.raises(Exception, match="killed mid-shard"):
        _score(str(tmp_path), download, config, key="k")
    monkeypatch.setattr(score_graph.ScoreShard, "_complete", real)
    rerun = _score(str(tmp_path), download, config, key="k")
    undisturbed = runs["fineweb"][0]
    def content(done):
        return {name: list(table.read(done.file(name))) if name.endswith(".parquet")
                else storage.read_text(done.file(name))
                for name in sorted(done.files) if not name.startswith("_")}
    assert content(rerun) == content(undisturbed)
