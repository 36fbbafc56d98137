"""A finished stage's output, as its `_SUCCESS.json` describes it: what downstream stages read.

    done = pipeline.cache.load(cache_root, "shard", key)     # a Committed, or None when not done
    done.file("manifest.json"); done.paths("train-*.bin")

It lives at the bottom layer because both sides of a process boundary need it: the cache builds it from a
manifest (pipeline/cache.py), and a training worker rebuilds it from its JSON spec (stages/train/spec.py),
which may not import pipeline/.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any

from stages.io import storage


@dataclasses.dataclass(frozen=True)
class Committed:
    """Downstream stages find their inputs here, never by globbing the bucket: `paths("*.parquet")` returns
    the full paths of the listed files that match, in sorted order."""

    stage: str
    key: str
    path: str                 # the committed attempt directory
    files: dict[str, int]     # relative name -> size in bytes
    manifest: dict[str, Any]  # the stage's _SUCCESS.json

    def file(self, name: str) -> str:
        if name not in self.files:
            raise FileNotFoundError(
                f"{self.stage} output {self.path} has no {name!r}; it has: {sorted(self.files)}")
        return storage.join(self.path, name)

    def paths(self, pattern: str = "*") -> list[str]:
        return [storage.join(self.path, n) for n in sorted(self.files) if fnmatch.fnmatch(n, pattern)]


def stage_of(node: str) -> str:
    """A node's stage: `clean[code]` (source code's own clean stage, pipeline/dag.py) -> `clean`; a stage's
    own name is its own. The one place the node naming is read; the orchestrator uses it too."""
    return node.partition("[")[0]


def source_of(node: str) -> str:
    """`clean[code]` -> `code`; "" for a node that is no source's own."""
    return node.partition("[")[2].rstrip("]")


def by_source(inputs: dict[str, Committed], stage: str) -> dict[str, Committed]:
    """A stage's inputs of one upstream stage, by source: {"": it} in a one-source run, where the input is
    named `stage`; {"code": ..., "web": ...} when the stage reads every source's instance (`shard[code]`,
    `shard[web]`: pipeline/dag.py names them so). Sorted by source."""
    found = {source_of(name): c for name, c in inputs.items() if stage_of(name) == stage}
    if not found:
        raise KeyError(f"no {stage} among the inputs: {sorted(inputs)}")
    return dict(sorted(found.items()))
