"""The tokenizer stage on a small synthetic English corpus (a few hundred documents, vocab 500)."""

import random

import numpy as np
import pytest
import sentencepiece as spm

from pipeline import cache
from stages import tokenizer
from stages.io import documents, split_rule, storage
from stages.io.committed import by_source

WORDS = """the of and to in is was for that with as on by at from it this be are an or which his her their
they have had were not but all one two three new first year time people city river music history water
government school system war team north south world between after during under while about against
through known family village county station company national century built began became game film
played born member island church music language market season village mountain bridge library garden
engine paper letter morning evening winter summer simple careful quiet bright ancient modern famous"""


def english_docs(n: int, seed: int = 0, prefix: str = "doc") -> list[dict]:
    """`n` documents of made-up English: paragraphs of sentences, newlines between paragraphs."""
    rng = random.Random(seed)
    vocabulary = WORDS.split()

    def sentence():
        words = [rng.choice(vocabulary) for _ in range(rng.randint(5, 14))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(1, 2024)))
        return " ".join(words).capitalize() + rng.choice(".....?!;")

    docs = []
    for i in range(n):
        paragraphs = [" ".join(sentence() for _ in range(rng.randint(2, 5)))
                      for _ in range(rng.randint(1, 4))]
        docs.append({"id": f"{prefix}-{i:05d}", "text": "\n\n".join(paragraphs), "url": f"test://{i}"})
    return docs


def write_clean(cache_root: str, shards: list[list[dict]], key: str = "k") -> cache.Committed:
    """A committed clean stage holding `shards` (lists of documents) as docs-*.parquet."""
    def fn(config, inputs, out_dir, work_dir):
        for i, docs in enumerate(shards):
            documents.write(storage.join(out_dir, documents.shard_name(i, len(shards))), docs)

    return cache.run_stage(cache_root=cache_root, stage="clean", key=key, config={}, upstream={}, fn=fn)


def train(cache_root: str, clean: cache.Committed, key: str = "t", **overrides) -> cache.Committed:
    # heldout_fraction: as much as test_shard's val_fraction, so shard never validates on trained documents
    config = tokenizer.Config(**({"vocab_size": 500, "num_threads": 1, "heldout_fraction": 0.1} | overrides))
    return cache.run_stage(cache_root=cache_root, stage="tokenizer", key=key, config=config,
                           upstream={"clean": clean}, fn=tokenizer.run)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    docs = english_docs(400)
    return write_clean(str(tmp_path_factory.mktemp("cache")), [docs[:150], docs[150:300], docs[300:]])


@pytest.fixture(scope="module")
def trained(clean, tmp_path_factory):
    return train(str(tmp_path_factory.mktemp("cache")), clean, heldout_fraction=0.1)


def test_trains_a_model_that_round_trips_and_reports_stats(trained):
    assert set(trained.files) >= {"tokenizer.model", "tokenizer.vocab", "stats.json"}
    stats = storage.read_json(trained.file("stats.json"))
    assert stats["vocab_size"] == 500 and stats["model_type"] == "bpe"
    assert 15 < stats["heldout_docs"] < 70                      # ~10% of 400
    assert stats["sampled_docs"] + stats["heldout_docs"] == 400  # the budget exceeds the corpus
    assert stats["sentences"] > stats["sampled_docs"]           # documents are fed as lines
    assert stats["long_lines_split"] == 0
    assert stats["bytes_per_token"] > 2.0
    assert stats["round_trip_rate"] == 1.0
    assert not [k for k in stats if k.endswith("_seconds")]     # a wall time is no function of the key

    sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(trained.file("tokenizer.model")))
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    for text in ["The river\n\nwas  built in 1984.\n", "  indented\tcode()\n", "naïve — 東京 🙂"]:
        assert sp.decode(sp.encode(text)) == text
    assert [sp.id_to_piece(i) for i in sp.encode("1984")][-4:] == ["1", "9", "8", "4"]   # split_digits
    vocab = storage.read_text(trained.file("tokenizer.vocab")).splitlines()
    assert len(vocab) == 500 and vocab[:3] == ["<unk>\t0", "<s>\t0", "</s>\t0"]


