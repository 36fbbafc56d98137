"""The tokenizer stage: trains a sentencepiece model on a deterministic sample of cleaned text.

    make stage STAGE=tokenizer OVERRIDES='tokenizer.Config.vocab_size=3000'

Reads clean's `docs-*.parquet`, writes `tokenizer.model` and `tokenizer.vocab` (the files
`spm_train` writes) and `stats.json` (what was sampled, bytes per token and the
decode(encode(x)) == x rate on held-out documents). Like every output file, stats.json is a function of
the cache key, so it holds no measurement of time: the training time is logged, and the manifest records
the stage's wall time.

The sample: shards are visited in an order fixed by `seed`, and each gives its share of the
remaining `sample_chars` from its first rows, so the sample spans the whole corpus while reading
only about `sample_chars` of it (shards that run short leave their part to those visited again).
Over a mixture's sources `sample_chars` is split by `source_shares` (equal by default) and water-filled:
a source holding less than its share gives all it has (one WARNING line names it) and the rest is split
among the sources that hold more, until it settles; stats.json records each source's realised characters
and share (`sources`), and the characters a token the trained model makes of each source's sample
(`chars_per_token`, which `make plan` divides a source's cleaned characters by before it is sharded).
A document whose `split_rule.fraction(id) < heldout_fraction` is never
trained on; those met while sampling measure bytes per token. The shard stage splits off its
validation documents with the same number, so when `val_fraction <= heldout_fraction` the
tokenizer never saw a validation document; the shard stage refuses any other pair (`shard.check_no_leak`).

Sentencepiece silently drops every training sentence longer than `max_sentence_length` bytes and
cannot take a newline inside one, so documents are fed as lines, and over-long lines are cut into
pieces (counted in stats.json): nothing is dropped.

Two guards run on the sample before training (`check_vocab_size`) and after it (`check_heldout`):
a vocabulary out of proportion to the sampled text fails the stage, naming the largest sensible size
(`allow_large_vocab=True` only warns). Bytes per token on the held-out documents is logged (INFO) with
its standard error, and recorded in stats.json (`bytes_per_token_stderr`); a WARNING names the fix only
when the estimate is unreliable (`heldout_warning`): no held-out documents, fewer than
`MIN_HELDOUT_DOCS`, or a standard error over `MAX_RELATIVE_STDERR` of the figure.

    make stage STAGE=tokenizer OVERRIDES='tokenizer.Config.allow_large_vocab=True'
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import math
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from stages.io import documents, split_rule, storage
from stages.io.committed import by_source
from stages.io.refusal import Refusal
from stages.io.token_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # pieces 0, 1, 2, no pad (Llama's layout)

log = logging.getLogger(__name__)

MODEL_TYPES = ("bpe", "unigram")
MAX_VOCAB = 1 << 20
# Bytes per token over the held-out documents is a ratio estimate, sum(bytes) / sum(tokens); its standard
# error (`heldout_stats`) says how far another sample of documents could move it. Beyond 5% of the figure,
# comparing two tokenizers by it is guesswork; with fewer than 10 documents the standard error itself is
# not to be trusted. (On the embedded corpus, 5% held out: ~110 documents, 73 KB, 1.7%.)
MAX_RELATIVE_STDERR = 0.05
MIN_HELDOUT_DOCS = 10
# `check_vocab_size`: pieces per word that occurs at least twice. On the embedded corpus and its twins'
# filtered subset, about 30% of the learned pieces then occur at most once in the text they were learned
# from (8% at one piece per word); past it, most new pieces spell out single occurrences.
PIECES_PER_REPEATED_WORD = 2
# Sentencepiece never lets a piece cross whitespace, a change of Unicode script (letters | punctuation)
# or, with split_digits, a digit: the "words" a piece can grow within. `_` is punctuation to it.
_WORDS = re.compile(r"[^\W\d_]+|[^\w\s]+|_+")
_WORDS_AND_NUMBERS = re.compile(r"[^\W\d_]+|[^\w\s]+|_+|\d+")


@dataclasses.dataclass(frozen=True)
class Config:
    model_type: str = "bpe"                 # "bpe" | "unigram"
    vocab_size: int = 8192
    byte_fallback: bool = True              # characters outside the vocab become byte pieces, not <unk>
    split_digits: bool = True               # every digit its own piece, as in Llama
    character_coverage: float = 0.9995      # rarer characters are left to byte fallback (or <unk>)
    sample_chars: int = 20_000_000          # training text to sample; sentencepiece holds it all in RAM
    heldout_fraction: float = 0.02          # documents never trained on, used to measure bytes per token
    max_sentence_length: int = 4192         # bytes; longer lines are cut into pieces this long
    num_threads: int = 2                    # the model is byte-identical across runs for a given value
    seed: int = 0                           # which shards' rows are sampled, and sentencepiece's RNG
    # A sentencepiece model to use as it is instead of training one: a .model file or a directory holding
    # tokenizer.model (local, gs://, hf://owner/name@<commit>), e.g. the checkpoint of train.Config.init_from.
    # The fields above that shape training are then unused; held-out bytes per token is still measured.
    pretrained: str = ""
    # With several sources (train.Mixture): each one's share of `sample_chars`, {source: weight}, normalized;
    # empty: equal characters from each. A source holding less gives all it has and the others share the rest
    # (`water_fill`). Not the training mixture: a weight change there never retrains this.
    source_shares: Any = ()
    # True: a vocab_size beyond `max_vocab_size` of the sample only warns (check_vocab_size)
    allow_large_vocab: bool = dataclasses.field(default=False, metadata={"key": False})

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"tokenizer.Config.model_type={self.model_type!r} is not one of {MODEL_TYPES}")
        low = _reserved_pieces(self.byte_fallback) + 1
        if not low <= self.vocab_size <= MAX_VOCAB:
            raise ValueError(f"tokenizer.Config.vocab_size={self.vocab_size} is not in [{low}, {MAX_VOCAB}] "
                             f"(byte_fallback={self.byte_fallback} reserves {low - 1} pieces)")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ValueError(
                f"tokenizer.Config.character_coverage={self.character_coverage} is not in (0, 1]")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(f"tokenizer.Config.heldout_fraction={self.heldout_fraction} is not in [0, 1)")
        if isinstance(self.source_shares, Mapping):      # gin gives a dict: kept sorted, so it hashes
            object.__setattr__(self, "source_shares", tuple(sorted(self.source_shares.items())))
        for name, share in self.source_shares:
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < math.inf:
                raise ValueError(f"tokenizer.Config.source_shares[{name!r}]={share!r} must be a number >= 0")
        if self.source_shares and not sum(share for _, share in self.source_shares) > 0:
            raise ValueError("tokenizer.Config.source_shares are all 0; give one source a share > 0")
        if self.sample_chars < 1:
            raise ValueError(f"tokenizer.Config.sample_chars={self.sample_chars} must be >= 1")
        if self.max_sentence_length < 4:     # room for any one UTF-8 character
            raise ValueError(f"tokenizer.Config.max_sentence_length={self.max_sentence_length} must be >= 4")
        if self.num_threads < 1:
            raise ValueError(f"tokenizer.Config.num_threads={self.num_threads} must be >= 1")


CONFIGURABLES = (Config,)
# 2: stats.json records bytes_per_token_stderr. 3: stats.json no longer records train_seconds (a wall time,
# different on every run of one key; it is logged instead). 4: a source (or shard) holding less than its share
# of the sample leaves the rest to the others (water-filling) instead of leaving it unused; stats.json records
# the realised shares and chars_per_token
VERSION = "4"


def key_inputs(config: Config) -> dict | None:
    """The pretrained model file's version (storage.versions), for the cache key; None when training."""
    if not config.pretrained:
        return None
    path = pretrained_file(config.pretrained)
    found = storage.versions(storage.escape(path))      # the file itself, whatever its name holds
    if not found:
        raise ValueError(f"tokenizer.Config.pretrained={config.pretrained!r}: {path} does not exist")
    return {"pretrained": found}


