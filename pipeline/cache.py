"""The stage cache: content-addressed keys, attempt directories and the `_SUCCESS.json` commit.

Layout, for a stage `clean` whose key is `3f9a…`:

    <cache_root>/clean/3f9a…/attempt-20261123T014501-1a2b3c/   what one run wrote
    <cache_root>/clean/3f9a…/_SUCCESS.json                       written last; names the attempt

A stage is done when `_SUCCESS.json` exists, reads as a manifest (a damaged one is "not done", with a
warning naming it), and every file it lists is present in the named attempt with the listed size.
Nothing is ever renamed (GCS has no directory rename), so a crashed attempt is just a directory no
manifest points at; the next commit removes it.

One run at a time computes a key: `run_stage` holds the key's lease (`lease.py`) from before it
creates its attempt until after it commits, and a second run of the same key waits for it and then
reuses its commit. So the commit that removes other attempts never removes one that a live run is
still writing, and a manifest is only ever written by the run that holds the key.

A run reads an upstream stage through `reading`, which pins the committed attempt (`lease.pin`) for as
long as the downstream stage runs: a concurrent forced run may commit the key anew meanwhile, but it
leaves a pinned attempt in place, and the last reader removes it when it lets go. A forced run
(`run_stage(since=...)`) reuses a commit only when it was made under a lease taken after the run began.

The key is `sha256(stage name, VERSION, canonical JSON of the Config, upstream keys, inputs)` and
nothing else. Config fields declared with `metadata={"key": False}` (how a stage runs, such as
the Beam runner, not what it computes) stay out of the key. `inputs` is what a stage reads from
outside the cache, as its module's optional `key_inputs(config)` states it (download: a fingerprint
of its source's files); stages without one read only their upstream stages, and leave it out.
The manifest also records the code that built the entry (its "code": the checkout's commit and the stage's
source hash, pipeline/provenance.py), outside the key: `status` marks an entry whose code differs from now.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import posixpath
import re
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata as importlib_metadata
from typing import Any

from pipeline import lease, provenance
from stages.io import storage
from stages.io.committed import MANIFEST, Committed

log = logging.getLogger(__name__)
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


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def stage_dir(cache_root: str, stage: str, key: str) -> str:
    """`<cache_root>/<stage>/<key>`; a stage name or key that is not a plain name (a separator, `..`, an
    empty string) is refused, so nothing a config or a manifest says can write outside the cache root."""
    for what, name in (("stage", stage), ("key", key)):
        if not _NAME.fullmatch(name) or ".." in name:
            raise ValueError(f"{what} {name!r} is not a plain name (letters, digits, _ . -): refusing to "
                             f"write outside the cache root {cache_root}")
    return storage.join(cache_root, stage, key)


# Names a stage whose run this process kills (SIGKILL) after every output file is written and before the
# manifest: the one instant a kill at random times rarely hits. Set only by tests/faults.
KILL_BEFORE_COMMIT = "REFINERY_KILL_BEFORE_COMMIT"
ATTEMPT = "attempt-"   # <key>/attempt-<UTC time>-<random>/: what one run wrote
WORK = "work"   # <key>/work/: resumable scratch shared by every attempt of a key, deleted by the commit


# ---------------------------------------------------------------------------------------------
# What downstream stages see of a committed stage

def load(cache_root: str, stage: str, key: str) -> Committed | None:
    """The committed output of (stage, key), or None when it is missing, incomplete or its manifest is
    damaged (logged as a warning naming the file: the stage is rebuilt by the next run that needs it).
    A manifest that changed while its files were being listed (a concurrent commit of the key, which may
    remove the attempt it replaced) is read again, so a recommit never reads as "not done"."""
    root = stage_dir(cache_root, stage, key)
    path = storage.join(root, MANIFEST)
    raw = _read_manifest(path)
    while raw is not None:
        manifest, problem = parse_manifest(raw)
        if problem:
            log.warning("%s: %s; %s is not done and will be rebuilt", path, problem, stage)
            return None
        attempt = storage.join(root, manifest["attempt"])
        try:
            present = storage.sizes(attempt)
        except FileNotFoundError:     # removed while listed
            present = {}
        if all(present.get(name) == size for name, size in manifest["files"].items()):
            return Committed(stage, key, attempt, manifest["files"], manifest)
        again = _read_manifest(path)
        raw = again if again != raw else None
    return None


def _read_manifest(path: str) -> bytes | None:
    try:
        return storage.read_bytes(path)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def reading(cache_root: str, stage: str, key: str, *, owner: str) -> Iterator[Committed | None]:
    """The committed output of (stage, key), as `load` gives it, pinned (`lease.pin`) while the block runs,
    so that no commit removes its attempt meanwhile; None when the stage is not done.

        with cache.reading(root, "tokenizer", key, owner="run 3f2a… of shard") as tokenizer:
            ...   # tokenizer.file("tokenizer.model") stays readable until the block ends

    The pin is made, then the manifest is read again: a commit that landed in between (and may already have
    removed the attempt) is pinned instead. On the way out, an attempt that a newer commit superseded and
    no other live pin names is removed (the last reader cleans up what the commit had to leave)."""
    root = stage_dir(cache_root, stage, key)
    with contextlib.ExitStack() as stack:
        done = load(cache_root, stage, key)
        while done is not None:
            attempt = done.manifest["attempt"]
            stack.enter_context(lease.pin(root, attempt, owner=owner))
            again = load(cache_root, stage, key)
            if again is not None and again.manifest["attempt"] == attempt:
                break
            stack.close()             # recommitted (or undone) before the pin was seen: pin that instead
            done = again
        try:
            yield done
        finally:
            stack.close()
            if done is not None:
                _remove_if_superseded(root, done.manifest["attempt"])


def _remove_if_superseded(root: str, attempt: str) -> None:
    """Removes `attempt` (once committed) when the manifest now names another one and no live pin names it."""
    raw = _read_manifest(storage.join(root, MANIFEST))
    named = parse_manifest(raw)[0].get("attempt") if raw is not None else None
    if named and named != attempt and attempt not in lease.pinned(root):
        storage.remove(storage.join(root, attempt))


def parse_manifest(raw: bytes) -> tuple[dict, str]:
    """(manifest, "") for the bytes of a well-formed `_SUCCESS.json`, else ({}, what is wrong with it).
    Well-formed: a UTF-8 JSON object whose `attempt` names a directory directly inside the key
    (`attempt-…`, no separators) and whose `files` maps relative paths that stay inside it (no `..`,
    no leading `/`) to sizes in bytes, so no manifest can send a reader outside its key."""
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return {}, f"not a JSON manifest ({type(e).__name__}: {str(e)[:80]})"
    if not isinstance(manifest, dict):
        return {}, f"a manifest is a JSON object, not {type(manifest).__name__}"
    attempt, files = manifest.get("attempt"), manifest.get("files")
    if not (isinstance(attempt, str) and attempt.startswith(ATTEMPT) and "/" not in attempt
            and "\\" not in attempt):
        return {}, f"'attempt' is {attempt!r}, not the name of an {ATTEMPT}* directory"
    if not isinstance(files, dict) or not files:
        return {}, "'files' is missing or empty"
    for name, size in files.items():
        parts = posixpath.normpath(name).split("/")
        if name.startswith("/") or ".." in parts or not isinstance(size, int) or isinstance(size, bool) \
                or size < 0:
            return {}, f"'files' entry {name!r}: {size!r} is not a relative path in the attempt and a size"
    return manifest, ""


# ---------------------------------------------------------------------------------------------
# Running a stage into the cache

def run_stage(*, cache_root: str, stage: str, key: str, config: Any,
              upstream: Mapping[str, Committed], fn: Callable[[Any, Mapping[str, Committed], str, str], Any],
              extra_files: Mapping[str, str] = (), run_id: str = "", since: int | None = None,
              lease_ttl_s: float = lease.TTL_S) -> Committed:
    """Runs `fn(config, upstream, attempt_dir, work_dir)` in a fresh attempt and commits it, holding the
    key's lease throughout; when the key is committed once this run holds the lease (another run committed
    it while this one waited), returns that commit instead of running. With `since` (a lease number, as
    `lease_now` gave it when a forced run began), only a commit made under a later lease is taken: one made
    during the forced run, by it or by a concurrent run; an older one is computed again.

    `work_dir` (`<key>/work/`) is scratch space that survives a failed attempt of the same key and is
    deleted by the commit: the one deliberate exception to "a crashed attempt's leftovers are never
    read". Training keeps its periodic checkpoints there, so a preempted run resumes where it stopped
    instead of starting over; everything a downstream stage reads lives in the committed attempt.

    `extra_files` (name -> text) are written into the attempt before the commit, for example config.gin
    (what the key covers, as gin). `run_id`, the lease number and the code that ran (`provenance.code`: the
    checkout's commit, the stage's source hash; not in the key) are recorded in the manifest.

    Upstream attempts should be pinned (`reading`) for as long as this runs, so a concurrent forced run
    cannot remove them. The commit removes the attempts it supersedes except those a live pin names.
    """
    root = stage_dir(cache_root, stage, key)
    with lease.hold(root, owner=f"run {run_id or uuid.uuid4().hex} of {stage}", ttl_s=lease_ttl_s) as held:
        if (done := load(cache_root, stage, key)) is not None and (since is None or made_after(done, since)):
            log.info("%s %s: committed by another run while this one waited; reusing it", stage, key[:12])
            lease.remove_old(root, keep=held.number)
            return done
        attempt = f"{ATTEMPT}{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
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
            "checksums": storage.checksums(out_dir),      # what `verify` (status --verify) compares
            "config": config_to_json(config),
            "upstream": {name: c.key for name, c in upstream.items()},
            "libraries": library_versions(),
            "code": provenance.code(stage),     # the commit and the stage's source hash (`status` compares)
            "wall_time_s": round(wall, 3),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_id": run_id,
            "lease": held.number,         # what a forced run compares with the lease it saw when it began
            "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        held.check()          # taken over while this run stalled: the other run owns the key now
        if os.environ.get(KILL_BEFORE_COMMIT) == stage:     # the fault-injection harness (tests/faults)
            os.kill(os.getpid(), signal.SIGKILL)
        storage.write_json(storage.join(root, MANIFEST), manifest)
        remove_stale_attempts(root, keep=attempt)
        lease.remove_old(root, keep=held.number)
    committed = load(cache_root, stage, key)
    if committed is None:
        raise RuntimeError(f"stage {stage} committed {root} but its files do not match the manifest")
    return committed


def lease_now(cache_root: str, stage: str, key: str) -> int:
    """The number of the key's newest lease (0 when it has none): what a forced run notes when it begins, so
    that it later takes only a commit made under a lease after it (`run_stage(since=...)`, `made_after`)."""
    numbers = lease.lease_numbers(stage_dir(cache_root, stage, key))
    return numbers[-1] if numbers else 0


def made_after(done: Committed, lease_number: int) -> bool:
    """Whether `done` was committed under a lease numbered above `lease_number` (taken after it)."""
    made = done.manifest.get("lease")
    return isinstance(made, int) and made > lease_number


def verify(done: Committed) -> list[str]:
    """What is wrong with a committed stage's files beyond their sizes (which `load` checks): each file
    whose checksum no longer matches the manifest's, named; [] when all match, or when the manifest
    predates checksums (nothing to compare)."""
    recorded = done.manifest.get("checksums") or {}
    now = storage.checksums(done.path) if recorded else {}
    return [f"{storage.join(done.path, name)}: checksum {now.get(name, 'missing')} != recorded {want}"
            for name, want in sorted(recorded.items()) if now.get(name) != want]


def uncommit(cache_root: str, stage: str, key: str) -> str:
    """Turns a damaged commit back into "not done": its manifest moves to `_DAMAGED-<UTC time>.json` (kept
    for a look), so the next run that needs the stage rebuilds it. Returns the kept manifest's path."""
    root = stage_dir(cache_root, stage, key)
    kept = storage.join(root, f"{DAMAGED}{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}.json")
    storage.write_bytes(kept, storage.read_bytes(storage.join(root, MANIFEST)))
    storage.remove(storage.join(root, MANIFEST))
    return kept


