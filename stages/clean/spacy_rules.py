"""spaCy's English tokenizer and sentencizer as datatrove 0.10.1 runs them, without spaCy: its rules
written out here, in regular expressions and a table of special cases.

    words("Don't stop, e.g. plant-based.") == ("Do", "n't", "stop", ",", "e.g.", "plant", "-", "based", ".")
    sentences("It works. Does it? Yes!") == 3
    words.splitter("spacy_rules")       # the same as the quality filters' word splitter (words.py)

What datatrove does for English (`SpaCyTokenizer("en")`) is `spacy.blank("en")` plus the `sentencizer`;
its words are the tokens' texts stripped, the empty ones dropped. spaCy's tokenizer (3.8, `tokenizer.pyx`)
works on each run of non-whitespace characters (a "chunk") on its own, so here:

1. the text is cut at whitespace (`str.split`, the same whitespace as spaCy's `str.isspace`); the
   whitespace tokens spaCy makes are dropped by datatrove's stripping anyway;
2. a chunk that is a special case (`SPECIALS`: English contractions `don't` -> `do n't`, `cannot`,
   `gonna`, abbreviations `e.g.`, `Dr.`, `Jan.`, single letters `a.`, times `5pm`, emoticons `:)`, and
   each with `'` as `’` too) becomes its tokens;
3. otherwise a prefix (`_PREFIX`: an opening bracket or quote, punctuation, a currency sign, a symbol)
   and a suffix (`_SUFFIX`: closing punctuation, `'s`, a unit or currency after a digit, a period after a
   digit, a lowercase letter or punctuation, or after two capitals) are split off in turn until neither
   is left or what is left is a special case;
4. what is left stays whole when it is a special case or looks like a URL or domain (`_URL`:
   `example.com`, `http://a/b?c`), and else splits at its infixes (`_INFIX`: `...`, a symbol, `+ - * ^`
   between digits, `.` between a lowercase and an uppercase letter, `,` between letters, hyphens and
   `: < > = /` between letters (or a digit, then a letter));
5. special cases made of several of those tokens are joined again (`word):` -> `word ):`).

Speed: each chunk's tokens depend on the chunk alone (but for step 5 across chunks, `_reached`), so they
are cached in a dict (`_CACHE`): web text repeats its chunks, and a text whose chunks are known costs
`str.split` and one dict look-up per chunk in C (`map`, `chain`). A chunk not known yet is learned inside
that look-up (`_Tokens.__missing__`): a word by `str.isalpha`, the commonest other shapes by `_quick`
(`word,` `(word)` `1,000` `dog's` `well-known`), only the rest by the rules themselves (`_split`).

Sentences (C4's count) follow spaCy's `sentencizer`: a token that is one of `SENTENCE_ENDS` (`. ! ?`
and their kin in other scripts; `...` is not one) starts a new sentence at the next token that is
neither one of them nor punctuation (every character of Unicode category P); a run of whitespace
other than one space is such a token. datatrove counts at least one sentence in a line.

The character classes are spaCy's: letters are the scripts of `_ALPHA_RANGES` (Latin, Greek, Cyrillic,
Arabic, Hebrew, Indic, Ethiopic, Hangul, kana, CJK; not Thai, Georgian or Armenian), lower- and uppercase
as Python's `str.islower`/`isupper` say, uncased scripts both; symbols are Unicode's category So as of
spaCy's table (Unicode 11: later symbols and emoji, `_NEWER_SYMBOLS`, are not split off). Known
differences from spaCy 3.8.18: none found. Compared token by token, the benchmark's three real sets (992
pages, 574k tokens, and every line's sentence count), 1,566 texts of installed packages' READMEs and
documentation (2.8 M tokens) and 500k generated strings give spaCy's tokens exactly; so do the prefix,
suffix, infix and URL rules on every character in ten contexts, and the special cases equal spaCy's
table (tests/stages/test_words_spacy.py checks the tables, one real set and generated strings against
spaCy where it is installed, and hand-written cases of spaCy's output everywhere).
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from itertools import chain, compress

# The version of these rules, for the clean stage's key (words.fingerprint): bump on any change that can
# change a token.
VERSION = "1: spaCy 3.8's English tokenizer and sentencizer"

# ---------------------------------------------------------------------------------------------
# Character classes

# Letters, as code point ranges by script. Cased scripts: the case of each letter is Python's.
_CASED_RANGES = (
    (0x41, 0x5A), (0x61, 0x7A), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BF), (0x1C4, 0x2AF),   # Latin
    (0x1D00, 0x1D25), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1EFF), (0x2C60, 0x2C7B),
    (0x2C7E, 0x2C7F), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xA790, 0xA7B9),
    (0xA7FA, 0xA7FA), (0xAB30, 0xAB5A), (0xAB60, 0xAB64), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x38F), (0x391, 0x3A9), (0x3AC, 0x3AF),  # Greek
    (0x3B1, 0x3C9), (0x3CC, 0x3CE),
    # Cyrillic
    (0x400, 0x401), (0x403, 0x40A), (0x40C, 0x40D), (0x410, 0x451), (0x453, 0x45A), (0x45C, 0x45D),
    (0x490, 0x491), (0x496, 0x497), (0x4A2, 0x4A3), (0x4AE, 0x4AF), (0x4BA, 0x4BB), (0x4D8, 0x4D9),
    (0x4E8, 0x4E9),
)
# Scripts without case: their letters count as lowercase and as uppercase.
_UNCASED_RANGES = (
    (0x591, 0x5F4),                                                              # Hebrew
    (0x620, 0x64A), (0x66E, 0x6D5), (0x6E5, 0x6FF), (0x750, 0x77F), (0x8A0, 0x8BD),  # Arabic, Persian
    (0xFB1D, 0xFBB1), (0xFBD3, 0xFD3D), (0xFD50, 0xFDC7), (0xFDF0, 0xFDFB), (0xFE70, 0xFEFC),
    (0x1EE00, 0x1EEBB),
    (0x900, 0x9FF), (0xB80, 0xCFF), (0xD80, 0xDFF),        # Devanagari, Bengali; Tamil to Kannada; Sinhala
    (0x1100, 0x137F),                                      # Hangul Jamo, Ethiopic
    (0xAC00, 0xD7AF),                                      # Hangul syllables
    (0x2E80, 0x2FDF), (0x2FF0, 0x30FF), (0x31C0, 0x31EF), (0x3200, 0x4DBF), (0x4E00, 0x9FFF),  # CJK, kana
    (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0x1F200, 0x1F2FF), (0x20000, 0x2A6DF), (0x2A700, 0x2EBEF),
    (0x2F800, 0x2FA1F),
)
# Two letters whose case spaCy's tables give otherwise than Python: ʔ counts as lowercase, and an unassigned
# code point of Greek as uppercase (harmless).
_EXTRA_LOWER, _EXTRA_UPPER = "\u0294", "\u03a2"
# Symbols (category So) that Unicode added after spaCy's table was written: not split off.
_NEWER_SYMBOLS = (
    (0x166D, 0x166D), (0x2B97, 0x2B97), (0x2BC9, 0x2BC9), (0x2BFF, 0x2BFF), (0x2E50, 0x2E51),
    (0x32FF, 0x32FF), (0xFD40, 0xFD4F), (0xFDCF, 0xFDCF), (0xFDFE, 0xFDFF), (0x1019C, 0x1019C),
    (0x11FD5, 0x11FDC), (0x11FE1, 0x11FF1), (0x1CF50, 0x1CFC3), (0x1D1E9, 0x1D1EA), (0x1E14F, 0x1E14F),
    (0x1ED2E, 0x1ED2E), (0x1F10D, 0x1F10F), (0x1F16C, 0x1F16F), (0x1F1AD, 0x1F1AD), (0x1F6D5, 0x1F6D7),
    (0x1F6DD, 0x1F6DF), (0x1F6FA, 0x1F6FC), (0x1F7E0, 0x1F7EB), (0x1F7F0, 0x1F7F0), (0x1F8B0, 0x1F8B1),
    (0x1F90C, 0x1F90F), (0x1F93F, 0x1F93F), (0x1F971, 0x1F972), (0x1F977, 0x1F979), (0x1F97B, 0x1F97B),
    (0x1F9A3, 0x1F9AF), (0x1F9BA, 0x1F9BF), (0x1F9C3, 0x1F9CF), (0x1FA00, 0x1FA53), (0x1FA70, 0x1FA74),
    (0x1FA78, 0x1FA7C), (0x1FA80, 0x1FA86), (0x1FA90, 0x1FAAC), (0x1FAB0, 0x1FABA), (0x1FAC0, 0x1FAC5),
    (0x1FAD0, 0x1FAD9), (0x1FAE0, 0x1FAE7), (0x1FAF0, 0x1FAF6), (0x1FB00, 0x1FB92), (0x1FB94, 0x1FBCA),
)
# Punctuation that spaCy splits off either end of a chunk, and quotes (which include `,`).
_PUNCT = "…,:;!?¿؟¡()[]{}<>_#*&。？！，、；：～·।،۔؛٪"
# (\u2329 \u232a are angle brackets that NFC would write as the two before them.)
_QUOTES = "'\"”“`‘´’‚,„»«「」『』（）〔〕【】《》〈〉\u2329\u232a⟦⟧"
_HYPHENS = ("-", "–", "—", "--", "---", "——", "~")
_CURRENCY = ("$", "£", "€", "¥", "฿", "US$", "C$", "A$", "₽", "﷼", "₴", "₠", "₡", "₢", "₣", "₤", "₥", "₦",
             "₧", "₨", "₩", "₪", "₫", "₭", "₮", "₯", "₰", "₱", "₲", "₳", "₵", "₶", "₷", "₸", "₹", "₺", "₻",
             "₼", "₾", "₿")
# Units split off a number (`10km` -> `10 km`). spaCy's list also joins `тб` to the next unit by a missing
# space, so `тб` is not one.
_UNITS_TEXT = """
km km² km³ m m² m³ dm dm² dm³ cm cm² cm³ mm mm² mm³ ha µm nm yd in ft kg g mg µg t lb oz m/s km/h kmh mph
hPa Pa mbar mb MB kb KB gb GB tb TB T G M K % км км² км³ м м² м³ дм дм² дм³ см см² см³ мм мм² мм³ нм кг г
мг м/с км/ч кПа Па мбар Кб КБ кб Мб МБ мб Гб ГБ гб Тб ТБ كم² كم³ م م² م³ سم سم² سم³ مم مم² مم³ كم غرام
جرام جم كغ ملغ كوب اكواب
"""
_UNITS = _UNITS_TEXT.split()
# The sentencizer's sentence-ending characters (datatrove's TERMINAL_PUNCTUATION less the marks of scripts
# spaCy's list predates).
SENTENCE_ENDS = frozenset(
    "!.?։؟۔܀܁܂߹।॥၊။።፧፨᙮᜵᜶᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？｡。"
    "\U00010a56\U00010a57\U00011047\U00011048\U000110be\U000110bf\U000110c0\U000110c1\U00011141\U00011142"
    "\U00011143\U000111c5\U000111c6\U000111cd\U000111de\U000111df\U00011238\U00011239\U0001123b\U0001123c"
    "\U000112a9\U0001144b\U0001144c\U000115c2\U000115c3\U000115c9\U000115ca\U000115cb\U000115cc\U000115cd"
    "\U000115ce\U000115cf\U000115d0\U000115d1\U000115d2\U000115d3\U000115d4\U000115d5\U000115d6\U000115d7"
    "\U00011641\U00011642\U0001173c\U0001173d\U0001173e\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41"
    "\U00011c42\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44\U0001bc9f\U0001da88")


def _ranges(chars) -> list[tuple[int, int]]:
    """The code points of `chars` (characters, or (first, last) code point pairs) as sorted ranges."""
    points = sorted({c for x in chars for c in ([ord(x)] if isinstance(x, str) else range(x[0], x[1] + 1))})
    out: list[tuple[int, int]] = []
    for c in points:
        if out and out[-1][1] == c - 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return out


def _class(*sets) -> str:
    """A regular expression for one character of any of `sets` (see `_ranges`). The characters beyond the
    Basic Multilingual Plane go in a class of their own: with them, `re` would test a character against
    every range in turn, without them it looks it up in a table."""
    ranges = _ranges(x for chars in sets for x in chars)
    bmp = [(a, min(b, 0xFFFF)) for a, b in ranges if a <= 0xFFFF]
    astral = [(max(a, 0x10000), b) for a, b in ranges if b > 0xFFFF]
    parts = ["[" + "".join(re.escape(chr(a)) + (f"-{re.escape(chr(b))}" if b > a else "") for a, b in r) + "]"
             for r in (bmp, astral) if r]
    return parts[0] if len(parts) == 1 else f"(?:{'|'.join(parts)})"


def _cased(test) -> list[str]:
    return [chr(c) for a, b in _CASED_RANGES for c in range(a, b + 1) if test(chr(c))]


@functools.cache
def _classes() -> dict[str, list]:
    """The character classes (see `_ranges`), built on first use."""
    newer = {c for a, b in _NEWER_SYMBOLS for c in range(a, b + 1)}
    symbols = [chr(c) for c in range(0xA0, 0x1FC00)
               if c not in newer and unicodedata.category(chr(c)) == "So"]
    return {"alpha": [*_CASED_RANGES, *_UNCASED_RANGES],
            "lower": [*_cased(str.islower), _EXTRA_LOWER, *_UNCASED_RANGES],
            "upper": [*_cased(str.isupper), _EXTRA_UPPER, *_UNCASED_RANGES],
            "symbols": symbols}


class _Rules:
    """Steps 3 and 4 of the module docstring, built on first use (`_rules()`): the prefix and suffix rules by
    sets of characters and strings (a suffix is the longest end of the chunk that any suffix rule gives,
    as spaCy's search for the leftmost match finds it), the infixes and the URL by regular expression."""

    def __init__(self):
        c = _classes()
        al, lo, up = _class(c["alpha"]), _class(c["lower"]), _class(c["upper"])
        al0 = _class(c["alpha"], "0123456789")
        symbols = frozenset(c["symbols"])
        currency = {x for x in _CURRENCY if len(x) == 1}
        self.prefix_chars = frozenset("§%=—–" + _PUNCT + _QUOTES) | currency | symbols
        self.suffix_chars = frozenset(_PUNCT + _QUOTES + "—–") | symbols
        # A period is a suffix after a digit, a lowercase letter, one of `%²-+|(?:)`, punctuation or a quote,
        # after two capitals, or after a degree sign and a scale (`°C.`).
        self.before_period = re.compile(_class(c["lower"], "0123456789%²-+|(?:)", _PUNCT, _QUOTES)).match
        self.upper = re.compile(up).match
        # `word.` `2019.`: a period is split off after a lowercase letter, a digit or two capitals.
        self.period_after = re.compile(rf".*(?:{lo}|[0-9]|{up}{up})", re.S).fullmatch
        self.hyphenated = re.compile(f"{al}+(?:-{al}+)+").fullmatch     # `well-known`: split at each hyphen
        self.number = re.compile(r"[0-9]+(?:[.,:/][0-9]+)*").fullmatch    # no rule splits `1,000.5` `12:30`
        self.apostrophe = re.compile(r"[^\W\d_]+['’][^\W\d_]+").fullmatch   # `O'Brien`, `dog's`
        # After a digit: a unit, a currency sign or `+`.
        self.after_digit = frozenset(_UNITS) | frozenset(_CURRENCY) | {"+"}
        self.longest_after_digit = max(map(len, self.after_digit))
        # The first characters of every prefix and the last of every suffix: `_split` asks `prefix` and
        # `suffix` only about strings that begin or end with one.
        self.prefix_starts = self.prefix_chars | set(".+UCA")
        self.suffix_ends = self.suffix_chars | set(".sS") | {x[-1] for x in self.after_digit}
        # Each alternative begins with the character it splits at (looking behind after it).
        lower_quote, upper_quote = _class(c["lower"], _QUOTES), _class(c["upper"], _QUOTES)
        hyphens = [(re.escape(h[0]), re.escape(h[1:])) for h in _HYPHENS]
        # The whole pattern is one group, so that `re.split` gives the infixes between the pieces (`_split`).
        infix_any = re.compile(
            rf"(\.\.+|…|{_class(symbols)}|[+\-*^](?<=[0-9].)(?=[0-9-])"
            rf"|\.(?<={lower_quote}\.)(?={upper_quote})|,(?<={al},)(?={al})"
            + "".join(f"|{h}{rest}(?<={al0}{h}{rest})(?={al})" for h, rest in hyphens)
            + rf"|[:<>=/](?<={al0}.)(?={al}))")
        # The same for text without characters beyond the Basic Multilingual Plane (nearly all): one class of
        # every character an infix starts with, first, then each alternative looking behind at it, so that
        # `re` skips to the next such character in C (it does so only for a pattern that begins with one
        # class or character, inside a group too).
        bmp_symbols = [x for x in symbols if x <= "\uffff"]
        starts = _class(bmp_symbols, ".…+-*^,:<>=/", [h[0] for h in _HYPHENS])
        infix_bmp = re.compile(
            rf"({starts}(?:(?<=\.)\.+|(?<=…)|(?<={_class(bmp_symbols)})|(?<=[0-9][+\-*^])(?=[0-9-])"
            rf"|(?<={lower_quote}\.)(?={upper_quote})|(?<={al},)(?={al})"
            + "".join(f"|(?<={al0}{h}){rest}(?={al})" for h, rest in hyphens)
            + rf"|(?<={al0}[:<>=/])(?={al})))")
        self._infix_any, self._infix_bmp = infix_any.finditer, infix_bmp.finditer
        self._pieces_any, self._pieces_bmp = infix_any.split, infix_bmp.split
        host_char = "A-Za-z0-9\u00a1-\uffff"
        url = (
            r"(?:[\w+\-.]{2,}://)?"                                   # a scheme
            r"{user}"                                                 # user[:password]@, below
            r"(?:"
            r"(?!(?:10|127)(?:\.\d{1,3}){3})(?!(?:169\.254|192\.168)(?:\.\d{1,3}){2})"   # not a private IPv4
            r"(?!172\.(?:1[6-9]|2\d|3[0-1])(?:\.\d{1,3}){2})"
            r"(?:[1-9]\d?|1\d\d|2[01]\d|22[0-3])(?:\.(?:1?\d{1,2}|2[0-4]\d|25[0-5])){2}"   # a public IPv4
            r"(?:\.(?:[1-9]\d?|1\d\d|2[0-4]\d|25[0-4]))"
            rf"|(?:(?:[{host_char}][{host_char}_-]{{0,62}})?[{host_char}]\.)+"        # host names, then a
            rf"(?:{lo}{{2,63}})"                                                        # lowercase top level
            r")"
            r"(?::\d{2,5})?"                                          # a port
            r"(?:[/?#]\S*)?$")                                       # a path
        # A user needs an `@`: without one the URL's match skips its search (quadratic in the chunk).
        self._url_user = re.compile(url.replace("{user}", r"(?:\S+(?::\S*)?@)?")).match
        self._url = re.compile(url.replace("{user}", "")).match

    def url(self, s: str):
        """Whether `s` looks like a URL or domain (spaCy's URL_MATCH), as a `re` match or None."""
        return (self._url_user if "@" in s else self._url)(s)

    def infix(self, s: str):
        """The infixes of `s`, as `re.finditer` matches."""
        return (self._infix_bmp if s.isascii() or max(s) <= "\uffff" else self._infix_any)(s)

    def infix_pieces(self, s: str) -> list[str]:
        """`s` split at its infixes, `re.split` of `infix`'s matches: the text before the first infix, the
        infix, the text after it (up to the next), and so on; the text between two infixes may be empty,
        the infixes never are (every alternative matches at least one character)."""
        return (self._pieces_bmp if s.isascii() or max(s) <= "\uffff" else self._pieces_any)(s)

    def prefix(self, s: str) -> int:
        """The length of the prefix spaCy splits off `s` (0: none)."""
        c = s[0]
        if c in self.prefix_chars:
            return 1
        if c == ".":
            n = len(s) - len(s.lstrip("."))
            return n if n > 1 else 0
        if c == "+":
            return 0 if s[1:2] in _DIGITS else 1
        if s.startswith(("US$", "C$", "A$")):
            return 3 if c == "U" else 2
        return 0

    def suffix(self, t: str) -> int:
        """The length of the suffix spaCy splits off `t` (0: none)."""
        c = t[-1]
        if c == ".":
            n = len(t) - len(t.rstrip("."))
            if n > 1:
                return n
            if len(t) < 2:
                return 0
            if self.before_period(t[-2]) or (t[-3:-1] in _DEGREES) or (
                    len(t) > 2 and self.upper(t[-2]) and self.upper(t[-3])):
                return 1
            return 0
        if c in self.suffix_chars:
            return 2 if c == "…" and t.endswith("……") else 1
        if c in "sS" and t[-2:-1] in ("'", "’"):
            return 2
        if _DIGITS.isdisjoint(t[-self.longest_after_digit - 1:-1]):     # no digit for a unit to follow
            return 0
        for n in range(min(self.longest_after_digit, len(t) - 1), 0, -1):
            if t[-n:] in self.after_digit and t[-n - 1] in _DIGITS:
                return n
        return 0


_DIGITS = frozenset("0123456789")
_DEGREES = frozenset(f"°{unit}" for unit in "FfCcKk")


@functools.cache
def _rules() -> _Rules:
    return _Rules()


def _alternatives(strings) -> str:
    return "|".join(map(re.escape, strings))


# ---------------------------------------------------------------------------------------------
# Special cases: chunks (or, step 5, runs of tokens) that become the tokens given

def _special_cases() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}

    def add(*tokens: str) -> None:
        out["".join(tokens)] = tokens

    for token in (" ", "\t", "\\t", "\n", "\\n", "\u2014", "\u00a0", "'", '\\")', "<space>", "''", "C++",
                  *(f"{c}." for c in "abcdefghijklmnopqrstuvwxyzäöü"), *_EMOTICONS):
        add(token)
    for unit in "cfkCFK":
        add("°", unit, ".")

    def cased(word: str) -> tuple[str, str]:
        return word, word.title()

    def both(*tokens: str) -> None:
        """The contraction with its apostrophes, and written without them."""
        add(*tokens)
        add(*(t.replace("'", "") for t in tokens))

    for i in cased("i"):
        both(i, "'m")
        both(i, "'m", "a")
    for pron in ("i", "you", "he", "she", "it", "we", "they"):
        for p in cased(pron):
            both(p, "'ll")
            both(p, "'ll", "'ve")
            both(p, "'d")
            both(p, "'d", "'ve")
    for pron in ("i", "you", "we", "they"):
        for p in cased(pron):
            both(p, "'ve")
    for pron in ("you", "we", "they"):
        for p in cased(pron):
            both(p, "'re")
    for pron in ("he", "she", "it"):
        for p in cased(pron):
            both(p, "'s")
    for word, number in (("who", ""), ("what", ""), ("when", ""), ("where", ""), ("why", ""), ("how", ""),
                         ("there", ""), ("that", "sing"), ("this", "sing"), ("these", "plur"),
                         ("those", "plur")):
        for w in cased(word):
            if number != "plur":
                both(w, "'s")
            both(w, "'ll")
            both(w, "'ll", "'ve")
            if number != "sing":
                both(w, "'re")
                both(w, "'ve")
            both(w, "'d")
            both(w, "'d", "'ve")
    for verb in ("ca", "could", "do", "does", "did", "had", "may", "might", "must", "need", "ought", "sha",
                 "should", "wo", "would"):
        for v in cased(verb):
            both(v, "n't")
            both(v, "n't", "'ve")
    for verb in ("could", "might", "must", "should", "would"):
        for v in cased(verb):
            both(v, "'ve")
    for verb in ("ai", "are", "is", "was", "were", "have", "has", "dare"):
        for v in cased(verb):
            both(v, "n't")
    for word in ("doin", "goin", "nothin", "nuthin", "ol", "somethin"):
        for w in cased(word):
            add(w)
            add(w + "'")
    for word in ("em", "ll", "nuff"):
        add(word)
        add("'" + word)
    for hour in range(1, 13):
        for period in ("a.m.", "am", "p.m.", "pm"):
            add(str(hour), period)
    for tokens in (("y'", "all"), ("y", "all"), ("how", "'d", "'y"), ("How", "'d", "'y"), ("not", "'ve"),
                   ("not", "ve"), ("Not", "'ve"), ("Not", "ve"), ("can", "not"), ("Can", "not"),
                   ("gon", "na"), ("Gon", "na"), ("got", "ta"), ("Got", "ta"), ("let", "'s"), ("Let", "'s"),
                   ("c'm", "on"), ("C'm", "on")):
        add(*tokens)
    for word in _WHOLE_WORDS:
        add(word)
    for word in ("Ill", "ill", "Its", "its", "Hell", "hell", "Shell", "shell", "Shed", "shed", "were",
                 "Were", "Well", "well", "Whore", "whore"):      # words, not contractions
        out.pop(word, None)
    for key, tokens in list(out.items()):                       # each with a curly apostrophe too
        if "'" in key:
            out[key.replace("'", "’")] = tuple(t.replace("'", "’") for t in tokens)
    return out


