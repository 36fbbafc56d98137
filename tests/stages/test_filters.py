"""The clean stage's pure parts: normalization rules, filters, per-document reasons, tallies."""

import dataclasses
import random
import re
import typing

import pytest

from stages import clean
from stages.clean import filters, normalize, tally

GOOD = "A plain sentence with plenty of letters in it, enough to pass. " * 5   # 320 chars


# ---------------------------------------------------------------------------------------------
# normalize.py

@pytest.mark.parametrize("raw, want", [
    ("Cafe\u0301", "Caf\u00e9"),                                  # NFC composes e + combining acute
    ("a\r\nb\rc\vd\fe\x85f\u2028g\u2029h", "a\nb\nc\nd\ne\nf\ng\nh"),  # every line break becomes \n
    ("a\x00b\x1bc\x7fd\x9fe\tf\ng", "abcde\tf\ng"),                # Cc removed, \t and \n kept
    ("a  b\t\tc \t d", "a b c d"),                                  # runs of spaces/tabs -> one space
    ("a\tb c", "a\tb c"),                                           # a single tab or space stays
    ("one  \ntwo\t\nthree", "one\ntwo\nthree"),                      # trailing whitespace per line
    ("a\n\n\n\n\nb\n\nc", "a\n\nb\n\nc"),                           # 3+ newlines -> 2, 2 stay
    ("a\n \t \n  \nb", "a\n\nb"),                                   # whitespace-only lines count as blank
    ("  \n\t lead and trail \n\n ", "lead and trail"),              # the document is stripped
    ("x\r\n \r\n\r\ny", "x\n\ny"),                                  # CRLF blank lines collapse too
])
def test_each_normalization_rule(raw, want):
    assert normalize.normalize(raw) == want


def test_normalization_steps_switch_off():
    assert normalize.normalize("Cafe\u0301", nfc=False) == "Cafe\u0301"
    assert normalize.normalize("a\x00b", control=False) == "a\x00b"
    assert normalize.normalize("a  b \n\n\n\nc", whitespace=False) == "a  b \n\n\n\nc"
    assert normalize.normalize(" a\r\nb ", nfc=False, control=False, whitespace=False) == "a\nb"


class _CountingPattern:
    """Stands in for one of normalize.py's compiled patterns: counts the characters each `sub` is given and
    keeps the longest run of spaces and tabs it was given (what a `$`-anchored pattern would rescan)."""

    def __init__(self, pattern):
        self.pattern, self.chars, self.longest_blank_run = pattern, 0, 0

    def sub(self, repl, text):
        self.chars += len(text)
        runs = re.findall("[ \t]+", text)
        self.longest_blank_run = max([self.longest_blank_run, *map(len, runs)])
        # Fail at once rather than hang for hours in the quadratic case this counting exists to catch.
        assert "$" not in self.pattern.pattern or self.longest_blank_run <= 1, \
            f"{self.pattern.pattern!r} given a run of {self.longest_blank_run} blanks: quadratic rescans"
        return self.pattern.sub(repl, text)


@pytest.fixture
def regex_work(monkeypatch):
    """normalize.py's patterns, each counting its work (a regex pass is the only work that is not a C-speed
    scan at memory speed; see normalize.py)."""
    names = [n for n, v in vars(normalize).items() if isinstance(v, re.Pattern)]
    spies = {n: _CountingPattern(getattr(normalize, n)) for n in names}
    for n, spy in spies.items():
        monkeypatch.setattr(normalize, n, spy)
    return spies


def test_normalization_is_linear_on_huge_whitespace_runs(regex_work):
    """Linear by construction, counted rather than timed: each pattern sees the text at most once, and the
    line-end pattern `[ \t]+$`, which rescans a run of n blanks from each of its n starts (quadratic: hours
    for these 2M-character runs), only ever sees runs of one blank, because runs are collapsed first."""
    text = "a" + " " * 2_000_000 + "b\n" + "\t" * 2_000_000 + "\n" * 2_000_000 + "c"
    assert normalize.normalize(text) == "a b\n\nc"
    passes = {name: spy.chars for name, spy in regex_work.items()}
    assert all(chars <= len(text) for chars in passes.values()), passes
    assert regex_work["_SPACE_RUN"].longest_blank_run == 2_000_000          # the runs, collapsed in one pass
    assert regex_work["_LINE_END_SPACE"].chars and regex_work["_LINE_END_SPACE"].longest_blank_run <= 1


# ---------------------------------------------------------------------------------------------
# filters.py

