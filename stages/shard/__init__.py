"""The shard stage: tokenizes cleaned documents into llm.c token shards (a Beam pipeline).

    make stage STAGE=shard OVERRIDES='shard.Config.tokens_per_shard=100_000_000'

Reads clean's `docs-*.parquet` and tokenizer's `tokenizer.model`; writes `train-00000.bin`,
`train-00001.bin`, …, `val-00000.bin`, … (format in `llmc.py`) and `manifest.json`.

Every document becomes `[bos] tokens eos` (bos only with `add_bos`) and goes to `val` when
`split_rule.fraction(id) < val_fraction`, else to `train`. Within a split, documents follow the
order of clean's shards and then their rows, and the stream is cut into shards of exactly
`tokens_per_shard` tokens (the last one holds the rest), so the bytes depend only on the inputs
and the config. The graph is in `beam_graph.py`.
"""

from __future__ import annotations

import dataclasses
import logging

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


def summary(out) -> str:
    """One line for the run summary, from a committed shard (`pipeline.cache.Committed`)."""
    m = storage.read_json(out.file("manifest.json"))
    parts = [f"{name} {s['tokens']:,} tokens / {s['docs']:,} docs in {len(s['shards'])} shards"
             for name, s in m["splits"].items()]
    return f"{'; '.join(parts)} ({m['dtype']}, vocab {m['vocab_size']:,})"