_EMOTICONS_TEXT = r"""
:) :-) :)) :-)) :))) :-))) (: (-: =) (= :] :-] [: [-: [= =] :o) (o: :} :-} 8) 8-) (-8 ;) ;-) (; (-; :( :-(
:(( :-(( :((( :-((( ): )-: =( >:( :') :'-) :'( :'-( :/ :-/ =/ =| :| :-| ]= =[ :1 :P :-P :p :-p :O :-O :o :-o
:0 :-0 :() >:o :* :-* :3 :-3 =3 :> :-> :X :-X :x :-x :D :-D ;D ;-D =D xD XD xDD XDD 8D 8-D ^_^ ^__^ ^___^ >.<
>.> <.< ._. ;_; -_- -__- v.v V.V v_v V_V o_o o_O O_o O_O 0_o o_0 0_0 o.O O.o O.O o.o 0.0 o.0 0.o @_@ <3 <33
<333 </3 (^_^) (-_-) (._.) (>_<) (*_*) (¬_¬) ಠ_ಠ ಠ︵ಠ (ಠ_ಠ) ¯\(ツ)/¯ (╯°□°）╯︵┻━┻ ><(((*>
"""
_EMOTICONS = _EMOTICONS_TEXT.split()
# Abbreviations and other words that stay one token with their periods or apostrophes.
_WHOLE_WORDS_TEXT = """
'S 's ‘S ‘s and/or w/o 're 'Cause 'cause 'cos 'Cos 'coz 'Coz 'cuz 'Cuz 'bout ma'am Ma'am o'clock O'clock
lovin' Lovin' lovin Lovin havin' Havin' havin Havin doin' Doin' doin Doin goin' Goin' goin Goin
Mt. Ak. Ala. Apr. Ariz. Ark. Aug. Calif. Colo. Conn. Dec. Del. Feb. Fla. Ga. Ia. Id. Ill. Ind. Jan. Jul. Jun.
Kan. Kans. Ky. La. Mar. Mass. Mich. Minn. Miss. N.C. N.D. N.H. N.J. N.M. N.Y. Neb. Nebr. Nev. Nov. Oct. Okla.
Ore. Pa. S.C. Sep. Sept. Tenn. Va. Wash. Wis.
'd a.m. Adm. Bros. co. Co. Corp. D.C. Dr. e.g. E.g. E.G. Gen. Gov. i.e. I.e. I.E. Inc. Jr. Ltd. Md. Messrs.
Mo. Mont. Mr. Mrs. Ms. p.m. Ph.D. Prof. Rep. Rev. Sen. St. vs. v.s.
"""
_WHOLE_WORDS = _WHOLE_WORDS_TEXT.split()
SPECIALS = _special_cases()


