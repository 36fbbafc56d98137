"""FineWeb's quality filters (stages/clean/gopher.py, c4.py, fineweb.py; what they share in quality.py, the
n-gram counts in ngrams.py) and their word splitter (words.py): one document
per reason that trips exactly that rule and a near miss that passes, C4's rewrite, the config and gin
wiring, and the reasons counted by the real clean stage."""

import dataclasses
import math
import pickle
import random
import re
from collections import Counter

import pytest

from pipeline import cache
from pipeline import config as pipeline_config
from stages import clean
from stages.clean import c4, fineweb, gopher, ngrams, quality, words
from stages.io import documents, storage
from tests.conftest import REPO

# Sentences with many distinct words, so that nothing repeats unless a test makes it repeat.
RNG = random.Random(0)
VOCAB = [f"{a}{b}" for a in ("alp", "bet", "gam", "del", "eps", "zet", "eta", "the", "iot", "kap")
         for b in ("ar", "en", "ix", "os", "um", "ed", "ing", "ly")]


def prose(sentences: int, seed: int = 0) -> str:
    """Varied English-looking sentences, one per line, with stop words: passes every filter."""
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        body = rng.sample(VOCAB, 10)
        for stop in ("the", "of", "and"):
            body.insert(rng.randrange(1, len(body)), stop)
        lines.append(" ".join([body[0].capitalize(), *body[1:]]) + ".")
    return "\n".join(lines)


PROSE = prose(12)


def _doc(text):
    return {"id": "x", "text": text}


# ---------------------------------------------------------------------------------------------
# words.py

@pytest.mark.parametrize("text, want", [
    ("Don't stop, Mr. Smith.", ["Do", "n't", "stop", ",", "Mr.", "Smith", "."]),
    ("It's 3,000 $ at 12:30; we'll see!",
     ["It", "'s", "3,000", "$", "at", "12:30", ";", "we", "'ll", "see", "!"]),
    ('He said "hi." (maybe) -- ok...',
     ["He", "said", "``", "hi", ".", "''", "(", "maybe", ")", "--", "ok", "..."]),
    ("I cannot; e.g. the U.S. and J. Doe.",
     ["I", "can", "not", ";", "e.g.", "the", "U.S.", "and", "J.", "Doe", "."]),
    ("well-known and/or example.com o'clock", ["well-known", "and/or", "example.com", "o'clock"]),
    ("dogs' bones 'quoted' they're", ["dogs", "'", "bones", "'", "quoted", "'", "they", "'re"]),
    ("a—b “c” #1 50% x*y", ["a", "—", "b", "“", "c", "”", "#", "1", "50", "%", "x", "*", "y"]),
])
def test_words_split_like_nltk(text, want):
    assert list(words.words(text)) == want


@pytest.mark.parametrize("line, n", [
    ("One. Two? Three! Four.", 4), ("Mr. Smith met Dr. Jones in the U.S. today.", 1),
    ("It costs 3.50 and that is all", 1), ("Wait... what", 1), ('He said "hi." Then left.', 2), ("  ", 0),
])
def test_sentences(line, n):
    assert words.sentences(line) == n


# ---------------------------------------------------------------------------------------------
# Gopher repetition

def _naive_repeated_chars(ws, n):
    """Gopher's walk as written in the paper's pseudo-code, position by position."""
    seen, i, total = set(), 0, 0
    while i < len(ws) - n + 1:
        gram = "".join(ws[i:i + n])
        if gram in seen:
            total += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return total


# "a b" and "ab", "ab a" and "a ba" are the same n-gram joined without spaces; é and the emoji are
# beyond Latin-1 and the BMP (the hash reads code points)
WALK_VOCABULARIES = (["ab", "c", "d", "ab"], ["a", "b", "ab", "ba", "aba", "é", "\U0001F600"])