def pretrained_file(pretrained: str) -> str:
    """The sentencepiece model `tokenizer.Config.pretrained` names: the path itself when it ends in .model,
    else its tokenizer.model."""
    return pretrained if pretrained.endswith(".model") else storage.join(pretrained, "tokenizer.model")


def check(config: Config) -> str:
    """What stops `config` before any stage runs, in one line, or "": a `pretrained` file that cannot be read
    or is not a sentencepiece model (it is loaded here: a model is megabytes, and random bytes failed only
    when the stage ran)."""
    if not config.pretrained:
        return ""
    import sentencepiece as spm

    path = pretrained_file(config.pretrained)
    where = f"tokenizer.Config.pretrained={config.pretrained!r}"
    try:
        model = storage.read_bytes(path)
    except Exception as e:  # noqa: BLE001 - however the store fails, one line naming the file
        return f"{where}: cannot read {path} ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"
    try:                # an empty proto parses as a model of no pieces, which nothing can encode with
        pieces = spm.SentencePieceProcessor(model_proto=model).get_piece_size() if model else 0
    except RuntimeError:
        pieces = 0
    if pieces < 1:
        return (f"{where}: {path} ({len(model):,} bytes) is not a sentencepiece model; name a "
                "tokenizer.model file (or a directory holding one) that sentencepiece wrote")
    return ""


