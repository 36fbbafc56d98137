"""The shard stage: exact token streams, fixed shard sizes, the train/val split, the llm.c format."""

import re

import numpy as np
import pytest
import sentencepiece as spm

from pipeline import cache, config
from pipeline import sweep as _sweep  # noqa: F401  registers `sweep`, which the sweep twin among RUN_FILES binds
from stages import beam_runner, shard, tokenizer
from stages.io import documents, llmc, split_rule, storage
from stages.shard import beam_graph
from tests.conftest import REPO, run_files
from tests.io.test_llmc import numpy_read
from tests.stages.test_tokenizer import english_docs, train, write_clean

TOKENS_PER_SHARD = 5000


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache"))
    docs = english_docs(400)
    clean = write_clean(root, [docs[:150], docs[150:300], docs[300:]])
    return {"clean": clean, "tokenizer": train(root, clean)}


def run_shard(root, upstream, key="s", **overrides) -> cache.Committed:
    config = shard.Config(**({"tokens_per_shard": TOKENS_PER_SHARD, "val_fraction": 0.1} | overrides))
    return cache.run_stage(cache_root=str(root), stage="shard", key=key, config=config, upstream=upstream,
                           fn=shard.run)


def processor(upstream) -> spm.SentencePieceProcessor:
    model = storage.read_bytes(upstream["tokenizer"].file("tokenizer.model"))
    return spm.SentencePieceProcessor(model_proto=model)


@pytest.fixture(scope="module")
def sharded(upstream, tmp_path_factory):
    return run_shard(tmp_path_factory.mktemp("cache"), upstream)


def expected_streams(upstream, add_bos=False, val_fraction=0.1) -> dict[str, list[int]]:
    """The token streams the stage must write, computed the slow, obvious way."""
    sp = processor(upstream)
    streams = {"train": [], "val": []}
    for path in documents.shards_of(upstream["clean"]):
        for doc in documents.read(path):
            split = "val" if split_rule.fraction(doc["id"], path) < val_fraction else "train"
            streams[split] += [sp.bos_id()] * add_bos + sp.encode(doc["text"]) + [sp.eos_id()]
    return streams