@functools.cache
def _joined_specials() -> dict[tuple[str, ...], tuple[str, ...]]:
    """{the tokens the rules give a special case that holds a prefix, suffix or infix: its own tokens}:
    spaCy joins such runs of tokens back into the special case after the rules (step 5)."""
    rules = _rules()
    out = {}
    for key, tokens in SPECIALS.items():
        if rules.prefix(key) or rules.suffix(key) or next(rules.infix(key), None) or " " in key:
            out[_split(key, specials=False)] = tokens
    return out


# ---------------------------------------------------------------------------------------------
# Tokens and sentences

class _Tokens(dict):
    """chunk -> its tokens (after step 5 within the chunk). A chunk not seen yet is learned when it is
    looked up (`__missing__`), so that `words` looks each chunk up once, in C, and pays Python only for
    the new ones: a word by `str.isalpha`, the commonest other shapes by `_quick`, the rest by the rules."""

    def __missing__(self, chunk: str) -> tuple[str, ...]:
        if chunk.isalpha() and chunk not in SPECIALS:
            out = self[chunk] = (chunk,)
            return out
        joined = _quick(chunk)
        if joined is None:
            joined = split = _split(chunk, specials=True)
            if not _adjacent_tokens().isdisjoint(zip(split, split[1:])):
                joined = _join_specials(split)
                if joined != split:
                    _JOINED[chunk] = split
        self[chunk] = joined
        return joined


