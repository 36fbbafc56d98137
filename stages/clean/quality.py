"""FineWeb's quality filters for the clean stage: Gopher repetition, Gopher quality, C4, FineWeb.

    GopherRepetition().check({"text": "same line\n" * 10}) == "dup_para_frac"
    C4Quality().apply({"text": text}) == (None, {"text": <the lines C4 keeps>})

Each is a frozen dataclass whose defaults are those of datatrove 0.10.1 as FineWeb's recipe
(datatrove `examples/fineweb.py`) runs them: every filter with its defaults except
`C4QualityFilter(filter_no_terminal_punct=False)`. Reasons are datatrove's, so a benchmark can
compare decisions per reason, except that C4's get a `c4_` prefix (datatrove: `lorem_ipsum`,
`curly_bracket`, `too_few_sentences`) to say which filter spoke. Each is a config of its own, switched
on in `clean.Config` and bound on its class in gin (`clean.GopherQuality.min_doc_words = 50`); the stage
runs them after the cheap filters, in FineWeb's order (`config.RECIPE`).

Words and sentences come from the word splitter each filter names (`splitter`, one of
`words.SPLITTERS`): "spacy_rules" (the default: what datatrove 0.10.1 runs, spaCy's English rules without
spaCy, spacy_rules.py), "spacy" (the same by spaCy), "nltk" (`nltk.word_tokenize`, what FineWeb ran) or
"fast" (NLTK's English rules as regular expressions, words.py); a library loads once
per process, on the first document (`_splitter`), never into the dataclass. FineWeb itself ran datatrove
0.2.0, whose rules differ slightly from 0.10.1's: Gopher quality counted stop-word occurrences
(0.10.1 counts distinct stop words), Gopher repetition split lines with `splitlines` (0.10.1 on
`\\n+`), and the FineWeb filter ended lines with `. ' " ! ?` only, compared with `<=`/`>=` and
counted blank lines in its line ratios (0.10.1: every terminal punctuation mark, `<`/`>`, blank
lines dropped). This module follows 0.10.1, the datatrove a benchmark installs today.

Measured (filters.py, issue 38): each filter but C4 (a rewriter, measured by its reason) has
`measure(doc) -> (attrs, doc)` with every statistic its rules compare, and `decide(attrs)` with the rules,
which give `check`'s reason; its class docstring lists the attrs. Gopher quality's and FineWeb's `check`
is `decide` over statistics computed when read (`filters.LazyAttrs`); Gopher repetition's keeps its own
rules, for the upper bounds below, while `measure` computes every exact value.

Speed: everything that walks characters or words runs in C (`str.count`, `str.split`, `re`, `Counter`,
`set`, `map`) or numpy (`_NGrams.scan`: one sort of the hashes of every n-gram Gopher repetition
counts, which bounds each rule's value from above); the exact values (the top n-gram, the walk in
Python over the n-grams that may repeat) are computed only where a bound trips its rule.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
import math
import operator
import re
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from stages.clean import filters
from stages.clean import words as words_lib

if TYPE_CHECKING:      # numpy loads when a repetition check runs: clean.Config imports this module for the
    import numpy as np  # filters' configs, and planning (a fully cached rerun included) imports no numpy

# datatrove's TERMINAL_PUNCTUATION and PUNCTUATION_SET (utils/text.py), sorted: the sentence-ending
# marks of many scripts; ASCII and CJK punctuation and the C0/C1 control characters but tab and
# newline. A word made only of PUNCTUATION is a symbol, not a word.
TERMINAL_PUNCTUATION = (
    "!.?։؝؞؟۔܀܁܂߹࠷࠹࠽࠾।॥၊။።፧፨᙮᜵᜶។៕៖៙៚᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᭽᭾᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼⹓⹔。꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？｡"
    "\U00010a56\U00010a57\U00010f55\U00010f56\U00010f57\U00010f58\U00010f59\U00010f86\U00010f87"
    "\U00010f88\U00010f89\U00011047\U00011048\U000110be\U000110bf\U000110c0\U000110c1\U00011141"
    "\U00011142\U00011143\U000111c5\U000111c6\U000111cd\U000111de\U000111df\U00011238\U00011239"
    "\U0001123b\U0001123c\U000112a9\U0001144b\U0001144c\U000115c2\U000115c3\U000115c9\U000115ca"
    "\U000115cb\U000115cc\U000115cd\U000115ce\U000115cf\U000115d0\U000115d1\U000115d2\U000115d3"
    "\U000115d4\U000115d5\U000115d6\U000115d7\U00011641\U00011642\U0001173c\U0001173d\U0001173e"
    "\U00011944\U00011946\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41\U00011c42\U00011ef7"
    "\U00011ef8\U00011f43\U00011f44\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44"
    "\U00016e98\U0001bc9f\U0001da88"
)
PUNCTUATION = ("!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
               + "".join(map(chr, (*range(0, 9), *range(11, 32), *range(127, 160))))
               + TERMINAL_PUNCTUATION)
_SYMBOL_WORD = re.compile(f"^[{re.escape(PUNCTUATION)}]+$", re.M)
# A word without a letter: every character is a non-word character, a digit or `_` (words hold no
# whitespace). Python's \w is str.isalnum, so a word whose only "letters" are numerals like ² or ½
# counts as having a letter here and not in datatrove (`str.isalpha`).
_NO_LETTER_WORD = re.compile(r"^(?:[^\w\s]|[\d_])+$", re.M)
# The words that may be either: every character a non-word character but a line break, a digit or `_`.
_MAYBE_NO_LETTER = re.compile(r"\n((?:[^\w\n]|[\d_])+)(?=\n)")
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
_PARAGRAPHS = re.compile(r"\n{2,}")
_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
                  "use cookies")


class _SplitsWords:
    """A filter that splits words or sentences with the splitter its `splitter` field names."""

    splitter: str

    def problem(self) -> str:
        """What would fail the first document, in one line, or "": the splitter's library missing (spaCy
        and NLTK are extras of the same names; "spacy_rules" and "fast" need none)."""
        library = words_lib.LIBRARY.get(self.splitter)
        if library is None or importlib.util.find_spec(library) is not None:
            return ""
        return (f"clean.{type(self).__name__}.splitter={self.splitter!r} needs {library}, which is not "
                f"installed: pip install -e '.[{library}]', or use the {words_lib.DEFAULT!r} splitter "
                "(no library)")


@dataclasses.dataclass(frozen=True)
class GopherRepetition(_SplitsWords):
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
        _check_splitter(self)
        _in_unit_interval(self, "dup_line_frac", "dup_para_frac", "dup_line_char_frac", "dup_para_char_frac")
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
        # datatrove 0.10.1 drops an empty text as "empty" before any rule (0.10.0 divided by its length:
        # ZeroDivisionError). The clean stage drops empty texts itself before any filter (document.py), so
        # this decides only for a caller of `check` (a benchmark); the stage's output is unchanged.
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
                    _top_n_gram_chars(words, n, grams) / chars > limit:
                return f"top_{n}_gram"
        for n, limit in self.dup_n_grams:
            if len(words) >= n and repeats.get(n, 0) / chars > limit and \
                    _repeated_chars(words, n, grams, (chars, limit)) / chars > limit:
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
                attrs[f"top_{n}_gram"] = _top_n_gram_chars(words, n, grams) / chars
        for n, _ in self.dup_n_grams:
            if len(words) >= n:       # the whole walk, no early exit; a bound of 0 is the count (no repeat)
                repeated = _repeated_chars(words, n, grams) if repeats.get(n) else 0
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
        """(the words, their `_NGrams` (None for fewer than two), upper bounds of each n's value of the top
        n-gram rule, and of the repeated n-grams rule): the n-gram hashes and one numpy pass for every n."""
        words = _splitter(self.splitter)(text)
        grams = _NGrams(words) if len(words) > 1 else None
        tops, repeats = ({}, {}) if grams is None else grams.scan([n for n, _ in self.top_n_grams],
                                                                  [n for n, _ in self.dup_n_grams])
        return words, grams, tops, repeats


@dataclasses.dataclass(frozen=True)
class GopherQuality(_SplitsWords):
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
        _check_splitter(self)
        _in_unit_interval(self, "max_symbol_word_ratio", "max_bullet_lines_ratio", "max_ellipsis_lines_ratio",
                          "min_alpha_words_ratio")
        _at_least(self, 0, "min_doc_words", "max_doc_words", "min_avg_word_length", "max_avg_word_length",
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
        self.text, self.all_words = text, _splitter(splitter)(text)
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


@dataclasses.dataclass(frozen=True)
class C4Quality(_SplitsWords):
    """C4's line rules (Raffel et al. 2020), which also REWRITE the text to the lines they keep.

    Per line (stripped): dropped when a word is longer than `max_word_length`, when it has fewer
    than `min_words_per_line` words, mentions javascript, or a cookie/terms-of-use phrase, or (with
    `filter_no_terminal_punct`) does not end in `. ? ! " '` or ends in `...`; Wikipedia citation
    marks (`[1]`, `[edit]`) are removed from kept lines. The document is dropped for `lorem ipsum`
    (`c4_lorem_ipsum`), a curly bracket (`c4_curly_bracket`) in a line that got that far, or fewer
    than `min_num_sentences` sentences in the kept lines (`c4_too_few_sentences`). A count of -1 is
    off. FineWeb runs it with `filter_no_terminal_punct=False`, the default here.
    """

    filter_no_terminal_punct: bool = False
    min_num_sentences: int = 5
    min_words_per_line: int = 3
    max_word_length: int = 1000
    remove_citations: bool = True
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True
    splitter: str = words_lib.DEFAULT       # counts the sentences (words.SPLITTERS)

    def __post_init__(self):
        _check_splitter(self)
        _at_least(self, -1, "min_num_sentences", "min_words_per_line", "max_word_length")

    def reasons(self) -> tuple[str, ...]:
        return ("c4_lorem_ipsum", "c4_curly_bracket", "c4_too_few_sentences")

    def rewrites(self) -> tuple[str, ...]:
        return ("c4_lines",)

    def changes(self, before: dict, after: dict) -> tuple[str, ...]:
        return ("c4_lines",)      # lines dropped, stripped, or citations removed: one kind of change

    def check(self, doc: dict) -> str | None:
        return self.apply(doc)[0]

    def apply(self, doc: dict) -> tuple[str | None, dict]:
        """(reason or None, the document with its text rewritten to the kept lines when kept)."""
        kept: list[str] = []
        sentences = 0
        count_sentences = _splitter(self.splitter).sentences
        for line in doc["text"].splitlines():
            line = line.strip()
            n_words = len(line.split())
            if self.max_word_length != -1 and len(line) > self.max_word_length and any(
                    len(word) > self.max_word_length for word in line.split()):
                continue
            if self.remove_citations and "[" in line:
                line = _CITATION.sub("", line)
            if self.filter_no_terminal_punct and (not line.endswith((".", "?", "!", '"', "'"))
                                                  or line.endswith("...")):
                continue
            if n_words < self.min_words_per_line:    # words counted before citations were removed
                continue
            lower = line.lower()
            if self.filter_lorem_ipsum and "lorem ipsum" in lower:
                return "c4_lorem_ipsum", doc
            if self.filter_javascript and "javascript" in lower:
                continue
            if self.filter_curly_bracket and "{" in line:
                return "c4_curly_bracket", doc
            if self.filter_policy and any(phrase in lower for phrase in POLICY_PHRASES):
                continue
            if self.min_num_sentences != -1:
                sentences += count_sentences(line)
            kept.append(line)
        if sentences < self.min_num_sentences:
            return "c4_too_few_sentences", doc
        return None, {**doc, "text": "\n".join(kept).strip()}


@dataclasses.dataclass(frozen=True)
class FineWebQuality(_SplitsWords):
    """FineWeb's own rules (Penedo et al. 2024), over the non-blank lines: too few lines ending in
    terminal punctuation (`line_punct_ratio`), too many lines of at most `short_line_length`
    characters (`short_line_ratio`), too many characters in duplicated lines (`char_dup_ratio`),
    too many line breaks per word (`list_ratio`).

    Measured (filters.py): attrs are `lines` (non-blank), `line_punct_ratio` and `short_line_ratio` (of
    them; None without any), `char_dup_ratio` and `list_ratio`. `short_line_length` and `splitter` are
    scoring (they change a statistic), the other fields thresholds."""

    line_punct_thr: float = 0.12
    line_punct_exclude_zero: bool = False
    short_line_thr: float = 0.67
    short_line_length: int = 30
    char_duplicates_ratio: float = 0.01
    new_line_ratio: float = 0.3
    splitter: str = words_lib.DEFAULT       # the word splitter (words.SPLITTERS)

    THRESHOLDS: ClassVar[tuple[str, ...]] = ("line_punct_thr", "line_punct_exclude_zero", "short_line_thr",
                                             "char_duplicates_ratio", "new_line_ratio")

    def __post_init__(self):
        _check_splitter(self)
        _in_unit_interval(self, "line_punct_thr", "short_line_thr", "char_duplicates_ratio")
        _at_least(self, 0, "short_line_length", "new_line_ratio")

    def reasons(self) -> tuple[str, ...]:
        return ("empty", "line_punct_ratio", "short_line_ratio", "char_dup_ratio", "list_ratio")

    def check(self, doc: dict) -> str | None:
        return self.decide(_FineWebAttrs(doc["text"], self))   # statistics as far as the rules get

    def measure(self, doc: dict) -> tuple[dict, dict]:
        return _FineWebAttrs(doc["text"], self).every(), doc

    def decide(self, attrs: dict) -> str | None:
        if not attrs["lines"]:
            return "empty"
        ratio = attrs["line_punct_ratio"]
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return "line_punct_ratio"
        if attrs["short_line_ratio"] > self.short_line_thr:
            return "short_line_ratio"
        if attrs["char_dup_ratio"] > self.char_duplicates_ratio:
            return "char_dup_ratio"
        if attrs["list_ratio"] > self.new_line_ratio:
            return "list_ratio"
        return None


class _FineWebAttrs(filters.LazyAttrs):
    """FineWebQuality's attrs of one text, each computed when read (see FineWebQuality)."""

    KEYS = ("lines", "line_punct_ratio", "short_line_ratio", "char_dup_ratio", "list_ratio")

    def __init__(self, text: str, f: FineWebQuality):
        self.text, self.f = text, f
        self.non_blank = [line for line in text.split("\n") if line.strip()]     # what the first rule reads

    def lines(self) -> int:
        return len(self.non_blank)

    def line_punct_ratio(self) -> float | None:
        lines = self.non_blank
        return sum(1 for line in lines if line.endswith(_TERMINAL)) / len(lines) if lines else None

    def short_line_ratio(self) -> float | None:
        lines, short = self.non_blank, self.f.short_line_length
        return sum(1 for line in lines if len(line) <= short) / len(lines) if lines else None

    def char_dup_ratio(self) -> float:
        return _duplicates(self.non_blank)[1] / max(len(self.text) - self.text.count("\n"), 1)

    def list_ratio(self) -> float:
        return self.text.count("\n") / max(len(_splitter(self.f.splitter)(self.text)), 1)