def test_shards_hold_exactly_the_tokenized_documents_in_order(sharded, upstream):
    want = expected_streams(upstream)
    for split in ("train", "val"):
        paths = sharded.paths(f"{split}-*.bin")
        assert len(paths) == -(-len(want[split]) // TOKENS_PER_SHARD) > 1
        got = [numpy_read(p) for p in paths]
        for header, tokens in got:
            assert header[:3].tolist() == [20240520, 1, len(tokens)] and not header[3:].any()
            assert tokens.dtype == np.uint16
        assert [len(t) for _, t in got[:-1]] == [TOKENS_PER_SHARD] * (len(got) - 1)
        assert 0 < len(got[-1][1]) <= TOKENS_PER_SHARD
        assert np.concatenate([t for _, t in got]).tolist() == want[split]
        with storage.local_files(paths[:1]) as (local,):
            assert llmc.read(local).tolist() == got[0][1].tolist()
            assert llmc.read(local, mmap=True).tolist() == got[0][1].tolist()


def test_split_is_by_document_and_eos_ends_every_document(sharded, upstream):
    sp = processor(upstream)
    texts = {}
    for split in ("train", "val"):
        tokens = np.concatenate([numpy_read(p)[1] for p in sharded.paths(f"{split}-*.bin")])
        assert tokens[-1] == sp.eos_id() and sp.bos_id() not in tokens
        ends = np.flatnonzero(tokens == sp.eos_id())
        texts[split] = [sp.decode(d.tolist()) for d in np.split(tokens, ends + 1)[:-1]]
    docs = [d for p in documents.shards_of(upstream["clean"]) for d in documents.read(p)]
    val = [d["text"] for d in docs if split_rule.fraction(d["id"], "") < 0.1]
    assert texts["val"] == val and 20 < len(val) < 60
    assert texts["train"] == [d["text"] for d in docs if d["text"] not in val]
    assert not set(texts["train"]) & set(texts["val"])


def test_manifest_describes_the_shards(sharded, upstream):
    m = storage.read_json(sharded.file("manifest.json"))
    vocab = storage.read_text(upstream["tokenizer"].file("tokenizer.vocab")).splitlines()
    assert {k: m[k] for k in ("dtype", "magic", "version", "vocab_size", "bos_id", "eos_id", "add_bos",
                              "tokens_per_shard", "header_bytes")} == {
        "dtype": "uint16", "magic": 20240520, "version": 1, "vocab_size": len(vocab), "bos_id": 1,
        "eos_id": 2, "add_bos": False, "tokens_per_shard": TOKENS_PER_SHARD, "header_bytes": 1024}
    assert m["split"]["val_fraction"] == 0.1 and "sha256" in m["split"]["rule"]
    assert m["splits"]["train"]["docs"] + m["splits"]["val"]["docs"] == 400
    for split in ("train", "val"):
        shards = m["splits"][split]["shards"]
        assert [s["file"] for s in shards] == [p.rsplit("/", 1)[1] for p in sharded.paths(f"{split}-*.bin")]
        assert sum(s["tokens"] for s in shards) == m["splits"][split]["tokens"]
        assert all(sharded.files[s["file"]] == 1024 + 2 * s["tokens"] for s in shards)
        assert m["splits"][split]["docs"] == sum(numpy_read(p)[1].tolist().count(2)
                                                 for p in sharded.paths(f"{split}-*.bin"))


def test_bytes_do_not_depend_on_chunking_or_parallelism(sharded, upstream, tmp_path, monkeypatch):
    monkeypatch.setattr(beam_graph, "CHUNK_TOKENS", 700)      # many chunks, pieces cut at odd places
    runner = beam_runner.Runner(options=("--direct_num_workers=2", "--direct_running_mode=multi_threading"))
    again = run_shard(tmp_path, upstream, runner=runner, docs_per_batch=7)
    assert again.files == sharded.files
    for name in sharded.files:
        assert storage.read_bytes(again.file(name)) == storage.read_bytes(sharded.file(name)), name


def test_spilled_chunks_give_the_bytes_of_chunks_held_in_memory(sharded, upstream, tmp_path, monkeypatch):
    """Locally the token chunks wait in files (beam_graph.Spilled) and the pieces cut from them are file
    ranges; held in memory (Dataflow's way) they give the same shards. Many chunks, cut at odd places."""
    monkeypatch.setattr(beam_graph, "CHUNK_TOKENS", 700)
    spilled = run_shard(tmp_path / "spilled", upstream)              # many chunks, in files
    build, spilled_dirs = beam_graph.build, []

    def held(p, config, doc_shards, model, out_dir, manifest, work_dir, spill_dir=None):
        spilled_dirs.append(spill_dir)
        build(p, config, doc_shards, model, out_dir, manifest, work_dir, None)
    monkeypatch.setattr(beam_graph, "build", held)
    in_memory = run_shard(tmp_path / "held", upstream)
    assert spilled_dirs and spilled_dirs[0] is not None            # the stage asked for a spill directory
    assert spilled_dirs[0].startswith(str(tmp_path / "held"))       # in its work dir on the cache's disk
    assert in_memory.files == spilled.files == sharded.files
    for name in sharded.files:
        want = storage.read_bytes(sharded.file(name))
        assert storage.read_bytes(in_memory.file(name)) == want, name
        assert storage.read_bytes(spilled.file(name)) == want, name
    piece = beam_graph.Spilled.write(str(tmp_path), np.arange(10, dtype=np.uint16))[3:8][1:]
    assert (piece.start, piece.stop, len(piece)) == (4, 8, 4) and piece.array().tolist() == [4, 5, 6, 7]


def test_add_bos_and_no_validation_split(upstream, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="stages.shard"):
        out = run_shard(tmp_path, upstream, add_bos=True, val_fraction=0.0, tokens_per_shard=10**6,
                        allow_small_val=True)
    assert "the validation split holds 0 tokens (0 docs)" in caplog.text and "going on" in caplog.text
    assert sorted(out.files) == ["manifest.json", "train-00000.bin"]
    tokens = numpy_read(out.file("train-00000.bin"))[1]
    assert tokens.tolist() == expected_streams(upstream, add_bos=True, val_fraction=0.0)["train"]
    eos = np.flatnonzero(tokens == 2)
    assert tokens[0] == 1 and (tokens[eos[:-1] + 1] == 1).all() and (tokens == 1).sum() == len(eos) == 400
    m = storage.read_json(out.file("manifest.json"))
    assert m["add_bos"] and m["splits"]["val"] == {"docs": 0, "shards": [], "tokens": 0}


@pytest.mark.gcs
def test_writes_to_gcs(upstream, gcs_bucket):
    out = run_shard(f"{gcs_bucket}/cache", upstream, tokens_per_shard=50_000)
    assert out.path.startswith("gs://") and set(out.files) == {"manifest.json", "train-00000.bin",
                                                                "train-00001.bin", "val-00000.bin"}
    assert np.concatenate([numpy_read(p)[1] for p in out.paths("train-*.bin")]).tolist() == \
        expected_streams(upstream)["train"]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("tokens_per_shard", 0, r"tokens_per_shard=0 is not in \[1, 2\*\*31 - 1\]"),
    ("tokens_per_shard", 2**31, r"tokens_per_shard=2147483648 is not in"),
    ("val_fraction", 1.0, r"val_fraction=1.0 is not in \[0, 1\)"),
    ("val_fraction", -0.1, r"val_fraction=-0.1 is not in \[0, 1\)"),
    ("docs_per_batch", 0, r"docs_per_batch=0 must be >= 1"),
    ("seq_len", -1, r"seq_len=-1 must be >= 0"),
])
def test_config_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        shard.Config(**{field: value})


