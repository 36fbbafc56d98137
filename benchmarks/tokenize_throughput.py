"""Tokens/s of the shard stage end to end vs. plain sentencepiece on the same texts, one core each.

    .venv/bin/python -m benchmarks.tokenize_throughput     # writes benchmarks/out/tokenize_throughput.json

Builds ~`target_mb` of cleaned documents (the embedded stdlib prose when `stages.download.embedded`
is there, else made-up English; copies get distinct ids), trains a tokenizer on it once, then times
(a) `sp.encode(batch, num_threads=1)` over every text already in memory, and (b) the shard stage
(read parquet, tokenize, split, cut, write llm.c shards) under FnApiRunner with one worker. The
ratio (a's seconds / b's seconds) is the share of raw tokenizer speed the stage keeps; target >= 0.8.

Most of what the stage adds is fixed, not per token: importing Beam and building and starting the
pipeline (~3 s here, of which encoding is none). So the stage also runs on a tiny corpus (TINY_DOCS
documents) first, cold (it pays the Beam import, as the old single figure did) and again after the
full run, warm; `ratio_stage_vs_sentencepiece` times the full run warm, and `ratio_marginal` leaves
out the warm fixed cost too: the share a corpus large enough to hide start-up would see.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import time

from pipeline import cache
from stages import beam_runner, shard, tokenizer
from stages.io import documents, storage

DOC_CHARS = 3000          # documents are built to about the size of a web page (FineWeb's mean is ~3 kB)
SHARDS = 4
BATCH = 256               # documents per sp.encode call, the stage's default docs_per_batch
TINY_DOCS = 64            # the corpus that measures the stage's fixed cost
MADE_UP_WORDS = """the of and to in is was for that with as on by at from it this be are an or which their
they have had were not but all one two three new first year time people city river music history
water government school system war team north south world"""


def measure(work_dir: str, target_mb: float = 30.0, vocab_size: int = 8192) -> dict:
    cache_root = os.path.join(work_dir, "cache")
    texts, corpus = base_texts()
    copies = max(1, round(target_mb * 1e6 / sum(map(len, texts))))
    docs = [{"id": f"copy{c}-{i}", "text": t} for c in range(copies) for i, t in enumerate(texts)]
    per_shard = -(-len(docs) // SHARDS)

    def write_clean(config, inputs, out_dir, work_dir):
        for s in range(SHARDS):
            documents.write(storage.join(out_dir, documents.shard_name(s, SHARDS)),
                          docs[s * per_shard:(s + 1) * per_shard])

    def write_tiny(config, inputs, out_dir, work_dir):
        documents.write(storage.join(out_dir, documents.shard_name(0, 1)), docs[:TINY_DOCS])

    clean = cache.run_stage(cache_root=cache_root, stage="clean", key="bench", config={}, upstream={},
                            fn=write_clean)
    tiny = cache.run_stage(cache_root=cache_root, stage="clean", key="tiny", config={}, upstream={},
                           fn=write_tiny)
    tok = cache.run_stage(cache_root=cache_root, stage="tokenizer", key="bench",
                          config=tokenizer.Config(vocab_size=vocab_size, sample_chars=5_000_000),
                          upstream={"clean": clean}, fn=tokenizer.run)

    baseline_s, baseline_tokens = _plain_sentencepiece([d["text"] for d in docs],
                                                       storage.read_bytes(tok.file("tokenizer.model")))
    config = shard.Config(tokens_per_shard=10_000_000, val_fraction=0.005,
                          runner=beam_runner.Runner(options=("--direct_num_workers=1",)))

    # the tiny corpus has (almost) no validation split: let the stage go on
    tiny_config = (dataclasses.replace(config, allow_small_val=True) if hasattr(config, "allow_small_val")
                   else config)

    def run_shard(key, docs_stage, shard_config):
        start = time.perf_counter()
        out = cache.run_stage(cache_root=cache_root, stage="shard", key=key, config=shard_config,
                              upstream={"clean": docs_stage, "tokenizer": tok}, fn=shard.run)
        return out, time.perf_counter() - start

    _, fixed_cold_s = run_shard("tiny-cold", tiny, tiny_config)     # pays Beam's import
    out, stage_s = run_shard("bench", clean, config)
    _, fixed_warm_s = run_shard("tiny-warm", tiny, tiny_config)
    splits = storage.read_json(out.file("manifest.json"))["splits"]
    stage_tokens = sum(s["tokens"] for s in splits.values())
    stage_docs = sum(s["docs"] for s in splits.values())
    if stage_tokens - stage_docs != baseline_tokens:     # the stage adds one eos per document
        raise RuntimeError(f"the stage wrote {stage_tokens} tokens for {stage_docs} docs, "
                           f"plain sentencepiece gives {baseline_tokens} (+1 eos each)")
    return {
        "benchmark": "tokenize_throughput",
        "corpus": corpus,
        "corpus_mb": round(sum(len(d["text"].encode()) for d in docs) / 1e6, 1),
        "docs": len(docs),
        "mean_doc_chars": round(sum(len(d["text"]) for d in docs) / len(docs)),
        "vocab_size": vocab_size,
        "tokens": baseline_tokens,
        "sentencepiece_s": round(baseline_s, 3),
        "sentencepiece_tokens_per_s": round(baseline_tokens / baseline_s),
        "shard_stage_s": round(stage_s, 3),
        "shard_stage_tokens_per_s": round(baseline_tokens / stage_s),
        "ratio_stage_vs_sentencepiece": round(baseline_s / stage_s, 3),
        "shard_stage_fixed_cold_s": round(fixed_cold_s, 3),
        "shard_stage_fixed_warm_s": round(fixed_warm_s, 3),
        "ratio_marginal": round(baseline_s / max(stage_s - fixed_warm_s, 1e-9), 3),
        "target_ratio": 0.8,
    }


def _plain_sentencepiece(texts: list[str], model: bytes) -> tuple[float, int]:
    """Best of two timed passes of batched encoding on one thread: (seconds, tokens)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        tokens = sum(len(ids) for i in range(0, len(texts), BATCH)
                     for ids in sp.encode(texts[i:i + BATCH], num_threads=1))
        best = min(best, time.perf_counter() - start)
    return best, tokens


def base_texts() -> tuple[list[str], str]:
    """Distinct documents of about DOC_CHARS chars, and the name of the corpus they came from."""
    try:
        from stages.download import embedded

        pieces = [d["text"] for u in embedded.units() for d in embedded.read(u) if d["text"]]
        corpus = "embedded stdlib docstrings and pydoc topics, joined into page-sized documents"
    except ImportError:
        pieces, corpus = _made_up_paragraphs(5000), "made-up English paragraphs"
    texts, current = [], []
    for piece in pieces:      # join consecutive pieces with a blank line until a page is full
        current.append(piece)
        if sum(map(len, current)) >= DOC_CHARS:
            texts.append("\n\n".join(current))
            current = []
    return texts + (["\n\n".join(current)] if current else []), corpus


def _made_up_paragraphs(n: int) -> list[str]:
    rng = random.Random(0)
    words = MADE_UP_WORDS.split()
    return [" ".join(" ".join(rng.choice(words) for _ in range(rng.randint(6, 16))).capitalize() + "."
                     for _ in range(rng.randint(2, 6))) for _ in range(n)]


if __name__ == "__main__":
    from benchmarks.__main__ import main  # writes the JSON and prints the table

    sys.exit(main(["tokenize_throughput"]))
