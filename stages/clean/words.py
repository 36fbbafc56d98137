"""English words and sentences for the quality filters, by splitter name (`splitter`): "spacy_rules", the
default (spaCy's English rules written out, no library: spacy_rules.py), "fast" (NLTK's rules by regular
expression, `words` and `sentences` below, no library), and the reference splitters (spaCy, NLTK, loaded
lazily).

    words("Don't stop, Mr. Smith.") == ("Do", "n't", "stop", ",", "Mr.", "Smith", ".")
    sentences("It works. Does it? Yes!") == 3

FineWeb's Gopher and FineWeb filters counted words with NLTK's `word_tokenize` (punkt sentences,
then the Treebank rules per sentence); current datatrove uses spaCy. `words` follows NLTK's rules
on ordinary English with one `re.split` that puts spaces around every token NLTK splits off, then
`str.split`, so it runs in C: ~10 MB/s on one core, 10x NLTK's Treebank rules with an untrained punkt
(on 200 English Common Crawl pages, 255,940 tokens here vs 256,128 from NLTK):

- punctuation is its own token: `, ; : ? ! ( ) [ ] { } < > * @ # $ % & -- ...` and the dashes
  U+2012..U+2015; `,` and `:` stay inside a number (`3,000`, `12:30`); `-`, `/`, `'` and a period
  followed by a letter stay inside a word (`well-known`, `and/or`, `o'clock`, `example.com`);
- a period that ends a sentence is its own token; one after an initial or a short title (`J.`,
  `e.g.`, `U.S.`, `Mr.`, `Dr.`, `Inc.`, ...) stays on its word;
- contractions split as NLTK splits them: `do n't`, `it 's`, `we 'll`, `they 're`, `I 've`, `I 'm`,
  `he 'd`, `can not`;
- a double quote becomes two characters as in NLTK: ``` `` ``` when it opens (at the start or after
  whitespace or an opening bracket) and `''` otherwise; the curly quotes `“ ” ‘ ’ « » „` are tokens.

Known differences from NLTK (`tests/stages/test_quality.py` pins the cases above):
- Sentence ends are found without punkt's trained model: a period ends a sentence unless it follows
  a single letter or one of `_TITLES`; punkt knows ~1,000 abbreviations and looks at the next word's
  case, so `etc.`, `Jan.`, `No.` mid-sentence split here and not in NLTK (one more `.` token).
- A number before a sentence-final period (`in 2019.`, a list's `1.`) gives `1 .` here; punkt
  often keeps `1.` when the next word is not a sentence start.
- A `"` after a line break inside a sentence opens (```` `` ````) here and closes (`''`) in NLTK.
- Not split here: `gonna`, `gotta`, `wanna`, `gimme`, `lemme`, `d'ye`, `more'n`, `'tis`, `'twas`,
  and a quote made of two apostrophes (`''`) inside a word.
- `n't` or `not` (of `cannot`) right after a period or a quote (`x.n't`, not English) also splits the
  period or quote off (the space put before it, below, ends a sentence there).
These change a word count by about one token in a thousand, far below the filters' margins.

The splitter each reference used, by name (`splitter(name)`, picklable, so Beam can ship it):

    split = splitter("spacy_rules")   # or "spacy", "fast" (`words`, above), "nltk"
    split("Don't stop.")            # -> the words, as that reference splits them
    split.sentences("It works. Yes!")   # -> 2, sentences in a line as that reference counts them

- "spacy_rules" (`DEFAULT`, the quality filters' and gin/data/fineweb_filters.gin's): "spacy"'s tokens and
  sentence counts without spaCy (stages/clean/spacy_rules.py: spaCy 3.8's English prefix, suffix and
  infix rules, special cases, URL match and sentencizer; each chunk's tokens cached per process). Every
  filter agrees with datatrove + spaCy on every page of the benchmark's three real sets, at 4.9-30x its
  speed per filter with every pass cold (8.3-63x once the chunks are known; benchmarks/RESULTS.md).
- "fast": `words` and `sentences` above (no library; NLTK's rules, 9.8-75x faster per filter than
  datatrove, and 93-100% of its decisions with spaCy).
- "spacy": what datatrove 0.10.1 does for English (`datatrove/utils/word_tokenizers.py`,
  `SpaCyTokenizer("en")`): `spacy.blank("en")` plus its rule-based `sentencizer`, every token's text
  stripped, empty ones dropped. Needs spaCy: `pip install -e '.[spacy]'`.
- "nltk": what FineWeb ran (datatrove 0.2.0): `nltk.word_tokenize` = punkt sentences, then the
  Treebank rules per sentence. Needs NLTK (`pip install -e '.[nltk]'`) and punkt's trained English model
  (`tokenizers/punkt_tab/english`), a separate NLTK data download: `python -m nltk.downloader punkt_tab`.
  Without the model it refuses (`problem`, which the clean stage's check runs before any stage, and
  `MissingPunkt` at load): an untrained punkt, NLTK's only fallback, splits sentences at abbreviations
  (Dr., U.S., Ph.D.) where the trained one does not, so the same key would write other bytes on a
  machine without the download.

Which bytes a splitter gives depends on its library and, for NLTK, on punkt's model files:
`fingerprint(name)` (the library's version; for "nltk" also the model's directory listing hashed; for
"spacy_rules" its rules' `spacy_rules.VERSION`) is in the clean stage's key (`clean.key_inputs`) and
stats.json, so another spaCy, NLTK or punkt model, or other rules, is another cache entry, never a silent
mix. "fast" is this file, whose changes bump the clean stage's VERSION.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence

from stages.clean import spacy_rules

SPLITTERS = ("spacy_rules", "fast", "spacy", "nltk")
DEFAULT = "spacy_rules"          # the filters' default and the recipe's (gin/data/fineweb_filters.gin)
# The extra that installs each splitter's library (setup.cfg); the others need none.
LIBRARY = {"spacy": "spacy", "nltk": "nltk"}
PUNKT = "tokenizers/punkt_tab/english"      # punkt's trained English model, under an NLTK data directory
PUNKT_DOWNLOAD = "python -m nltk.downloader punkt_tab"

# Characters that are always a token of their own (NLTK's PUNCTUATION, PARENS_BRACKETS and quotes).
_ALONE = r"""[;@#$%&?!\[\](){}<>*\u2012-\u2015«»“”‘’„]"""
# Closing characters that may sit between a sentence's last period and the space after it.
_CLOSERS = r"""[\])}>"'»”’]"""
# A period after one of these stays on the word (punkt's English model knows them as abbreviations).
_TITLES = {2: "mr|ms|dr|st|jr|sr|co|vs", 3: "mrs|inc|ltd|rev|gov|sen", 4: "prof|corp"}
_NOT_AFTER_TITLE = "".join(rf"(?<!\b(?i:{names})\.)" for names in _TITLES.values())
# A period that ends a sentence (tested just after it): not after another period, an initial
# (`J.`, `e.g.`) or a title, and followed by closing characters, then whitespace or the end.
_ENDS_SENTENCE = rf"(?<=[^.\s]\.)(?<!\b[A-Za-z]\.){_NOT_AFTER_TITLE}"
# What may follow a contraction for NLTK to split it off (it needs a space after it once the
# punctuation has been spaced out).
_AFTER_CONTRACTION = rf"(?=\s|$|[.,:]|{_ALONE})"

# Every token to split off, written as its first character and then, per case, a lookbehind that
# tells which first character it was: a pattern that starts with a character class lets `re` skip
# ahead to the next candidate in C (3x faster than trying every alternative at every character).
# The whole pattern is one capturing group, so that `_SPLIT.split` returns the text between tokens and the
# tokens in turn, all in C (`sub` with a `\g<0>` template calls Python once per match: 30% slower).
_SPLIT = re.compile(r"""([`.\-;@#$%&?!\[\](){}<>*\u2012-\u2015«»“”‘’„,:']""" + "(?:" + "|".join((
    r"(?<=`)`*",                                          # ``` `` ``` and longer runs
    r"(?<=\.)\.+",                                        # .. ... ....
    r"(?<=-)-",                                           # --
    rf"(?<={_ALONE})",
    r"(?<=[,:])(?!\d)",                                   # , and : except inside a number
    rf"{_ENDS_SENTENCE}(?={_CLOSERS}*(?:\s|$))",
    rf"(?<=[^'\s]')(?:[sSmMdD]|ll|LL|re|RE|ve|VE)?{_AFTER_CONTRACTION}",     # it 's, dogs '
    r"(?<=')(?<!\w')(?!(?i:re|ve|ll|m|t|s|d|n)\b)(?=\w)",  # an opening single quote
)) + "))")
# `n't` and `not` in `cannot` start with letters, which the first character of `_SPLIT` would then have
# to include (every n in the text a candidate: 2x slower); a space goes before them first instead, where
# the text has them (found by a literal search), and one after them, as for any token split off.
_NT = re.compile(rf"n't(?<=[^'\s]n't){_AFTER_CONTRACTION}|N'T(?<=[^'\s]N'T){_AFTER_CONTRACTION}")
_CANNOT = re.compile(r"(?i:not)(?<=\b(?i:cannot))\b")
# NLTK writes a double quote (or two apostrophes) as two characters: `` when it opens, '' otherwise.
_OPENING_QUOTE = re.compile(r"""(?:^|(?<=[\s(\[{<]))(?:"|'')""")
_CLOSING_QUOTE = re.compile(r""""|''""")

# A sentence boundary inside a line: ? ! or a sentence-final period (as above), then whitespace and
# more text.
_SENTENCE_END = re.compile(
    rf"(?:[?!]|\.(?!\.){_ENDS_SENTENCE})[.?!]*{_CLOSERS}*\s+(?=\S)")


@functools.lru_cache(maxsize=4)
def words(text: str) -> tuple[str, ...]:
    """`text` as NLTK `word_tokenize` would split it (the differences are in the module docstring).

    Cached for the last few texts: the Gopher and FineWeb filters split the same document in turn.
    """
    if '"' in text or "''" in text:
        text = _CLOSING_QUOTE.sub(" '' ", _OPENING_QUOTE.sub(" `` ", text))
    if "n't" in text or "N'T" in text:
        text = _NT.sub(r" \g<0> ", text)
    if "not" in text.lower():
        text = _CANNOT.sub(r" \g<0> ", text)
    return tuple(" ".join(_SPLIT.split(text)).split())    # a space each side of every token split off


def sentences(line: str) -> int:
    """How many sentences punkt would find in `line` (at least 1 when it holds any text)."""
    return len(_SENTENCE_END.findall(line)) + 1 if line.strip() else 0


# ---------------------------------------------------------------------------------------------
# The splitters by name

def splitter(name: str) -> Callable[[str], Sequence[str]]:
    """The word splitter `name` (one of `SPLITTERS`): a picklable callable text -> words, with a
    `sentences(line) -> int` method. spaCy and NLTK are imported on first use (ImportError naming the
    extra to install when they are missing)."""
    if name not in SPLITTERS:
        raise ValueError(f"unknown word splitter {name!r}: valid choices are {', '.join(SPLITTERS)}")
    return {"spacy_rules": SpacyRules, "fast": Fast, "spacy": Spacy, "nltk": Nltk}[name]()


class _Splitter:
    """A splitter that loads its library once per process (not pickled) and remembers its last
    text's words (the Gopher and FineWeb filters split the same document in turn)."""

    name = ""

    def __init__(self):
        self._loaded = None
        self._last: tuple[str, tuple[str, ...]] | None = None

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))

    def __repr__(self):
        return f"words.splitter({self.name!r})"

    def __call__(self, text: str) -> tuple[str, ...]:
        if self._last is None or self._last[0] != text:
            self._last = (text, self._words(text))
        return self._last[1]

    def sentences(self, line: str) -> int:
        """How many sentences this reference finds in `line` (datatrove counts at least 1)."""
        raise NotImplementedError

    def _words(self, text: str) -> tuple[str, ...]:
        raise NotImplementedError

    def _library(self):
        if self._loaded is None:
            try:
                self._loaded = self._load()
            except ImportError as e:
                extra = LIBRARY[self.name]
                raise ImportError(f"word splitter {self.name!r} needs {e.name}, which is not installed: "
                                  f"install the {extra!r} extra (pip install -e '.[{extra}]')") from None
        return self._loaded

    def _load(self):
        raise NotImplementedError


