"""The shard stage: tokenizes cleaned documents into llm.c token shards (a Beam pipeline).

    make stage STAGE=shard OVERRIDES='shard.Config.tokens_per_shard=100_000_000'

Reads clean's `docs-*.parquet` and tokenizer's `tokenizer.model`; writes `train-00000.bin`,
`train-00001.bin`, …, `val-00000.bin`, … (format in `llmc.py`) and `manifest.json`.

Every document becomes `[bos] tokens eos` (bos only with `add_bos`) and goes to `val` when
`split_rule.fraction(id) < val_fraction`, else to `train`. Within a split, documents follow the
order of clean's shards and then their rows, and the stream is cut into shards of exactly
`tokens_per_shard` tokens (the last one holds the rest), so the bytes depend only on the inputs
and the config. The graph is in `beam_graph.py`.

Two guards (`Config` and its SPLITS are in config.py):
- No leak (`check_no_leak`, before any work): the tokenizer holds out the documents whose
  `split_rule.fraction(id) < tokenizer.Config.heldout_fraction` and the val split is those below
  `val_fraction`, so `val_fraction` above the tokenizer's fraction (read from the tokenizer this stage
  reads; before the run, `check_upstream`, against the planned one) would validate on documents the
  tokenizer trained on: refused before any work, naming both (gin/tiny.gin and the twins bind both
  from one macro, VAL_FRACTION).
- A validation split of fewer than `min_val_tokens` tokens (one training sequence, `Config.seq_len` + 1,
  the run files bind seq_len with train.Config.seq_len from one macro, SEQ_LEN) fails the stage, naming
  the corpus, the split and a `val_fraction` (and held-out fraction) that would do (`check_val_split`);
  training and evaluation read the val split, and would otherwise fail two stages on. The fraction comes
  from the split rule itself: the Beam graph keeps the (split_rule.fraction(id), tokens) of the documents
  with the lowest fractions, and `split_rule.threshold` finds the fraction above which the hashed split
  holds `min_val_tokens` (an average document length would not: the hash, not the average, decides which
  documents are held out, so the advice it gave could be refused again):

    make stage STAGE=shard OVERRIDES='shard.Config.allow_small_val=True'     # only warn
"""

from __future__ import annotations

import logging
import math

from stages import beam_runner
from stages.io import documents, split_rule, storage
from stages.io.refusal import Refusal
from stages.shard.config import SPLITS, Config

__all__ = ["CONFIGURABLES", "SPLITS", "VERSION", "Config", "check_no_leak", "check_upstream",
           "check_val_split", "run", "summary"]

log = logging.getLogger(__name__)

CONFIGURABLES = (Config,)
VERSION = "1"


def run(config: Config, inputs, out_dir: str, work_dir: str) -> None:
    import hashlib

    import sentencepiece as spm

    from stages.io import llmc
    from stages.shard import beam_graph

    heldout = tokenizer_heldout_fraction(inputs["tokenizer"])
    check_no_leak(config, heldout, inputs["tokenizer"].path)
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
    # Locally the token chunks wait in files, not in Beam's in-memory groups (beam_graph.Spilled)
    with beam_runner.spill_dir(config.runner, "shard", work_dir) as spill_dir, \
            beam_runner.pipeline(config.runner) as p:
        beam_graph.build(p, config, doc_shards, model, out_dir, manifest, work_dir, spill_dir)

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
        raise Refusal(f"shard: no training documents in the {len(doc_shards)} clean shards under "
                      f"{inputs['clean'].path} (val_fraction={config.val_fraction}); lower the val "
                      "fraction or keep more documents in clean")
    lowest = storage.read_json(storage.join(work_dir, beam_graph.LOWEST))
    check_val_split(config, manifest, inputs["clean"].path, heldout, [tuple(d) for d in lowest])


def tokenizer_heldout_fraction(tokenizer) -> float:
    """The `heldout_fraction` the committed tokenizer was trained with (from its `_SUCCESS.json` config)."""
    value = (tokenizer.manifest.get("config") or {}).get("heldout_fraction")
    if not isinstance(value, (int, float)):
        raise ValueError(f"tokenizer {tokenizer.path}: its manifest records no "
                         "tokenizer.Config.heldout_fraction, so the shard stage cannot tell which documents "
                         "it trained on; rerun the tokenizer")
    return float(value)


def check_upstream(config: Config, upstream: dict) -> str:
    """The pre-run check (pipeline/checks.py): `check_no_leak` against the planned tokenizer's config, as one
    line, or ""."""
    try:
        check_no_leak(config, upstream["tokenizer"].heldout_fraction, "as planned")
    except ValueError as e:
        return str(e)
    return ""


