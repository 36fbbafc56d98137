"""The one order clean uses wherever a group of documents must pick one, or be written in a fixed order.

    survivor = min(copies, key=order.doc_order)        # exact dedup's choice among equal texts
    kept.sort(key=order.doc_order)                     # the rows of an output shard
    bisect.insort(samples, sample, key=order.doc_order)   # rejected samples (tally.py)

A content-addressed cache promises that a key names one output, so no choice may depend on which
copy arrived first: Beam's bundling differs with the number of workers. `doc_order` is a total order
over the whole record: the id first (a null id before any other), then every other column of
`stages.io.documents.COLUMNS` in order (text, url, source, error, metadata), then any other field by
name. Two records it calls equal are equal in every field, so which of them is taken changes nothing.
FineWeb shows why the whole record matters: the same id and text occur in several dumps, whose
`metadata` (dump, date, score) differ.
"""

from __future__ import annotations

from stages.io.documents import COLUMNS


def doc_order(doc: dict) -> tuple:
    """Sort key over every field of `doc`: `COLUMNS` first (id first), then the rest by name."""
    names = [*COLUMNS, *sorted(k for k in doc if k not in COLUMNS)]
    return tuple(_value_order(doc.get(name)) for name in names)


def _value_order(value) -> tuple:
    """None first, then strings; any other type (bytes, a number) by its repr, after every string."""
    if value is None:
        return (0, "")
    if isinstance(value, str):
        return (1, value)
    return (2, repr(value))
