"""The stage cache: content-addressed keys, attempt directories and the `_SUCCESS.json` commit.

Layout, for a stage `clean` whose key is `3f9a…`:

    <cache_root>/clean/3f9a…/attempt-20261123T014501-1a2b3c/   what one run wrote
    <cache_root>/clean/3f9a…/_SUCCESS.json                       written last; names the attempt

A stage is done when `_SUCCESS.json` exists and every file it lists is present in the named
attempt with the listed size. Nothing is ever renamed (GCS has no directory rename), so a crashed
attempt is just a directory no manifest points at; the next commit removes it.

The key is `sha256(stage name, VERSION, canonical JSON of the Config, upstream keys, inputs)` and
nothing else. Config fields declared with `metadata={"key": False}` (how a stage runs, such as
the Beam runner, not what it computes) stay out of the key. `inputs` is what a stage reads from
outside the cache, as its module's optional `key_inputs(config)` states it (download: a fingerprint
of its source's files); stages without one read only their upstream stages, and leave it out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fnmatch
import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from importlib import metadata as importlib_metadata
from typing import Any

from stages.io import storage

MANIFEST = "_SUCCESS.json"
LIBRARIES = ("apache-beam", "sentencepiece", "pyarrow", "numpy", "jax", "flax", "optax",
             "orbax-checkpoint", "luigi", "gin-config", "gcsfs")


# ---------------------------------------------------------------------------------------------
# Keys

def config_to_json(config: Any, *, for_key: bool = False) -> Any:
    """A JSON-able view of a (possibly nested) Config dataclass.

    With `for_key`, fields marked `metadata={"key": False}` are left out. The class name is
    included, so `source = @download.Files()` and `@download.Tfds()` never share a key.
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {"@type": type(config).__name__} | {
            f.name: config_to_json(getattr(config, f.name), for_key=for_key)
            for f in dataclasses.fields(config)
            if not (for_key and f.metadata.get("key", True) is False)
        }
    if isinstance(config, (list, tuple)):
        return [config_to_json(v, for_key=for_key) for v in config]
    if isinstance(config, Mapping):
        return {str(k): config_to_json(v, for_key=for_key) for k, v in config.items()}
    if config is None or isinstance(config, (bool, int, float, str)):
        return config
    raise TypeError(f"config value {config!r} of type {type(config).__name__} is not JSON-able")


def stage_key(stage: str, version: str, config: Any, upstream_keys: Mapping[str, str],
              inputs: Any = None) -> str:
    """The cache key. `inputs` (JSON-able) is what the stage reads from outside the cache; None, for a
    stage that reads only its upstream stages, leaves the payload (and so the key) as it was without it."""
    content = {"stage": stage, "version": version, "config": config_to_json(config, for_key=True),
               "upstream": dict(sorted(upstream_keys.items()))}
    if inputs is not None:
        content["inputs"] = inputs
    payload = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def stage_dir(cache_root: str, stage: str, key: str) -> str:
    return storage.join(cache_root, stage, key)


WORK = "work"   # <key>/work/: resumable scratch shared by every attempt of a key, deleted by the commit


# ---------------------------------------------------------------------------------------------
# What downstream stages see of a committed stage

@dataclasses.dataclass(frozen=True)
class Committed:
    """A finished stage's output, as its `_SUCCESS.json` describes it.

    Downstream stages find their inputs here, never by globbing the bucket: `paths("*.parquet")`
    returns the full paths of the listed files that match, in sorted order.
    """

    stage: str
    key: str
    path: str                 # the committed attempt directory
    files: Mapping[str, int]  # relative name -> size in bytes
    manifest: Mapping[str, Any]

    def file(self, name: str) -> str:
        if name not in self.files:
            raise FileNotFoundError(
                f"{self.stage} output {self.path} has no {name!r}; it has: {sorted(self.files)}")
        return storage.join(self.path, name)

    def paths(self, pattern: str = "*") -> list[str]:
        return [storage.join(self.path, n) for n in sorted(self.files) if fnmatch.fnmatch(n, pattern)]


def load(cache_root: str, stage: str, key: str) -> Committed | None:
    """The committed output of (stage, key), or None when it is missing or incomplete."""
    root = stage_dir(cache_root, stage, key)
    try:
        manifest = storage.read_json(storage.join(root, MANIFEST))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    path = storage.join(root, manifest["attempt"])
    present = storage.sizes(path)
    for name, size in manifest["files"].items():
        if present.get(name) != size:
            return None
    return Committed(stage, key, path, manifest["files"], manifest)


# ---------------------------------------------------------------------------------------------
# Running a stage into the cache

def run_stage(*, cache_root: str, stage: str, key: str, config: Any,
              upstream: Mapping[str, Committed], fn: Callable[[Any, Mapping[str, Committed], str, str], Any],
              extra_files: Mapping[str, str] = (), run_id: str = "") -> Committed:
    """Runs `fn(config, upstream, attempt_dir, work_dir)` in a fresh attempt and commits it.

    `work_dir` (`<key>/work/`) is scratch space that survives a failed attempt of the same key and is
    deleted by the commit: the one deliberate exception to "a crashed attempt's leftovers are never
    read". Training keeps its periodic checkpoints there, so a preempted run resumes where it stopped
    instead of starting over; everything a downstream stage reads lives in the committed attempt.

    `extra_files` (name -> text) are written into the attempt before the commit, for example the
    operative gin config. `run_id` is recorded so `--force` can tell this invocation's commit
    from an older one.
    """
    root = stage_dir(cache_root, stage, key)
    attempt = f"attempt-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    out_dir = storage.join(root, attempt)
    storage.makedirs(out_dir)
    for name, text in dict(extra_files).items():
        storage.write_text(storage.join(out_dir, name), text)
    start = time.time()
    fn(config, upstream, out_dir, storage.join(root, WORK))
    wall = time.time() - start
    files = storage.sizes(out_dir)
    if not files:
        raise RuntimeError(f"stage {stage} wrote nothing into {out_dir}")
    manifest = {
        "stage": stage,
        "key": key,
        "attempt": attempt,
        "files": files,
        "config": config_to_json(config),
        "upstream": {name: c.key for name, c in upstream.items()},
        "libraries": library_versions(),
        "wall_time_s": round(wall, 3),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "run_id": run_id,
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    storage.write_json(storage.join(root, MANIFEST), manifest)
    remove_stale_attempts(root, keep=attempt)
    committed = load(cache_root, stage, key)
    if committed is None:
        raise RuntimeError(f"stage {stage} committed {root} but its files do not match the manifest")
    return committed


def remove_stale_attempts(root: str, keep: str) -> None:
    for name in storage.listdir(root):
        if (name.startswith("attempt-") or name == WORK) and name != keep:
            storage.remove(storage.join(root, name))


def library_versions() -> dict[str, str]:
    out = {}
    for lib in LIBRARIES:
        with contextlib.suppress(importlib_metadata.PackageNotFoundError):
            out[lib] = importlib_metadata.version(lib)
    return out