@pytest.mark.parametrize("vocabulary", WALK_VOCABULARIES)
def test_repeated_n_gram_chars_match_the_plain_walk(vocabulary):
    rng = random.Random(1)
    for _ in range(300):
        ws = tuple(rng.choice(vocabulary) for _ in range(rng.randint(0, 40)))
        grams = ngrams.NGrams(ws)
        for n in (1, 2, 3, 5, 7, 10):
            want = _naive_repeated_chars(ws, n)
            assert ngrams.repeated_chars(ws, n, grams) == want, (ws, n)
            for fraction in (0.05, 0.2, 0.5):      # a walk stopped past a rule's limit passes its test alike
                chars = max(len("".join(ws)), 1)
                stopped = ngrams.repeated_chars(ws, n, grams, (chars, fraction))
                assert (stopped / chars > fraction) == (want / chars > fraction) and stopped <= want, (ws, n)


def test_repeated_n_gram_chars_survive_hash_collisions(monkeypatch):
    # base 1: an n-gram's hash is the sum of its code points, so "ab" and "ba" (and many more) collide;
    # the strings compared after the hash keep the count exact
    monkeypatch.setattr(ngrams.NGrams, "_BASE", 1)
    rng = random.Random(2)
    for _ in range(300):
        ws = tuple(rng.choice(WALK_VOCABULARIES[1]) for _ in range(rng.randint(0, 40)))
        for n in (1, 2, 5):
            assert ngrams.repeated_chars(ws, n) == _naive_repeated_chars(ws, n), (ws, n)
    assert ngrams.NGrams(("ab", "x", "ba", "y")).candidates(1).tolist() == [0, 2]   # a collision, compared