def test_length_bounds_are_inclusive():
    f = filters.Length(min_chars=3, max_chars=5)
    assert [f.check({"text": "x" * n}) for n in (2, 3, 5, 6)] == ["too_short", None, None, "too_long"]


def test_alpha_fraction_counts_letters_among_non_whitespace():
    f = filters.AlphaFraction(min_fraction=0.5)
    assert f.check({"text": "ab 12"}) is None                  # 2 letters of 4 visible: exactly 0.5
    assert f.check({"text": "ab 123"}) == "too_few_alpha"      # 2 of 5
    assert f.check({"text": "ab\n\n\t  1"}) is None             # whitespace does not count
    assert f.check({"text": "日本語 123"}) is None                # letters are Unicode letters
    assert f.check({"text": "éé 1€€"}) == "too_few_alpha"


def test_letters_and_visible_match_str_methods_on_mixed_text():
    rng = random.Random(0)
    alphabet = "ab Z9\t\n_.,é日\u00a0\u2028\x1c€ß𝔘"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        want = (sum(c.isalpha() for c in text), sum(not c.isspace() for c in text))
        assert filters.letters_and_visible(text) == want, repr(text)


# ---------------------------------------------------------------------------------------------
# One document: which reason, in which order

FILTERS = clean.build_filters(clean.Config())


@pytest.mark.parametrize("doc, reason", [
    ({"id": "1", "text": None, "error": "malformed_json"}, "malformed_json"),
    ({"id": "2", "text": None, "error": "invalid_utf8"}, "invalid_utf8"),
    ({"id": "3", "text": None, "error": "non_string_text"}, "non_string_text"),
    ({"id": "4", "text": None, "error": "missing_text"}, "missing_text"),
    ({"id": "5", "text": GOOD, "error": "malformed_json"}, "malformed_json"),  # an error wins over good text
    ({"id": "6", "text": None}, "null_text"),
    ({"id": "7", "text": b"bytes"}, "null_text"),
    ({"id": "8", "text": 42}, "null_text"),
    ({"id": "9", "text": " \t\r\n\x00\x07 \n"}, "empty"),
    ({"id": "10", "text": "short"}, "too_short"),
    ({"id": "11", "text": "x" * 100_001}, "too_long"),
    ({"id": "12", "text": "1234 5678 " * 30}, "too_few_alpha"),
    ({"id": "13", "text": GOOD}, None),
    ({"id": "14", "text": GOOD, "error": ""}, None),           # an empty error string is no error
])
def test_each_reason(doc, reason):
    assert clean.clean_document(doc, clean.Config(), FILTERS)[0] == reason


def test_kept_document_has_normalized_text_and_other_fields():
    raw = {"id": "a", "url": "u", "source": "s", "text": "  x\r\n\r\n\r\ny  " + GOOD}
    reason, doc = clean.clean_document(raw, clean.Config(), FILTERS)
    assert reason is None
    assert doc == {"id": "a", "url": "u", "source": "s", "text": "x\n\ny " + GOOD.strip()}


def test_length_runs_before_any_filter_that_walks_the_characters(regex_work):
    assert [type(f) for f in FILTERS] == [filters.Length, filters.AlphaFraction]
    assert clean.build_filters(clean.Config(min_alpha_fraction=0.0)) == (filters.Length(200, 100_000),)

    seen = []

    class Spy:
        def check(self, doc):
            seen.append(doc["id"])

    line = "0" * 10_000_000    # 10 MB on one line, and no letters at all
    reason, _ = clean.clean_document({"id": "big", "text": line}, clean.Config(), (FILTERS[0], Spy()))
    assert reason == "too_long" and seen == []                    # the filter after Length never walked it
    assert all(spy.chars <= len(line) for spy in regex_work.values())      # and normalizing it was one pass
    assert clean.clean_document({"id": "ok", "text": GOOD}, clean.Config(), (FILTERS[0], Spy()))[0] is None
    assert seen == ["ok"]


# ---------------------------------------------------------------------------------------------
# Config

@pytest.mark.parametrize("kwargs, message", [
    ({"min_chars": -1}, "min_chars=-1 must be >= 0"),
    ({"num_shards": 0}, "num_shards=0 must be >= 1"),
    ({"samples_per_reason": -2}, "samples_per_reason=-2 must be >= 0"),
    ({"min_chars": 300, "max_chars": 200}, "max_chars=200 must be >= min_chars=300"),
    ({"max_chars": 0, "min_chars": 0}, "max_chars=0 must be >= min_chars=0 and >= 1"),
    ({"min_alpha_fraction": 1.5}, r"min_alpha_fraction=1.5 must be in \[0, 1\]"),
])
def test_config_rejects_bad_values_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        clean.Config(**kwargs)


