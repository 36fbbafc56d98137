"""The shard stage: tokenizes cleaned documents into llm.c token shards (a Beam pipeline).

    make stage STAGE=shard OVERRIDES='shard.Config.tokens_per_shard=100_000_000'

Reads clean's `docs-*.parquet` and tokenizer's `tokenizer.model`; writes `train-00000.bin`,
`train-00001.bin`, …, `val-00000.bin`, … (format in `llmc.py`) and `manifest.json`.

Every document becomes `[bos] tokens eos` (bos only with `add_bos`) and goes to `val` when
`split_rule.fraction(id) < val_fraction`, else to `train`. Within a split, documents follow the
order of clean's shards and then their rows, and the stream is cut into shards of exactly
`tokens_per_shard` tokens (the last one holds the rest), so the bytes depend only on the inputs
and the config. The graph is in `beam_graph.py`.

A validation split of fewer than `min_val_tokens` tokens (one training sequence) fails the stage,
naming the corpus, the split and a `val_fraction` that would do (`check_val_split`); training and
evaluation read the val split, and would otherwise fail two stages on, on a missing file:

    make stage STAGE=shard OVERRIDES='shard.Config.allow_small_val=True'     # only warn
"""

from __future__ import annotations

import dataclasses
import logging
import math

from stages import beam_runner
from stages.io import documents, split_rule, storage

log = logging.getLogger(__name__)

SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class Config:
    tokens_per_shard: int = 100_000_000     # llm.c's shard size
    val_fraction: float = 0.005             # share of documents (by a hash of the id) held out for validation
    add_bos: bool = False                   # start every document with bos, not only end it with eos
    docs_per_batch: int = 256               # documents per sentencepiece call
    # The val split must hold one training sequence, train.Config.seq_len + 1 tokens (here llm.c's
    # T = 1024; this stage does not know train's seq_len). True: a smaller one only warns.
    min_val_tokens: int = dataclasses.field(default=1025, metadata={"key": False})
    allow_small_val: bool = dataclasses.field(default=False, metadata={"key": False})
    runner: beam_runner.Runner = dataclasses.field(default_factory=beam_runner.Runner,
                                                   metadata={"key": False})

    def __post_init__(self):
        if not 1 <= self.tokens_per_shard <= 2**31 - 1:   # the llm.c header stores the count as int32
            raise ValueError(
                f"shard.Config.tokens_per_shard={self.tokens_per_shard} is not in [1, 2**31 - 1]")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"shard.Config.val_fraction={self.val_fraction} is not in [0, 1)")
        if self.docs_per_batch < 1:
            raise ValueError(f"shard.Config.docs_per_batch={self.docs_per_batch} must be >= 1")
        if self.min_val_tokens < 0:
            raise ValueError(f"shard.Config.min_val_tokens={self.min_val_tokens} must be >= 0")


CONFIGURABLES = (Config,)
VERSION = "1"