DAMAGED = "_DAMAGED-"   # <key>/_DAMAGED-<time>.json: a manifest `uncommit` set aside


def damaged(cache_root: str, stage: str, key: str) -> bool:
    """Whether (stage, key) was committed and that commit no longer holds: its manifest is there but `load`
    does not take it (it does not parse, or a file it lists is missing or of another size), or `uncommit`
    (`status --verify`) set it aside and nothing was committed since. A key directory removed whole (to save
    space) is not damaged, only absent. What was built from a damaged stage is rebuilt with it
    (`pipeline.plan.to_run`, `tasks.build`), as after `--force`."""
    names = storage.listdir(stage_dir(cache_root, stage, key))
    if MANIFEST in names:
        return load(cache_root, stage, key) is None
    return any(name.startswith(DAMAGED) for name in names)


def garbage(cache_root: str) -> list[str]:
    """The attempt directories no manifest names and no live pin names, under keys that no live lease holds:
    what a crashed or superseded run left. A key's `work/` (a preempted training run's checkpoints, which
    its rerun resumes from) is not garbage."""
    out = []
    for stage in storage.listdir(cache_root):
        for key in storage.listdir(storage.join(cache_root, stage)):
            root = storage.join(cache_root, stage, key)
            names = storage.listdir(root)
            if not any(n.startswith(ATTEMPT) for n in names):
                continue
            numbers = lease.lease_numbers(root)
            if numbers and lease.live(lease.read(storage.join(root, lease.lease_name(numbers[-1])))):
                continue
            named = None
            if MANIFEST in names:
                with contextlib.suppress(OSError):
                    named = parse_manifest(storage.read_bytes(storage.join(root, MANIFEST)))[0].get("attempt")
            read = lease.pinned(root)
            out += [storage.join(root, n) for n in names
                    if n.startswith(ATTEMPT) and n != named and n not in read]
    return out


def remove_stale_attempts(root: str, keep: str) -> None:
    """Remove every attempt but `keep` and those a live pin names (a concurrent downstream stage reads
    them; its `reading` removes them after), and the scratch `work/`. Called only by the run that holds the
    key's lease and has just written its manifest, so no other attempt belongs to a live writer, and a
    reader that pins one from now on finds the new manifest and reads that instead."""
    read = lease.pinned(root, prune=True)
    for name in storage.listdir(root):
        if (name.startswith(ATTEMPT) or name == WORK) and name != keep and name not in read:
            storage.remove(storage.join(root, name))


def library_versions() -> dict[str, str]:
    out = {}
    for lib in LIBRARIES:
        with contextlib.suppress(importlib_metadata.PackageNotFoundError):
            out[lib] = importlib_metadata.version(lib)
    return out
