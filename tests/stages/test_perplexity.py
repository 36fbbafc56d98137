"""The perplexity stage's column under the tiny DAG's trained model (the session's shared `tiny_run`): it
equals evaluation's bits per byte of each document scored as a reference set of its own (a document longer
than the window, an empty and a null one included), two runs write the same bytes, the batch size moves no
value beyond float rounding, and text the model trained on scores below its characters shuffled.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/stages/test_perplexity.py
"""

from __future__ import annotations

import logging
import math
import random

import numpy as np
import pytest

from stages import evaluate, perplexity, train
from stages.evaluate import measure as evaluation
from stages.io import documents, storage
from stages.io.committed import Committed
from stages.perplexity import column, measure
from stages.train.model_config import ModelConfig
from stages.yardsticks import score, tokenized

CHARS = 1500            # of each training document: enough for several windows of the tiny model's 64 tokens


@pytest.fixture(scope="module")
def tiny(tiny_run):
    """The tiny DAG's committed train, tokenizer and clean outputs, the restored model and its tokenizer."""
    train_out, tokenizer_out, clean = tiny_run.committed("train", "tokenizer", "clean")
    return {"train": train_out, "tokenizer": tokenizer_out, "clean": clean,
            "model": measure.load(train_out), "sp": measure.tokenizer(tokenizer_out)}


@pytest.fixture(scope="module")
def texts(tiny):
    """Training text (the first clean shard's documents, cut), one long document of many windows, and the
    ones with nothing to score: an empty text and a null one."""
    found = [d["text"][:CHARS] for d in documents.read(documents.shards_of(tiny["clean"])[0])][:10]
    long = "\n\n".join(d["text"] for d in documents.read(documents.shards_of(tiny["clean"])[1]))[:12_000]
    return [*found[:4], "", long, *found[4:], None]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, texts):
    """Two document shards of `texts` (the second holding the empty, long and null documents)."""
    root = tmp_path_factory.mktemp("docs")
    paths = [str(root / documents.shard_name(i, 2)) for i in range(2)]
    docs = [{"id": f"doc-{i}", "text": text} for i, text in enumerate(texts)]
    documents.write(paths[0], docs[:4])
    documents.write(paths[1], docs[4:])
    return paths


def _run(tiny, shards, out, config: perplexity.Config | None = None) -> dict[str, bytes]:
    inputs = {"train": tiny["train"], "tokenizer": tiny["tokenizer"], "score": shards}
    perplexity.run(config or perplexity.Config(), inputs, str(out), str(out) + "-work")
    return {name: storage.read_bytes(str(out / name)) for name in sorted(storage.sizes(str(out)))}


def _column(out) -> tuple[list[str], np.ndarray]:
    found = [column.read(str(out / column.shard_name(i, 2))) for i in range(2)]
    return [i for ids, _ in found for i in ids], np.concatenate([bpb for _, bpb in found])


@pytest.fixture(scope="module")
def first(tmp_path_factory, tiny, shards):
    out = tmp_path_factory.mktemp("first") / "out"
    return out, _run(tiny, shards, out)


def _evaluation_bpb(tiny, texts) -> list[float | None]:
    """Each text's bits per byte as the evaluate stage reports a reference set of that one document: the
    yardsticks stage's tokenization, evaluation's scorer (rows of training's seq_len), `score.score`."""
    sp, net = tiny["sp"], tiny["model"].net
    seq_len = storage.read_json(tiny["train"].file("summary.json"))["seq_len"]
    sets = {f"doc-{i}": tokenized.reference_rows(f"doc-{i}", [(f"doc-{i}", text)], sp.encode, 0)
            for i, text in enumerate(texts) if text}
    found = tokenized.Yardsticks({name: [tokenized.Document(r["id"], r["bytes"], tuple(r["ids"]))
                                         for r in rows] for name, rows in sets.items()}, {}, sp.eos_id())
    scored = score.score(evaluation.task_scorer(evaluate.Config(), net, sp.eos_id(), seq_len), found)
    return [scored["reference_bpb"][f"doc-{i}"]["bpb"] if text else None for i, text in enumerate(texts)]