_CACHE = _Tokens()
# Chunks whose tokens step 5 changed -> their tokens before step 5 (a special case across chunks may keep
# step 5 from changing them: `_reached`).
_JOINED: dict[str, tuple[str, ...]] = {}
_CACHE_LIMIT = 300_000             # distinct chunks remembered (some 50 MB), then forgotten all at once


def cache_clear() -> None:
    """Forget every chunk's tokens (a benchmark's cold pass)."""
    _CACHE.clear()
    _JOINED.clear()


def _bound_cache() -> None:
    """Forgets every chunk's tokens once more than `_CACHE_LIMIT` are known: between texts, never while
    one is split (its chunks' entries in `_JOINED` decide step 5 across them)."""
    if len(_CACHE) > _CACHE_LIMIT:
        cache_clear()


def words(text: str) -> tuple[str, ...]:
    """`text` split as datatrove 0.10.1 splits English with spaCy: the tokens, stripped, none empty."""
    _bound_cache()
    chunks = text.split()
    out = tuple(chain.from_iterable(map(_CACHE.__getitem__, chunks)))
    if _JOINED.keys().isdisjoint(chunks):
        return out
    reached = _reached(chunks)
    if not reached:
        return out
    parts = list(map(_CACHE.__getitem__, chunks))
    for k in reached:
        parts[k] = _in_context(*_around(text, chunks, k))
    return tuple(chain.from_iterable(parts))