class Fast(_Splitter):
    """`words` and `sentences` above: NLTK's rules as regular expressions, no library."""

    name = "fast"

    def __call__(self, text: str) -> tuple[str, ...]:
        return words(text)

    def sentences(self, line: str) -> int:
        return sentences(line)


class SpacyRules(_Splitter):
    """spaCy's English tokenizer and sentencizer as datatrove 0.10.1 runs them, by rules: no library
    (stages/clean/spacy_rules.py)."""

    name = "spacy_rules"

    def _words(self, text: str) -> tuple[str, ...]:
        return spacy_rules.words(text)

    def sentences(self, line: str) -> int:
        return spacy_rules.sentences(line)


class Spacy(_Splitter):
    """datatrove 0.10.1's English splitter: `spacy.blank("en")` + `sentencizer`."""

    name = "spacy"

    def _load(self):
        import spacy

        nlp = spacy.blank("en")
        nlp.add_pipe("sentencizer")
        return nlp

    def _doc(self, text: str):
        nlp = self._library()
        nlp.max_length = len(text) + 10
        return nlp(text)

    def _words(self, text: str) -> tuple[str, ...]:
        nlp = self._library()
        with nlp.memory_zone():
            return tuple(t for t in (token.text.strip() for token in self._doc(text)) if t)

    def sentences(self, line: str) -> int:
        nlp = self._library()
        with nlp.memory_zone():
            return max(sum(1 for _ in self._doc(line).sents), 1)