def check_no_leak(config: Config, heldout_fraction: float, where: str) -> None:
    """ValueError when the val split would hold documents the tokenizer trained on: both splits compare
    one number per document (`split_rule.fraction`) with their fraction, so val stays inside the
    tokenizer's held-out set exactly when `val_fraction <= heldout_fraction`."""
    if config.val_fraction <= heldout_fraction:
        return
    raise ValueError(
        f"shard.Config.val_fraction={config.val_fraction} is above the tokenizer's "
        f"tokenizer.Config.heldout_fraction={heldout_fraction} ({where}): the documents with "
        f"split_rule.fraction(id) in [{heldout_fraction}, {config.val_fraction}) would be validation "
        "documents the tokenizer trained on. Fix: set tokenizer.Config.heldout_fraction to at least "
        f"{config.val_fraction} (gin/tiny.gin binds both from one macro: "
        f"OVERRIDES='VAL_FRACTION={config.val_fraction}'), or lower shard.Config.val_fraction to "
        f"{heldout_fraction}")


def check_val_split(config: Config, manifest: dict, where: str, heldout_fraction: float | None = None,
                    lowest: list[tuple[float, int]] | None = None) -> None:
    """Fails (warns with `allow_small_val`) when the val split in `manifest` holds fewer than
    `min_val_tokens` tokens. The message names the val_fraction that would hold them, computed from the
    split rule: `lowest`, the (split_rule.fraction(id), tokens) of the documents with the lowest fractions
    (`split_rule.lowest`), gives the threshold the fraction must be above (`split_rule.threshold`), and the
    advice is the first two-digit number above it; when that is above the tokenizer's `heldout_fraction`,
    it says to raise both together (`check_no_leak`). Without `lowest` (or when even every document holds
    fewer tokens), the corpus is too small."""
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    if val["tokens"] >= config.min_val_tokens:
        return
    docs, tokens = train["docs"] + val["docs"], train["tokens"] + val["tokens"]
    needed = split_rule.threshold(lowest or (), config.min_val_tokens)
    want = _above(needed) if needed is not None else ""
    if not want or float(want) >= 1.0:
        fix = f"the corpus is too small to hold out {config.min_val_tokens:,} tokens: give it more text"
    else:
        why = (f"the documents that split_rule.fraction(id) puts below {want} hold "
               f"{config.min_val_tokens:,} tokens; below {needed:.4g} they do not")
        if heldout_fraction is not None and float(want) <= heldout_fraction:
            fix = f"raise shard.Config.val_fraction to {want} or more (at most {heldout_fraction}; {why})"
        else:   # raising val_fraction alone would leak: the tokenizer's held-out set must grow with it
            fix = (f"raise shard.Config.val_fraction and tokenizer.Config.heldout_fraction to {want} or more "
                   f"together ({why}), so the tokenizer never trains on a validation document (gin/tiny.gin "
                   f"binds both from one macro: OVERRIDES='VAL_FRACTION={want}')")
    message = (f"the validation split holds {val['tokens']:,} tokens ({val['docs']:,} docs), fewer than one "
               f"sequence of shard.Config.seq_len={config.seq_len:,} tokens and its target "
               f"({config.min_val_tokens:,}): val_fraction={config.val_fraction} of {docs:,} documents "
               f"({tokens:,} tokens) in {where}. Fix: {fix}; or set shard.Config.seq_len to "
               "train.Config.seq_len if that is shorter (the run files bind both from SEQ_LEN), or "
               "shard.Config.allow_small_val = True to go on (training and evaluation read the val split)")
    if not config.allow_small_val:
        raise Refusal(message)     # an expected end: printed once, no traceback
    log.warning("shard: %s (allow_small_val=True: going on)", message)


def _above(x: float) -> str:
    """The smallest number of two significant digits above `x`: 0.01234 -> '0.013', 0.013 -> '0.014'."""
    scale = 10.0 ** (math.floor(math.log10(max(x, 1e-12))) - 1)
    steps = math.floor(round(x / scale, 9)) + 1
    while float(f"{round(steps * scale, 12):g}") <= x:    # rounding must not land on x or below it
        steps += 1
    return f"{round(steps * scale, 12):g}"


def summary(out) -> str:
    """One line for the run summary, from a committed shard (a `stages.io.committed.Committed`)."""
    m = storage.read_json(out.file("manifest.json"))
    parts = [f"{name} {s['tokens']:,} tokens / {s['docs']:,} docs in {len(s['shards'])} shards"
             for name, s in m["splits"].items()]
    return f"{'; '.join(parts)} ({m['dtype']}, vocab {m['vocab_size']:,})"
