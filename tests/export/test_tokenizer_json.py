"""The fast tokenizer the export writes gives sentencepiece's ids, on real Common Crawl text
(tests/data/cc_excerpts.md): the `tokenizers` library (installed with transformers) reads our
tokenizer.json."""

import io
import json
import pathlib

import pytest
import sentencepiece as spm

from stages import tokenizer as tokenizer_stage
from stages.export import tokenizer_json

tokenizers = pytest.importorskip("tokenizers")
EXCERPTS = pathlib.Path(__file__).parents[1] / "data" / "cc_excerpts.jsonl"


def _texts():
    return [json.loads(line)["text"] for line in EXCERPTS.read_text().splitlines()]


def _train(model_type: str, byte_fallback: bool, texts: list[str]) -> bytes:
    """A model trained as the tokenizer stage trains one (its options), on `texts`' lines."""
    config = tokenizer_stage.Config(model_type=model_type, vocab_size=1500, byte_fallback=byte_fallback)
    lines = [line for t in texts for line in t.split("\n") if line.strip()]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                   **tokenizer_stage.trainer_options(config))
    return out.getvalue()


def _pair(model_type, byte_fallback):
    texts = _texts()
    model = _train(model_type, byte_fallback, texts[:40])
    sp = spm.SentencePieceProcessor(model_proto=model)
    converted = tokenizer_json.tokenizer_json(tokenizer_json.read_model(model))
    fast = tokenizers.Tokenizer.from_str(json.dumps(converted))
    return sp, fast, texts[40:]


@pytest.mark.parametrize("byte_fallback", [True, False])
def test_bpe_gives_sentencepiece_ids_on_every_document(byte_fallback):
    sp, fast, texts = _pair("bpe", byte_fallback)
    assert len(texts) == 60
    odd = [" leading spaces", "  two\n\n  blank lines  ", "", "12345 digits", "emoji \U0001F600 é"]
    for text in texts + odd:
        assert fast.encode(text, add_special_tokens=False).ids == sp.encode(text), text[:80]
    if byte_fallback:      # and decodes back to the text, as sentencepiece does
        assert all(fast.decode(sp.encode(t)) == sp.decode(sp.encode(t)) for t in texts)


def test_unigram_ids_agree_but_for_sentencepieces_float32_near_ties():
    """Sentencepiece's unigram encoder adds path scores in float32; transformers' in float64. On a long
    document two segmentations within float32's rounding of each other may come out differently: where the
    ids differ, the fast tokenizer's path must score at least as high (it is the true best path)."""
    sp, fast, texts = _pair("unigram", True)
    same = 0
    for text in texts:
        ours, theirs = fast.encode(text, add_special_tokens=False).ids, sp.encode(text)
        if ours == theirs:
            same += 1
            continue
        score = lambda ids: sum(sp.get_score(i) for i in ids)          # noqa: E731
        assert score(ours) >= score(theirs) - 1e-6
        assert abs(score(ours) - score(theirs)) < 1e-4 * abs(score(theirs))
    assert same >= 0.9 * len(texts)


def test_bos_when_the_shards_add_it_and_problems_named():
    model = _train("bpe", True, _texts()[:10])
    m = tokenizer_json.read_model(model)
    fast = tokenizers.Tokenizer.from_str(json.dumps(tokenizer_json.tokenizer_json(m, bos_id=1)))
    sp = spm.SentencePieceProcessor(model_proto=model)
    assert fast.encode("Hello there").ids == [1] + sp.encode("Hello there")
    import dataclasses
    with pytest.raises(ValueError, match="remove_extra_whitespaces=True"):
        tokenizer_json.tokenizer_json(dataclasses.replace(m, remove_extra_whitespaces=True))