_TERMINAL = tuple(TERMINAL_PUNCTUATION)


@functools.cache
def _splitter(name: str):
    """The word splitter `name`, one per process, shared by every filter that names it: it loads its
    library on first use and remembers the last text's words, which the next filter splits again."""
    return words_lib.splitter(name)


def _check_splitter(obj) -> None:
    if obj.splitter not in words_lib.SPLITTERS:
        raise ValueError(f"splitter={obj.splitter!r} is not a word splitter; valid: "
                         f"{', '.join(map(repr, words_lib.SPLITTERS))} (words.py)")


def _in_unit_interval(obj, *names: str) -> None:
    for name in names:
        if not 0 <= getattr(obj, name) <= 1:
            raise ValueError(f"{name}={getattr(obj, name)!r} must be in [0, 1] (0 turns the rule off)")


def _at_least(obj, low: int, *names: str) -> None:
    for name in names:
        if getattr(obj, name) < low:
            raise ValueError(f"{name}={getattr(obj, name)!r} must be >= {low} ({low} turns the rule off)")


def _letterless(words: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(the distinct words without a letter, those made only of punctuation), looked for among the
    distinct words, joined by line breaks: a text repeats its words, and a regular expression's search
    costs per character."""
    maybe = _MAYBE_NO_LETTER.findall("\n" + "\n".join(set(words)) + "\n")
    return set(filter(_NO_LETTER_WORD.fullmatch, maybe)), set(filter(_SYMBOL_WORD.fullmatch, maybe))


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(how many items repeat an earlier one, their characters): every item less the distinct ones, summed
    in C (`map`) rather than by a Python loop over the repeated ones."""
    counts = Counter(items)
    return len(items) - len(counts), sum(map(len, items)) - sum(map(len, counts))


def _paragraphs(text: str) -> list[str]:
    """`_PARAGRAPHS.split(text.strip())`, by `str.split` where no run of newlines is longer than two (then
    each "\n\n" is a whole run), which is several times faster than the regular expression."""
    text = text.strip()
    return _PARAGRAPHS.split(text) if "\n\n\n" in text else text.split("\n\n")


def _paragraph_fractions(text: str) -> tuple[float, float]:
    """(repeated paragraphs / paragraphs, their characters / the text's): Gopher repetition's
    `dup_para_frac` and `dup_para_char_frac` (text non-empty)."""
    paragraphs = _paragraphs(text)
    repeats, repeat_chars = _duplicates(paragraphs)
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


def _top_n_gram_chars(words: tuple[str, ...], n: int, grams: _NGrams | None = None) -> int:
    """Characters of the most frequent n-gram (joined by spaces) times its count; the first one seen
    wins a tie, as in `Counter.most_common`. With `grams` (the words' `_NGrams`), the n-grams are counted
    by hash in numpy and the winner's positions compared as words (a collision falls back to `Counter`)."""
    if grams is not None and n > 1:
        found = grams.top(n)
        if found is not None:
            i, top = found
            return (int(grams.offsets[i + n] - grams.offsets[i]) + n - 1) * top
    counts = Counter(zip(*(words[i:] for i in range(n))))
    values = list(counts.values())
    top = max(values)
    gram = next(itertools.islice(counts, values.index(top), None))    # the first seen with that count
    return (sum(map(len, gram)) + n - 1) * top


def _repeated_chars(words: tuple[str, ...], n: int, grams: _NGrams | None = None,
                    limit: tuple[int, float] = (1, math.inf)) -> int:
    """Characters in repeated n-grams, counted as Gopher (and datatrove) count them: walk the words;
    an n-gram seen before adds its characters and the walk jumps past it, else it is remembered and
    the walk steps one word. Here (as in datatrove) an n-gram is its words joined WITHOUT spaces, so
    `ab c` repeats `a bc`.

    The walk only has to stop at positions whose n-gram occurred earlier, so it visits those in
    Python and skips the rest: most documents have few or none. Which positions may repeat is found
    in numpy from a hash of each n-gram's characters (`_NGrams.candidates`); their strings are then
    compared, so a hash collision costs time, never a different count. `grams` is the words' `_NGrams`,
    built once per document for every n. With `limit` (chars, fraction), the walk stops once the count
    over `chars` is above `fraction` (a rule's test): what it returns then passes that test (the count can
    only grow), but is not the count.
    """
    grams = grams or _NGrams(words)
    candidates = grams.candidates(n)              # every position whose n-gram may repeat, ascending
    if not len(candidates):
        return 0
    starts, text = candidates.tolist(), grams.text
    begins, ends = grams.offsets[candidates], grams.offsets[candidates + n]
    strings = [text[a:b] for a, b in zip(begins.tolist(), ends.tolist())]
    first = dict(zip(reversed(strings), reversed(starts)))      # each string's first position: its name
    firsts = list(map(first.__getitem__, strings))
    # An n-gram is remembered when the walk has stood on any of its positions. Every position not
    # jumped over is stood on; `jumped[p]` says whether p was jumped over. A first occurrence (left out
    # here) is stood on, or jumped over, and adds nothing. An n-gram is named by its first position.
    seen: set[int] = set()
    jumped = bytearray(len(words) + n)
    over = b"\1" * (n - 1)
    position = total = 0
    later = map(operator.ne, starts, firsts)
    for i, first_i, chars in itertools.compress(zip(starts, firsts, (ends - begins).tolist()), later):
        if i < position:                          # jumped over
            continue
        if first_i in seen or not jumped[first_i]:
            total += chars
            if total / limit[0] > limit[1]:
                break
            jumped[i + 1:i + n] = over
            position = i + n
        else:
            position = i + 1
        seen.add(first_i)
    return total


class _NGrams:
    """One document's words, for finding its repeated n-grams in numpy, for every n.

    `text` is the words joined without spaces, and prefix sums give the hash of any run of its
    characters in O(1): h(text[a:b]) = sum_t text[a+t] * B^t = (S[b] - S[a]) * B^-a mod 2^64, with
    S[k] = sum_{j<k} text[j] * B^j (B odd, so B^-1 exists mod 2^64; numpy uint64 arithmetic wraps
    modulo 2^64 by definition, the arithmetic meant here). Equal strings have equal hashes; unequal
    ones rarely do, and the caller compares strings. The powers of B and B^-1 are tables shared by
    every document (`_powers`).

    Most documents have a few hundred words, where numpy's cost per call, not per element, dominates:
    hence `scan`, one set of calls for every n of both rules.
    """

    _BASE = 0x9E3779B97F4A7C15                       # odd
    _COMBINE = 0xA24BAED4963EE407                    # odd: combines the words' hashes into an n-gram's
    _MIX = 0xBF58476D1CE4E5B9                        # odd: carries a hash's low bits up (`_position_sort`)
    _PAD = 16                                        # `_ends` slices for n up to the shortest n + 16

    def __init__(self, words: tuple[str, ...]):
        import numpy as np

        m = len(words)
        self.words = words
        self.text = "".join(words)
        # word i is text[offsets[i]:offsets[i+1]]; past offsets[m], the text's end again `_PAD` times, so
        # that the ends of the spans of n words from every position, min(i + n, m), are a slice (`_ends`)
        self._bounds = np.empty(m + 1 + self._PAD, dtype=np.int64)
        self._bounds[0] = 0
        np.fromiter(map(len, words), dtype=np.int64, count=m).cumsum(out=self._bounds[1:m + 1])
        self._bounds[m + 1:] = self._bounds[m]
        self.offsets = self._bounds[:m + 1]
        codes = np.frombuffer(self.text.encode("utf-32-le"), dtype=np.uint32)
        self._sums = np.empty(len(codes) + 1, dtype=np.uint64)
        self._sums[0] = 0
        np.multiply(codes, _powers(self._BASE, len(codes)), out=self._sums[1:])
        np.cumsum(self._sums[1:], out=self._sums[1:])
        self._inverse = _powers(_inverse(self._BASE), len(codes))
        # `scan`'s hashes of runs of whole words, times M (`_MIX`): text[offsets[i]:offsets[j]] hashes
        # to (_at[j] - _at[i]) * _unit[i]; `_at_bounds` runs on as `_bounds` does
        self._at_bounds = self._sums[self._bounds]                                # (m + 1 + _PAD,)
        self._at = self._at_bounds[:m + 1]
        self._unit = self._inverse[self.offsets[:-1]] * np.uint64(self._MIX)   # (m,)
        self._word_keys = (self._at[1:] - self._at[:-1]) * self._unit         # (m,): each word's
        self._scanned: tuple = ([], [], None, None, 0)   # `scan`'s ns (top, repeat), rows, `same`, mask

    def _ends(self, values: np.ndarray, n: int, width: int) -> np.ndarray:
        """values[min(i + n, m)] for i < width, (width,), of `_bounds` or `_at_bounds`: a slice where
        their padding reaches, else a gather."""
        import numpy as np

        m = len(self.words)
        if n + width <= m + 1 + self._PAD:
            return values[n:n + width]
        return values[np.minimum(np.arange(n, n + width), m)]

    def _row(self, n: int, top: bool) -> tuple[np.ndarray, np.ndarray, int]:
        """`scan`'s sorted row for n (of the top n-grams, else of the repeated ones), its `same` and mask;
        for an n `scan` made no row for, the same of n alone."""
        import numpy as np

        top_ns, repeat_ns, ordered, same, mask = self._scanned
        if n in (top_ns if top else repeat_ns):
            row = top_ns.index(n) if top else len(top_ns) + repeat_ns.index(n)
            return ordered[row], same[row], mask
        keys = np.empty((1, len(self.words) - n + 1), dtype=np.uint64)
        (self._word_gram_keys if top else self._char_gram_keys)([n], keys)
        ordered, mask = _position_sort(keys)
        return ordered[0], _same_as_before(ordered, mask)[0], mask

    def top(self, n: int) -> tuple[int, int] | None:
        """(the first position of the commonest n-gram of words, its count), from a hash of each word
        sequence (a polynomial in the words' hashes); None when the winner's positions do not all hold
        the same words (a collision: the caller counts them itself). Of the hashes with the top count,
        the one at the first position wins, as the first seen wins `Counter.most_common`'s ties: the
        longest run of equal hashes in position order (`_position_sort`), of those the first seen. From
        the row `scan` sorted, if it did (its suffixes, in a run, fail the comparison), else a sort."""
        import numpy as np

        ordered, same, mask = self._row(n, top=True)
        position = np.arange(len(ordered))
        start = np.maximum.accumulate(np.where(same, 0, position))          # where its run starts
        first = (ordered[start] & mask).view(np.int64)                      # its run's first position
        end = int((((position - start) << mask.bit_length()) | (mask - first)).argmax())   # its last
        begin, i = int(start[end]), int(first[end])
        gram = self.words[i:i + n]
        if any(self.words[p:p + n] != gram for p in (ordered[begin + 1:end + 1] & mask).tolist()):
            return None
        return i, end - begin + 1

    def scan(self, top_ns: Iterable[int], repeat_ns: Iterable[int]) -> tuple[dict[int, int], dict[int, int]]:
        """Upper bounds of `_top_n_gram_chars(words, n)` for each n of `top_ns`, and of
        `_repeated_chars(words, n)` for each n of `repeat_ns` (`_repeat_bounds`), in one sort of a row of
        hashes per n (k rows), with their positions (`_position_sort`), so that equal ones lie together
        in position order: the exact values, in Python or from these rows, are needed only where a
        bound trips its rule. A row holds (width,) hashes, the shortest n's count of positions; past its
        own last position, the hashes of shorter runs (the text's suffixes)."""
        import numpy as np

        m = len(self.words)
        top_ns = sorted({n for n in top_ns if n <= m})
        repeat_ns = sorted({n for n in repeat_ns if n < m})            # two positions or more
        if not top_ns and not repeat_ns:
            return {}, {}
        width = m - min(top_ns[:1] + repeat_ns[:1]) + 1
        keys = np.empty((len(top_ns) + len(repeat_ns), width), dtype=np.uint64)
        if top_ns:
            self._word_gram_keys(top_ns, keys[:len(top_ns)])
        if repeat_ns:
            self._char_gram_keys(repeat_ns, keys[len(top_ns):])
        ordered, mask = _position_sort(keys)
        same = _same_as_before(ordered, mask)
        self._scanned = top_ns, repeat_ns, ordered, same, mask
        tops = self._top_bounds(top_ns, ordered[:len(top_ns)], same[:len(top_ns)])
        return tops, self._repeat_bounds(repeat_ns, ordered[len(top_ns):], same[len(top_ns):], mask)

    def _word_gram_keys(self, ns: list[int], keys: np.ndarray) -> None:
        """Fill `keys` (len(ns), width) with a hash of each n-gram of words, sum over t of h(word i + t) *
        C^t mod 2^64, for each n of `ns` (ascending); past a row's last n-gram, its shorter suffixes."""
        import numpy as np

        width = keys.shape[1]
        hashes = np.zeros(width + ns[-1] - 1, dtype=np.uint64)         # the words', then 0s
        hashes[:len(self._word_keys)] = self._word_keys
        gram = hashes[:width]
        if 1 in ns:
            keys[0] = gram
        for t, power in enumerate(_combine_powers(self._COMBINE, ns[-1])[1:], 1):
            out = keys[ns.index(t + 1)] if t + 1 in ns else None
            gram = np.add(gram, hashes[t:t + width] * power, out=out)

    def _char_gram_keys(self, ns: list[int], keys: np.ndarray) -> None:
        """Fill `keys` (len(ns), width) with a hash of each n-gram of characters (its words joined without
        spaces), (_at[i + n] - _at[i]) * _unit[i], for each n of `ns`; past a row's last n-gram, its shorter
        suffixes."""
        import numpy as np

        width = keys.shape[1]
        for row, n in enumerate(ns):
            np.subtract(self._ends(self._at_bounds, n, width), self._at[:width], out=keys[row])
        keys *= self._unit[:width]

    def _top_bounds(self, ns: list[int], ordered: np.ndarray, same: np.ndarray) -> dict[int, int]:
        """For each n of `ns` (a row each of `scan`), an upper bound of `_top_n_gram_chars(words, n)`: the
        row's longest run of equal hashes (the top count or more: a collision only lengthens a run) times
        the characters of its longest n-gram (a suffix past the last is shorter than it)."""
        import numpy as np

        if not ns:
            return {}
        width = ordered.shape[1]
        index = np.arange(same.size)                                    # flat: numpy's 1-D loops are faster
        runs = np.maximum.accumulate(np.where(same.ravel(), 0, index))   # where each one's run starts
        counts = (index - runs).reshape(same.shape).max(axis=1) + 1
        starts = self.offsets[:width]
        return {n: int(count) * (int((self._ends(self._bounds, n, width) - starts).max()) + n - 1)
                for n, count in zip(ns, counts.tolist())}

    def _repeat_bounds(self, ns: list[int], ordered: np.ndarray, same: np.ndarray,
                       mask: int) -> dict[int, int]:
        """For each n of `ns` (a row each of `scan`), an upper bound of `_repeated_chars(words, n)`: the
        characters of the union of the n-grams whose hash equals an earlier position's. The walk counts
        n-grams equal to an earlier one (so are their hashes) and never two that overlap, so at most the
        union's characters; a hash collision only widens the union."""
        import numpy as np

        if not same.any():                               # most documents: no n-gram twice
            return dict.fromkeys(ns, 0)
        m = len(self.words)
        later = same.ravel().nonzero()[0]                # flat
        # by row, then position (one key), each row's characters then shifted past the previous row's, so
        # that the union of the spans, in order, adds each span less what the one before it covers; a
        # suffix's span (cut at the end) is text too, and only widens a union
        order = later // ordered.shape[1] * (m + 1) + (ordered.ravel()[later] & mask).view(np.int64)
        order.sort()
        row, start = np.divmod(order, m + 1)
        shift = row * (int(self.offsets[-1]) + 1)
        begin = self.offsets[start] + shift
        end = self.offsets[np.minimum(start + np.array(ns)[row], m)] + shift
        spans = end - begin
        spans[1:] = end[1:] - np.maximum(begin[1:], end[:-1])
        return dict(zip(ns, np.bincount(row, weights=spans, minlength=len(ns)).astype(np.int64).tolist()))

    def candidates(self, n: int) -> np.ndarray:
        """Every position whose n-gram may equal another's, ascending, (count,): those in a run of two or
        more equal high bits of the sorted row for n (`_row`)."""
        import numpy as np

        if len(self.words) - n < 1:                      # one position at most
            return np.empty(0, dtype=np.int64)
        ordered, same, mask = self._row(n, top=False)
        runs = same.copy()                               # in a run of two or more: as the one before or after
        runs[:-1] |= same[1:]
        starts = (ordered[runs] & mask).view(np.int64)
        starts = starts[starts <= len(self.words) - n]   # not a suffix
        starts.sort()
        return starts


def _same_as_before(ordered: np.ndarray, mask: int) -> np.ndarray:
    """(k, width): whether each of `_position_sort`'s keys (k, width) has the high bits of the one
    before it in its row, in one pass over the flat array (faster than a 2-D one)."""
    import numpy as np

    flat = ordered.ravel()
    same = np.empty(flat.shape, dtype=bool)
    same[0] = False
    np.less_equal(flat[1:] ^ flat[:-1], mask, out=same[1:])
    same[::ordered.shape[1]] = False
    return same.reshape(ordered.shape)


def _position_sort(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """(`keys`, hashes times M (`_NGrams._MIX`), with their low bits replaced by their position along the
    last axis, sorted along it; the mask of those bits), in place. Equal keys come out together in
    position order, as by a stable argsort, at the cost of a plain sort (several times less), and the
    mask reads their positions (`ordered & mask`). Keys whose high bits are equal come together too,
    like a hash collision: equal high bits (`ordered[1:] ^ ordered[:-1] <= mask`) say two n-grams may be
    equal, never that they are. M (odd, so a bijection: Fibonacci hashing) carries the low bits of a
    polynomial hash, which hold its first character, up."""
    import numpy as np

    mask = (1 << max(keys.shape[-1] - 1, 1).bit_length()) - 1
    keys &= np.uint64(2**64 - 1 - mask)
    keys |= np.arange(keys.shape[-1], dtype=np.uint64)
    keys.sort(axis=-1)
    return keys, mask


_POWERS: dict[int, np.ndarray] = {}       # base: base^0 .. base^(2^k - 1) mod 2^64
_POWERS_KEPT = 1 << 20                    # the longest table kept (8 MiB); a longer text computes its own


def _powers(base: int, count: int) -> np.ndarray:
    """base^0 .. base^(count-1) mod 2^64, (count,): a read-only slice of a table per base and process,
    grown to the next power of two when a longer text comes, so that a document costs a slice rather
    than a cumprod of its own."""
    import numpy as np

    table = _POWERS.get(base)
    if table is None or len(table) < count:
        table = np.full(max(1024, 1 << (count - 1).bit_length()), base, dtype=np.uint64)
        table[0] = 1
        np.cumprod(table, out=table)
        table.flags.writeable = False
        if len(table) <= _POWERS_KEPT:
            _POWERS[base] = table
    return table[:count]


@functools.cache
def _combine_powers(combine: int, count: int) -> tuple[np.uint64, ...]:
    """combine^0 .. combine^(count-1) mod 2^64, as numpy scalars."""
    import numpy as np

    return tuple(np.uint64(pow(combine, t, 2**64)) for t in range(count))


@functools.cache
def _inverse(base: int) -> int:
    """base^-1 mod 2^64 (base odd)."""
    return pow(base, -1, 2**64)