def _reached(chunks: list[str]) -> list[int]:
    """The chunks whose tokens step 5 changed and that have a neighbour with which a special case across
    the two could form (their tokens then depend on their neighbours: `_in_context`)."""
    last = len(chunks) - 1
    pairs = _adjacent_tokens()
    return [k for k in compress(range(len(chunks)), map(_JOINED.__contains__, chunks))
            if (k > 0 and (_before_step5(chunks[k - 1])[-1], _JOINED[chunks[k]][0]) in pairs)
            or (k < last and (_JOINED[chunks[k]][-1], _before_step5(chunks[k + 1])[0]) in pairs)]


_STRETCH = 16        # `_around`'s first stretch: this many characters per piece read, on either side


def _around(text: str, chunks: list[str], k: int) -> tuple[list[str], int, int]:
    """`_in_context`'s arguments for chunk k of `text` (`chunks`: text.split()): the `_PIECES` of a stretch
    of the text around it that holds as many pieces on either side as `_in_context` reads (or the text's
    ends), rather than of the whole text. The chunk is the text's (n+1)-th whole occurrence of its string,
    n its occurrences among the chunks before it."""
    chunk, nth = chunks[k], chunks[:k].count(chunks[k])
    at = -1
    while True:                       # a whole occurrence: whitespace or the text's end on both sides
        at = text.find(chunk, at + 1)
        end = at + len(chunk)
        if (at == 0 or text[at - 1].isspace()) and (end == len(text) or text[end].isspace()):
            if not nth:
                break
            nth -= 1
    reach = 2 * (_longest_special() - 1)               # pieces `_in_context` reads on either side
    radius = _STRETCH * reach
    while True:
        a, b = max(at - radius, 0), min(end + radius, len(text))
        p = len(_PIECES.findall(text, a, at))          # the chunk is pieces[p]
        pieces = _PIECES.findall(text, a, b)
        # a stretch that begins or ends inside a piece cuts it: such a piece must lie beyond those read
        if (a == 0 or p >= reach + 2) and (b == len(text) or len(pieces) >= p + reach + 2):
            first = (1 if pieces[0][0].isspace() else 0) if a == 0 else p % 2
            return pieces, p, first
        radius *= 4