def run(config: Config, inputs, out_dir: str, work_dir: str) -> None:
    import sentencepiece as spm

    cleans = by_source(inputs, "clean")         # {"": clean} or one per source of a mixture
    shards = [path for c in cleans.values() for path in documents.shards_of(c)]
    where = ", ".join(c.path for c in cleans.values())
    samples = sample_sources(cleans, config)
    sentences, heldout, stats = merged(samples)
    if config.pretrained:
        path = pretrained_file(config.pretrained)
        log.info("tokenizer: using %s as it is (tokenizer.Config.pretrained); not training", path)
        model = storage.read_bytes(path)
        finish(spm.SentencePieceProcessor(model_proto=model), model, "pretrained", stats, heldout, config,
               out_dir, samples)
        return
    if not sentences:
        raise Refusal(f"tokenizer: no training text in {len(shards)} clean shards under {where}; every "
                      "document was dropped (clean's report.md says by which filter)")
    check_vocab_size(config, sentences, stats, where)
    log.info("training a %s tokenizer (vocab %d) on %d sentences, %d chars",
             config.model_type, config.vocab_size, stats["sentences"], stats["sampled_chars"])

    # Trained in memory: a model_prefix would be recorded inside the model, so a temp dir's name
    # would make two identical trainings differ.
    model = io.BytesIO()
    start = time.perf_counter()
    spm.set_random_generator_seed(config.seed)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                       **trainer_options(config))
    except RuntimeError as e:
        # sentencepiece's message says which setting to change (vocab_size, character_coverage).
        raise RuntimeError(f"sentencepiece could not train a {config.model_type} vocab of "
                           f"{config.vocab_size} on {stats['sampled_chars']} chars ({config}): {e}") from e
    seconds = time.perf_counter() - start
    log.info("trained in %.1f s", seconds)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    finish(sp, model.getvalue(), config.model_type, stats, heldout, config, out_dir, samples)


def finish(sp, model: bytes, model_type: str, stats: dict, heldout: list[str], config: Config,
           out_dir: str, samples: Mapping[str, Sample]) -> None:
    """Writes the model, its .vocab and stats.json (with bytes per token measured on `heldout`, and
    characters per token on each source's sample, `sample_tokens`)."""
    storage.write_bytes(storage.join(out_dir, "tokenizer.model"), model)
    storage.write_text(storage.join(out_dir, "tokenizer.vocab"), vocab_text(sp))

    stats |= {"vocab_size": sp.get_piece_size(), "model_type": model_type} | \
        heldout_stats(sp, heldout, config.num_threads)
    measured = {source: sample_tokens(sp, x.docs, config.num_threads) for source, x in samples.items()}
    chars, tokens = (sum(m[i] for m in measured.values()) for i in (0, 1))
    stats["chars_per_token"] = round(chars / tokens, 4) if tokens else None
    for source, (chars, tokens) in measured.items():
        if source:
            stats["sources"][source]["chars_per_token"] = round(chars / tokens, 4) if tokens else None
    storage.write_json(storage.join(out_dir, "stats.json"), stats)
    if stats["heldout_docs"]:
        log.info("tokenizer: %s", heldout_figure(stats))
    if warning := heldout_warning(stats):
        log.warning("tokenizer: %s (heldout_fraction=%s)", warning, config.heldout_fraction)


def summary(out) -> str:
    """One line for the run summary, from a committed tokenizer (a `stages.io.committed.Committed`)."""
    s = storage.read_json(out.file("stats.json"))
    line = f"{s['model_type']} vocab {s['vocab_size']:,}: "
    if s["heldout_docs"]:
        line += f"{heldout_figure(s)}, round trip {s['round_trip_rate']:.1%}"
    else:
        line += "bytes/token not measured"
    warning = heldout_warning(s)
    return f"{line}; WARNING: {warning}" if warning else line


