"""Evaluation's samples: a prompt and its continuation read as one text."""

import io

import sentencepiece as spm
from flax import nnx

from stages import evaluate
from stages.evaluate import measure, report
from stages.train import model
from stages.train.configs import ModelConfig
from tests.stages.test_tokenizer import english_docs


def test_samples_keep_the_space_between_prompt_and_continuation(monkeypatch):
    proto = io.BytesIO()
    sentences = [d["text"].replace("\n", " ") for d in english_docs(200)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=proto, vocab_size=300,
                                   model_type="bpe", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    continuation = sp.encode("river music")        # its first piece carries the space: "▁river"
    assert sp.id_to_piece(continuation[0]).startswith("▁")
    # The model's choice of tokens is not the point here: pin it, and check how the text is put together.
    monkeypatch.setattr(measure, "_generate", lambda net, ids, n, **kw: continuation)
    net = model.Transformer(ModelConfig(vocab_size=300, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2,
                                        mlp_dim=32, max_seq_len=32), rngs=nnx.Rngs(0))
    s = measure.sample(net, sp, "The old", evaluate.Config(prompts=("The old",)))
    assert s["greedy"] == s["sampled"] == "The old river music"        # not "The oldriver music"
    text = report.samples_text([s])
    assert "--- greedy:\nThe old river music\n" in text and "The old The old" not in text
    assert "`The old river music`" in report.markdown(
        {"loss": 1.0, "unigram_entropy": 2.0, "perplexity": 2.7, "bits_per_byte": 1.0, "tokens": 10,
         "tokens_per_s": 1.0}, [s], [], "train/path")