# ---------------------------------------------------------------------------------------------
# tally.py

def _sample_doc(i):
    return {"id": f"{i:03d}", "text": f"text {i}", "url": f"u{i}", "source": "s"}


def test_tallies_merge_to_the_same_result_in_any_order():
    parts = []
    for part in range(4):
        t = tally.Tally(samples_per_reason=3)
        for i in range(part, 40, 4):
            t.docs_in += 1
            t.chars_in += 10
            t.drop("too_short" if i % 2 else "empty", _sample_doc(i), 10)
        t.keep(5, ("pii_email", "pii_ip", "pii_email") if part % 2 else ("c4_lines",))   # once per kind
        parts.append(t)
    merged = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        acc = tally.Tally(samples_per_reason=3)
        for i in order:
            acc.merge(parts[i])
        merged.append(acc)
    assert merged[0] == merged[1] == merged[2]
    assert merged[0].stats(shards=2) == {"docs_in": 40, "chars_in": 400, "docs_kept": 4, "chars_kept": 20,
                                         "dropped": {"empty": 20, "too_short": 20},
                                         "dropped_chars": {"empty": 200, "too_short": 200}, "shards": 2,
                                         "rewritten": {"c4_lines": 2, "pii_email": 2, "pii_ip": 2}}
    assert [s["id"] for s in merged[0].samples["too_short"]] == ["001", "003", "005"]
    assert [s["id"] for s in merged[0].samples["empty"]] == ["000", "002", "004"]


def test_samples_are_truncated_and_reason_names_become_safe_file_names():
    t = tally.Tally(samples_per_reason=1)
    t.drop("too_long", {"id": "a", "text": "y" * 10_000}, 10_000)
    assert t.samples["too_long"] == [{"id": "a", "url": None, "source": None, "reason": "too_long",
                                      "text": "y" * tally.REJECTED_TEXT_CHARS}]
    assert tally.file_name("http 404/not found") == "http_404_not_found"
    assert tally.file_name("../x") == "_x"
    assert tally.file_name("invalid_utf8") == "invalid_utf8"


def test_each_recipe_step_is_one_field_holding_its_filter_or_none():
    """A new filter is its class plus one line, its field in clean.Config: the recipe's order, the gin
    configurables and the build order follow from the fields."""
    fields = {f.name: f for f in dataclasses.fields(clean.Config)}
    assert list(clean.FILTERS) == list(clean.RECIPE)
    for name, cls in clean.FILTERS.items():
        assert fields[name].default is None, name                    # off unless switched on
        f = cls()                                                     # its own defaults
        assert callable(f.check) and isinstance(f.reasons(), tuple), name
        assert clean.build_filters(clean.Config(**{name: f}))[-1] is f
    # and the contamination check, a config of its own that is not a filter (stages/clean/contamination.py)
    assert (clean.Config, *clean.FILTERS.values(), clean.Contamination, clean.KeepTop) == clean.CONFIGURABLES
    # no filter parameter is restated in clean.Config, prefixed or not (gopher_min_doc_words)
    parameters = {p.name for cls in clean.FILTERS.values() for p in dataclasses.fields(cls)}
    assert not [(f, p) for f in fields for p in parameters if f == p or f.endswith("_" + p)]


def test_a_new_filter_is_its_class_plus_one_field():
    """A Config with one more filter field (declared before PII masking) runs it there, with no other edit."""
    from stages.clean import config as clean_config

    @dataclasses.dataclass(frozen=True)
    class NoDigits:
        def reasons(self):
            return ("digits",)

        def check(self, doc):
            return "digits" if any(c.isdigit() for c in doc["text"]) else None

    hints = typing.get_type_hints(clean.Config)          # the annotations as types, not strings
    fields = [(f.name, hints[f.name], f) for f in dataclasses.fields(clean.Config)]
    at = [name for name, _, _ in fields].index("pii_masking")
    fields.insert(at, ("no_digits", NoDigits | None, dataclasses.field(default=None)))
    Extended = dataclasses.make_dataclass("Extended", fields, frozen=True)
    recipe = clean_config._recipe(Extended)
    assert list(recipe) == [*clean.RECIPE[:-1], "no_digits", "pii_masking"]
    assert recipe["no_digits"] is NoDigits