def _before_step5(chunk: str) -> tuple[str, ...]:
    """A chunk's tokens before step 5 (the same as after it, unless step 5 changed them); learned first,
    since learning it is what records them (`_JOINED`)."""
    after = _CACHE[chunk]
    return _JOINED.get(chunk, after)


def tokens(chunk: str) -> tuple[str, ...]:
    """The tokens spaCy's English tokenizer makes of `chunk`, a run of non-whitespace characters, on its
    own (step 5 may join tokens otherwise when the chunk's neighbours hold a special case: `words`)."""
    return _CACHE[chunk]


def _quick(chunk: str) -> tuple[str, ...] | None:
    """The tokens of the commonest chunks, as the rules give them but without running them, or None (then
    the rules run): letters and digits (`a9`, but not `10km`), numbers (`3.5`, `1,000`, `12:30`), a word
    with an apostrophe (`O'Brien`, `dog's`), a word (letters, or ASCII digits) with a character split off
    its start and one or two off its end (`word,` `(word` `2019.` `(word)` `word).`), words joined by
    hyphens; none a special case or holding one where the rules look one up. Two tokens are never joined by
    step 5 (that would take a special case spelled like the whole chunk); three are checked."""
    inner = chunk[1:-2]
    if chunk in SPECIALS or not _NEVER_QUICK.isdisjoint(inner):
        return None
    rules = _rules()
    if inner and not inner.isalnum():           # `1,000` `dog's` `well-known`, and code: one shape to try
        return _quick_marked(chunk, inner, rules)
    core, last = chunk[:-1], chunk[-1]
    if core.isalpha() and core not in SPECIALS and (        # the commonest: `word,` `word.`
            last in rules.suffix_chars or (last == "." and rules.period_after(core))):
        return (core, last)
    if chunk.isalnum():
        return None if last in rules.suffix_ends and rules.suffix(chunk) else (chunk,)
    if rules.number(chunk):
        return (chunk,)
    if rules.apostrophe(chunk):
        return _apostrophe_tokens(chunk)
    if "-" in chunk and rules.hyphenated(chunk):
        return _hyphen_tokens(chunk)
    start = 1 if chunk[0] in rules.prefix_chars else 0
    end = len(chunk)
    if len(chunk) > start and rules.suffix(chunk[start:]) == 1:
        end -= 1
        if start == 0 and end and rules.suffix(chunk[:end]) == 1:
            end -= 1        # `word).`
    core = chunk[start:end]
    if not core or not (core.isalpha() or (core.isascii() and core.isdigit())):
        return None
    # What is left after each split, where the rules look up a special case; and two tokens that step 5
    # might join.
    out = (*chunk[:start], core, *chunk[end:])
    looked_up = (core, chunk[start:], chunk[:end], chunk[start:-1], chunk[:-1],
                 *map("".join, zip(out, out[1:])))
    return None if any(rest in SPECIALS for rest in looked_up) else out


