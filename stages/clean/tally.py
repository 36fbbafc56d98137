"""The clean stage's counts and rejected samples: what becomes `stats.json` and `rejected/`.

Each Beam worker tallies the documents it saw (`Tally.keep`, `Tally.drop`); `rewritten` counts the kept
documents per kind of text rewrite (`filters.Rewriter`: `pii_email`, `pii_ip`, `c4_lines`, ...), so a
document masked twice counts once per kind and each count is at most `docs_kept`. Tallies of disjoint
parts of the data `merge` in any order to the same result: counts add, and samples keep the
`samples_per_reason` smallest by `order.doc_order` (id first, then every other field), a total
order, so the merged samples do not depend on how Beam bundled the work.
"""

from __future__ import annotations

import bisect
import dataclasses
import json

from stages.clean.order import doc_order
from stages.io import storage

REJECTED_TEXT_CHARS = 500   # of each rejected document kept in rejected/ (report.md shows fewer)


@dataclasses.dataclass
class Tally:
    samples_per_reason: int
    docs_in: int = 0
    chars_in: int = 0
    docs_kept: int = 0
    chars_kept: int = 0
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)         # reason -> documents
    dropped_chars: dict[str, int] = dataclasses.field(default_factory=dict)   # reason -> characters
    samples: dict[str, list[dict]] = dataclasses.field(default_factory=dict)  # reason -> sorted samples
    rewritten: dict[str, int] = dataclasses.field(default_factory=dict)       # kind -> kept documents

    def keep(self, chars: int, rewrites: tuple[str, ...] = ()) -> None:
        self.docs_kept += 1
        self.chars_kept += chars
        for kind in dict.fromkeys(rewrites):      # once per kind
            self.rewritten[kind] = self.rewritten.get(kind, 0) + 1

    def drop(self, reason: str, doc: dict, chars: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        self.dropped_chars[reason] = self.dropped_chars.get(reason, 0) + chars
        text = doc.get("text")
        text = text[:REJECTED_TEXT_CHARS] if isinstance(text, str) else None
        self._offer(reason, {"id": doc.get("id"), "url": doc.get("url"), "source": doc.get("source"),
                             "reason": reason, "text": text})

    def merge(self, other: Tally) -> None:
        self.docs_in += other.docs_in
        self.chars_in += other.chars_in
        self.docs_kept += other.docs_kept
        self.chars_kept += other.chars_kept
        for reason in other.dropped:
            self.dropped[reason] = self.dropped.get(reason, 0) + other.dropped[reason]
            self.dropped_chars[reason] = self.dropped_chars.get(reason, 0) + other.dropped_chars[reason]
        for reason, samples in other.samples.items():
            for sample in samples:
                self._offer(reason, sample)
        for kind, docs in other.rewritten.items():
            self.rewritten[kind] = self.rewritten.get(kind, 0) + docs

    def _offer(self, reason: str, sample: dict) -> None:
        k = self.samples_per_reason
        if k == 0:
            return
        kept = self.samples.setdefault(reason, [])
        if len(kept) == k and doc_order(sample) >= doc_order(kept[-1]):
            return
        bisect.insort(kept, sample, key=doc_order)
        del kept[k:]

    def stats(self, shards: int) -> dict:
        return {"docs_in": self.docs_in, "chars_in": self.chars_in,
                "docs_kept": self.docs_kept, "chars_kept": self.chars_kept,
                "dropped": dict(sorted(self.dropped.items())),
                "dropped_chars": dict(sorted(self.dropped_chars.items())), "shards": shards,
                "rewritten": dict(sorted(self.rewritten.items()))}


def write(tally: Tally, out_dir: str, shards: int) -> None:
    """Writes `stats.json` and one `rejected/<reason>.jsonl` per reason that has samples."""
    storage.write_json(storage.join(out_dir, "stats.json"), tally.stats(shards))
    for reason, samples in sorted(tally.samples.items()):
        lines = "".join(json.dumps(s, ensure_ascii=False, sort_keys=True) + "\n" for s in samples)
        storage.write_text(storage.join(out_dir, "rejected", f"{file_name(reason)}.jsonl"), lines)


def file_name(reason: str) -> str:
    """A reason as a safe file name: upstream error strings are data, and could hold `/` or spaces."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in reason)
    return safe.strip(".") or "_"