def test_a_corpus_of_validation_documents_only_is_an_error(upstream, tmp_path):
    val_only = [d for d in english_docs(30) if split_rule.fraction(d["id"], "") < 0.5]
    clean = write_clean(str(tmp_path), [val_only])
    tok = train(str(tmp_path), upstream["clean"], heldout_fraction=0.5)
    with pytest.raises(ValueError, match="no training documents in the 1 clean shards"):
        run_shard(tmp_path, {"clean": clean, "tokenizer": tok}, val_fraction=0.5)


def every_document(clean, tok) -> list[tuple[float, int]]:
    """(split_rule.fraction(id), tokens) of every document, computed the slow, obvious way."""
    sp = processor({"tokenizer": tok})
    return [(split_rule.fraction(doc["id"], path), len(sp.encode(doc["text"])) + 1)       # + eos
            for path in documents.shards_of(clean) for doc in documents.read(path)]


def test_the_split_rule_finds_the_fraction_a_number_of_tokens_needs():
    docs = [(0.5, 10), (0.1, 3), (0.3, 4), (0.2, 1), (0.9, 100)]
    assert split_rule.threshold(docs, 8) == 0.3 and split_rule.threshold(docs, 9) == 0.5
    assert split_rule.threshold(docs, 118) == 0.9 and split_rule.threshold(docs, 119) is None
    assert split_rule.lowest(docs, 8) == [(0.1, 3), (0.2, 1), (0.3, 4)]
    assert split_rule.lowest(docs, 1000) == sorted(docs) and split_rule.lowest(docs, 0) == []
    for t in (1, 4, 8, 9, 50, 200):     # each worker's lowest, merged, is the corpus's
        assert split_rule.lowest(split_rule.lowest(docs[:2], t) + split_rule.lowest(docs[2:], t), t) == \
            split_rule.lowest(docs, t)
    assert [shard._above(x) for x in (0.01234, 0.013, 0.0999, 0.1, 0.27451)] == \
        ["0.013", "0.014", "0.1", "0.11", "0.28"]