def run(config: Config, inputs, out_dir: str, work_dir: str) -> None:
    import hashlib

    import sentencepiece as spm

    from stages.io import llmc
    from stages.shard import beam_graph

    doc_shards = documents.shards_of(inputs["clean"])
    model = storage.read_bytes(inputs["tokenizer"].file("tokenizer.model"))
    sp = spm.SentencePieceProcessor(model_proto=model)
    if sp.eos_id() < 0 or (config.add_bos and sp.bos_id() < 0):
        raise ValueError(f"tokenizer {inputs['tokenizer'].path} has no eos (or bos) piece: "
                         f"eos_id={sp.eos_id()}, bos_id={sp.bos_id()}")
    vocab_size = sp.get_piece_size()
    manifest = {
        "format": "llm.c",
        "dtype": llmc.dtype_for(vocab_size).name,
        "magic": llmc.magic_for(vocab_size),
        "version": llmc.FORMATS[llmc.magic_for(vocab_size)][0],
        "header_bytes": llmc.HEADER_BYTES,
        "vocab_size": vocab_size,
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
        "add_bos": config.add_bos,
        "tokens_per_shard": config.tokens_per_shard,
        "split": {"rule": split_rule.RULE,
                  "val_fraction": config.val_fraction},
        "tokenizer_sha256": hashlib.sha256(model).hexdigest(),
        "document_order": "clean shard, then row",
    }
    log.info("tokenizing %d clean shards into %s shards of %d tokens", len(doc_shards), manifest["dtype"],
             config.tokens_per_shard)
    with beam_runner.pipeline(config.runner) as p:
        beam_graph.build(p, config, doc_shards, model, out_dir, manifest)

    # The pipeline wrote the manifest from its token counts; check the files agree with it.
    written = storage.sizes(out_dir)
    manifest = storage.read_json(storage.join(out_dir, "manifest.json"))
    listed = {s["file"] for split in SPLITS for s in manifest["splits"][split]["shards"]}
    if listed != {name for name in written if name.endswith(".bin")}:
        raise RuntimeError(f"{out_dir} holds shards {sorted(n for n in written if n.endswith('.bin'))}, "
                           f"the manifest lists {sorted(listed)}")
    for split in SPLITS:
        for shard in manifest["splits"][split]["shards"]:
            want = llmc.file_size(shard["tokens"], vocab_size)
            if written.get(shard["file"]) != want:
                raise RuntimeError(f"{storage.join(out_dir, shard['file'])} is {written.get(shard['file'])} "
                                   f"bytes, the manifest implies {want}")
        log.info("%s: %d docs, %d tokens in %d shards", split, manifest["splits"][split]["docs"],
                 manifest["splits"][split]["tokens"], len(manifest["splits"][split]["shards"]))
    if not manifest["splits"]["train"]["tokens"]:
        raise ValueError(f"no training documents in the {len(doc_shards)} clean shards under "
                         f"{inputs['clean'].path} (val_fraction={config.val_fraction})")
    check_val_split(config, manifest, inputs["clean"].path)


def check_val_split(config: Config, manifest: dict, where: str) -> None:
    """Fails (warns with `allow_small_val`) when the val split in `manifest` holds fewer than
    `min_val_tokens` tokens. The message suggests twice the fraction that would give them on average,
    since documents differ in length and the split takes whole documents."""
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    if val["tokens"] >= config.min_val_tokens:
        return
    docs, tokens = train["docs"] + val["docs"], train["tokens"] + val["tokens"]
    fraction = 2 * config.min_val_tokens / max(tokens, 1)
    fix = (f"raise shard.Config.val_fraction to {_round_up(fraction)} or more" if fraction <= 0.2 else
           f"the corpus is too small to hold out {config.min_val_tokens:,} tokens: give it more text")
    message = (f"the validation split holds {val['tokens']:,} tokens ({val['docs']:,} docs), fewer than one "
               f"sequence (shard.Config.min_val_tokens={config.min_val_tokens:,}): "
               f"val_fraction={config.val_fraction} of {docs:,} documents ({tokens:,} tokens) in {where}. "
               f"Fix: {fix}; or set min_val_tokens to train.Config.seq_len + 1 if your sequences are "
               "shorter, or shard.Config.allow_small_val = True to go on (training and evaluation read "
               "the val split)")
    if not config.allow_small_val:
        raise ValueError(message)
    log.warning("shard: %s (allow_small_val=True: going on)", message)


def _round_up(x: float) -> str:
    """`x` rounded up to two significant digits: 0.01234 -> '0.013'."""
    scale = 10.0 ** (math.floor(math.log10(x)) - 1)
    return f"{round(math.ceil(round(x / scale, 9)) * scale, 12):g}"


def summary(out) -> str:
    """One line for the run summary, from a committed shard (`pipeline.cache.Committed`)."""
    m = storage.read_json(out.file("manifest.json"))
    parts = [f"{name} {s['tokens']:,} tokens / {s['docs']:,} docs in {len(s['shards'])} shards"
             for name, s in m["splits"].items()]
    return f"{'; '.join(parts)} ({m['dtype']}, vocab {m['vocab_size']:,})"