def heldout_figure(stats: dict) -> str:
    """Bytes per token with its standard error and what it was measured on: '3.49 ± 0.06 bytes/token on
    114 held-out docs (73.4 KB)'."""
    stderr = stats.get("bytes_per_token_stderr")
    error = f" ± {stderr:.2f}" if stderr is not None else ""
    return (f"{stats['bytes_per_token']:.2f}{error} bytes/token on {stats['heldout_docs']:,} held-out docs "
            f"({stats['heldout_bytes'] / 1000:.1f} KB)")


def heldout_warning(stats: dict) -> str | None:
    """Why the held-out measurement in `stats` (stats.json) is not to be trusted, or None."""
    fix = ("raise tokenizer.Config.heldout_fraction (shard.Config.val_fraction may be at most it) or use a "
           "larger corpus")
    docs = stats["heldout_docs"]
    if not docs:
        return "no held-out documents; raise tokenizer.Config.heldout_fraction to measure bytes/token"
    if docs < MIN_HELDOUT_DOCS:
        return (f"only {docs} held-out documents (under {MIN_HELDOUT_DOCS}): bytes/token "
                f"{stats['bytes_per_token']:.2f} and its error cannot be trusted; {fix}")
    stderr = stats.get("bytes_per_token_stderr")   # absent from stats.json of VERSION 1
    if stderr is not None and stderr > MAX_RELATIVE_STDERR * stats["bytes_per_token"]:
        return (f"{heldout_figure(stats)} is uncertain by {stderr / stats['bytes_per_token']:.1%} (one "
                f"standard error; over {MAX_RELATIVE_STDERR:.0%}), a noisy estimate; {fix}")
    return None