class MissingPunkt(RuntimeError):
    """The "nltk" splitter without punkt's trained English model (what `problem` says, in one line)."""


class Nltk(_Splitter):
    """FineWeb's splitter: `nltk.word_tokenize` (punkt's trained English model, then Treebank rules)."""

    name = "nltk"

    def _load(self):
        import nltk
        from nltk.tokenize import NLTKWordTokenizer, PunktTokenizer

        keyed = punkt_model()
        try:
            found = str(nltk.data.find(PUNKT + "/"))
        except LookupError:
            raise MissingPunkt(problem("nltk")) from None
        if keyed is None or os.path.realpath(found) != os.path.realpath(keyed):
            raise MissingPunkt(f"NLTK loads punkt's English model from {found}, where the clean stage's key "
                               f"covers {keyed} (words.punkt_model follows nltk.data.path's order): put the "
                               f"model in one directory, {PUNKT} under a directory of NLTK_DATA")
        return PunktTokenizer("english"), NLTKWordTokenizer()

    def _words(self, text: str) -> tuple[str, ...]:
        punkt, treebank = self._library()
        return tuple(t for s in punkt.tokenize(text) for t in (w.strip() for w in treebank.tokenize(s)) if t)

    def sentences(self, line: str) -> int:
        punkt = self._library()[0]
        return max(sum(1 for s in punkt.tokenize(line) if s.strip()), 1)