def test_training_is_deterministic(clean, tmp_path, trained):
    again = train(str(tmp_path), clean, heldout_fraction=0.1)
    for name in ("tokenizer.model", "tokenizer.vocab", "stats.json"):
        assert storage.read_bytes(again.file(name)) == storage.read_bytes(trained.file(name))
    two = [train(str(tmp_path / str(i)), clean, num_threads=2) for i in range(2)]    # also with threads
    assert len({storage.read_bytes(t.file("tokenizer.model")) for t in two}) == 1


def test_unigram_and_no_byte_fallback(clean, tmp_path):
    out = train(str(tmp_path), clean, model_type="unigram", byte_fallback=False, vocab_size=200,
                character_coverage=1.0)
    sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(out.file("tokenizer.model")))
    assert sp.get_piece_size() == 200
    assert sp.decode(sp.encode("The city\n\nThe river")) == "The city\n\nThe river"   # "\n" has its own piece
    assert sp.unk_id() in sp.encode("東京")                                        # no byte fallback
    assert storage.read_json(out.file("stats.json"))["round_trip_rate"] == 1.0


def test_sample_respects_the_budget_and_never_trains_on_heldout(clean):
    shards = documents.shards_of(clean)
    config = tokenizer.Config(sample_chars=20_000, heldout_fraction=0.2)
    got = tokenizer.sample(shards, config)
    sentences, heldout, counts = got.sentences, got.heldout, got.counts
    assert 20_000 <= counts["sampled_chars"] < 20_000 + 3 * 2_000        # at most one doc over per shard
    assert counts["sampled_chars"] == sum(map(len, sentences)) and not got.exhausted
    assert counts["shards_read"] == 3 and len(got.docs) == counts["sampled_docs"]
    assert sentences == [line for doc in got.docs for line in doc.split("\n") if line]   # whole documents
    trained_lines = set(sentences)
    assert heldout and not any(line in trained_lines for text in heldout for line in text.split("\n") if line)
    assert tokenizer.sample(shards, config) == got
    other_seed = tokenizer.sample(shards, tokenizer.Config(sample_chars=20_000, heldout_fraction=0.2, seed=1))
    assert other_seed.sentences != sentences


def _trainable_chars(docs: list[dict], heldout_fraction: float) -> int:
    """The characters of training lines `docs` hold outside the held-out documents: all a sample can take."""
    return sum(len(line) for d in docs if split_rule.fraction(d["id"], "") >= heldout_fraction
               for line in d["text"].split("\n") if line)


