"""Selection by a score (`clean.KeepTop`): which of the documents the filters kept a ranking keeps.

    ranked = select.survivors(config, score_tables)          # every document the filters keep: (rank, chars)
    cut = select.cutoff(config.keep_top, ranked)             # the rank of the last one kept (keep_fraction)
    select.kept(config.keep_top, row, cut)                   # in clean's workers, per document
    select.ladder(ranked, (0.1, 0.2, 0.5))                   # make plan: documents and characters kept

A document's rank is (-score, id, text hash): the highest score first, ties broken by a total order over
what the document is, so the cut never depends on how Beam bundled the work. `keep_fraction` f keeps
exactly f * N ranks (to the nearest integer, halves up: `count`) of the N documents the filters kept; the
cut is computed before the Beam graph by reading the score tables' small columns (never the text:
attributes, id, hash, score; about 100 bytes a document in memory at once for the ranks, so ~10 GB at 1e8
documents: past that, an approximate quantile would be the step to take). `threshold` needs no cut.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from stages.clean.config import Config, KeepTop, build_filters, scoring_filters
from stages.clean.document import decide_document
from stages.score import table

# The score table's columns a rank needs (no text): what decide_document reads, less the text.
RANK_COLUMNS = ("id", "url", "source", "metadata", "fixed", "attrs", "before", "dup_key", "chars", "quality")


def score(keep_top: KeepTop, row: dict) -> float:
    """The document's score, higher ranking higher: the score table's column (a reference model's bits per
    byte negated), or for "random" a uniform draw in [0, 1) from a hash of (seed, id, text hash)."""
    if keep_top.score == "random":
        digest = hashlib.blake2b(repr((keep_top.seed, row["id"])).encode() + row["dup_key"], digest_size=8)
        return int.from_bytes(digest.digest(), "big") / 2**64
    value = row[keep_top.score]
    if value is None and keep_top.score == "bpb":     # a text of no token: nothing to rank it by
        return -math.inf
    if value is None:
        raise ValueError(f"clean.KeepTop.score={keep_top.score!r}: the score table has no {keep_top.score} "
                         f"score for document {row['id']!r}; switch on the model that computes it "
                         "(classifier.Config.positives and .negatives) or use score='random'")
    return -value if keep_top.score == "bpb" else value


def rank(keep_top: KeepTop, row: dict) -> tuple:
    """Sorts best first: (-score, id (a null id first), text hash)."""
    return (-score(keep_top, row), row["id"] is not None, row["id"] or "", row["dup_key"])


def kept(keep_top: KeepTop, row: dict, cut: tuple | None) -> bool:
    if keep_top.threshold is not None:
        value = score(keep_top, row)
        return -value <= keep_top.threshold if keep_top.score == "bpb" else value >= keep_top.threshold
    return cut is not None and rank(keep_top, row) <= cut


def rows(path: str, bpb_path: str | None, columns=table.COLUMNS):
    """The rows of one score table, each with its `bpb` from the perplexity stage's column file for that
    table (the same rows in the same order), or None without one."""
    if bpb_path is None:
        for row in table.read(path, columns):
            yield {**row, "bpb": None}
        return
    from stages.perplexity import column
    ids, bpb = column.read(bpb_path)
    count = 0
    for i, row in enumerate(table.read(path, columns)):
        if i >= len(ids) or ids[i] != row["id"]:
            raise ValueError(f"{bpb_path} does not hold the rows of {path} in order (row {i}: "
                             f"{ids[i] if i < len(ids) else 'none'!r} vs {row['id']!r}); rerun perplexity")
        value = float(bpb[i])
        count += 1
        yield {**row, "bpb": None if value != value else value}        # NaN: nothing to score
    if count != len(ids):
        raise ValueError(f"{bpb_path} holds {len(ids)} rows, {path} {count}; rerun perplexity")


def survivors(config: Config, paths: Sequence[str], bpb_paths: Sequence[str] | None = None,
              ) -> list[tuple[tuple | None, int]]:
    """(rank, characters) of every document the filters keep (before dedup), reading the score tables'
    small columns (and the perplexity columns, `bpb_paths`, one per table); rank is None without
    `config.keep_top`."""
    doc_filters = build_filters(config)
    positions = {type(f).__name__: i for i, f in enumerate(scoring_filters(config))}
    out = []
    for path, bpb_path in zip(paths, bpb_paths or [None] * len(paths)):
        for row in rows(path, bpb_path, RANK_COLUMNS):
            reason, _ = decide_document({**row, "text": ""}, doc_filters, positions)
            if reason is None:
                out.append((rank(config.keep_top, row) if config.keep_top else None, row["chars"]))
    return out


def cutoff(keep_top: KeepTop, ranked: list[tuple[tuple, int]]) -> tuple | None:
    """The rank of the last document `keep_fraction` keeps (None: it keeps none), or None for a threshold."""
    if keep_top.keep_fraction is None:
        return None
    k = count(keep_top.keep_fraction, len(ranked))
    if k == 0:
        return None
    ranks = sorted(r for r, _ in ranked)
    return ranks[k - 1]


def count(fraction: float, n: int) -> int:
    """How many of `n` documents a keep fraction keeps: f * n to the nearest integer, halves up."""
    return math.floor(fraction * n + 0.5)


def ladder(ranked: list[tuple[tuple, int]], fractions: Sequence[float]) -> list[tuple[float, int, int]]:
    """[(fraction, documents, characters)] kept at each keep fraction of `ranked` (best first)."""
    order = sorted(ranked, key=lambda rc: rc[0])
    out = []
    for f in fractions:
        k = count(f, len(order))
        out.append((f, k, sum(chars for _, chars in order[:k])))
    return out