def nltk_data_path() -> list[str]:
    """The directories NLTK looks for its data in, in its order (`nltk.data.path` on Linux and macOS: each of
    NLTK_DATA, ~/nltk_data, then the interpreter's and the system's nltk_data), computed without importing
    NLTK, which takes seconds: the key of every run that names the splitter needs it."""
    out = [os.path.expanduser(d) for d in os.environ.get("NLTK_DATA", "").split(os.pathsep) if d]
    if "APPENGINE_RUNTIME" not in os.environ and os.path.expanduser("~/") != "~/":
        out.append(os.path.expanduser("~/nltk_data"))
    return out + [os.path.join(sys.prefix, "nltk_data"), os.path.join(sys.prefix, "share", "nltk_data"),
                  os.path.join(sys.prefix, "lib", "nltk_data"), "/usr/share/nltk_data",
                  "/usr/local/share/nltk_data", "/usr/lib/nltk_data", "/usr/local/lib/nltk_data"]


def punkt_model() -> str | None:
    """The directory of punkt's trained English model that NLTK would load (the first of `nltk_data_path`
    holding `PUNKT`), or None when none does."""
    for root in nltk_data_path():
        if os.path.isdir(path := os.path.join(root, PUNKT)):
            return path
    return None


def problem(name: str) -> str:
    """What would stop the splitter `name` at its first document, beyond its library (each filter's own
    `problem` names a missing one), in one line, or "": for "nltk", punkt's trained model not installed."""
    if name != "nltk" or importlib.util.find_spec("nltk") is None or punkt_model() is not None:
        return ""
    return (f"word splitter 'nltk' needs punkt's trained English model ({PUNKT}), which is in none of NLTK's "
            f"data directories {nltk_data_path()}: {PUNKT_DOWNLOAD} (or put it under a directory named in "
            "NLTK_DATA). FineWeb's nltk.word_tokenize ran it; the untrained punkt NLTK would fall back to "
            "splits sentences at abbreviations (Dr., U.S., Ph.D.), so it is refused")


def fingerprint(name: str) -> dict | None:
    """What decides the bytes the splitter `name` gives, beyond this file, for the clean stage's key: None
    for "fast"; {"spacy_rules": the version of its rules} (spacy_rules.VERSION); {library: version} for
    "spacy"; for "nltk" also {"punkt_tab": sha256 of the model's files (names and bytes)}, or None where the
    model is not installed (the stage then refuses to start)."""
    if name == "fast":
        return None
    if name == "spacy_rules":
        return {"spacy_rules": spacy_rules.VERSION}
    from importlib import metadata

    try:
        out: dict = {name: metadata.version(name)}
    except metadata.PackageNotFoundError:
        out = {name: None}
    if name == "nltk":
        model = punkt_model()
        out["punkt_tab"] = _directory_sha256(model) if model is not None else None
    return out


def _directory_sha256(path: str) -> str:
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for file_name in sorted(files):
            full = os.path.join(root, file_name)
            digest.update(os.path.relpath(full, path).encode() + b"\0")
            with open(full, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()
