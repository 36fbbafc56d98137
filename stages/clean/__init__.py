"""The clean stage: select from the score table by thresholds, then drop exact and near duplicates.

    make stage STAGE=clean OVERRIDES='clean.Config.min_chars=100'    # selection alone: score is cached
    clean.run(clean.Config(min_chars=100), {"score": scored}, out_dir, work_dir)
    clean.run(clean.Config(min_chars=100), {"download": downloaded}, out_dir, work_dir)  # both passes at once

Reads the score stage's tables (stages/score/table.py: every document measured once) and, with a reference
model, the perplexity stage's bits-per-byte columns; writes into `out_dir` what the one-pass stage wrote
before cleaning was split (tests/stages/test_score.py holds it to that, file by file):

    docs-XXXXX-of-YYYYY.parquet  kept documents (`stages.io.documents` schema, `error` null), sorted by id;
                                 shard b holds the texts whose hash % num_shards == b
    stats.json                   {docs_in, chars_in, docs_kept, chars_kept, dropped: {reason: docs},
                                  dropped_chars: {reason: chars}, shards, rewritten: {kind: kept docs}[,
                                  splitters: {name: library version[, punkt_tab: model hash]}]}
    rejected/<reason>.jsonl      up to `samples_per_reason` dropped documents per reason, smallest ids
                                 first: {id, url, source, reason, text (first 500 chars)}
    report.md, removed.png       documents and characters removed per reason in pipeline order (a chart),
                                 and the rejected samples (report.py); written even when min_docs fails
    contamination.json           per yardstick scored (yardsticks.Config's reference sets and tasks): {kind,
                                 items, short_items, items_contaminated, docs_contaminated, n, dropped,
                                 examples}: the items that share a word 13-gram with a kept document, or
                                 that one holds whole when shorter than 13 words (contamination.py)

Modules, one job each: config.py (`Config`, and the filters it switches on, in order: `build_filters`),
document.py (one document: `score_document` measures it, `decide_document` decides it, `clean_document` does
both at once; `duplicate_key`), select.py (`KeepTop`: the exact top fraction of a score), checks.py (the key's
inputs, `follow` and `check`, which the score stage shares), normalize.py, filters.py (the filter protocol:
`measure` once, `decide` per threshold; length and letters), FineWeb's recipe in urls.py, langid.py,
gopher.py, c4.py, fineweb.py (the quality filters; what they share in quality.py, the n-gram counts in
ngrams.py) and pii.py (each filter a config of its own: `clean.GopherQuality.min_doc_words = 50`, switched on
by `clean.Config.gopher_quality = @clean.GopherQuality()`), minhash.py, order.py, graph.py (the Beam graph),
tally.py (stats.json, rejected/), report.py, contamination.py (the yardstick overlap check; its config,
`Contamination`, is in config.py, so that planning never imports the check's numpy index).

Every document gets the first reason that applies, so docs_in == docs_kept + sum(dropped). In the
order a document meets them:
    <error>        download's `error` for the record (malformed_json, invalid_utf8, missing_text, ...)
    null_text      text is null or not a string
    empty          nothing left after normalization (normalize.py)
    the filters of `build_filters`, each with the reasons its `reasons()` lists, in order: `Length`
                   (too_short, too_long), `AlphaFraction` (too_few_alpha), then the steps of FineWeb's
                   recipe that the config switches on, in `config.RECIPE`'s order: URL filter, language
                   id, Gopher repetition, Gopher quality, C4 (which also rewrites kept texts to the lines
                   it keeps), FineWeb, PII masking (a rewriter that drops nothing)
    low_quality, high_bpb, not_sampled
                   outside the top fraction (or past the threshold) of `keep_top`'s score (select.py)
    duplicate      the same normalized text as a document with a smaller id (`dedup`)
    near_duplicate in a MinHash cluster (below) whose smallest id is another document (`minhash`)
    contaminated   shares a word 13-gram with a yardstick item (holds all of an item shorter than 13
                   words), when `clean.Contamination.drop` is on
                   (contamination.py; reported in contamination.json either way)
report.md lists every step with its reasons. chars_in and dropped_chars count the text as
downloaded and chars_kept the text written, so chars_in - chars_kept - sum(dropped_chars) is what
normalization (and C4's line filter, which rewrites a kept text to its kept lines) removed from the
kept documents. `rewritten` counts the kept documents whose text a step rewrote, per kind, once per
kind (`filters.Rewriter`): c4_lines (C4 dropped or changed lines), pii_email, pii_ip (masked).

The key covers what the stage reads from outside the cache (`key_inputs`): the URL filter's list files,
each configured file's `storage.versions` (local: size and modification time; gs://: generation), so
rewriting a list changes the clean key and every key after it; and the word splitters the filters name
other than "fast" (`words.fingerprint`: spaCy's or NLTK's version, and a hash of punkt's trained model
files), also written to stats.json (`splitters`), so another library or model is another cache entry.
With no list file and no such splitter it is None and the key is what it was without them.

The Beam graph is in graph.py. Deduplication groups documents by a duplicate key (`duplicate_key`:
a 128-bit hash of the normalized text) and keeps the smallest id in each group; the bucket (output
shard) is derived from the key, so duplicates always meet in one worker. Near-duplicate removal
(`minhash`, on by default as in FineWeb; minhash.py) gives each kept document 14 LSH band keys from a
MinHash signature of its 5-word shingles (14 bands x 8 rows of 64-bit hashes); documents sharing any
band key are candidates, clusters are the connected components of the candidate pairs (a~b and b~c
join a, b, c), and every document but the smallest id of its cluster is dropped as near_duplicate.
The dropped keys go to the bucket that holds them, so documents never move:

    make stage STAGE=clean OVERRIDES='clean.Config.minhash=False'      # exact dedup only
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping

from stages.clean.checks import check, follow, key_inputs, splitter_fingerprints
from stages.clean.config import CONFIGURABLES, FILTERS, RECIPE, Config, Contamination, KeepTop, build_filters
from stages.clean.document import clean_document, duplicate_key
from stages.io import documents, storage
from stages.io.refusal import Refusal

__all__ = ["CONFIGURABLES", "FILTERS", "RECIPE", "VERSION", "Config", "Contamination", "KeepTop",
           "build_filters", "check", "plan_inputs", "clean_document", "duplicate_key", "follow", "key_inputs",
           "run", "summary"]

log = logging.getLogger(__name__)

# 2: report.md and removed.png; 3: NFC after removing control characters (normalize.py);
# 4: which copy of a text survives, and the order of rows, is a total order over the whole record (order.py):
# copies with the same id and text but other metadata were picked by arrival, so the bytes changed with
# the number of Beam workers;
# 5: each filter of FineWeb's recipe is a config of its own (`clean.Config.gopher_quality =
# @clean.GopherQuality()`, None: off) instead of prefixed fields of clean.Config (`gopher_min_doc_words`):
# the config's JSON, and so every key, changed; the documents did not;
# 6: the contamination check (`clean.Config.contamination`): every output gains contamination.json, and
# with `clean.Contamination.drop` the documents that share a 13-gram with a yardstick are dropped;
# 7: an item shorter than 13 words (n) is found when a document holds it whole (it could never be before),
# and contamination.json counts them (short_items); the "nltk" splitter refuses to run without punkt's
# trained model (it fell back to an untrained punkt), and stats.json names the splitters' fingerprints
# 8: the quality filters' default word splitter is "spacy_rules" (spaCy's English rules without spaCy:
# datatrove 0.10.1's words and sentences), no longer "fast" (NLTK's rules); GopherRepetition counts its top
# n-grams by hash (the same counts)
VERSION = "8"
def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.clean import graph, report  # Beam (and matplotlib) load only when the stage actually runs

    start = time.time()
    paths, read = _score_tables(config, inputs, work_dir)
    log.info("clean: %d score tables -> %d output shards in %s", len(paths), config.num_shards, out_dir)
    graph.run(config, paths, out_dir, work_dir, _bpb_columns(inputs))
    stats = storage.read_json(storage.join(out_dir, "stats.json"))
    if splitters := splitter_fingerprints(config):      # which library and punkt model split the words
        stats["splitters"] = splitters
        storage.write_json(storage.join(out_dir, "stats.json"), stats)
    wall = time.time() - start
    log.info("clean: %d docs in %.1f s (%.0f docs/s); kept %d (%.1f%%); dropped %s",
             stats["docs_in"], wall, stats["docs_in"] / max(wall, 1e-9), stats["docs_kept"],
             100 * stats["docs_kept"] / max(stats["docs_in"], 1), stats["dropped"])
    report.write(out_dir, stats, config, read)   # before the check below: it explains a failure
    # Fewer documents than `min_docs` (0 allows an empty output) fail the stage here, naming the input and
    # what removed them, rather than the tokenizer failing two stages on.
    min_docs = config.min_docs
    if stats["docs_kept"] < min_docs:
        dropped = sorted(stats["dropped"].items(), key=lambda kv: (-kv[1], kv[0]))
        removed_by = (f"; the filter that removed the most: {dropped[0][0]} ({dropped[0][1]:,} docs, samples "
                      f"in {storage.join(out_dir, 'rejected', dropped[0][0] + '.jsonl')})") if dropped else ""
        raise Refusal(f"clean kept {stats['docs_kept']} of {stats['docs_in']:,} documents "
                         f"(min_docs={min_docs}) from {len(paths)} score tables of "
                         f"{read.path}; dropped: "
                         f"{dict(dropped) or 'none'}{removed_by}. Loosen that filter in clean.Config, check "
                         "download's inputs, or allow an empty output with clean.Config.min_docs = 0 (what "
                         f"each filter removed: {storage.join(out_dir, 'report.md')})")


LADDER = (0.1, 0.2, 0.5)         # keep fractions `make plan` lists for a scored source
CHARS_PER_TOKEN_GUESS = 4.0      # tokens ~ characters / this, before a tokenizer is trained


def plan_inputs(config: Config, inputs: Mapping) -> str:
    """`make plan`'s selection table, once the source's score stage is committed: the documents and (about)
    tokens its filters keep, what `keep_top` keeps of them, and a ladder of keep fractions by its score (or
    at random without one), all read from the score tables' small columns without running selection.
    Before dedup: exact and near duplicates among them are removed after."""
    scored = inputs.get("score")
    if scored is None:
        return ""
    if config.keep_top is not None and config.keep_top.score == "bpb" and inputs.get("perplexity") is None:
        return ("selection: by the reference model's bits per byte, which are not computed yet (its run and "
                "the perplexity stage come first); the ladder shows once they are cached")
    from stages.clean import select
    from stages.score import table
    keep_top = config.keep_top or KeepTop(score="random", keep_fraction=1.0)
    try:
        ranked = select.survivors(dataclasses.replace(config, keep_top=keep_top), table.shards_of(scored),
                                  _bpb_columns(inputs))
    except ValueError as e:      # the ranking's score is not in the table
        return f"clean: a run would stop here: {e}"
    by = f"by {keep_top.score}" if config.keep_top else "at random (no clean.KeepTop)"
    rows = [("kept", "documents", "~tokens")]
    total = sum(chars for _, chars in ranked)
    rows.append(("by the filters", f"{len(ranked):,}", f"{total / CHARS_PER_TOKEN_GUESS:,.0f}"))
    if config.keep_top is not None:
        if config.keep_top.keep_fraction is not None:
            fraction = config.keep_top.keep_fraction
            _, docs, chars = select.ladder(ranked, (fraction,))[0]
        else:
            picked = [c for r, c in ranked if -r[0] >= config.keep_top.threshold]
            fraction, docs, chars = None, len(picked), sum(picked)
        rows.append((f"configured ({'threshold' if fraction is None else f'top {fraction:.0%}'})",
                     f"{docs:,}", f"{chars / CHARS_PER_TOKEN_GUESS:,.0f}"))
    for fraction, docs, chars in select.ladder(ranked, LADDER):
        rows.append((f"top {fraction:.0%} {by}", f"{docs:,}", f"{chars / CHARS_PER_TOKEN_GUESS:,.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"selection (score tables of {scored.path}; before dedup; ~tokens = characters / "
             f"{CHARS_PER_TOKEN_GUESS:g}):"]
    return "\n".join(lines + ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows])


def _bpb_columns(inputs: Mapping) -> list[str] | None:
    """The perplexity stage's bits-per-byte column files, one per score table, or None without the stage."""
    if inputs.get("perplexity") is None:
        return None
    from stages.perplexity import column
    return inputs["perplexity"].paths(column.SHARDS)


def _score_tables(config: Config, inputs: Mapping, work_dir: str) -> tuple[list[str], object]:
    """(the score tables to select from, the committed stage that read the documents: score, or download
    when clean runs on its own and scores into `work_dir` first)."""
    from stages.score import table
    if "score" in inputs:
        return table.shards_of(inputs["score"]), inputs["score"]
    from stages.score import graph as score_graph
    scored = storage.join(work_dir, "score")
    score_graph.run(config, documents.shards_of(inputs["download"]), scored)
    return sorted(storage.glob(storage.join(scored, table.SHARDS))), inputs["download"]


def summary(out) -> str:
    """One line for the run summary, from a committed clean (a `stages.io.committed.Committed`)."""
    s = storage.read_json(out.file("stats.json"))
    dropped = ", ".join(f"{k} {v:,}" for k, v in sorted(s["dropped"].items(), key=lambda kv: -kv[1]))
    return (f"kept {s['docs_kept']:,} of {s['docs_in']:,} docs ({s['chars_kept'] / 1e6:.1f}M chars); "
            f"dropped: {dropped or 'none'}")
