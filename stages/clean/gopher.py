"""Gopher's filters (Rae et al. 2021, table A1), as datatrove 0.10.1 runs them in FineWeb's recipe:
repetition (`GopherRepetition`: repeated paragraphs, lines and n-grams) and quality (`GopherQuality`: word
counts and lengths, symbols, bullets, stop words).

    from stages.clean.gopher import GopherQuality, GopherRepetition
    GopherRepetition().check({"text": "same line\n" * 10}) == "dup_para_frac"
    GopherQuality(min_doc_words=20).measure({"text": text})[0]["stop_words"]

quality.py says what the quality filters share (defaults, reasons, the word splitter, empty texts);
ngrams.py counts the repeated and most frequent n-grams Gopher repetition's rules compare.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from typing import ClassVar

from stages.clean import filters, ngrams
from stages.clean import words as words_lib
from stages.clean.quality import (
    PUNCTUATION,
    SplitsWords,
    at_least,
    check_splitter,
    duplicates,
    in_unit_interval,
    shared_splitter,
)

_SYMBOL_WORD = re.compile(f"^[{re.escape(PUNCTUATION)}]+$", re.M)
# A word without a letter: every character is a non-word character, a digit or `_` (words hold no
# whitespace). Python's \w is str.isalnum, so a word whose only "letters" are numerals like ² or ½
# counts as having a letter here and not in datatrove (`str.isalpha`).
_NO_LETTER_WORD = re.compile(r"^(?:[^\w\s]|[\d_])+$", re.M)
# The words that may be either: every character a non-word character but a line break, a digit or `_`.
_MAYBE_NO_LETTER = re.compile(r"\n((?:[^\w\n]|[\d_])+)(?=\n)")
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
_PARAGRAPHS = re.compile(r"\n{2,}")


@dataclasses.dataclass(frozen=True)
class GopherRepetition(SplitsWords):
    """Drops documents that repeat themselves (Gopher, Rae et al. 2021, table A1): duplicated
    paragraphs and lines (as a fraction of the count and of the characters), the most frequent 2-,
    3-, 4-gram of words, and the characters in repeated 5- to 10-grams. A threshold of 0 is off
    (but for the n-grams', where 0 drops a document with any n-gram, resp. any repeated one).

    Measured (filters.py): attrs are `chars` and each rule's value, under its reason's name:
    `dup_para_frac` (repeated paragraphs / paragraphs), `dup_para_char_frac` (their characters / chars),
    the same of lines, `top_{n}_gram` (the characters of the commonest n-gram times its count / chars)
    for each n of `top_n_grams`, and `duplicated_{n}_n_grams` (characters in repeated n-grams / chars) for
    each n of `dup_n_grams`; an n-gram's value is None when the text has fewer than n words, and every
    value is None for an empty text. The n's are scoring, their fractions and the four others thresholds.
    """

    dup_line_frac: float = 0.3
    dup_para_frac: float = 0.3
    dup_line_char_frac: float = 0.2
    dup_para_char_frac: float = 0.2
    top_n_grams: tuple[tuple[int, float], ...] = ((2, 0.2), (3, 0.18), (4, 0.16))
    dup_n_grams: tuple[tuple[int, float], ...] = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11),
                                                  (10, 0.10))
    splitter: str = words_lib.DEFAULT       # the word splitter (words.SPLITTERS)

    THRESHOLDS: ClassVar[tuple[str, ...]] = ("dup_line_frac", "dup_para_frac", "dup_line_char_frac",
                                             "dup_para_char_frac")
    PAIRED: ClassVar[tuple[str, ...]] = ("top_n_grams", "dup_n_grams")     # (n: scoring, fraction: threshold)
    _FRACTIONS: ClassVar[tuple[str, ...]] = ("dup_para_frac", "dup_para_char_frac", "dup_line_frac",
                                             "dup_line_char_frac")         # check's order
    _GRAM_KEYS: ClassVar[dict[str, re.Pattern]] = {"top_n_grams": re.compile(r"top_(\d+)_gram"),
                                                   "dup_n_grams": re.compile(r"duplicated_(\d+)_n_grams")}

    def __post_init__(self):
        check_splitter(self)
        in_unit_interval(self, "dup_line_frac", "dup_para_frac", "dup_line_char_frac", "dup_para_char_frac")
        for name in ("top_n_grams", "dup_n_grams"):
            pairs = tuple(tuple(pair) for pair in getattr(self, name))   # gin may give lists
            if not all(len(p) == 2 and isinstance(p[0], int) and p[0] >= 1 and 0 <= p[1] <= 1 for p in pairs):
                raise ValueError(f"{name}={getattr(self, name)!r} must be pairs (n >= 1, fraction in "
                                 "[0, 1]), e.g. ((2, 0.2), (3, 0.18))")
            object.__setattr__(self, name, pairs)
        # derived once (not fields: equality, hashing and the keys see the fields only): the n-gram rules in
        # check's order, as (attr, limit), and every attr in measure's order
        rules = [(f"top_{n}_gram", limit) for n, limit in self.top_n_grams]
        rules += [(f"duplicated_{n}_n_grams", limit) for n, limit in self.dup_n_grams]
        object.__setattr__(self, "_gram_rules", tuple(rules))
        object.__setattr__(self, "_attrs", tuple(dict.fromkeys(("chars", *self._FRACTIONS,
                                                                *(key for key, _ in rules)))))

    def reasons(self) -> tuple[str, ...]:
        return ("empty", "dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac",
                *(f"top_{n}_gram" for n, _ in self.top_n_grams),
                *(f"duplicated_{n}_n_grams" for n, _ in self.dup_n_grams))

    def check(self, doc: dict) -> str | None:
        # `decide`'s rules on the statistics as far as they get, each n-gram's exact value computed only where
        # its upper bound trips its rule (written out rather than `decide` over `filters.LazyAttrs`: this is
        # the costliest filter, and a call per rule read costs it ~2%)
        text = doc["text"]
        chars = len(text)
        # An empty text is "empty", before any rule, as in datatrove 0.10.1 (0.10.0 divided by its length:
        # ZeroDivisionError); Refinery keeps that. No stage reaches it: clean and score set an empty text
        # aside before any filter (document.py), and this filter runs before C4's rewrite; a direct caller
        # of `check` (a benchmark) gets it.
        if not chars:
            return "empty"
        para_frac, para_char_frac = _paragraph_fractions(text)
        if self.dup_para_frac and para_frac > self.dup_para_frac:
            return "dup_para_frac"
        if self.dup_para_char_frac and para_char_frac > self.dup_para_char_frac:
            return "dup_para_char_frac"
        line_frac, line_char_frac = _line_fractions(text)
        if self.dup_line_frac and line_frac > self.dup_line_frac:
            return "dup_line_frac"
        if self.dup_line_char_frac and line_char_frac > self.dup_line_char_frac:
            return "dup_line_char_frac"
        # upper bounds of every n's value of both rules (`_scan`): the exact value is needed only where the
        # bound trips the rule (a bound is at least the value, so `value / chars > limit` implies
        # `bound / chars > limit`)
        words, grams, tops, repeats = self._scan(text)
        for n, limit in self.top_n_grams:
            if len(words) >= n and tops.get(n, math.inf) / chars > limit and \
                    ngrams.top_n_gram_chars(words, n, grams) / chars > limit:
                return f"top_{n}_gram"
        for n, limit in self.dup_n_grams:
            if len(words) >= n and repeats.get(n, 0) / chars > limit and \
                    ngrams.repeated_chars(words, n, grams, (chars, limit)) / chars > limit:
                return f"duplicated_{n}_n_grams"
        return None

    def measure(self, doc: dict) -> tuple[dict, dict]:
        text = doc["text"]
        chars = len(text)
        attrs = dict.fromkeys(self._attrs)           # None: an empty text, or fewer words than n
        attrs["chars"] = chars
        if not chars:
            return attrs, doc
        attrs["dup_para_frac"], attrs["dup_para_char_frac"] = _paragraph_fractions(text)
        attrs["dup_line_frac"], attrs["dup_line_char_frac"] = _line_fractions(text)
        words, grams, _, repeats = self._scan(text)
        for n, _ in self.top_n_grams:
            if len(words) >= n:
                attrs[f"top_{n}_gram"] = ngrams.top_n_gram_chars(words, n, grams) / chars
        for n, _ in self.dup_n_grams:
            if len(words) >= n:       # the whole walk, no early exit; a bound of 0 is the count (no repeat)
                repeated = ngrams.repeated_chars(words, n, grams) if repeats.get(n) else 0
                attrs[f"duplicated_{n}_n_grams"] = repeated / chars
        return attrs, doc

    def decide(self, attrs: dict) -> str | None:
        """`check`'s reason from `measure`'s attrs; a ValueError when they were measured for other n's."""
        for name, pattern in self._GRAM_KEYS.items():
            wanted = sorted({n for n, _ in getattr(self, name)})
            measured = sorted(int(m[1]) for m in map(pattern.fullmatch, attrs) if m)
            if measured != wanted:
                raise ValueError(f"GopherRepetition.{name}={getattr(self, name)!r} reads n = {wanted}, but "
                                 f"these attrs were measured for n = {measured}: measure with the same n's "
                                 "(they are in its scoring_key)")
        if not attrs["chars"]:
            return "empty"
        for key in self._FRACTIONS:
            limit = getattr(self, key)
            if limit and attrs[key] > limit:
                return key
        for key, limit in self._gram_rules:      # top_n_grams', then dup_n_grams', in their order
            value = attrs[key]
            if value is not None and value > limit:
                return key
        return None

    def _scan(self, text: str) -> tuple:
        """(the words, their `ngrams.NGrams` (None for fewer than two), upper bounds of each n's value of the
        top n-gram rule, and of the repeated n-grams rule): the n-gram hashes and one numpy pass for every
        n."""
        words = shared_splitter(self.splitter)(text)
        grams = ngrams.NGrams(words) if len(words) > 1 else None
        tops, repeats = ({}, {}) if grams is None else grams.scan([n for n, _ in self.top_n_grams],
                                                                  [n for n, _ in self.dup_n_grams])
        return words, grams, tops, repeats


@dataclasses.dataclass(frozen=True)
class GopherQuality(SplitsWords):
    """Drops documents that do not read like prose (Gopher): too few or too many words, words too
    short or too long on average, too many `#` or ellipses per word, lines that are mostly bullets
    or end in an ellipsis, too few words with a letter, fewer than `min_stop_words` distinct English
    stop words. A word count or ratio of 0 is off.

    Measured (filters.py): attrs are `words` (the words not made only of punctuation), `mean_word_length`
    (of those; None without any), `hash_ratio` and `ellipsis_ratio` (`#` and `...`/`…` per word, every
    word counted), `bullet_lines_ratio` and `end_ellipsis_lines_ratio` (of the lines), `alpha_words_ratio`
    (words with a letter / words) and `stop_words` (distinct ones). Every field but `splitter` is a
    threshold."""

    min_doc_words: int = 50
    max_doc_words: int = 100_000
    min_avg_word_length: float = 3
    max_avg_word_length: float = 10
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    min_alpha_words_ratio: float = 0.8      # datatrove's max_non_alpha_words_ratio (a minimum, as it says)
    min_stop_words: int = 2
    splitter: str = words_lib.DEFAULT       # the word splitter (words.SPLITTERS)

    THRESHOLDS: ClassVar[tuple[str, ...]] = ("min_doc_words", "max_doc_words", "min_avg_word_length",
                                             "max_avg_word_length", "max_symbol_word_ratio",
                                             "max_bullet_lines_ratio", "max_ellipsis_lines_ratio",
                                             "min_alpha_words_ratio", "min_stop_words")

    def __post_init__(self):
        check_splitter(self)
        in_unit_interval(self, "max_symbol_word_ratio", "max_bullet_lines_ratio", "max_ellipsis_lines_ratio",
                          "min_alpha_words_ratio")
        at_least(self, 0, "min_doc_words", "max_doc_words", "min_avg_word_length", "max_avg_word_length",
                  "min_stop_words")

    def reasons(self) -> tuple[str, ...]:
        return ("gopher_short_doc", "gopher_long_doc", "gopher_below_avg_threshold",
                "gopher_above_avg_threshold",
                "gopher_too_many_hashes", "gopher_too_many_ellipsis", "gopher_too_many_bullets",
                "gopher_too_many_end_ellipsis", "gopher_below_alpha_threshold", "gopher_enough_stop_words")

    def check(self, doc: dict) -> str | None:
        return self.decide(_QualityAttrs(doc["text"], self.splitter))   # statistics as far as the rules get

    def measure(self, doc: dict) -> tuple[dict, dict]:
        return _QualityAttrs(doc["text"], self.splitter).every(), doc

    def decide(self, attrs: dict) -> str | None:
        if self.min_doc_words and attrs["words"] < self.min_doc_words:
            return "gopher_short_doc"
        if self.max_doc_words and attrs["words"] > self.max_doc_words:
            return "gopher_long_doc"
        if self.min_avg_word_length or self.max_avg_word_length:
            mean_length = attrs["mean_word_length"]
            if mean_length is not None:   # datatrove's mean of no word is nan, which passes both bounds
                if self.min_avg_word_length and mean_length < self.min_avg_word_length:
                    return "gopher_below_avg_threshold"
                if self.max_avg_word_length and mean_length > self.max_avg_word_length:
                    return "gopher_above_avg_threshold"
        if self.max_symbol_word_ratio and attrs["hash_ratio"] > self.max_symbol_word_ratio:
            return "gopher_too_many_hashes"
        if self.max_symbol_word_ratio and attrs["ellipsis_ratio"] > self.max_symbol_word_ratio:
            return "gopher_too_many_ellipsis"
        if self.max_bullet_lines_ratio and attrs["bullet_lines_ratio"] > self.max_bullet_lines_ratio:
            return "gopher_too_many_bullets"
        if (self.max_ellipsis_lines_ratio
                and attrs["end_ellipsis_lines_ratio"] > self.max_ellipsis_lines_ratio):
            return "gopher_too_many_end_ellipsis"
        if self.min_alpha_words_ratio and attrs["alpha_words_ratio"] < self.min_alpha_words_ratio:
            return "gopher_below_alpha_threshold"
        if self.min_stop_words and attrs["stop_words"] < self.min_stop_words:
            return "gopher_enough_stop_words"     # datatrove's name for "not enough stop words"
        return None


class _QualityAttrs(filters.LazyAttrs):
    """GopherQuality's attrs of one text, each computed when read (see GopherQuality)."""

    KEYS = ("words", "mean_word_length", "hash_ratio", "ellipsis_ratio", "bullet_lines_ratio",
            "end_ellipsis_lines_ratio", "alpha_words_ratio", "stop_words")

    def __init__(self, text: str, splitter: str):
        # the words, which the first rule reads: the distinct ones without a letter, those made only of
        # punctuation (symbols) and the rest (real words)
        self.text, self.all_words = text, shared_splitter(splitter)(text)
        self.no_letter, symbolic = _letterless(self.all_words)
        self.symbols = list(filter(symbolic.__contains__, self.all_words))
        self.n_real = len(self.all_words) - len(self.symbols)
        self._lines: list[str] | None = None     # on first read

    def _all_lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.text.splitlines() or [""]
        return self._lines

    def words(self) -> int:
        return self.n_real

    def mean_word_length(self) -> float | None:
        if not self.n_real:
            return None
        return (sum(map(len, self.all_words)) - sum(map(len, self.symbols))) / self.n_real

    def hash_ratio(self) -> float:
        return self.text.count("#") / (len(self.all_words) or 1)

    def ellipsis_ratio(self) -> float:
        return (self.text.count("...") + self.text.count("…")) / (len(self.all_words) or 1)

    def bullet_lines_ratio(self) -> float:
        lines = self._all_lines()
        return sum(1 for line in lines if line.lstrip().startswith(("•", "-"))) / len(lines)

    def end_ellipsis_lines_ratio(self) -> float:
        lines = self._all_lines()
        return sum(1 for line in lines if line.rstrip().endswith(("...", "…"))) / len(lines)

    def alpha_words_ratio(self) -> float:
        words = self.all_words
        return (len(words) - sum(map(self.no_letter.__contains__, words))) / (len(words) or 1)

    def stop_words(self) -> int:
        return len(set(STOP_WORDS).intersection(self.all_words))


def _letterless(words: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(the distinct words without a letter, those made only of punctuation), looked for among the
    distinct words, joined by line breaks: a text repeats its words, and a regular expression's search
    costs per character."""
    maybe = _MAYBE_NO_LETTER.findall("\n" + "\n".join(set(words)) + "\n")
    return set(filter(_NO_LETTER_WORD.fullmatch, maybe)), set(filter(_SYMBOL_WORD.fullmatch, maybe))


def _paragraphs(text: str) -> list[str]:
    """`_PARAGRAPHS.split(text.strip())`, by `str.split` where no run of newlines is longer than two (then
    each "\n\n" is a whole run), which is several times faster than the regular expression."""
    text = text.strip()
    return _PARAGRAPHS.split(text) if "\n\n\n" in text else text.split("\n\n")


def _paragraph_fractions(text: str) -> tuple[float, float]:
    """(repeated paragraphs / paragraphs, their characters / the text's): Gopher repetition's
    `dup_para_frac` and `dup_para_char_frac` (text non-empty)."""
    paragraphs = _paragraphs(text)
    repeats, repeat_chars = duplicates(paragraphs)
    return repeats / len(paragraphs), repeat_chars / len(text)


def _line_fractions(text: str) -> tuple[float, float]:
    """(repeated lines / lines, their characters / the text's): Gopher repetition's `dup_line_frac` and
    `dup_line_char_frac` (text non-empty)."""
    lines, repeats, repeat_chars = _line_duplicates(text)
    return repeats / lines, repeat_chars / len(text)


def _line_duplicates(text: str) -> tuple[int, int, int]:
    """(lines, how many repeat an earlier one, their characters) of the text split on runs of newlines
    (datatrove's `re.split(r"\n+", text)`), counted from `text.split("\n")`, several times faster: its
    items are the lines and an empty string inside each run of newlines, which is no line; an empty first
    or last item is one (the regular expression's too)."""
    parts = text.split("\n")
    counts = Counter(parts)
    empty_lines = (parts[0] == "") + (len(parts) > 1 and parts[-1] == "")
    lines = len(parts) - counts.pop("", 0) + empty_lines
    distinct = len(counts) + (empty_lines > 0)
    line_chars = len(text) - (len(parts) - 1)          # every character but the newlines
    return lines, lines - distinct, line_chars - sum(map(len, counts))
