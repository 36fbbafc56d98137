"""One document through the clean stage (pure; graph.py calls these inside the Beam workers).

    reason, doc = clean_document(doc, config, build_filters(config))    # None: kept
    duplicate_key(doc["text"])                                            # equal keys: exact duplicates
"""

from __future__ import annotations

import hashlib

from stages.clean import filters, normalize
from stages.clean.config import Config


def clean_document(doc: dict, config: Config, doc_filters: tuple[filters.Filter, ...],
                   rewrites: list[str] | None = None) -> tuple[str | None, dict]:
    """(reason to drop it or None to keep it, the document with its text normalized where it has one,
    and rewritten by the filters that rewrite text (`apply`, filters.py) up to where it stopped).
    `rewrites`, when given, is extended with the kinds of text rewrite made (`filters.Rewriter`)."""
    if doc.get("error"):
        return doc["error"], doc
    text = doc.get("text")
    if not isinstance(text, str):
        return "null_text", doc
    text = normalize.normalize(text, nfc=config.unicode_nfc, control=config.remove_control_chars,
                               whitespace=config.tidy_whitespace)
    doc = {**doc, "text": text}
    if not text:
        return "empty", doc
    for f in doc_filters:
        apply = getattr(f, "apply", None)
        if apply is None:
            reason = f.check(doc)
        else:
            reason, new = apply(doc)
            if rewrites is not None and new["text"] != doc["text"]:
                changes = getattr(f, "changes", None)
                rewrites.extend(changes(doc, new) if changes else (type(f).__name__,))
            doc = new
        if reason:
            return reason, doc
    return None, doc


def duplicate_key(text: str) -> bytes:
    """Documents with equal keys are duplicates: 16 bytes of blake2b, so an accidental collision among
    1e9 documents has odds of about 1e-21."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
