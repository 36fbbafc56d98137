"""The perplexity stage: bits per byte of every document under a small reference model, as a score column.

    make stage STAGE=perplexity
    python -m pipeline run --gin gin/tiny.gin --stage perplexity --gin-param 'perplexity.Config.batch_size=16'

CCNet's and "Perplexed by Perplexity"'s selection signal: a model Refinery trained (the committed train
output named "train", with its "tokenizer") scores each document of another stage's output ("score": parquet
shards with an `id` and a `text` column), and a selection downstream keeps documents by the figure. Each
document is scored exactly as evaluation scores its reference text (`stages/yardstick_data/reference.py`,
`document_bits`): its tokens (sentencepiece, no EOS added) in rolling windows of `max_length` tokens, every
token predicted once, the first window conditioned on the tokenizer's EOS (what precedes a document in
training), the next ones on the `max_length` tokens before them; its bits over the UTF-8 bytes of its text.
So the column equals the bits per byte eval.json would report for a reference set of that one document.

Writes, for the input's shards in order:

    bpb-00003-of-00016.parquet   the input shard's rows in their order: `id` (string) and `bpb` (float64;
                                 null for a document with no text: a null or empty text, one that is not
                                 UTF-8 (read back as bytes), or one that encodes to no token (whitespace))
    stats.json                   documents, scored (those with a bpb), bytes (the scored ones' UTF-8 bytes),
                                 bits_per_byte (their bits over their bytes, pooled: what evaluation's
                                 reference_bpb computes over a set), mean_bpb and median_bpb (over scored
                                 documents; null when none), window and batch_size (how they were made),
                                 and reference_key: the train output's key (its manifest's), when it has one

Each file is written whole under a temporary name and renamed (`storage.write_bytes`; a GCS object appears
only once uploaded), so a crash leaves no part of one; the values are a function of the inputs and the config,
so a killed run's rerun writes the same bytes. Progress is logged every `log_every` documents.

Modules: `measure.py` (JAX: the model restored, documents scored; in-process, a model at hand,
`measure.bits_per_byte(texts, model, sp, config)`), `column.py` (the files' names, one shard's column written
and read; no JAX, for the selection that reads it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from stages.io import storage
from stages.perplexity import column
from stages.score import table

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    # Rows of `window` tokens per forward pass: evaluate.Config.batch_size's meaning. The values do not depend
    # on it beyond float rounding (requests are packed into rows of their own segments either way).
    batch_size: int = 8
    # Tokens per scored window; a longer document is scored in consecutive windows, each conditioned on the
    # max_length tokens before it (evaluation's rolling windows). 0 = training's seq_len (train.Config
    # .seq_len, from the train output's summary): the windows evaluation scores reference text in. At most
    # the model's max_seq_len.
    max_length: int = 0
    # Documents between progress lines on long scoring (how it runs, not what it computes: not in the key).
    log_every: int = dataclasses.field(default=10_000, metadata={"key": False})

    def __post_init__(self):
        if self.batch_size < 1 or self.log_every < 1:
            raise ValueError(f"perplexity.Config.batch_size={self.batch_size} and "
                             f"log_every={self.log_every}: each must be >= 1")
        if self.max_length < 0:
            raise ValueError(f"perplexity.Config.max_length={self.max_length}: must be >= 1 tokens, or 0 for "
                             f"training's seq_len (the windows evaluation scores reference text in)")


CONFIGURABLES = (Config,)
VERSION = "1"


def check(config: Config) -> str:
    """What stops the stage before anything runs, in one line, or "". `Config` refuses a bad field when it
    is built, and the window's only bound is the reference model's length (`check_upstream`), so there is
    nothing else to find here."""
    return ""


def check_upstream(config: Config, upstream: Mapping) -> str:
    """The window against the planned train config (pipeline/checks.py), in one line, or "": a max_length
    longer than the reference model's max_seq_len has no positions to run at."""
    train = upstream.get("train")
    if train is None:
        return ""
    window = config.max_length or train.seq_len
    if window > train.model.max_seq_len:
        return (f"perplexity.Config.max_length={config.max_length}: longer than the reference model's "
                f"train.ModelConfig.max_seq_len={train.model.max_seq_len}; set it to at most that, or 0 for "
                f"training's seq_len ({train.seq_len})")
    return ""


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.perplexity import measure
    from stages.train import native

    native.backends_initialized()       # no TPU here: one line, not libtpu's dozen
    model = measure.load(inputs["train"])
    sp = measure.tokenizer(inputs["tokenizer"])
    stats = measure.score_shards(document_shards(inputs["score"]), model, sp, config, out_dir)
    storage.write_json(storage.join(out_dir, column.STATS), stats)
    log.info("perplexity: %s", described(stats))


def document_shards(found) -> list[str]:
    """The parquet shards (each with an `id` and a `text` column) of the "score" input, in order: a list of
    paths as given, or a committed score stage's tables (stages/score/table.py: scores-*.parquet)."""
    if isinstance(found, (list, tuple)):
        return [str(path) for path in found]
    return table.shards_of(found)


def summary(out) -> str:
    """One line for the run summary, from a committed perplexity stage (a `stages.io.committed.Committed`)."""
    return f"{described(storage.read_json(out.file(column.STATS)))}; columns: {out.path}"


def described(stats: dict) -> str:
    """stats.json in words: how many documents were scored, under which model, and their figures."""
    key = stats.get("reference_key")
    under = f" under train {key[:12]}" if key else ""
    if not stats["scored"]:
        return f"0 of {stats['documents']:,} documents have text to score{under}"
    return (f"{stats['scored']:,} of {stats['documents']:,} documents scored{under}: "
            f"{stats['bits_per_byte']:.3f} bits/byte pooled, mean {stats['mean_bpb']:.3f}, median "
            f"{stats['median_bpb']:.3f} (window {stats['window']} tokens)")