def test_a_validation_split_shorter_than_one_sequence_fails_naming_the_fix(sharded, upstream, tmp_path):
    m = storage.read_json(sharded.file("manifest.json"))
    tokens = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
    docs = every_document(upstream["clean"], upstream["tokenizer"])
    needed = split_rule.threshold(docs, 1025)
    want = shard._above(needed)
    assert 0.01 < float(want) < 0.1       # within the upstream tokenizer's heldout_fraction, 0.1
    with pytest.raises(ValueError, match=(
            r"the validation split holds \d+ tokens \(4 docs\), fewer than one sequence of "
            r"shard.Config.seq_len=1,024 tokens and its target \(1,025\): val_fraction=0.01 of 400 "
            rf"documents \({tokens:,} tokens\) in .*Fix: raise shard.Config.val_fraction to {want} or more "
            rf"\(at most 0.1; the documents that split_rule.fraction\(id\) puts below {want} hold 1,025 "
            r"tokens; below [0-9.e-]+ they do not\); or set shard.Config.seq_len to train.Config.seq_len "
            r".*allow_small_val")):
        run_shard(tmp_path, upstream, val_fraction=0.01)
    with pytest.raises(ValueError, match=r"too small to hold out 1,000,001 tokens: give it more text"):
        run_shard(tmp_path, upstream, key="s2", seq_len=10**6)
    assert run_shard(tmp_path, upstream, key="s3", val_fraction=float(want)).files   # the suggestion works
    with pytest.raises(ValueError, match="fewer than one sequence"):      # and the threshold itself does not
        run_shard(tmp_path, upstream, key="s4", val_fraction=needed)
    shard.check_val_split(shard.Config(), m, "here")     # the sharded fixture's 10% is enough
    # Where the fraction it takes is above the tokenizer's, raising val_fraction alone would leak: both rise.
    with pytest.raises(ValueError, match=(
            rf"Fix: raise shard.Config.val_fraction and tokenizer.Config.heldout_fraction to {want} or more "
            r"together \(the documents .*\), so the tokenizer never trains on a validation document")):
        shard.check_val_split(shard.Config(val_fraction=0.01), m | {"splits": m["splits"] | {
            "val": {"docs": 0, "tokens": 0, "shards": []}}}, "here", heldout_fraction=0.01, lowest=docs)


def test_the_advice_passes_on_a_corpus_whose_first_hashed_documents_are_short(upstream, tmp_path):
    """The documents the hash puts first are one sentence, the rest five documents long: a fraction from the
    average document (what the guard said before) holds out a few short ones and is refused again; the
    fraction from the split rule holds out enough."""
    root = str(tmp_path)
    long = english_docs(1500, seed=3)
    docs = []
    for i in range(300):
        doc_id = f"need-{i}"
        if split_rule.fraction(doc_id, "") < 0.4:          # ~20 tokens
            text = " ".join(long[i]["text"].split()[:16]) + "."
        else:                                               # ~600 tokens
            text = "\n\n".join(d["text"] for d in long[5 * i:5 * i + 5])
        docs.append({"id": doc_id, "text": text})
    clean = write_clean(root, [docs[:150], docs[150:]], key="need")
    tok = train(root, upstream["clean"], key="t-half", heldout_fraction=0.5)
    up = {"clean": clean, "tokenizer": tok}
    every = every_document(clean, tok)
    total = sum(t for _, t in every)
    average_advice = shard._above(2 * 1025 / total)           # twice the average share: the old advice
    with pytest.raises(ValueError, match=r"Fix: raise shard.Config.val_fraction to ([0-9.]+) or more") as e:
        run_shard(root, up, key="need-1", val_fraction=0.005)
    advice = re.search(r"val_fraction to ([0-9.]+) or more", str(e.value)).group(1)
    assert advice == shard._above(split_rule.threshold(every, 1025))
    assert 2 * float(average_advice) < float(advice) < 0.4                     # reached in the short ones
    with pytest.raises(ValueError, match=f"Fix: raise shard.Config.val_fraction to {advice} or more"):
        run_shard(root, up, key="need-2", val_fraction=float(average_advice))    # the old advice: refused
    done = run_shard(root, up, key="need-3", val_fraction=float(advice))         # the advice: enough
    assert storage.read_json(done.file("manifest.json"))["splits"]["val"]["tokens"] >= 1025


