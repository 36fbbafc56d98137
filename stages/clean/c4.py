"""C4's line rules (Raffel et al. 2020) as datatrove 0.10.1 runs them in FineWeb's recipe: a filter that
also rewrites each kept text to the lines it keeps (`C4Quality.apply`).

    from stages.clean.c4 import C4Quality
    C4Quality().apply({"text": text}) == (None, {"text": <the lines C4 keeps>})    # or (reason, doc)

quality.py says what the quality filters share (defaults, reasons, the word splitter, empty texts).
"""

from __future__ import annotations

import dataclasses
import re

from stages.clean import words as words_lib
from stages.clean.quality import SplitsWords, at_least, check_splitter, shared_splitter

_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
                  "use cookies")


@dataclasses.dataclass(frozen=True)
class C4Quality(SplitsWords):
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
        check_splitter(self)
        at_least(self, -1, "min_num_sentences", "min_words_per_line", "max_word_length")

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
        count_sentences = shared_splitter(self.splitter).sentences
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