def _quick_marked(chunk: str, inner: str, rules: _Rules) -> tuple[str, ...] | None:
    """`_quick` of a chunk whose inner characters (`inner`: all but its first and its last two) are not all
    letters and digits (`str.isalnum`), such as `1,000` `dog's` `well-known` `urllib.parse` `'key':`.

    Why one shape is enough: of `_quick`'s shapes, all but three require their inner characters to be
    `isalnum` (`word,` and `word.`: `core.isalpha()`; `a9`: `chunk.isalnum()`; `(word)` `word).`: a core
    `isalpha` or of ASCII digits). The three are a number (inside: ASCII digits and `. , : /`), a word with
    an apostrophe (`re`'s word characters but digits and `_`, all `isalnum`, and one `'` or `’`) and
    hyphenated words (`-` and spaCy's letters, some not `isalnum`: Indic vowel signs, Hebrew points). None
    of spaCy's letters is one of `. , : / ' ’`, so by those in `inner` only one shape can take the chunk:
    it is tried alone, and gives what trying every shape in turn would (a chunk whose shapes none took)."""
    if not _NUMBER_MARKS.isdisjoint(inner):
        return (chunk,) if rules.number(chunk) else None
    if "'" in inner or "’" in inner:
        return _apostrophe_tokens(chunk) if rules.apostrophe(chunk) else None
    return _hyphen_tokens(chunk) if "-" in chunk and rules.hyphenated(chunk) else None


def _apostrophe_tokens(chunk: str) -> tuple[str, ...] | None:
    """`_quick` of a word with an apostrophe (`rules.apostrophe`): `'s` split off, unless what is left is a
    special case."""
    if chunk[-1] in "sS" and chunk[-2] in "'’":
        return None if chunk[:-2] in SPECIALS else (chunk[:-2], chunk[-2:])
    return (chunk,)


def _hyphen_tokens(chunk: str) -> tuple[str, ...] | None:
    """`_quick` of words joined by hyphens (`rules.hyphenated`): split at each hyphen, unless a word might
    begin a run of step 5."""
    out = tuple(_HYPHEN.split(chunk))
    return out if _run_lengths().keys().isdisjoint(out) else None


_NUMBER_MARKS = frozenset(".,:/")        # what a number holds besides digits (`rules.number`)
_HYPHEN = re.compile("(-)")
# Characters of none of `_quick`'s shapes but at their ends (code: `snake_case`, `a=b`, `f(x)`): a chunk
# with one inside goes to the rules at once.
_NEVER_QUICK = frozenset("_=(){}[]<>\"*&#@$%^|\\;!?~`+")


def _split(chunk: str, specials: bool) -> tuple[str, ...]:
    """Steps 2-4 of the module docstring (without special cases when `specials` is False)."""
    known = SPECIALS if specials else _NO_SPECIALS
    if chunk in known:
        return known[chunk]
    rules = _rules()
    prefix_chars, suffix_chars = rules.prefix_chars, rules.suffix_chars
    starts, ends = rules.prefix_starts, rules.suffix_ends
    prefixes: list[str] = []
    suffixes: list[str] = []
    s = chunk
    while True:          # a prefix and a suffix split off in turn, until neither is or a special case is left
        # The commonest prefix and suffix are one character of `prefix_chars`, `suffix_chars` (but `…`,
        # which may be `……`): what `rules.prefix` and `rules.suffix` would say first, without calling them.
        c = s[0]
        pre = 1 if c in prefix_chars else rules.prefix(s) if c in starts else 0
        if pre:
            rest = s[pre:]
            if rest in known:
                prefixes.append(s[:pre])
                s = rest
                break
        n = len(s)
        c = s[-1]
        if n <= pre:
            suf = 0
        elif c in suffix_chars and c != "…":
            suf = 1
        else:
            suf = rules.suffix(s[pre:]) if c in ends else 0
        if suf:
            rest = s[:n - suf]
            if rest in known:
                suffixes.append(s[n - suf:])
                s = rest
                break
            suffixes.append(s[n - suf:])
            if pre:
                prefixes.append(s[:pre])
                s = s[pre:n - suf]
                if not s or s in known:
                    break
            else:
                s = rest            # not known, as just seen
                if not s:
                    break
        elif pre:
            prefixes.append(s[:pre])
            s = rest                # not known, as seen above
            if not s:
                break
        else:
            break
    out = prefixes
    if s:
        if s in known:
            out += known[s]
        elif s.isalnum() or ("." in s and rules.url(s)):   # no infix is a letter or digit; a URL has a period
            out.append(s)
        else:
            pieces = rules.infix_pieces(s)
            if len(pieces) > 1 and not pieces[0]:     # spaCy skips an infix at the very start: it joins the
                pieces[:3] = [pieces[1] + pieces[2]]   # text after it
            out += filter(None, pieces)
    out.extend(reversed(suffixes))
    return tuple(out)


