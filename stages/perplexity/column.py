"""The perplexity stage's files: their names, and one shard's column written and read back. No JAX here: a
selection downstream reads the column through this module.

    from stages.perplexity import column
    done.paths(column.SHARDS)                      # bpb-00000-of-00016.parquet, ... in order
    ids, bpb = column.read(path)                   # [id], (D,) float64 with NaN for null
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from stages.io import documents, storage

if TYPE_CHECKING:       # numpy loads when a column is written or read: planning imports no numpy
    import numpy as np

STATS = "stats.json"
PREFIX = "bpb"                      # the column shards' names: bpb-00003-of-00016.parquet
SHARDS = f"{PREFIX}-*.parquet"      # the same, as a pattern for `Committed.paths`


def shard_name(index: int, count: int) -> str:
    """bpb-00003-of-00016.parquet: the column of input shard `index` of `count`."""
    return documents.shard_name(index, count, prefix=PREFIX)


def write(path: str, ids: Sequence[str | None], bpb: np.ndarray) -> None:
    """One shard's column, `id` (string) and `bpb` (float64, null where NaN), written whole to a temporary
    name and renamed (`storage.write_bytes`), so a crash leaves no part of it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": pa.array(ids, pa.string()),
                      "bpb": pa.array(bpb, pa.float64(), mask=np.isnan(bpb))})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=documents.ROWS_PER_GROUP)
    storage.write_bytes(path, sink.getvalue().to_pybytes())


def read(path: str) -> tuple[list[str | None], np.ndarray]:
    """(ids, bpb (D,) float64 with NaN for null) of one `write` file."""
    import numpy as np

    rows = [row for _, row in documents.rows(path, ("id", "bpb"))]
    bpb = np.asarray([math.nan if r["bpb"] is None else r["bpb"] for r in rows], np.float64)
    return [r["id"] for r in rows], bpb
