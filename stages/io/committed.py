"""A finished stage's output, as its `_SUCCESS.json` describes it: what downstream stages read.

    done = pipeline.cache.load(cache_root, "shard", key)     # a Committed, or None when not done
    done.file("manifest.json"); done.paths("train-*.bin")
    manifest_of(done, "clean", done.manifest["upstream"]["clean"])   # a commit it read, from the same cache

It lives at the bottom layer because both sides of a process boundary need it: the cache builds it from a
manifest (pipeline/cache.py), and a training worker rebuilds it from its JSON spec (stages/train/spec.py),
which may not import pipeline/.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import posixpath
from typing import Any

from stages.io import storage

MANIFEST = "_SUCCESS.json"     # a commit's manifest, written last into <cache_root>/<stage>/<key>/ (cache.py)


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


def manifest_of(beside: Committed, stage: str, key: str) -> dict[str, Any] | None:
    """The manifest of `stage`'s commit of `key` in the cache `beside` was committed to (its `upstream` names
    what that commit read: following them from an input reaches every stage a commit was made from). None when
    that cache holds no such commit (never built there, or removed), when its manifest is no JSON object, or
    when `beside` is not laid out as pipeline/cache.py lays a commit out (an output a test made by hand):
    `<cache_root>/<stage>/<key>/<attempt>/` beside `<cache_root>/<stage>/<key>/_SUCCESS.json`."""
    key_dir = storage.parent(beside.path)
    stage_dir = storage.parent(key_dir)
    laid_out = (posixpath.basename(beside.path) == beside.manifest.get("attempt")
                and posixpath.basename(key_dir) == beside.key
                and posixpath.basename(stage_dir) == stage_of(beside.stage))
    if not laid_out or not (_plain(stage) and _plain(key)):
        return None
    try:
        manifest = storage.read_json(storage.join(storage.parent(stage_dir), stage, key, MANIFEST))
    except (FileNotFoundError, ValueError):       # not committed there; a damaged manifest: nothing to follow
        return None
    return manifest if isinstance(manifest, dict) else None


def _plain(name: str) -> bool:
    """A name that stays one directory level down (a stage's, a key): what a manifest says names no path."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\")


def stage_of(node: str) -> str:
    """A node's stage: `clean[code]` (source code's own clean stage, pipeline/dag.py) -> `clean`; a stage's
    own name is its own. The one place the node naming is read; the orchestrator uses it too."""
    return node.partition("[")[0]


def source_of(node: str) -> str:
    """`clean[code]` -> `code`; "" for a node that is no source's own."""
    return node.partition("[")[2].rstrip("]")


def node_name(stage: str, source: str) -> str:
    """(`clean`, `code`) -> `clean[code]`; the stage's own name for no source."""
    return f"{stage}[{source}]" if source else stage


# The "source" of the reference model's run (pipeline/dag.py's REFERENCE): a run whose model selects another
# run's data (perplexity reads its train and tokenizer), its nodes named `<stage>[reference]`.
REFERENCE = "reference"


def by_source(inputs: dict[str, Committed], stage: str) -> dict[str, Committed]:
    """A stage's inputs of one upstream stage, by source: {"": it} in a one-source run, where the input is
    named `stage`; {"code": ..., "web": ...} when the stage reads every source's instance (`shard[code]`,
    `shard[web]`: pipeline/dag.py names them so). Sorted by source."""
    found = {source_of(name): c for name, c in inputs.items() if stage_of(name) == stage}
    if not found:
        raise KeyError(f"no {stage} among the inputs: {sorted(inputs)}")
    return dict(sorted(found.items()))
