"""Reference bits per byte: bytes come from the text (two tokenizers, the same bytes), and the embedded
default's set is packaged, untouched by the data stages, and absent from the embedded training corpus.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q -p no:cacheprovider tests/stages/test_reference.py
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from flax import nnx

from stages.download import embedded
from stages.train import scoring
from stages.train.model import Transformer
from stages.train.model_config import ModelConfig
from stages.yardstick_data import reference, texts

NGRAM = 13


def _tokenizer(texts, vocab_size: int, model_type: str):
    import sentencepiece as spm
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=proto, vocab_size=vocab_size,
                                   model_type=model_type, character_coverage=1.0, minloglevel=2,
                                   hard_vocab_limit=False)
    return spm.SentencePieceProcessor(model_proto=proto.getvalue())


def test_two_tokenizers_are_scored_over_the_same_bytes():
    docs = reference.embedded_documents()
    texts = [text for _, text in docs]
    small, large = _tokenizer(texts, 80, "unigram"), _tokenizer(texts, 300, "bpe")
    cfg = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, mlp_dim=64,
                      max_seq_len=64, dtype="float32")
    scorer = scoring.Scorer(Transformer(cfg, rngs=nnx.Rngs(0)), prefix_id=0, rows=16)
    out = {}
    for name, sp in (("unigram-80", small), ("bpe-300", large)):
        got = reference.bits_per_byte(scorer, sp.encode, docs)
        tokens = sum(len(sp.encode(t)) for t in texts)
        print(f"{name}: {tokens} tokens, {got}")
        assert got["bytes"] == sum(len(t.encode("utf-8")) for t in texts)
        assert got["docs"] == len(docs)
        assert 0 < got["low"] <= got["bpb"] <= got["high"] < 20
        # The figure is the rolling NLL over the bytes: checked against the scorer directly.
        nll = -sum(scorer.loglikelihood_rolling_many([sp.encode(t) for t in texts]))
        assert got["bpb"] == pytest.approx(nll / math.log(2) / got["bytes"], rel=1e-9)
        out[name] = (got, tokens)
    (a, ta), (b, tb) = out.values()
    assert a["bytes"] == b["bytes"] and ta != tb        # same bytes, different token counts
    assert a["bpb"] != b["bpb"]


def test_bootstrap_interval_is_seeded_and_covers_the_ratio():
    rng = np.random.default_rng(5)
    bits, nbytes = rng.uniform(100, 900, 40), rng.uniform(300, 1000, 40)
    first = reference.bootstrap_ratio(bits, nbytes, seed=0, resamples=500)
    assert first == reference.bootstrap_ratio(bits, nbytes, seed=0, resamples=500)
    assert first[0] < bits.sum() / nbytes.sum() < first[1]
    with pytest.raises(ValueError, match="empty ones"):
        reference.bits_per_byte(None, list, [("a", "text"), ("b", "")])


def test_embedded_set_is_packaged_real_text():
    docs = reference.embedded_documents()
    assert reference.EMBEDDED in reference.packaged_sets()
    assert len(docs) == 53 and len({title for title, _ in docs}) == 53
    total = sum(len(text.encode("utf-8")) for _, text in docs)
    assert 20_000 < total < 60_000
    assert all(text.startswith(title + "\n\n") and len(text) > 200 for title, text in docs)
    with pytest.raises(ValueError, match="no packaged file data/nope.txt"):
        reference.embedded_documents("nope")


def test_embedded_set_never_reaches_the_embedded_training_corpus():
    """No 13-gram (of normalized words, `texts.words`, as clean's contamination check compares them) of the
    reference set occurs in the embedded corpus's documents; the set is read from the package, so no
    download/clean/tokenizer setting can change it (the first test shows the bytes are the same under two
    tokenizers)."""
    ref = set().union(*(texts.ngrams(texts.words(text), NGRAM) for _, text in reference.embedded_documents()))
    assert len(ref) > 4000
    corpus_docs, shared = 0, set()
    for unit in embedded.units():
        for doc in embedded.read(unit):
            corpus_docs += 1
            shared |= ref & texts.ngrams(texts.words(doc["text"]), NGRAM)
    print(f"{len(ref)} reference 13-grams, {corpus_docs} corpus documents, {len(shared)} shared")
    assert corpus_docs > 1000
    assert not shared, sorted(shared)[:5]


def test_yardsticks_config_and_the_report_carry_the_reference_sets():
    from stages import yardsticks
    from stages.evaluate import report
    assert yardsticks.Config().reference_sets == (reference.EMBEDDED,)
    with pytest.raises(ValueError, match=r"\['nope'\] are not packaged reference sets; choose from "):
        yardsticks.Config(reference_sets=("nope",))
    m = {"loss": 1.0, "unigram_entropy": 2.0, "perplexity": 2.7, "bits_per_byte": 1.0, "tokens": 10,
         "tokens_per_s": 1.0,
         "reference_bpb": {"aesop_fables": {"bpb": 2.5, "low": 2.4, "high": 2.6, "docs": 53, "bytes": 30416}}}
    text = report.markdown(m, [], [], "train/path")
    assert "| aesop_fables | 2.5000 | 2.4000 - 2.6000 | 53 | 30,416 |" in text
    assert text.index("Reference text") < text.index("## Training curves")