def test_top_n_gram_chars_match_counter_most_common():
    rng = random.Random(3)
    for _ in range(300):
        ws = tuple(rng.choice(WALK_VOCABULARIES[1]) for _ in range(rng.randint(4, 30)))
        for n in (2, 3, 4):
            gram, count = Counter(" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)).most_common(1)[0]
            assert ngrams.top_n_gram_chars(ws, n) == len(gram) * count, (ws, n)


def _reference_check(f, text, ws):
    """GopherRepetition.check written plainly: datatrove 0.10.1's rules in their order, with `Counter`, the
    regular expressions and the naive walk."""
    def duplicates(items):
        counts = Counter(items)
        return (sum(c - 1 for c in counts.values() if c > 1),
                sum((c - 1) * len(item) for item, c in counts.items() if c > 1))

    chars = len(text)
    paragraphs = re.split(r"\n{2,}", text.strip())
    repeats, repeat_chars = duplicates(paragraphs)
    if f.dup_para_frac and repeats / len(paragraphs) > f.dup_para_frac:
        return "dup_para_frac"
    if f.dup_para_char_frac and repeat_chars / chars > f.dup_para_char_frac:
        return "dup_para_char_frac"
    lines = re.split(r"\n+", text)
    repeats, repeat_chars = duplicates(lines)
    if f.dup_line_frac and repeats / len(lines) > f.dup_line_frac:
        return "dup_line_frac"
    if f.dup_line_char_frac and repeat_chars / chars > f.dup_line_char_frac:
        return "dup_line_char_frac"
    for n, limit in f.top_n_grams:
        if len(ws) >= n:
            gram, count = Counter(" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)).most_common(1)[0]
            if len(gram) * count / chars > limit:
                return f"top_{n}_gram"
    for n, limit in f.dup_n_grams:
        if len(ws) >= n and _naive_repeated_chars(ws, n) / chars > limit:
            return f"duplicated_{n}_n_grams"
    return None


def _reference_values(text, ws, tops, dups):
    """{rule: its value / characters} of `_reference_check`'s n-gram rules, to set limits at or below."""
    values = {}
    for n in tops:
        if len(ws) >= n:
            gram, count = Counter(" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)).most_common(1)[0]
            values["top", n] = len(gram) * count / len(text)
    for n in dups:
        if len(ws) >= n:
            values["dup", n] = _naive_repeated_chars(ws, n) / len(text)
    return values


# words that join without spaces into the same n-grams (`ab c`, `a bc`), beyond Latin-1 and the BMP
CHECK_VOCABULARY = ["a", "b", "ab", "ba", "aba", "c", "bc", "é", "\U0001F600", "the", "of"]


@pytest.mark.parametrize("base", [ngrams.NGrams._BASE, 1])     # 1: an n-gram's hash is a code point sum
def test_gopher_repetition_matches_a_plain_check(monkeypatch, base):
    """The numpy fast paths (one sort for every n, upper bounds that skip the exact counts, the walk's
    candidates from the sorted rows, paragraphs and lines by `str.split`) give the reason a plain check
    gives, on random documents full of repeats, ties, n-grams that join alike and (base 1) hash collisions,
    with random limits and limits exactly at a rule's value and just below it; every bound is at least its
    exact value."""
    monkeypatch.setattr(ngrams.NGrams, "_BASE", base)
    monkeypatch.setattr(gopher, "shared_splitter", lambda name: str.split)     # what GopherRepetition calls
    rng = random.Random(4)
    tops, dups = (1, 2, 3, 4), (1, 2, 5, 6, 7, 8, 9, 10)
    for _ in range(250):
        vocabulary = rng.sample(CHECK_VOCABULARY, rng.randint(1, len(CHECK_VOCABULARY)))
        phrase = [rng.choice(vocabulary) for _ in range(rng.randint(1, 12))]
        ws = []
        while len(ws) < rng.randint(1, 60):      # words, and now and then a phrase again
            ws += phrase if rng.random() < 0.15 else [rng.choice(vocabulary)]
        text = "".join(w + rng.choice([" ", " ", " ", "\n", "\n\n", "\n\n\n", "  "]) for w in ws).rstrip(" ")
        ws = tuple(text.split())
        values = _reference_values(text, ws, tops, dups)
        if len(ws) > 1:       # (a single word has no `_NGrams`)
            top_bounds, repeat_bounds = ngrams.NGrams(ws).scan(tops, dups)
            for (kind, n), value in values.items():    # no repeat bound: one n-gram, which repeats none
                bound = top_bounds[n] if kind == "top" else repeat_bounds.get(n, 0)
                assert bound / len(text) >= value, (ws, kind, n)
        fractions = [rng.choice([0, 0.1, 0.3]) for _ in range(4)]
        configs = [gopher.GopherRepetition(*fractions,
                                            top_n_grams=tuple((n, rng.random() / 2) for n in tops),
                                            dup_n_grams=tuple((n, rng.random() / 4) for n in dups))]
        for (kind, n), value in values.items():     # one rule at its value (kept), then just below (dropped)
            for limit in (value, math.nextafter(value, 0)):
                if 0 < limit <= 1:
                    rules = {"top_n_grams": (), "dup_n_grams": ()}
                    rules["top_n_grams" if kind == "top" else "dup_n_grams"] = ((n, limit),)
                    configs.append(gopher.GopherRepetition(0, 0, 0, 0, **rules))
        for f in configs:
            assert f.check({"text": text}) == _reference_check(f, text, ws), (ws, f)


# Each text trips its rule and no rule checked before it; the near miss passes the whole filter.
UNIQUE = [f"Paragraph {w} number {i} stands alone here." for i, w in enumerate(VOCAB[:20])]
REPETITION = [
    ("dup_para_frac", "\n\n".join(UNIQUE[:6] + [UNIQUE[0]] * 3),
     "\n\n".join(UNIQUE[:7] + [UNIQUE[0]] * 3)),                                   # 3/9 > 0.3; 3/10 is not
    ("dup_para_char_frac", "\n\n".join(UNIQUE[:3] + ["x" * 100] * 2),
     "\n\n".join(UNIQUE[:8] + ["x" * 100] * 2)),
    ("dup_line_frac", "\n".join(UNIQUE[:6] + [UNIQUE[0]] * 3),
     "\n".join(UNIQUE[:7] + [UNIQUE[0]] * 3)),
    ("dup_line_char_frac", "\n".join(UNIQUE[:3] + ["y" * 100] * 2), "\n".join(UNIQUE[:9] + ["y" * 100] * 2)),
    ("top_2_gram", " ".join(["hello world"] * 3 + VOCAB[:20]), " ".join(["hello world"] * 3 + VOCAB[:40])),
    ("top_3_gram", " ".join(["aa bb cc", *VOCAB[:4], "aa bb cc", *VOCAB[4:8], "aa bb cc"] + VOCAB[8:14]),
     " ".join(["aa bb cc", *VOCAB[:4], "aa bb cc", *VOCAB[4:8], "aa bb cc"] + VOCAB[8:40])),
    ("top_4_gram", " ".join(["a b c d", *VOCAB[:4], "a b c d", *VOCAB[4:8], "a b c d"] + VOCAB[8:9]),
     " ".join(["a b c d", *VOCAB[:4], "a b c d", *VOCAB[4:8], "a b c d"] + VOCAB[8:20])),
    ("duplicated_5_n_grams", " ".join(VOCAB[:5] * 2 + VOCAB[10:25]), " ".join(VOCAB[:5] * 2 + VOCAB[10:40])),
]
# A repeated n-gram (n = 6..10) and k filler words: k is the most that still trips the default limit
# (0.14 at n = 6 down to 0.10 at n = 10, of the characters in duplicated n-grams); k + 1 does not.
FILLER = VOCAB[20:] + [w.upper() for w in VOCAB]
REPETITION += [(f"duplicated_{n}_n_grams", " ".join(VOCAB[:n] * 2 + FILLER[:k]),
                " ".join(VOCAB[:n] * 2 + FILLER[:k + 1]))
               for n, k in ((6, 23), (7, 31), (8, 39), (9, 50), (10, 63))]


def _only(reason):
    """GopherRepetition with every rule off but the one that gives `reason`, at its default."""
    default = gopher.GopherRepetition()
    off = {"dup_line_frac": 0, "dup_para_frac": 0, "dup_line_char_frac": 0, "dup_para_char_frac": 0,
           "top_n_grams": (), "dup_n_grams": ()}
    if reason.startswith("top_"):
        return gopher.GopherRepetition(**{**off, "top_n_grams": (default.top_n_grams[int(reason[4]) - 2],)})
    if reason.startswith("duplicated_"):
        n = int(reason.split("_")[1])
        return gopher.GopherRepetition(**{**off, "dup_n_grams": (default.dup_n_grams[n - 5],)})
    return gopher.GopherRepetition(**{**off, reason: getattr(default, reason)})


@pytest.mark.parametrize("reason, trips, near_miss", REPETITION, ids=[r[0] for r in REPETITION])
def test_gopher_repetition_reasons(reason, trips, near_miss):
    # rules interact (a repeated line also repeats its n-grams), so each is tested on its own ...
    assert _only(reason).check(_doc(trips)) == reason
    assert _only(reason).check(_doc(near_miss)) is None
    # ... and with all rules on, the document stops at this rule or an earlier one
    order = ["dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac", "top_2_gram",
             "top_3_gram", "top_4_gram", *(f"duplicated_{n}_n_grams" for n in range(5, 11))]
    assert order.index(gopher.GopherRepetition().check(_doc(trips))) <= order.index(reason)


def test_gopher_repetition_longer_n_grams_and_switching_rules_off():
    text = " ".join(VOCAB[:6] * 2 + VOCAB[10:40])    # a repeated 6-gram
    only_n_grams = {"top_n_grams": ()}
    assert gopher.GopherRepetition(**only_n_grams, dup_n_grams=((5, 0.5), (6, 0.1))).check(_doc(text)) == \
        "duplicated_6_n_grams"
    assert gopher.GopherRepetition(**only_n_grams, dup_n_grams=((5, 0.5), (6, 0.2))).check(_doc(text)) \
        is None
    lines = "\n".join(UNIQUE[:6] + [UNIQUE[0]] * 3)
    assert gopher.GopherRepetition(dup_para_frac=0, dup_line_frac=0).check(_doc(lines)) == \
        "dup_line_char_frac"
    all_off = {"dup_para_frac": 0, "dup_line_frac": 0, "dup_line_char_frac": 0, "dup_para_char_frac": 0,
               "top_n_grams": (), "dup_n_grams": ()}
    assert gopher.GopherRepetition(**all_off).check(_doc(lines)) is None
    assert gopher.GopherRepetition().check(_doc(PROSE)) is None


def test_gopher_repetition_drops_an_empty_text_as_datatrove_does():
    # datatrove 0.10.1: (False, "empty"), whichever rules are on; the reason is listed first, as checked first
    all_off = {"dup_para_frac": 0, "dup_line_frac": 0, "dup_line_char_frac": 0, "dup_para_char_frac": 0,
               "top_n_grams": (), "dup_n_grams": ()}
    assert gopher.GopherRepetition().check(_doc("")) == "empty"
    assert gopher.GopherRepetition(**all_off).check(_doc("")) == "empty"
    assert gopher.GopherRepetition().reasons()[0] == "empty"
    assert gopher.GopherRepetition().check(_doc(" ")) is None       # not empty: nothing in it repeats


# ---------------------------------------------------------------------------------------------
# Gopher quality

def _sentence(n_words, word="word"):
    return " ".join(["the", "cat", "and", *[word] * (n_words - 3)])


GOPHER = [
    ("gopher_short_doc", _sentence(49) + " .", _sentence(50) + " ."),          # punctuation is not a word
    ("gopher_long_doc", _sentence(100_001), _sentence(100_000)),
    ("gopher_below_avg_threshold", " ".join(["the", "and"] + ["ab"] * 60),
     " ".join(["the", "and"] + ["abc"] * 60)),
    ("gopher_above_avg_threshold", " ".join(["the", "and"] + ["x" * 11] * 60),
     " ".join(["the", "and"] + ["x" * 10] * 60)),
    ("gopher_too_many_hashes", _sentence(60, "tag") + " #" * 7, _sentence(60, "tag") + " #" * 6),
    ("gopher_too_many_ellipsis", _sentence(60) + " wait..." * 8 + " end.",
     _sentence(60) + " wait..." * 7 + " end."),
    ("gopher_too_many_bullets", "\n".join(["intro " + _sentence(20)] + ["- " + _sentence(20)] * 10),
     "\n".join(["intro " + _sentence(20)] * 2 + ["• " + _sentence(20)] * 10)),
    ("gopher_too_many_end_ellipsis", "\n".join([_sentence(20)] * 2 + [_sentence(20) + " and so…"]),
     "\n".join([_sentence(20)] * 3 + [_sentence(20) + " and so…"])),
    ("gopher_below_alpha_threshold", _sentence(60) + " 1" * 16, _sentence(60) + " 1" * 15),
    ("gopher_enough_stop_words", " ".join(["the"] * 3 + ["word"] * 60),
     " ".join(["the", "of"] + ["word"] * 60)),
]


@pytest.mark.parametrize("reason, trips, near_miss", GOPHER, ids=[g[0] for g in GOPHER])
def test_gopher_quality_reasons(reason, trips, near_miss):
    f = gopher.GopherQuality()
    assert f.check(_doc(trips)) == reason
    assert f.check(_doc(near_miss)) is None


def test_gopher_quality_counts_punctuation_as_words_but_not_as_long_words():
    # 60 words and 60 commas: the commas count for the alpha ratio (60 / 120 < 0.8) ...
    assert gopher.GopherQuality().check(_doc(" ".join(["the", "and"] + ["word,"] * 58))) == \
        "gopher_below_alpha_threshold"
    # ... and not for the word count or the mean word length
    text = " ".join(["the", "and"] + ["word,"] * 58)
    assert gopher.GopherQuality(min_alpha_words_ratio=0).check(_doc(text)) is None


def test_letterless_and_symbol_words_are_found_among_the_distinct_words():
    """GopherQuality looks for words without a letter and words of punctuation only among a text's distinct
    words (`_letterless`); they are the words its two patterns match, one word a line, in every text."""
    rng = random.Random(6)
    alphabet = [*"aZé1٣_²½#.,!?…—-•$%\x01\x85\x0b", "’", "「", "％", "１", "\u0f0d", "\U00011047", "ab", "12"]
    for _ in range(2000):
        ws = tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
                   for _ in range(rng.randint(0, 30)))
        no_letter, symbolic = gopher._letterless(ws)
        joined = "\n".join(ws)
        assert sum(w in no_letter for w in ws) == len(gopher._NO_LETTER_WORD.findall(joined)), ws
        assert [w for w in ws if w in symbolic] == gopher._SYMBOL_WORD.findall(joined), ws


# ---------------------------------------------------------------------------------------------
# C4

def test_c4_rewrites_the_text_to_the_lines_it_keeps():
    text = "\n".join([
        "A first line of prose [1] with a citation[edit].",
        "Too short",                                     # fewer than 3 words
        "Enable JavaScript to see this page properly.",  # javascript
        "By using this site you accept the Privacy Policy.",
        "  Second kept line, no terminal punctuation  ",  # kept: FineWeb does not require it
        "word " + "x" * 1001 + " here",                  # a word over 1000 characters
        "Third kept line. It has two sentences.",
        "Fourth kept line is here.",
    ])
    reason, doc = c4.C4Quality().apply({"id": "a", "url": "u", "text": text})
    assert reason is None
    assert doc == {"id": "a", "url": "u", "text": "\n".join([
        "A first line of prose  with a citation.", "Second kept line, no terminal punctuation",
        "Third kept line. It has two sentences.", "Fourth kept line is here."])}
    assert c4.C4Quality().check({"text": text}) is None
    # datatrove's own default drops lines without terminal punctuation: then 4 sentences are left
    assert c4.C4Quality(filter_no_terminal_punct=True).apply({"text": text})[0] == "c4_too_few_sentences"


C4 = [
    ("c4_too_few_sentences", "One two three.\nFour five six. Seven eight nine.\nTen eleven twelve?\nhi there",
     "One two three.\nFour five six. Seven eight nine.\nTen eleven twelve? Yes no maybe.\nhi there"),
    ("c4_lorem_ipsum", PROSE + "\nLorem ipsum dolor sit amet.",
     PROSE + "\nLorem ipsum."),                            # a 2-word line is dropped before the check
    ("c4_curly_bracket", PROSE + "\nvar x = {a: 1};", PROSE + "\nenable javascript {a: 1};"),
]


@pytest.mark.parametrize("reason, trips, near_miss", C4, ids=[c[0] for c in C4])
def test_c4_reasons(reason, trips, near_miss):
    f = c4.C4Quality()
    assert f.apply(_doc(trips)) == (reason, _doc(trips))      # a dropped document keeps its text
    assert f.apply(_doc(near_miss))[0] is None


# ---------------------------------------------------------------------------------------------
# FineWeb

LONG = "This line is long enough to not count as a short one"
FINEWEB = [
    ("line_punct_ratio", "\n".join([LONG + "."] + [LONG + f" {i}" for i in range(8)]),
     "\n".join([LONG + "."] + [LONG + f" {i}" for i in range(7)])),      # 1/9 < 0.12 <= 1/8
    ("short_line_ratio", "\n".join([LONG + "."] + [f"Short {i}." for i in range(3)]),
     "\n".join([LONG + "."] + [f"Short {i}." for i in range(2)])),      # 3/4 > 0.67 >= 2/3
    ("char_dup_ratio", "\n".join([LONG + f" {i}." for i in range(20)] + ["Again and again."] * 2),
     "\n".join([LONG + f" {i}." for i in range(60)] + ["Again and again."] * 2)),
    ("list_ratio", "\n".join(f"{'x' * 30}_{i}." for i in range(10)),         # 9 breaks / 20 words
     "\n".join(f"{'x' * 30}_{i} and more." for i in range(10))),             # 9 / 40
]


@pytest.mark.parametrize("reason, trips, near_miss", FINEWEB, ids=[f[0] for f in FINEWEB])
def test_fineweb_reasons(reason, trips, near_miss):
    f = fineweb.FineWebQuality()
    assert f.check(_doc(trips)) == reason
    assert f.check(_doc(near_miss)) is None


def test_fineweb_empty_after_c4_removed_every_line():
    assert fineweb.FineWebQuality().check(_doc("\n \n")) == "empty"


# ---------------------------------------------------------------------------------------------
# Config, gin, build_filters, clean_document

QUALITY_ON = {"gopher_repetition": gopher.GopherRepetition(), "gopher_quality": gopher.GopherQuality(),
              "c4_quality": c4.C4Quality(), "fineweb_quality": fineweb.FineWebQuality()}


def test_the_quality_filters_are_off_by_default():
    config = clean.Config()
    assert all(getattr(config, name) is None for name in QUALITY_ON)
    assert not any(isinstance(f, tuple(map(type, QUALITY_ON.values()))) for f in clean.build_filters(config))


@pytest.mark.parametrize("cls, kwargs, message", [
    (gopher.GopherRepetition, {"dup_line_frac": 1.5}, r"^dup_line_frac=1.5 must be in \[0, 1\]"),
    (gopher.GopherRepetition, {"top_n_grams": ((0, 0.2),)}, r"^top_n_grams=\(\(0, 0.2\),\) must be pairs"),
    (gopher.GopherQuality, {"min_doc_words": -1}, "^min_doc_words=-1 must be >= 0"),
    (c4.C4Quality, {"min_num_sentences": -2},
     r"^min_num_sentences=-2 must be >= -1 \(-1 turns the rule off\)"),
    (fineweb.FineWebQuality, {"short_line_thr": 2}, r"^short_line_thr=2 must be in \[0, 1\]"),
    (gopher.GopherQuality, {"splitter": "spcy"},
     "^splitter='spcy' is not a word splitter; valid: 'spacy_rules', 'fast', 'spacy', 'nltk'"),
])
def test_a_quality_filter_rejects_bad_values_naming_the_field(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


@pytest.mark.parametrize("binding, message", [
    ("clean.GopherQuality.min_doc_words = -1", "clean.GopherQuality: min_doc_words=-1 must be >= 0"),
    ('clean.FineWebQuality.splitter = "spcy"',
     "clean.FineWebQuality: splitter='spcy' is not a word splitter; valid: 'spacy_rules', 'fast', 'spacy', "
     "'nltk'"),
    ("clean.Config.gopher_quality = True", "clean.Config.gopher_quality = True has type bool"),
])
def test_gin_errors_name_the_binding(binding, message):
    with pytest.raises(pipeline_config.ConfigError, match=re.escape(message)):
        pipeline_config.load([f"{REPO}/gin/tiny.gin", f"{REPO}/gin/data/fineweb.gin"], [binding])


def test_gin_switches_quality_filters_on_and_binds_their_fields():
    config = pipeline_config.load([f"{REPO}/gin/tiny.gin"], [
        "clean.Config.gopher_repetition = @clean.GopherRepetition()",
        "clean.Config.c4_quality = @clean.C4Quality()",
        "clean.C4Quality.min_num_sentences = 3", "clean.GopherRepetition.top_n_grams = ((2, 0.3),)",
        "clean.Config.fineweb_quality = @clean.FineWebQuality()"]).stages["clean"].config
    built = clean.build_filters(config)
    assert [type(f) for f in built[2:]] == \
        [gopher.GopherRepetition, c4.C4Quality, fineweb.FineWebQuality]
    assert built[2].top_n_grams == ((2, 0.3),) and built[3].min_num_sentences == 3
    assert built[2] == gopher.GopherRepetition(top_n_grams=((2, 0.3),))     # the rest: datatrove's defaults


def test_a_splitter_is_chosen_per_filter_and_travels_to_beam_workers_by_name():
    f = gopher.GopherQuality(splitter="nltk")       # holds the name: NLTK loads on the first document
    assert pickle.loads(pickle.dumps(f)) == f
    assert gopher.GopherQuality().check({"text": PROSE}) is None
    assert quality.shared_splitter("fast") is quality.shared_splitter("fast")     # one per process, shared


def test_clean_document_runs_the_quality_filters_in_order_and_keeps_the_rewrite():
    config = clean.Config(**QUALITY_ON)
    doc_filters = clean.build_filters(config)
    text = PROSE + "\nPlease enable javascript to view this page correctly."
    rewrites: list[str] = []
    reason, doc = clean.clean_document({"id": "a", "text": text}, config, doc_filters, rewrites)
    assert reason is None and doc["text"] == PROSE and rewrites == ["c4_lines"]
    rewrites.clear()
    assert clean.clean_document({"id": "c", "text": PROSE}, config, doc_filters, rewrites) == \
        (None, {"id": "c", "text": PROSE}) and rewrites == []            # C4 kept every line: no rewrite
    assert clean.clean_document({"id": "b", "text": PROSE + "\nvar x = {a: 1};"}, config, doc_filters)[0] == \
        "c4_curly_bracket"


def test_an_empty_text_is_set_aside_before_the_filters_and_only_c4_empties_a_kept_one():
    """quality.py's account of empty texts: what each filter says of one (Gopher repetition and FineWeb
    "empty", as datatrove 0.10.1), that clean_document sets one aside before any filter (C4 would say
    c4_too_few_sentences), and that C4's rewrite keeping no line (min_num_sentences = -1) hands FineWeb
    one."""
    assert [f.check(_doc("")) for f in QUALITY_ON.values()] == \
        ["empty", "gopher_short_doc", "c4_too_few_sentences", "empty"]
    assert clean.clean_document(_doc(""), clean.Config(), (c4.C4Quality(),))[0] == "empty"
    config = clean.Config(**dict(QUALITY_ON, c4_quality=c4.C4Quality(min_num_sentences=-1)))
    # lines of two words, which C4 drops (min_words_per_line 3), and which pass both Gopher filters
    every_line_dropped = "\n".join(f"{stop} {word}" for stop, word in zip(["the", "of", "and"] * 20, VOCAB))
    assert c4.C4Quality(min_num_sentences=-1).apply(_doc(every_line_dropped))[1]["text"] == ""
    assert clean.clean_document(_doc(every_line_dropped), config, clean.build_filters(config))[0] == "empty"


# ---------------------------------------------------------------------------------------------
# The real clean stage counts the new reasons

@pytest.mark.parametrize("splitter", words.SPLITTERS)
def test_clean_stage_counts_quality_reasons_in_stats(tmp_path, splitter):
    """With each word splitter (the filters travel to Beam's workers by pickle, naming theirs), which
    agree on these plain English texts."""
    if splitter in words.LIBRARY:
        pytest.importorskip(splitter)       # an extra: pip install -e '.[spacy]' / '.[nltk]'
    if words.problem(splitter):             # nltk without punkt's trained model refuses to run
        pytest.skip(words.problem(splitter))
    root = str(tmp_path)
    docs = [
        {"id": "keep", "text": PROSE + "\nEnable javascript please for this site."},
        {"id": "rep", "text": "\n".join([PROSE.splitlines()[0]] * 8)},
        {"id": "gopher", "text": " ".join(["The", "of", *VOCAB[:45]]) + "."},       # 47 words
        {"id": "c4", "text": PROSE + "\nLorem ipsum dolor sit amet."},
        {"id": "fineweb", "text": "\n".join(line.rstrip(".") for line in prose(12, seed=1).splitlines())},
    ]

    def write(config, inputs, out_dir, work_dir):
        documents.write(storage.join(out_dir, documents.shard_name(0, 1)), docs)

    download = cache.run_stage(cache_root=root, stage="download", key="d", config=clean.Config(), upstream={},
                               fn=write)
    no_minhash = {"minhash": False} if "minhash" in clean.Config.__dataclass_fields__ else {}
    filters_on = {name: dataclasses.replace(f, splitter=splitter) for name, f in QUALITY_ON.items()}
    config = clean.Config(num_shards=1, **filters_on, **no_minhash)
    done = cache.run_stage(cache_root=root, stage="clean", key="c", config=config,
                           upstream={"download": download}, fn=clean.run)
    stats = storage.read_json(done.file("stats.json"))
    assert stats["dropped"] == {"dup_line_frac": 1, "gopher_short_doc": 1, "c4_lorem_ipsum": 1,
                                "line_punct_ratio": 1}
    kept = [d for path in documents.shards_of(done) for d in documents.read(path)]
    assert [(d["id"], d["text"]) for d in kept] == [("keep", PROSE)]     # C4 removed the javascript line
    assert stats["chars_kept"] == len(PROSE)
