"""FineWeb's own quality rules (Penedo et al. 2024) as datatrove 0.10.1 runs them: lines ending in
terminal punctuation, short lines, characters in duplicated lines, line breaks per word (`FineWebQuality`).

    from stages.clean.fineweb import FineWebQuality
    FineWebQuality().check({"text": "a list\nof\nshort\nlines"}) == "line_punct_ratio"

The last of the quality filters in FineWeb's order (`config.RECIPE`); quality.py says what they share
(defaults, reasons, the word splitter, empty texts).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from stages.clean import filters
from stages.clean import words as words_lib
from stages.clean.quality import (
    TERMINAL_PUNCTUATION,
    SplitsWords,
    at_least,
    check_splitter,
    duplicates,
    in_unit_interval,
    shared_splitter,
)

_TERMINAL = tuple(TERMINAL_PUNCTUATION)


@dataclasses.dataclass(frozen=True)
class FineWebQuality(SplitsWords):
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
        check_splitter(self)
        in_unit_interval(self, "line_punct_thr", "short_line_thr", "char_duplicates_ratio")
        at_least(self, 0, "short_line_length", "new_line_ratio")

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
        return duplicates(self.non_blank)[1] / max(len(self.text) - self.text.count("\n"), 1)

    def list_ratio(self) -> float:
        return self.text.count("\n") / max(len(shared_splitter(self.f.splitter)(self.text)), 1)