def test_the_column_is_evaluations_bits_per_byte_of_each_document(tiny, texts, first):
    out, files = first
    ids, bpb = _column(out)
    assert ids == [f"doc-{i}" for i in range(len(texts))]                  # every row, in the shards' order
    window = tiny["model"].seq_len
    assert len(tiny["sp"].encode(texts[5])) > 5 * window                   # the long one spans many windows
    want = _evaluation_bpb(tiny, texts)
    for i, (got, expected) in enumerate(zip(bpb, want)):
        if expected is None:
            assert math.isnan(got), (i, got)                               # the empty and the null document
        else:
            assert got == pytest.approx(expected, rel=1e-6), i
    # The in-process function is the column
    again = measure.bits_per_byte(texts, tiny["model"], tiny["sp"], perplexity.Config())
    np.testing.assert_array_equal(again, bpb)
    # stats.json: every document, the scored ones' bytes, and the pooled figure evaluation would report for
    # them as one set (their bits over their bytes)
    stats = storage.read_json(str(out / column.STATS))
    scored = [t for t in texts if t]
    nbytes = np.asarray([len(t.encode("utf-8")) for t in scored], np.float64)
    got = bpb[~np.isnan(bpb)]
    assert (stats["documents"], stats["scored"], stats["bytes"]) == (len(texts), len(scored), nbytes.sum())
    assert stats["bits_per_byte"] == pytest.approx((got * nbytes).sum() / nbytes.sum(), rel=1e-9)
    assert stats["median_bpb"] == pytest.approx(np.median(got)) and stats["window"] == window
    assert stats["reference_key"] == tiny["train"].key
    assert sorted(files) == [column.shard_name(0, 2), column.shard_name(1, 2), column.STATS]
    done = Committed("perplexity", "k", str(out), storage.sizes(str(out)), {})
    assert perplexity.summary(done).startswith(
        f"{len(scored)} of {len(texts)} documents scored under train {tiny['train'].key[:12]}: "
        f"{stats['bits_per_byte']:.3f} bits/byte")


def test_two_runs_write_the_same_bytes_and_the_batch_size_moves_no_value(tmp_path, tiny, shards, first,
                                                                         caplog):
    out, files = first
    assert _run(tiny, shards, tmp_path / "again") == files
    with caplog.at_level(logging.INFO, logger="stages.perplexity.measure"):
        _run(tiny, shards, tmp_path / "rows", perplexity.Config(batch_size=3, log_every=4))
    ids, bpb = _column(out)
    other_ids, other = _column(tmp_path / "rows")
    assert other_ids == ids
    np.testing.assert_allclose(other, bpb, rtol=1e-6)                     # NaN where NaN
    assert "8 documents scored (shard 2 of 2)" in caplog.text             # progress every log_every documents


def test_text_the_model_trained_on_scores_below_its_characters_shuffled(tiny, texts):
    trained_on = [t for t in texts if t][:6]
    shuffled = []
    for seed, text in enumerate(trained_on):
        chars = list(text)
        random.Random(seed).shuffle(chars)
        shuffled.append("".join(chars))
    config = perplexity.Config()
    own = measure.bits_per_byte(trained_on, tiny["model"], tiny["sp"], config)
    other = measure.bits_per_byte(shuffled, tiny["model"], tiny["sp"], config)
    assert np.all(other > own + 1.0), (own, other)                         # bits per byte, with a margin


def test_a_window_past_the_model_or_a_bad_field_is_one_line_naming_it(tiny):
    with pytest.raises(ValueError, match=r"batch_size=0 and log_every=1: each must be >= 1"):
        perplexity.Config(batch_size=0, log_every=1)
    with pytest.raises(ValueError, match=r"max_length=-1: must be >= 1 tokens, or 0 for training's seq_len"):
        perplexity.Config(max_length=-1)
    trained = train.Config(seq_len=64, model=ModelConfig(max_seq_len=128))
    assert perplexity.check_upstream(perplexity.Config(), {"train": trained}) == ""
    assert perplexity.check_upstream(perplexity.Config(max_length=128), {"train": trained}) == ""
    assert perplexity.check_upstream(perplexity.Config(max_length=129), {"train": trained}) == (
        "perplexity.Config.max_length=129: longer than the reference model's train.ModelConfig"
        ".max_seq_len=128; set it to at most that, or 0 for training's seq_len (64)")
    longest = tiny["model"].net.config.max_seq_len
    with pytest.raises(ValueError, match=f"max_length={longest + 1}: longer than the reference model's "
                                         f"max_seq_len={longest}"):
        measure.bits_per_byte(["text"], tiny["model"], tiny["sp"], perplexity.Config(max_length=longest + 1))
    assert perplexity.check(perplexity.Config()) == ""
