"""One document through cleaning (pure; the Beam graphs call these inside their workers).

    reason, doc = clean_document(doc, config, build_filters(config))    # None: kept (the two passes at once)
    row = score_document(doc, config, scoring_filters(config))        # the score stage: measure, never decide
    reason, sample = decide_document(row, build_filters(config))       # clean's selection: thresholds only
    duplicate_key(doc["text"])                                            # equal keys: exact duplicates

`decide_document(score_document(doc, ...), build_filters(config))` gives `clean_document`'s reason for every
document, and the text a rejected sample shows (tests/stages/test_score.py): scoring measures every filter on
every document (`filters.measure`: a rewriter's rewrite included), selection walks the filters in order and
stops at the first reason (`filters.decide`), as `clean_document` does.
"""

from __future__ import annotations

import hashlib
import json

from stages.clean import filters, normalize
from stages.clean.config import Config

SAMPLE_CHARS = 500      # of a text kept for a rejected sample (tally.REJECTED_TEXT_CHARS)


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


def score_document(doc: dict, config: Config, scoring: tuple[filters.Filter, ...]) -> dict:
    """The score table's row of one downloaded document (stages/score/table.py, less the columns computed
    for many documents at once: bands, contaminated, quality): every filter of `scoring`
    (`config.scoring_filters`) measured, in order, on the text as the filters before it left it."""
    raw = doc.get("text")
    row = {"id": doc.get("id"), "url": doc.get("url"), "source": doc.get("source"),
           "metadata": doc.get("metadata"), "chars_in": len(raw) if isinstance(raw, str) else 0}
    if doc.get("error") or not isinstance(raw, str):
        return row | {"fixed": doc.get("error") or "null_text", "text": raw if isinstance(raw, str) else None}
    text = normalize.normalize(raw, nfc=config.unicode_nfc, control=config.remove_control_chars,
                               whitespace=config.tidy_whitespace)
    if not text:
        return row | {"fixed": "empty", "text": ""}
    doc = {**doc, "text": text}
    attrs, before, rewrites = {}, [], []
    # Past max_chars only the length is measured: Length drops it first whatever the other thresholds, and
    # a 10 MB line is never walked by the costlier filters (which makes max_chars a scoring setting:
    # score.keyed)
    for position, f in enumerate(scoring[:1] if len(text) > config.max_chars else scoring):
        attrs[type(f).__name__], new = filters.measure(f, doc)
        if new["text"] != doc["text"]:
            before.append([position, doc["text"][:SAMPLE_CHARS]])
            changes = getattr(f, "changes", None)
            rewrites.extend(changes(doc, new) if changes else (type(f).__name__,))
        doc = new
    return row | {"text": doc["text"], "chars": len(doc["text"]), "metadata": doc.get("metadata"),
                  "fixed": None, "attrs": json.dumps(attrs, sort_keys=True, allow_nan=False),
                  "before": json.dumps(before, ensure_ascii=False) if before else None,
                  "rewrites": rewrites, "dup_key": duplicate_key(doc["text"])}


def decide_document(row: dict, doc_filters: tuple[filters.Filter, ...],
                    positions: dict[str, int] | None = None) -> tuple[str | None, dict]:
    """(the first reason to drop the scored document `row`, or None, the document as `clean_document` would
    return it: for a drop, the text the filter that dropped it saw, cut to `SAMPLE_CHARS`; for a keep,
    the document to write). `positions`: each filter class's position among the scoring filters (which
    `row["before"]` counts in), default `doc_filters`' own order."""
    doc = {"id": row["id"], "text": row["text"], "url": row["url"], "source": row["source"],
           "metadata": row["metadata"]}
    if row["fixed"]:
        return row["fixed"], doc
    attrs = json.loads(row["attrs"])
    for index, f in enumerate(doc_filters):
        name = type(f).__name__
        if name not in attrs:
            raise KeyError(f"the score table has no {name} attributes (it measured {sorted(attrs)}): the "
                           "score stage's output does not match clean's filters; rerun score")
        reason = filters.decide(f, attrs[name])
        if reason:
            position = index if positions is None else positions[name]
            later = [text for at, text in json.loads(row["before"] or "[]") if at >= position]
            return reason, {**doc, "text": later[0] if later else doc["text"][:SAMPLE_CHARS]}
    return None, doc


def duplicate_key(text: str) -> bytes:
    """Documents with equal keys are duplicates: 16 bytes of blake2b, so an accidental collision among
    1e9 documents has odds of about 1e-21."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