def test_a_shard_that_runs_short_leaves_its_part_to_the_shards_that_hold_more(tmp_path):
    """Whatever order the seed visits them in, a small shard beside a large one: the sample holds what was
    asked while the shards hold it, and all they hold (exhausted) when they hold less."""
    docs = english_docs(300, seed=3)
    clean = write_clean(str(tmp_path), [docs[:4], docs[4:]])
    held = _trainable_chars(docs, 0.1)
    longest = max(len(d["text"]) for d in docs)
    for seed in range(4):
        half = tokenizer.sample(documents.shards_of(clean), tokenizer.Config(
            sample_chars=held // 2, heldout_fraction=0.1, seed=seed))
        assert held // 2 <= half.counts["sampled_chars"] < held // 2 + 2 * longest and not half.exhausted
        everything = tokenizer.sample(documents.shards_of(clean), tokenizer.Config(
            sample_chars=held + 1, heldout_fraction=0.1, seed=seed))
        assert everything.exhausted and everything.counts["sampled_chars"] == held
        assert everything.counts["shards_read"] == 2 and len(everything.docs) == len(set(everything.docs))


@pytest.fixture(scope="module")
def web_code_legal(tmp_path_factory):
    """Three sources' clean stages, of 2%, 6% and 92% of the text (one, two and three shards), and the
    characters of training lines each holds at heldout_fraction 0.1."""
    root = str(tmp_path_factory.mktemp("sources"))
    docs = {"web": english_docs(17, seed=1, prefix="web"), "code": english_docs(64, seed=2, prefix="code"),
            "legal": english_docs(917, seed=3, prefix="legal")}
    shards = {"web": [docs["web"]], "code": [docs["code"][:32], docs["code"][32:]],
              "legal": [docs["legal"][:300], docs["legal"][300:600], docs["legal"][600:]]}
    cleans = {f"clean[{s}]": write_clean(root, shards[s], key=s) for s in docs}
    return cleans, {s: _trainable_chars(d, 0.1) for s, d in docs.items()}


@pytest.mark.parametrize("share", [0.6, 0.15])
def test_a_source_smaller_than_its_share_gives_all_it_has_and_the_others_take_the_rest(web_code_legal, share,
                                                                                       caplog):
    """The tokenizer's sample over web (2% of the text), code (6%) and legal (92%), equal shares asked.
    At 60% of the text each share is 20%: web and code give all they hold and legal takes the rest. At 15%
    each share is 5%: web gives its 2%, the 13% left is 6.5% each, more than code's 6%, so code gives all
    too and legal takes 7%. The realised shares are recorded and sum to the sample; one WARNING line."""
    cleans, held = web_code_legal
    total = sum(held.values())
    assert [round(held[s] / total, 2) for s in ("web", "code", "legal")] == [0.02, 0.06, 0.92]
    config = tokenizer.Config(sample_chars=round(share * total), heldout_fraction=0.1)
    with caplog.at_level("WARNING", logger="stages.tokenizer"):
        samples = tokenizer.sample_sources(by_source(cleans, "clean"), config)
    got = {s: x.counts["sampled_chars"] for s, x in samples.items()}
    assert got["web"] == held["web"] and got["code"] == held["code"]            # all they hold
    assert samples["web"].exhausted and samples["code"].exhausted and not samples["legal"].exhausted
    rest = config.sample_chars - held["web"] - held["code"]                       # the rest, to legal
    longest = max(len(d) for x in samples.values() for d in x.docs)
    assert rest <= got["legal"] < rest + 3 * longest            # at most one document over per shard
    _, _, counts = tokenizer.merged(samples)
    assert counts["sampled_chars"] == sum(got.values()) >= config.sample_chars
    assert {s: c["share"] for s, c in counts["sources"].items()} == pytest.approx(
        {s: got[s] / sum(got.values()) for s in got}, abs=1e-6)
    assert sum(c["share"] for c in counts["sources"].values()) == pytest.approx(1.0, abs=1e-5)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # web and code held less than a third of the sample; at 15%, code held more than its third (5%)
    short, rest = (("code", "web"), "legal") if share == 0.6 else (("web",), "code, legal")
    assert len(warnings) == 1 and "source(s) " + ", ".join(f"{s} ({held[s]:,} characters)" for s in short) + \
        " held less than their share" in warnings[0]
    assert f"the rest went to {rest};" in warnings[0]


def test_sources_that_all_hold_their_share_give_equal_characters(web_code_legal, caplog):
    cleans, held = web_code_legal
    config = tokenizer.Config(sample_chars=3 * held["web"] // 2, heldout_fraction=0.1)   # web holds 2 thirds
    with caplog.at_level("WARNING", logger="stages.tokenizer"):
        samples = tokenizer.sample_sources(by_source(cleans, "clean"), config)
    _within(samples, dict.fromkeys(samples, config.sample_chars / 3), cleans)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    # by weights too: 2:1:1, each within its share
    config = tokenizer.Config(sample_chars=held["web"], heldout_fraction=0.1,
                              source_shares={"legal": 2, "code": 1, "web": 1})
    samples = tokenizer.sample_sources(by_source(cleans, "clean"), config)
    _within(samples, {"legal": held["web"] / 2, "code": held["web"] / 4, "web": held["web"] / 4}, cleans)


def _within(samples: dict, asked: dict, cleans: dict) -> None:
    """Each source's sample holds at least what it was asked and at most one document more per shard."""
    longest = max(len(d) for x in samples.values() for d in x.docs)
    for source, x in samples.items():
        shards = len(documents.shards_of(cleans[f"clean[{source}]"]))
        assert asked[source] <= x.counts["sampled_chars"] < asked[source] + shards * longest, source
        assert not x.exhausted


def test_water_filling_gives_each_source_at_most_what_it_holds():
    fill = tokenizer.water_fill
    assert fill(90, {"a": 1, "b": 1, "c": 1}, {}) == {"a": 30, "b": 30, "c": 30}
    assert fill(90, {"a": 1, "b": 1, "c": 1}, {"a": 6}) == {"a": 6, "b": 42, "c": 42}
    assert fill(90, {"a": 1, "b": 1, "c": 1}, {"a": 6, "b": 40}) == {"a": 6, "b": 40, "c": 44}  # 40 < 42
    assert fill(90, {"a": 1, "b": 1, "c": 1}, {"a": 6, "b": 50}) == {"a": 6, "b": 42, "c": 42}  # 50 > 42
    assert fill(100, {"a": 2, "b": 1, "c": 1}, {"c": 5}) == {"a": 63, "b": 32, "c": 5}          # by weight
    assert fill(90, {"a": 1, "b": 0}, {"a": 6}) == {"a": 6, "b": 0}            # a 0 share takes nothing
    assert fill(90, {"a": 1, "b": 1}, {"a": 6, "b": 7}) == {"a": 6, "b": 7}    # all short: all they hold


def test_a_mixtures_stats_record_each_sources_realised_share_and_characters_a_token(web_code_legal, tmp_path):
    """The stage over the three sources: stats.json holds each source's realised characters and share (not
    the nominal third), and the characters a token the model makes of its sample: that sample's characters
    over its tokens, each document encoded whole and ended by eos, as the shard stage counts them."""
    cleans, held = web_code_legal
    total = sum(held.values())
    config = tokenizer.Config(vocab_size=500, num_threads=1, heldout_fraction=0.1, sample_chars=total // 2)
    out = cache.run_stage(cache_root=str(tmp_path), stage="tokenizer", key="mix", config=config,
                          upstream=cleans, fn=tokenizer.run)
    stats = storage.read_json(out.file("stats.json"))
    sources = stats["sources"]
    assert sources["web"]["sampled_chars"] == held["web"] and sources["web"]["exhausted"]
    assert sources["legal"]["share"] > 0.8 and not sources["legal"]["exhausted"]
    assert sum(s["sampled_chars"] for s in sources.values()) == stats["sampled_chars"]
    sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(out.file("tokenizer.model")))
    samples = tokenizer.sample_sources(by_source(cleans, "clean"), config)
    for source, x in samples.items():
        tokens = sum(len(sp.encode(d)) + 1 for d in x.docs)
        assert sources[source]["chars_per_token"] == round(sum(map(len, x.docs)) / tokens, 4)
    docs = [d for x in samples.values() for d in x.docs]
    tokens = sum(len(sp.encode(d)) + 1 for d in docs)
    assert stats["chars_per_token"] == round(sum(map(len, docs)) / tokens, 4)


def test_long_lines_are_cut_not_dropped(tmp_path):
    long_line = " ".join(["extraordinarily"] * 400)                # 6399 bytes
    no_spaces = "é" * 3000                                         # 6000 bytes, cut mid-word on a character
    docs = english_docs(60) + [{"id": "long", "text": f"short\n{long_line}\n\n{no_spaces}"}]
    clean = write_clean(str(tmp_path), [docs])
    out = train(str(tmp_path), clean, heldout_fraction=0.0, max_sentence_length=1000, vocab_size=400)
    stats = storage.read_json(out.file("stats.json"))
    assert stats["long_lines_split"] == 2
    assert stats["long_line_pieces"] == 7 + 6
    assert stats["heldout_docs"] == 0 and stats["bytes_per_token"] is None

    counts = {"long_lines_split": 0, "long_line_pieces": 0}
    pieces = list(tokenizer.lines(f"{long_line}\n{no_spaces}", 1000, counts))
    assert all(len(p.encode()) <= 1000 for p in pieces)
    assert "".join(pieces) == long_line + no_spaces
    assert pieces[1].startswith(" extraordinarily")                 # cut at a space


@pytest.mark.parametrize(("field", "value", "message"), [
    ("model_type", "bqe", r"model_type='bqe' is not one of \('bpe', 'unigram'\)"),
    ("vocab_size", 100, r"vocab_size=100 is not in \[260, 1048576\]"),
    ("vocab_size", 2**21, r"vocab_size=2097152 is not in"),
    ("heldout_fraction", 1.0, r"heldout_fraction=1.0 is not in \[0, 1\)"),
    ("character_coverage", 0.0, r"character_coverage=0.0 is not in \(0, 1\]"),
    ("sample_chars", 0, r"sample_chars=0 must be >= 1"),
    ("max_sentence_length", 2, r"max_sentence_length=2 must be >= 4"),
    ("num_threads", 0, r"num_threads=0 must be >= 1"),
])
def test_config_validation_names_the_field_and_the_valid_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        tokenizer.Config(**{field: value})


def test_a_vocab_out_of_proportion_to_the_sample_fails_naming_the_maximum(clean, tmp_path):
    config = tokenizer.Config(heldout_fraction=0.1)
    got = tokenizer.sample(documents.shards_of(clean), config)
    sentences, counts = got.sentences, got.counts
    repeated = tokenizer.repeated_words(sentences)
    most = tokenizer.max_vocab_size(repeated, byte_fallback=True)
    assert 200 < repeated < 300 and most == 259 + 2 * repeated
    message = (rf"vocab_size=700 is out of proportion to the {counts['sampled_chars']:,} chars sampled "
               r"from .*"
               rf"{repeated} distinct words that occur more than once, enough for at most {most} pieces .*"
               rf"Set tokenizer.Config.vocab_size <= {most}, .*allow_large_vocab = True")
    with pytest.raises(ValueError, match=message):
        train(str(tmp_path), clean, vocab_size=700, heldout_fraction=0.1)
    train(str(tmp_path), clean, vocab_size=most, heldout_fraction=0.1, key="at-most")   # the maximum passes


def test_allow_large_vocab_only_warns(clean, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="stages.tokenizer"):
        out = train(str(tmp_path), clean, vocab_size=700, heldout_fraction=0.1, allow_large_vocab=True)
    assert storage.read_json(out.file("stats.json"))["vocab_size"] == 700
    assert "vocab_size=700 is out of proportion" in caplog.text and "training anyway" in caplog.text
    # Far beyond even sentencepiece's own limit, its error still says what to change.
    with pytest.raises(RuntimeError, match="could not train a bpe vocab of 60000 on .* Vocabulary size"):
        train(str(tmp_path), clean, vocab_size=60_000, sample_chars=5_000, allow_large_vocab=True, key="t2")


def test_repeated_words_are_counted_as_sentencepiece_splits_words():
    # cat, the, "," and "_" occur twice or more; digits are pieces of their own (split_digits)
    assert tokenizer.repeated_words(["The cat, the cat.", "the_cat, 12 12 cat_"]) == 4
    assert tokenizer.repeated_words(["12 12 x"], split_digits=False) == 1
    assert tokenizer.repeated_words(["a a", "b b", "c c", "d d"], stop_at=2) == 2   # stops after a sentence


def test_heldout_bytes_per_token_comes_with_its_standard_error_and_warns_only_when_unreliable(clean, tmp_path,
                                                                                                caplog):
    with caplog.at_level("WARNING", logger="stages.tokenizer"):
        none = train(str(tmp_path), clean, heldout_fraction=0.0)
    assert "no held-out documents" in caplog.text
    assert tokenizer.summary(none) == ("bpe vocab 500: bytes/token not measured; WARNING: no held-out "
                                       "documents; raise tokenizer.Config.heldout_fraction to measure "
                                       "bytes/token")
    caplog.clear()
    with caplog.at_level("INFO", logger="stages.tokenizer"):
        out = train(str(tmp_path), clean, heldout_fraction=0.1, key="t2")
    stats = storage.read_json(out.file("stats.json"))
    # The ratio estimator's standard error, computed the obvious way from the held-out documents.
    sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(out.file("tokenizer.model")))
    held = [d["text"] for p in documents.shards_of(clean) for d in documents.read(p)
            if split_rule.fraction(d["id"], p) < 0.1]
    b = np.array([len(t.encode()) for t in held], float)
    t = np.array([len(sp.encode(x)) for x in held], float)
    r = b.sum() / t.sum()
    want = np.sqrt(((b - r * t) ** 2).sum() / (len(b) * (len(b) - 1))) / t.mean()
    assert stats["heldout_docs"] == len(held) and stats["bytes_per_token"] == round(r, 4)
    assert stats["bytes_per_token_stderr"] == pytest.approx(want, abs=1e-4) and 0 < want < 0.05 * r
    figure = (f"{stats['bytes_per_token']:.2f} ± {stats['bytes_per_token_stderr']:.2f} bytes/token on "
              f"{len(held)} held-out docs ({stats['heldout_bytes'] / 1000:.1f} KB)")
    assert tokenizer.summary(out) == f"bpe vocab 500: {figure}, round trip 100.0%"
    assert f"tokenizer: {figure}" in caplog.text and "WARNING" not in caplog.text   # under 100 KB, still fine
    assert stats["heldout_bytes"] < 100_000
    # Unreliable: too few documents, or a standard error over 5% of the figure.
    few = tokenizer.heldout_warning(stats | {"heldout_docs": 9})
    assert few.startswith("only 9 held-out documents (under 10)") and "heldout_fraction" in few
    noisy = tokenizer.heldout_warning(stats | {"bytes_per_token_stderr": 0.06 * stats["bytes_per_token"]})
    assert "is uncertain by 6.0% (one standard error; over 5%)" in noisy and "heldout_fraction" in noisy


def test_a_pretrained_model_is_used_as_it_is_and_its_file_is_in_the_key(clean, tmp_path, trained):
    """tokenizer.Config.pretrained (a checkpoint's tokenizer, for train.Config.init_from): copied, not
    trained; held-out bytes per token still measured; the file's version is what the key reads."""
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / "tokenizer.model").write_bytes(storage.read_bytes(trained.file("tokenizer.model")))
    out = train(str(tmp_path / "cache"), clean, key="p", pretrained=str(source), vocab_size=300)
    assert storage.read_bytes(out.file("tokenizer.model")) == (source / "tokenizer.model").read_bytes()
    stats = storage.read_json(out.file("stats.json"))
    assert stats["model_type"] == "pretrained" and stats["heldout_docs"] > 0
    inputs = tokenizer.key_inputs(tokenizer.Config(pretrained=str(source)))
    assert list(inputs["pretrained"]) == [str(source / "tokenizer.model")]
    assert tokenizer.key_inputs(tokenizer.Config()) is None
    with pytest.raises(ValueError, match="does not exist"):
        tokenizer.key_inputs(tokenizer.Config(pretrained=str(tmp_path / "nowhere")))
