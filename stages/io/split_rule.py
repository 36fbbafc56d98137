"""Which documents are held out: one number per document id, compared with a fraction.

    if split_rule.fraction(doc["id"], path) < val_fraction: ...      # the shard stage's val split
    if split_rule.fraction(doc["id"], path) < heldout_fraction: ...  # documents the tokenizer never sees

Both stages use the same number, so with `val_fraction <= heldout_fraction` the tokenizer never trained on
a validation document; the shard stage refuses any other pair (`shard.check_no_leak`). `RULE` is the rule
in words, recorded in the shard manifest. How many tokens a fraction holds out depends on which documents
the hash puts first, not on their average length: `threshold` finds the fraction a number of tokens needs
from each document's (fraction, tokens), `lowest` the few documents that decide it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

RULE = "val when int.from_bytes(sha256(id.utf8)[:8], 'big') / 2**64 < val_fraction"


def fraction(doc_id: str | None, where: str) -> float:
    """A number in [0, 1), uniform over documents, fixed by the id: sha256(id) as a fraction.

    `where` (the shard path) names the culprit when a document has no id.
    """
    if doc_id is None:
        raise ValueError(f"a document in {where} has no id; clean must give every document one")
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big") / 2.0**64


def lowest(documents: Iterable[tuple[float, int]], tokens: int) -> list[tuple[float, int]]:
    """Of `documents` as (`fraction(id)`, tokens), the ones with the lowest fractions, in order, up to the one
    at which they first hold `tokens` tokens (all of them when they never do): all that decides the smallest
    split holding `tokens`. Mergeable, so workers can each keep their own: lowest(lowest(a) + lowest(b), t)
    == lowest(a + b, t)."""
    out, held = [], 0
    for fraction_of_id, count in sorted(documents):
        if held >= tokens:
            break
        out.append((fraction_of_id, count))
        held += count
    return out


def threshold(documents: Iterable[tuple[float, int]], tokens: int) -> float | None:
    """The split threshold at which `tokens` tokens are held out: the `fraction(id)` of the document at which
    the documents, in order of fraction, first hold `tokens` tokens. The split `fraction(id) < f` holds them
    exactly when f is above it (what a val_fraction must be, whatever the documents' lengths); None when
    all of `documents` together hold fewer."""
    held = 0
    for fraction_of_id, count in sorted(documents):
        held += count
        if held >= tokens:
            return fraction_of_id
    return None