_NO_SPECIALS: dict[str, tuple[str, ...]] = {}


def _join_specials(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """Step 5 within one chunk: runs of its tokens that spell a special case become its tokens."""
    return _joined(tokens, _kept_runs(tokens))


def _kept_runs(tokens: tuple[str, ...], chunk_of: list[int] | None = None) -> list[tuple[int, int]]:
    """Step 5's runs to join, (start, end) ascending: runs of tokens that spell a special case, longest
    first, then leftmost, none overlapping one taken before. With `chunk_of` (each token's chunk), a run
    across chunks, found as spaCy finds it, takes its place in that order but is never joined."""
    joined = _joined_specials()
    n = len(tokens)
    lengths = _run_lengths()
    found = [(i, i + k) for i, token in enumerate(tokens) if token in lengths
             for k in lengths[token] if i + k <= n and tokens[i:i + k] in joined]
    if not found:
        return []
    found.sort(key=lambda span: (span[0] - span[1], span[0]))
    taken: set[int] = set()
    kept = []
    for i, j in found:
        if i not in taken and j - 1 not in taken and (chunk_of is None or chunk_of[i] == chunk_of[j - 1]):
            kept.append((i, j))
        taken.update(range(i, j))
    return sorted(kept)


def _joined(tokens: tuple[str, ...], runs: list[tuple[int, int]]) -> tuple[str, ...]:
    """`tokens` with each of `runs` (ascending, not overlapping) replaced by its special case's tokens."""
    if not runs:
        return tokens
    joined = _joined_specials()
    out: list[str] = []
    position = 0
    for i, j in runs:
        out += tokens[position:i]
        out += joined[tokens[i:j]]
        position = j
    return tuple(out + list(tokens[position:]))


@functools.cache
def _adjacent_tokens() -> frozenset[tuple[str, str]]:
    """Every two tokens next to each other in a run that `_joined_specials` joins."""
    return frozenset(pair for run in _joined_specials() for pair in zip(run, run[1:]))


@functools.cache
def _run_lengths() -> dict[str, tuple[int, ...]]:
    """{a token that begins a run `_joined_specials` joins: the lengths of such runs}"""
    out: dict[str, set[int]] = {}
    for run in _joined_specials():
        out.setdefault(run[0], set()).add(len(run))
    return {token: tuple(sorted(lengths)) for token, lengths in out.items()}


@functools.cache
def _longest_special() -> int:
    return max(map(len, _joined_specials()))


_PIECES = re.compile(r"\S+|\s+")


def _doc_tokens(text: str) -> tuple[str, ...]:
    """Every token of `text`, whitespace tokens included, as spaCy makes them: each run of whitespace is a
    token but for the one space after a chunk; step 5 over the whole text."""
    _bound_cache()
    pieces = _PIECES.findall(text)
    tokens, piece_of = _piece_tokens(pieces)
    return tokens if _JOINED.keys().isdisjoint(pieces) else _joined(tokens, _kept_runs(tokens, piece_of))


def _in_context(pieces: list[str], p: int, first: int) -> tuple[str, ...]:
    """The tokens of the chunk `pieces[p]` after step 5 over the whole text (`pieces`: `_PIECES` of it, the
    first chunk at `first`). A run of step 5 that reaches the chunk's tokens holds at most
    `_longest_special()` tokens, and every chunk at least one, so the chunks as far away on either side
    decide them, as they would in `_doc_tokens` of the whole text."""
    reach = 2 * (_longest_special() - 1)              # pieces: a chunk and the whitespace after it
    start = max(p - reach, first)                      # a chunk: whitespace before it is no token
    tokens, piece_of = _piece_tokens(pieces[start:p + reach + 1])
    a = piece_of.index(p - start)
    b = a + piece_of.count(p - start)
    runs = [(i - a, j - a) for i, j in _kept_runs(tokens, piece_of) if a <= i and j <= b]
    return _joined(tokens[a:b], runs)


def _piece_tokens(pieces: list[str]) -> tuple[tuple[str, ...], list[int]]:
    """The tokens of `pieces` (runs of whitespace and chunks, in the text's order, beginning with the
    text's first or with a chunk) before step 5 across chunks, and each token's piece: a chunk's index in
    `pieces`, or for a whitespace token -1 less it (no run of step 5 holds one)."""
    out: list[str] = []
    piece_of: list[int] = []
    for k, piece in enumerate(pieces):
        if piece[0].isspace():
            piece = piece[1:] if out and piece[0] == " " else piece
            if piece:
                out.append(piece)
                piece_of.append(-1 - k)
        else:
            split = _before_step5(piece)
            out += split
            piece_of += [k] * len(split)
    return tuple(out), piece_of


@functools.cache
def _sentence_breaks():
    """Finds, in a line's tokens each after a newline, each token that starts a sentence but the first: a
    sentence end (`SENTENCE_ENDS`, all of them punctuation), tokens of punctuation only (Unicode category P),
    then a token that is not."""
    punct = _class([chr(c) for c in range(sys.maxunicode + 1)
                    if unicodedata.category(chr(c)).startswith("P")])
    return re.compile(rf"\n{_class(SENTENCE_ENDS)}(?:\n{punct}+)*\n(?=[^\n])(?!{punct}+\n)").findall


_OTHER_WHITESPACE = re.compile(r"[^\S ]|  ")


def sentences(line: str) -> int:
    """How many sentences spaCy's sentencizer finds in `line`, at least 1, as datatrove counts them (its
    sentences stripped, the empty dropped: here the line is stripped)."""
    line = line.strip()
    if _OTHER_WHITESPACE.search(line):      # whitespace other than one space is a token, never punctuation
        toks = tuple("\0" if t.isspace() else t for t in _doc_tokens(line))
    else:
        toks = words(line)
    if SENTENCE_ENDS.isdisjoint(toks):
        return 1
    return 1 + len(_sentence_breaks()("\n" + "\n".join(toks) + "\n"))