def test_a_validation_split_the_tokenizer_trained_on_is_refused_before_any_work(upstream, tmp_path):
    with pytest.raises(ValueError, match=(
            r"shard.Config.val_fraction=0.2 is above the tokenizer's tokenizer.Config.heldout_fraction=0.1 "
            r"\(.*\): the documents with split_rule.fraction\(id\) in \[0.1, 0.2\) would be validation "
            r"documents the tokenizer trained on. Fix: set tokenizer.Config.heldout_fraction to at least "
            r"0.2")):
        run_shard(tmp_path, upstream, val_fraction=0.2)
    assert not list(tmp_path.glob("shard/*/attempt-*/*.bin"))
    # At val_fraction <= heldout_fraction no validation document is in the tokenizer's training sample.
    out = run_shard(tmp_path, upstream, key="ok", val_fraction=0.1)
    recorded = upstream["tokenizer"].manifest["config"]
    tok_config = tokenizer.Config(**{k: v for k, v in recorded.items() if k != "@type"})
    trained = set(tokenizer.sample(documents.shards_of(upstream["clean"]), tok_config).sentences)
    val = [d for p in documents.shards_of(upstream["clean"]) for d in documents.read(p)
           if split_rule.fraction(d["id"], p) < 0.1]
    assert len(val) == storage.read_json(out.file("manifest.json"))["splits"]["val"]["docs"] > 20
    assert not any(line in trained for d in val for line in d["text"].split("\n") if line)
    assert len(trained) > 800


RUN_FILES = run_files()


@pytest.mark.parametrize("run_file", RUN_FILES)
def test_every_run_file_guards_one_training_sequence_and_never_validates_on_tokenizer_text(run_file):
    """The shard stage's guard follows the run's own train.Config.seq_len (not llm.c's 1024), and its val
    split stays inside the tokenizer's held-out documents, for every run file and twin there is."""
    stages = config.load([f"{REPO}/gin/{run_file}"]).stages
    training, tok = stages["train"].config, stages["tokenizer"].config
    shards = [sp.config for sp in stages.values() if sp.stage == "shard"]     # a mixture: one per source
    assert shards
    for sharding in shards:
        assert sharding.min_val_tokens >= training.seq_len + 1, (sharding.seq_len, training.seq_len)
        assert sharding.val_fraction <= tok.heldout_fraction, (sharding.val_fraction, tok.heldout_fraction)


def test_a_leaking_val_split_is_refused_before_any_stage_runs(tmp_path, capsys):
    """The same refusal as the stage's own, by the pre-run checks: one error line, exit 2, nothing run."""
    from pipeline.__main__ import main

    root = tmp_path / "cache"
    argv = ["run", "--gin", f"{REPO}/gin/tiny.gin", "--stage", "shard",
            "--gin-param", f'pipeline.Settings.cache_root="{root}"',
            "--gin-param", "shard.Config.val_fraction=0.1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: shard: shard.Config.val_fraction=0.1 is above the tokenizer's "
        "tokenizer.Config.heldout_fraction=0.05 (as planned)"), err
    assert "OVERRIDES='VAL_FRACTION=0.1'" in err[0]
    assert not list(root.glob("*/*/attempt-*"))
