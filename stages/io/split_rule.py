"""Which documents are held out: one number per document id, compared with a fraction.

    if split_rule.fraction(doc["id"], path) < val_fraction: ...      # the shard stage's val split
    if split_rule.fraction(doc["id"], path) < heldout_fraction: ...  # documents the tokenizer never sees

Both stages use the same number, so with `val_fraction <= heldout_fraction` the tokenizer never trained on
a validation document; the shard stage refuses any other pair (`shard.check_no_leak`). `RULE` is the rule
in words, recorded in the shard manifest.
"""

from __future__ import annotations

import hashlib

RULE = "val when int.from_bytes(sha256(id.utf8)[:8], 'big') / 2**64 < val_fraction"


def fraction(doc_id: str | None, where: str) -> float:
    """A number in [0, 1), uniform over documents, fixed by the id: sha256(id) as a fraction.

    `where` (the shard path) names the culprit when a document has no id.
    """
    if doc_id is None:
        raise ValueError(f"a document in {where} has no id; clean must give every document one")
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big") / 2.0**64
