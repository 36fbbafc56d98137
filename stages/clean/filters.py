"""Document filters for the clean stage: each is one frozen dataclass with one method.

    Length(min_chars=200, max_chars=100_000).check({"text": "too little"}) == "too_short"

`check(doc)` sees one normalized document (a dict with `id, text, url, source`; `text` is a
non-empty str) and returns None to keep it or a short reason string to drop it; `reasons()` lists
every reason it can return, in the order it checks them. The stage counts the reasons (`stats.json`),
samples them (`rejected/<reason>.jsonl`) and charts them in that order (`report.md`, report.py).
It runs the filters that `build_filters(config)` (config.py) lists, in that order, and stops at the first
reason, so the cheap checks go first: `Length` looks only at `len(text)`, so a 10 MB line is
dropped before any filter walks its characters.

A filter that also changes the text it keeps (C4's line filter, quality.py) has a second method,
`apply(doc) -> (reason or None, doc)`, returning the document with its new text; `clean_document`
calls `apply` where a filter has it, so the filters after it see the new text, and `check` where not;
what a rewriter changed is counted per kept document (`Rewriter`, `stats.json`'s `rewritten`).

A filter of FineWeb's recipe is its own config: a frozen dataclass whose fields are its parameters, with
defaults (datatrove's FineWeb recipe), checked in `__post_init__` (a ValueError that starts with the
field's name: `min_doc_words=-1 must be >= 0`). Adding one is the class (in a module of its own:
urls.py, langid.py, quality.py, pii.py) plus one line in `clean.Config` (`my_filter: MyFilter | None =
None`), placed where it should run (the filter fields' order is `config.RECIPE`); gin then binds it as
`clean.MyFilter.<field>` and switches it on with `clean.Config.my_filter = @clean.MyFilter()`. A filter
must be deterministic and picklable (Beam ships it to workers); one that needs a model or large lists
(langid.py, urls.py) loads them lazily on first use and keeps them out of its dataclass fields, and may
say what would stop that before any stage runs: `problem() -> str` ("" when nothing; `clean.check` asks
every switched-on filter).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol

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


@dataclasses.dataclass(frozen=True)
class Length:
    min_chars: int
    max_chars: int

    def reasons(self) -> tuple[str, ...]:
        return ("too_short", "too_long")

    def check(self, doc: dict) -> str | None:
        n = len(doc["text"])
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

    def reasons(self) -> tuple[str, ...]:
        return ("too_few_alpha",)

    def check(self, doc: dict) -> str | None:
        letters, visible = letters_and_visible(doc["text"])
        return "too_few_alpha" if letters < self.min_fraction * visible else None


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
