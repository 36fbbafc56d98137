"""Document filters for the clean stage: each is one frozen dataclass with one method.

    Length(min_chars=200, max_chars=100_000).check({"text": "too little"}) == "too_short"

`check(doc)` sees one normalized document (a dict with `id, text, url, source`; `text` is a
non-empty str) and returns None to keep it or a short reason string to drop it; `reasons()` lists
every reason it can return, in the order it checks them. The stage counts the reasons (`stats.json`),
samples them (`rejected/<reason>.jsonl`) and charts them in that order (`report.md`, report.py).
It runs the filters that `build_filters(config)` (config.py) lists, in that order, and stops at the first
reason, so the cheap checks go first: `Length` looks only at `len(text)`, so a 10 MB line is
dropped before any filter walks its characters.

A filter that also changes the text it keeps (C4's line filter, c4.py) has a second method,
`apply(doc) -> (reason or None, doc)`, returning the document with its new text; `clean_document`
calls `apply` where a filter has it, so the filters after it see the new text, and `check` where not;
what a rewriter changed is counted per kept document (`Rewriter`, `stats.json`'s `rewritten`).

Measure once, decide many (issue 38): a scoring pass computes, once per document, what each filter's
decision reads (its "attrs"), and a selection pass decides from the attrs alone, so that a threshold
change never re-runs the expensive part. The stage calls only the functions of this module, never a
filter's own methods:

    attrs, after = measure(f, doc)   # ({"words": 312, "mean_word_length": 4.7, ...}, the doc after f)
    decide(f, attrs)                 # == f.apply(doc)[0] if f rewrites, else f.check(doc)
    scoring_key(f)                   # {"@type": "GopherQuality", "splitter": "spacy_rules"}: keys attrs
    thresholds(f)                    # {"min_doc_words": 50, ...}: what only `decide` reads

`attrs` is a small JSON object (str keys; int, float, str, bool or None values; no NaN) with the same keys
for every document a filter measures, so that a score table holds it as columns; json.loads(json.dumps(
attrs)) == attrs and decides the same. `after` is what `clean_document` continues with: the document
itself, or for a rewriter the document exactly as `apply` returns it (C4's rewritten text, or the original
when it drops; langid's metadata). The invariant, for every filter, config and normalized document:

    decide(f, measure(f, doc)[0]) == (f.apply(doc)[0] if hasattr(f, "apply") else f.check(doc))
    measure(f, doc)[1] == f.apply(doc)[1]                                  # a rewriter

A measured filter (`Measured`: Length, AlphaFraction, the Gopher and FineWeb filters, LanguageID) has
`measure(doc)` and `decide(attrs)` methods of its own, and says in `THRESHOLDS` which of its fields only
decide: changing one never changes what `measure` returns. Its other fields are scoring fields; a field
of (scoring value, threshold) pairs (Gopher repetition's `top_n_grams=((2, 0.2), ...)`: the n's are
measured, the fractions decide) is named in `PAIRED` instead, and splits: `scoring_key` lists the first of
each pair, `thresholds` the second. Every other filter (URLFilter, C4Quality, PIIMasker, and a new one
until it measures) falls back to attrs = {"reason": <what check/apply returns>}, all its fields scoring:
correct, but a change of any of its fields re-scores.

To make a filter measured:
- `measure(doc) -> (attrs, after)`: every statistic a rule compares, as the exact value `check` compares
  (`repeats / len(paragraphs)`, not a rounded or re-derived one), computed whatever the thresholds are:
  no early exit that depends on one, and no statistic whose value depends on a threshold field;
- `decide(attrs) -> reason or None`: `check`'s rules in `check`'s order, reading only thresholds and attrs,
  comparing as `check` compares (`letters < min_fraction * visible`, not `letters / visible < ...`);
- `THRESHOLDS` (and `PAIRED`): the fields `decide` reads;
- `check` is `decide` over a `LazyAttrs` (below), which computes each statistic when read, so that
  `decide`'s order gives `check` its early exits with one copy of the rules (Gopher quality, FineWeb); or
  `decide` over `measure` where that computes nothing check would skip (Length, AlphaFraction, langid);
  or, where every call counts, `check` keeps its own rules, with the statistics' helpers shared with
  `measure` (Gopher repetition: upper bounds first, exact values only where a bound trips a rule);
- tests/stages/test_measures.py: add the filter with a few threshold values to `CONFIGS`, a changed value
  of each field to `CHANGED`, and its thresholds with the attrs they compare to `BOUNDARIES` and `RULES`
  (with `OFF`, the filter with every rule off); it checks the invariant on real and generated text, at
  every threshold set to a document's value and one step past it.

A filter of FineWeb's recipe is its own config: a frozen dataclass whose fields are its parameters, with
defaults (datatrove's FineWeb recipe), checked in `__post_init__` (a ValueError that starts with the
field's name: `min_doc_words=-1 must be >= 0`). Adding one is the class (in a module of its own:
urls.py, langid.py, gopher.py, c4.py, fineweb.py, pii.py) plus one line in `clean.Config`
(`my_filter: MyFilter | None = None`), placed where it should run (the filter fields' order is
`config.RECIPE`); gin then binds it as
`clean.MyFilter.<field>` and switches it on with `clean.Config.my_filter = @clean.MyFilter()`. A filter
must be deterministic and picklable (Beam ships it to workers); one that needs a model or large lists
(langid.py, urls.py) loads them lazily on first use and keeps them out of its dataclass fields, and may
say what would stop that before any stage runs: `problem() -> str` ("" when nothing; `clean.check` asks
every switched-on filter).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import ClassVar, Protocol

# Letters and whitespace exactly as `str.isalpha` / `str.isspace` define them, restricted to ASCII,
# as `bytes.translate` deletion tables (the fast path for the ASCII part of a text).
_ASCII_LETTERS = bytes(i for i in range(128) if chr(i).isalpha())
_ASCII_SPACE = bytes(i for i in range(128) if chr(i).isspace())
_ASCII_RUNS = re.compile("[\x00-\x7f]+")


class Filter(Protocol):
    def check(self, doc: dict) -> str | None: ...

    def reasons(self) -> tuple[str, ...]:
        """Every reason `check` can return, in the order it checks them (the clean report's order)."""


class Rewriter(Filter, Protocol):
    """A filter that may change the text of a document it keeps (C4's line filter, PII masking).

    `rewrites()` names every kind of change `apply` makes, and `changes(before, after)` says which of
    them turned `before`'s text into `after`'s (asked only when the text changed). The stage counts
    the kept documents per kind (`stats.json`'s `rewritten`); a rewriter without `changes` counts
    under its class name. A rewrite of anything but the text (langid's metadata) is not counted."""

    def apply(self, doc: dict) -> tuple[str | None, dict]: ...

    def rewrites(self) -> tuple[str, ...]: ...

    def changes(self, before: dict, after: dict) -> tuple[str, ...]: ...


class Measured(Filter, Protocol):
    """A filter that measures once and decides many times (the module docstring): `THRESHOLDS` names
    its fields that only `decide` reads, `PAIRED` (optional) its fields of (scoring value, threshold)
    pairs."""

    THRESHOLDS: ClassVar[tuple[str, ...]]

    def measure(self, doc: dict) -> tuple[dict, dict]: ...

    def decide(self, attrs: dict) -> str | None: ...


def measure(f: Filter, doc: dict) -> tuple[dict, dict]:
    """(attrs, the document `clean_document` continues with) of one filter on one document: its own
    `measure`, else {"reason": what `apply` or `check` returns}."""
    own = getattr(f, "measure", None)
    if own is not None:
        return own(doc)
    apply = getattr(f, "apply", None)
    if apply is None:
        return {"reason": f.check(doc)}, doc
    reason, after = apply(doc)
    return {"reason": reason}, after


def decide(f: Filter, attrs: dict) -> str | None:
    """The reason to drop the document `attrs` were measured on (`measure(f, doc)[0]`), or None to keep
    it: what `f.apply(doc)[0]` or `f.check(doc)` returns."""
    if hasattr(f, "measure"):
        return f.decide(attrs)
    return attrs["reason"]


def scoring_key(f: Filter) -> dict:
    """What `measure(f, ...)` depends on, as JSON: {"@type": the class's name, each scoring field: its
    value}, a tuple as a list; a `PAIRED` field as the list of its pairs' first values."""
    threshold_names, paired = _split(f)
    key = {"@type": type(f).__name__}
    for field in dataclasses.fields(f):
        value = getattr(f, field.name)
        if field.name in paired:
            key[field.name] = [_jsonable(f, field.name, pair[0]) for pair in value]
        elif field.name not in threshold_names:
            key[field.name] = _jsonable(f, field.name, value)
    return key


def thresholds(f: Filter) -> dict:
    """What only `decide(f, ...)` reads, as JSON: {each threshold field: its value}; a `PAIRED` field as
    the list of its pairs' second values. Empty for a filter that does not measure."""
    threshold_names, paired = _split(f)
    out = {}
    for field in dataclasses.fields(f):
        value = getattr(f, field.name)
        if field.name in paired:
            out[field.name] = [_jsonable(f, field.name, pair[1]) for pair in value]
        elif field.name in threshold_names:
            out[field.name] = _jsonable(f, field.name, value)
    return out


def _split(f: Filter) -> tuple[frozenset[str], frozenset[str]]:
    """(the threshold fields, the paired fields) of `f`, checked against its dataclass fields."""
    name = type(f).__name__
    if not dataclasses.is_dataclass(f):
        raise TypeError(f"{name} is not a dataclass: a filter's parameters are its dataclass fields "
                        "(filters.py)")
    declared = getattr(f, "THRESHOLDS", ()), getattr(f, "PAIRED", ())
    if not hasattr(f, "measure"):
        if any(declared):
            raise TypeError(f"{name} declares THRESHOLDS or PAIRED but has no measure(doc) and "
                            "decide(attrs): without them every field is a scoring field; add both "
                            "(filters.py) or drop the declaration")
        return frozenset(), frozenset()
    fields = [field.name for field in dataclasses.fields(f)]
    for kind, names in zip(("THRESHOLDS", "PAIRED"), declared):
        unknown = [n for n in names if n not in fields]
        if unknown:
            raise TypeError(f"{name}.{kind} names {unknown!r}, which are not its fields; valid: {fields!r}")
    return frozenset(declared[0]), frozenset(declared[1])


def _jsonable(f: Filter, field: str, value):
    """`value` as JSON holds it (a tuple as a list); an error naming the field for what JSON cannot hold."""
    if isinstance(value, (tuple, list)):
        return [_jsonable(f, field, v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{type(f).__name__}.{field}={value!r}: a key holds finite numbers only")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"{type(f).__name__}.{field}={value!r}: a key holds str, int, float, bool, None "
                    f"and tuples of them, not {type(value).__name__}")


class LazyAttrs:
    """A document's attrs, each computed when read: `check` can be `decide(SomeAttrs(doc))`, which reads
    the statistics only as far as its rules get (check's cheap early exits), and `measure` reads them all
    (`every()`), with one copy of the rules and of the statistics (gopher.py's and fineweb.py's filters).

    A subclass lists its keys in `KEYS`, in measure's order, and defines a method named as each key that
    returns its value; what several keys share (the words, the lines) goes in a `functools.cached_property`.
    `attrs[key]` calls the method (decide reads each key once or twice: a plain call is cheaper than a
    cache); reading any other key is a KeyError. The cost is a call per statistic read, ~1 us a document
    for FineWeb's filter (0.5% of its check); Gopher repetition's check, the costliest, is written out.
    """

    KEYS: ClassVar[tuple[str, ...]] = ()
    _METHODS: ClassVar[dict[str, Callable]] = {}     # key: the method computing it (one lookup per read)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._METHODS = {key: getattr(cls, key) for key in cls.KEYS}

    def __getitem__(self, key: str):
        return self._METHODS[key](self)

    def every(self) -> dict:
        """Every attr, computed, as a plain dict in measure's order."""
        return {key: getattr(self, key)() for key in self.KEYS}


@dataclasses.dataclass(frozen=True)
class Length:
    min_chars: int
    max_chars: int

    THRESHOLDS: ClassVar[tuple[str, ...]] = ("min_chars", "max_chars")

    def reasons(self) -> tuple[str, ...]:
        return ("too_short", "too_long")

    def check(self, doc: dict) -> str | None:
        return self.decide({"chars": len(doc["text"])})

    def measure(self, doc: dict) -> tuple[dict, dict]:
        return {"chars": len(doc["text"])}, doc

    def decide(self, attrs: dict) -> str | None:
        n = attrs["chars"]
        if n < self.min_chars:
            return "too_short"
        if n > self.max_chars:
            return "too_long"
        return None


@dataclasses.dataclass(frozen=True)
class AlphaFraction:
    """Drops documents where letters are fewer than `min_fraction` of the non-whitespace characters
    (tables of numbers, code, base64, markup debris)."""

    min_fraction: float

    THRESHOLDS: ClassVar[tuple[str, ...]] = ("min_fraction",)

    def reasons(self) -> tuple[str, ...]:
        return ("too_few_alpha",)

    def check(self, doc: dict) -> str | None:
        return self.decide(self.measure(doc)[0])

    def measure(self, doc: dict) -> tuple[dict, dict]:
        letters, visible = letters_and_visible(doc["text"])
        return {"letters": letters, "visible": visible}, doc

    def decide(self, attrs: dict) -> str | None:
        return "too_few_alpha" if attrs["letters"] < self.min_fraction * attrs["visible"] else None


def letters_and_visible(text: str) -> tuple[int, int]:
    """(letters, non-whitespace characters) in `text`, as `str.isalpha` / `not str.isspace` count them.

    Counting char by char in Python costs ~50 ns a character; the ASCII part is counted with
    `bytes.translate` instead (~30x faster), so only the non-ASCII characters take the slow path.
    """
    ascii_part = text.encode("ascii", "ignore")
    other = "" if text.isascii() else _ASCII_RUNS.sub("", text)
    letters = len(ascii_part) - len(ascii_part.translate(None, _ASCII_LETTERS)) + sum(map(str.isalpha, other))
    visible = len(ascii_part.translate(None, _ASCII_SPACE)) + len(other) - sum(map(str.isspace, other))
    return letters, visible
