"""FineWeb's quality filters for the clean stage, and what the four share.

    from stages.clean.gopher import GopherRepetition
    GopherRepetition().check({"text": "same line\n" * 10}) == "dup_para_frac"
    C4Quality().apply({"text": text}) == (None, {"text": <the lines C4 keeps>})       # stages.clean.c4

The filters, a module per family: `gopher.py` (Gopher repetition and Gopher quality), `c4.py` (C4's line
rules), `fineweb.py` (FineWeb's own rules); `ngrams.py` is the rolling-hash n-gram library Gopher repetition
counts with. This module holds what they share: datatrove's punctuation sets, the word splitter each names
(`SplitsWords`, `shared_splitter`) and the checks of their fields.

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
per process, on the first document (`shared_splitter`), never into the dataclass. FineWeb itself ran datatrove
0.2.0, whose rules differ slightly from 0.10.1's: Gopher quality counted stop-word occurrences
(0.10.1 counts distinct stop words), Gopher repetition split lines with `splitlines` (0.10.1 on
`\\n+`), and the FineWeb filter ended lines with `. ' " ! ?` only, compared with `<=`/`>=` and
counted blank lines in its line ratios (0.10.1: every terminal punctuation mark, `<`/`>`, blank
lines dropped). These modules follow 0.10.1, the datatrove a benchmark installs today.

An empty text: Gopher repetition and FineWeb return "empty" before any rule, as datatrove 0.10.1 does
(0.10.0's Gopher repetition divided by the text's length: ZeroDivisionError), and Refinery keeps that;
Gopher quality finds it short (`gopher_short_doc`) and C4 finds too few sentences. The stages never hand a
filter one: clean and score set an empty text aside as `empty` before any filter (document.py). Only C4's
rewrite can leave a kept text empty, with `min_num_sentences = -1`, and FineWeb, after it, then says "empty".

Measured (filters.py, issue 38): each filter but C4 (a rewriter, measured by its reason) has
`measure(doc) -> (attrs, doc)` with every statistic its rules compare, and `decide(attrs)` with the rules,
which give `check`'s reason; its class docstring lists the attrs. Gopher quality's and FineWeb's `check`
is `decide` over statistics computed when read (`filters.LazyAttrs`); Gopher repetition's keeps its own
rules, for the upper bounds of `ngrams.NGrams.scan`, while `measure` computes every exact value.

Speed: everything that walks characters or words runs in C (`str.count`, `str.split`, `re`, `Counter`,
`set`, `map`) or numpy (`ngrams.NGrams.scan`: one sort of the hashes of every n-gram Gopher repetition
counts, which bounds each rule's value from above); the exact values (the top n-gram, the walk in
Python over the n-grams that may repeat) are computed only where a bound trips its rule.
"""

from __future__ import annotations

import functools
import importlib.util
from collections import Counter

from stages.clean import words as words_lib

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


class SplitsWords:
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


@functools.cache
def shared_splitter(name: str):
    """The word splitter `name`, one per process, shared by every filter that names it: it loads its
    library on first use and remembers the last text's words, which the next filter splits again."""
    return words_lib.splitter(name)


def check_splitter(obj) -> None:
    """ValueError naming `obj.splitter` and the valid ones when it names no word splitter."""
    if obj.splitter not in words_lib.SPLITTERS:
        raise ValueError(f"splitter={obj.splitter!r} is not a word splitter; valid: "
                         f"{', '.join(map(repr, words_lib.SPLITTERS))} (words.py)")


def in_unit_interval(obj, *names: str) -> None:
    """ValueError naming the first of `obj`'s fields `names` outside [0, 1]."""
    for name in names:
        if not 0 <= getattr(obj, name) <= 1:
            raise ValueError(f"{name}={getattr(obj, name)!r} must be in [0, 1] (0 turns the rule off)")


def at_least(obj, low: int, *names: str) -> None:
    """ValueError naming the first of `obj`'s fields `names` below `low`."""
    for name in names:
        if getattr(obj, name) < low:
            raise ValueError(f"{name}={getattr(obj, name)!r} must be >= {low} ({low} turns the rule off)")


def duplicates(items: list[str]) -> tuple[int, int]:
    """(how many items repeat an earlier one, their characters): every item less the distinct ones, summed
    in C (`map`) rather than by a Python loop over the repeated ones."""
    counts = Counter(items)
    return len(items) - len(counts), sum(map(len, items)) - sum(map(len, counts))