def check_vocab_size(config: Config, sentences: list[str], counts: dict, where: str) -> None:
    """Fails (warns with `allow_large_vocab`) when `vocab_size` exceeds `max_vocab_size(sentences)`.

    Why that maximum: BPE learns a piece by merging the pair of pieces that occurs most often, and a
    piece never crosses a word boundary (`_WORDS`). While some word that occurs twice or more is not yet
    one piece, a pair that occurs twice is left to merge; once the vocabulary outgrows the repeated
    words, merges join pairs seen once, spelling out single sentences of the sample: the tokenizer
    memorizes its training text instead of learning reusable pieces. Measured on the embedded corpus
    (1.5M chars, 7,827 repeated words) and its twins' filtered subset (0.29M chars, 2,848): the share of
    learned pieces that occur at most once in the training text is 8% at one piece per repeated word,
    about 30% at two (`PIECES_PER_REPEATED_WORD`, the maximum), and about 60% at three, the same in both.

    Counting stops once the sample has shown enough repeated words for `vocab_size`, so a large sample
    costs only the text it takes to prove the vocabulary is in proportion.
    """
    reserved = _reserved_pieces(config.byte_fallback)
    needed = -(-(config.vocab_size - reserved) // PIECES_PER_REPEATED_WORD)   # repeated words it takes
    repeated = repeated_words(sentences, config.split_digits, stop_at=needed)
    if repeated >= needed:
        return
    most = max_vocab_size(repeated, config.byte_fallback)
    message = (f"tokenizer.Config.vocab_size={config.vocab_size:,} is out of proportion to the "
               f"{counts['sampled_chars']:,} chars sampled from {where}: they hold {repeated:,} distinct "
               f"words that occur more than once, enough for at most {most:,} pieces ({reserved} reserved + "
               f"{PIECES_PER_REPEATED_WORD} per repeated word); a larger vocabulary memorizes single "
               f"occurrences. Set tokenizer.Config.vocab_size <= {most:,}, give the tokenizer more text "
               "(tokenizer.Config.sample_chars, or a larger corpus), or set "
               "tokenizer.Config.allow_large_vocab = True to train it anyway")
    if not config.allow_large_vocab:
        raise Refusal(message)     # an expected end: printed once, no traceback
    log.warning("tokenizer: %s (allow_large_vocab=True: training anyway)", message)


def max_vocab_size(repeated: int, byte_fallback: bool) -> int:
    """The largest vocabulary `check_vocab_size` accepts for a sample with `repeated` repeated words."""
    return _reserved_pieces(byte_fallback) + PIECES_PER_REPEATED_WORD * repeated


def repeated_words(sentences: list[str], split_digits: bool = True, stop_at: int | None = None) -> int:
    """How many distinct words (as sentencepiece splits them, `_WORDS`) occur at least twice in
    `sentences`; the count stops early once it reaches `stop_at`."""
    pattern = _WORDS if split_digits else _WORDS_AND_NUMBERS
    seen: dict[str, int] = {}
    repeated = 0
    for sentence in sentences:
        for word in pattern.findall(sentence):
            n = seen.get(word, 0) + 1
            seen[word] = n
            repeated += n == 2
        if stop_at is not None and repeated >= stop_at:
            break
    return repeated


def trainer_options(config: Config) -> dict:
    """Keyword arguments for `SentencePieceTrainer.train`."""
    return {
        "model_type": config.model_type, "vocab_size": config.vocab_size,
        "byte_fallback": config.byte_fallback, "split_digits": config.split_digits,
        "character_coverage": config.character_coverage, "max_sentence_length": config.max_sentence_length,
        "num_threads": config.num_threads,
        "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "pad_id": PAD_ID,
        # Clean already normalized the text; keep every character and space as it is, so that
        # decode(encode(x)) == x. Runs of spaces (code, indentation) may become pieces.
        "normalization_rule_name": "identity", "remove_extra_whitespaces": False,
        "allow_whitespace_only_pieces": True,
        # Training lines never hold "\n", but documents do. With byte fallback it encodes as <0x0A>
        # (as in Llama) at no vocab cost; without, it needs its own piece or it would be <unk>.
        "user_defined_symbols": [] if config.byte_fallback else ["\n"],
        "shuffle_input_sentence": False,      # we sampled already; keep the input order (determinism)
        "minloglevel": 2,
    }


def vocab_text(sp) -> str:
    """The `.vocab` file sentencepiece writes next to a model: `piece<TAB>score` per line, by id."""
    return "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))


@dataclasses.dataclass
class Sample:
    """What `sample` took from one clean stage's shards."""

    sentences: list[str]     # the training lines, in sampling order (`lines`)
    heldout: list[str]       # the held-out documents met while sampling, whole: never trained on
    docs: list[str]          # the sampled documents, whole: what characters per token is measured on
    counts: dict             # shards_read, sampled_docs, sampled_chars (of the lines), sentences, long lines
    exhausted: bool          # it holds less than asked: every shard was read to its end, this is all there is


def sample_sources(cleans: Mapping, config: Config) -> dict[str, Sample]:
    """{"": `sample` of the one clean stage}, or {source: its sample} over each source's ({source: clean}),
    `sample_chars` split by `source_shares` (equal by default) and water-filled (`water_fill`): a source
    holding less than its share gives all it has, and what it leaves goes to the sources that hold more.
    One WARNING line names the sources that held less than their share."""
    if list(cleans) == [""]:
        return {"": sample(documents.shards_of(cleans[""]), config)}
    weights = dict(config.source_shares) or dict.fromkeys(cleans, 1.0)
    if unknown := sorted(set(weights) - set(cleans)):
        raise ValueError(f"tokenizer.Config.source_shares names {unknown}, not sources of this run: "
                         f"{sorted(cleans)}")
    weights = {source: weights.get(source, 0.0) for source in cleans}
    shards = {source: documents.shards_of(clean) for source, clean in cleans.items()}
    held: dict[str, int] = {}            # a source that gave less than asked: all the characters it has
    samples: dict[str, tuple[int, Sample]] = {}      # source -> (characters asked, its sample)
    while True:     # each pass finds at least one more source short, or settles
        allotted = water_fill(config.sample_chars, weights, held)
        asked = {s: chars for s, chars in allotted.items()
                 if s not in held and (s not in samples or samples[s][0] != chars)}
        if not asked:
            break
        for source, chars in asked.items():
            got = sample(shards[source], config, chars)        # 0 characters: no shard is read
            samples[source] = (chars, got)
            if got.exhausted:          # less than asked: every shard was read to its end
                held[source] = got.counts["sampled_chars"]
    out = {source: samples[source][1] for source in cleans}
    if short := source_warning(config, weights, held, out):
        log.warning("tokenizer: %s", short)
    return out


def water_fill(total: int, weights: Mapping[str, float], held: Mapping[str, int]) -> dict[str, int]:
    """`total` characters split by `weights` among the sources, none given more than it holds (`held`: the
    characters of the sources known to hold less than they were asked; the others hold enough): a source
    whose share is at least what it holds gets all it has, the rest is split by weight among the others, and
    again until no share passes what its source holds. A source of weight 0 gets nothing.

        water_fill(60_000, {"web": 1, "code": 1, "legal": 1}, {"web": 1_200, "code": 3_600})
        # {"web": 1_200, "code": 3_600, "legal": 55_200}
    """
    fixed: dict[str, int] = {}
    while True:
        free = [s for s in weights if s not in fixed]
        left, weight = total - sum(fixed.values()), sum(weights[s] for s in free)
        share = {s: left * weights[s] / weight if weight else 0.0 for s in free}
        full = {s: held[s] for s in free if s in held and held[s] <= share[s]}
        if not full:
            return {s: fixed.get(s, round(share.get(s, 0.0))) for s in weights}
        fixed |= full


def source_warning(config: Config, weights: Mapping[str, float], held: Mapping[str, int],
                   samples: Mapping[str, Sample]) -> str:
    """One line naming the sources that held less than their share of `sample_chars` (by `weights`), with
    the realised shares, or ""."""
    total = sum(weights.values())
    nominal = {s: config.sample_chars * w / total for s, w in weights.items()}
    short = [s for s in weights if s in held and held[s] < nominal[s]]
    if not short:
        return ""
    chars = {s: x.counts["sampled_chars"] for s, x in samples.items()}
    realised = ", ".join(f"{s} {c / max(sum(chars.values()), 1):.1%}" for s, c in chars.items())
    rest = [s for s in weights if s not in short and weights[s] > 0]
    gone = (f"the rest went to {', '.join(rest)}" if rest else
            f"no source held more, so the sample is {sum(chars.values()):,} characters, all of their text")
    return (f"source(s) {', '.join(f'{s} ({held[s]:,} characters)' for s in short)} held less than "
            f"their share of tokenizer.Config.sample_chars={config.sample_chars:,} "
            f"({', '.join(f'{s} {nominal[s]:,.0f}' for s in short)}): all of their text is sampled and "
            f"{gone}; realised shares {realised} (stats.json records them)")


def merged(samples: Mapping[str, Sample]) -> tuple[list[str], list[str], dict]:
    """(training lines, held-out texts, counts) over `samples` ({source: Sample}): the counts summed, and with
    several sources each one's counts under "sources" with its realised share of the sampled characters."""
    if list(samples) == [""]:
        return samples[""].sentences, samples[""].heldout, dict(samples[""].counts)
    sentences, heldout, counts = [], [], {"sources": {}}
    for x in samples.values():
        sentences += x.sentences
        heldout += x.heldout
        for name, value in x.counts.items():
            counts[name] = counts.get(name, 0) + value
    for source, x in samples.items():
        counts["sources"][source] = x.counts | {
            "share": round(x.counts["sampled_chars"] / max(counts.get("sampled_chars", 0), 1), 6),
            "exhausted": x.exhausted}
    return sentences, heldout, counts


def sample(shards: list[str], config: Config, chars: int | None = None) -> Sample:
    """About `chars` (default `config.sample_chars`) characters of training lines from `shards`,
    deterministically, or all they hold when that is less (`Sample.exhausted`).

    Shards are visited in an order fixed by `config.seed`, each giving an equal part of the characters still
    wanted from its first rows; when shards run out before the sample is full, the shards that stopped at
    their part are visited again, from where they stopped, for an equal part of what is still wanted."""
    chars = config.sample_chars if chars is None else chars

    order = sorted(shards, key=lambda path: hashlib.sha256(f"{config.seed}:{os.path.basename(path)}".encode())
                   .digest())
    out = Sample([], [], [], {"shards_read": 0, "sampled_docs": 0, "sampled_chars": 0, "sentences": 0,
                              "long_lines_split": 0, "long_line_pieces": 0}, exhausted=False)
    counts = out.counts
    consumed: dict[str, int] = {}        # shard -> rows read so far, for one that stopped at its part
    visit = order
    while visit and counts["sampled_chars"] < chars:
        stopped = []
        for i, path in enumerate(visit):
            budget = (chars - counts["sampled_chars"]) / (len(visit) - i)
            taken, skip = 0, consumed.get(path, 0)
            counts["shards_read"] += path not in consumed
            consumed[path] = skip
            for row, doc in enumerate(documents.read(path, columns=("id", "text"))):
                if row < skip:
                    continue
                if taken >= budget:
                    stopped.append(path)
                    break
                consumed[path] = row + 1
                if doc["text"] is None:
                    continue
                if split_rule.fraction(doc["id"], path) < config.heldout_fraction:
                    out.heldout.append(doc["text"])
                    continue
                out.docs.append(doc["text"])
                for line in lines(doc["text"], config.max_sentence_length, counts):
                    out.sentences.append(line)
                    taken += len(line)
                counts["sampled_docs"] += 1
            counts["sampled_chars"] += taken
            if counts["sampled_chars"] >= chars:
                break
        visit = stopped
    out.exhausted = counts["sampled_chars"] < chars
    counts["sentences"] = len(out.sentences)
    return out


def lines(text: str, max_bytes: int, counts: dict) -> Iterator[str]:
    """The non-empty lines of `text`, each at most `max_bytes` UTF-8 bytes.

    A longer line is cut at the last space that keeps a piece within the limit (or mid-word when
    there is none); `counts` records how many lines were cut and into how many pieces.
    """
    for line in text.split("\n"):
        if not line:
            continue
        if len(line) * 4 <= max_bytes or len(line.encode("utf-8")) <= max_bytes:
            yield line
            continue
        pieces = list(_cut(line, max_bytes))
        counts["long_lines_split"] += 1
        counts["long_line_pieces"] += len(pieces)
        yield from pieces


def _cut(line: str, max_bytes: int) -> Iterator[str]:
    data = line.encode("utf-8")
    while len(data) > max_bytes:
        end = max_bytes
        while data[end] & 0xC0 == 0x80:      # do not cut inside a UTF-8 character
            end -= 1
        space = data.rfind(b" ", 0, end)
        end = space if space > 0 else end
        yield data[:end].decode("utf-8")
        data = data[end:]
    if data:
        yield data.decode("utf-8")


def sample_tokens(sp, docs: list[str], num_threads: int) -> tuple[int, int]:
    """(characters, tokens) of the sampled documents `docs`, whole, as the shard stage counts a document's
    tokens: its pieces and its eos. Characters over tokens is what `make plan` divides a source's cleaned
    characters by to estimate its tokens before it is sharded (stages/train `estimated_windows`). Measured
    on the training sample, which the tokenizer has seen, it runs a little above held-out text's figure."""
    if not docs:
        return 0, 0
    return sum(map(len, docs)), sum(len(ids) + 1 for ids in sp.encode(docs, num_threads=num_threads))


def heldout_stats(sp, texts: list[str], num_threads: int) -> dict:
    """Bytes per token (with its standard error) and the decode(encode(x)) == x rate over held-out texts.

    Bytes per token is the ratio r = sum(b_i) / sum(t_i) over the documents (bytes b_i, tokens t_i); its
    standard error is the ratio estimator's, sqrt(sum((b_i - r t_i)^2) / (n (n - 1))) / mean(t_i), None
    for fewer than two documents."""
    if not texts:
        return {"heldout_docs": 0, "heldout_bytes": 0, "heldout_tokens": 0, "bytes_per_token": None,
                "bytes_per_token_stderr": None, "round_trip_rate": None}
    ids = sp.encode(texts, num_threads=num_threads)
    decoded = sp.decode(ids, num_threads=num_threads)
    doc_bytes = [len(t.encode("utf-8")) for t in texts]
    doc_tokens = [len(i) for i in ids]
    num_bytes, num_tokens, n = sum(doc_bytes), sum(doc_tokens), len(texts)
    ratio = num_bytes / max(num_tokens, 1)
    stderr = None
    if n > 1 and num_tokens:
        squares = sum((b - ratio * t) ** 2 for b, t in zip(doc_bytes, doc_tokens))
        stderr = round(math.sqrt(squares / (n * (n - 1))) / (num_tokens / n), 4)
    return {"heldout_docs": n, "heldout_bytes": num_bytes, "heldout_tokens": num_tokens,
            "bytes_per_token": round(ratio, 4), "bytes_per_token_stderr": stderr,
            "round_trip_rate": sum(d == t for d, t in zip(decoded, texts)) / n}


def _reserved_pieces(byte_fallback: bool) -> int:
    return 3 + (256 if byte_fallback else 1)     # unk/bos/eos, then 256 byte pieces or the "\n" piece
