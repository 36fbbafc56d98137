"""File access for local paths, gs:// and every other fsspec URL (hf:// for the Hugging Face hub).

This is the only module that knows about URL schemes (a test checks that no other module holds a
scheme literal). Everything else passes plain strings
(`/tmp/cache/clean/ab12…/attempt-x/docs-00000-of-00004.parquet` or
`gs://bucket/prefix/clean/…`) and calls the functions here.

Local emulator runs: set `STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT`; gcsfs then talks to
the emulator and we pass `token="anon"` (the emulator has no auth). Also set
`GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`, or each bucket costs a 60 s gRPC time-out. TensorStore
(Orbax's array writer) ignores `STORAGE_EMULATOR_HOST`; `for_tensorstore` points it there.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import glob as _glob_module  # `glob` is this module's own function
import hashlib
import json
import logging
import os
import posixpath
import shutil
import socket
import stat
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any

# fsspec loads on the first remote path or write: local reads (all that a fully cached rerun does: manifests,
# listings, summaries) go through os, since importing fsspec costs more than those reads
if TYPE_CHECKING:
    import fsspec

SCHEME_SEPARATOR = "://"
FILE_SCHEME = "file://"
GCS_SCHEME = "gs://"
HUB_SCHEME = "hf://"


def is_local(path: str) -> bool:
    return SCHEME_SEPARATOR not in path or path.startswith(FILE_SCHEME)


def local_path(path: str) -> str:
    """A local path without its `file://` prefix (`file:///tmp/x` -> `/tmp/x`); ValueError for a URL."""
    if not is_local(path):
        raise ValueError(f"{path} is not a local path")
    return path[len(FILE_SCHEME):] if path.startswith(FILE_SCHEME) else path


def absolute(path: str) -> str:
    """A local path made absolute (relative to the working directory); URLs as they are."""
    return os.path.abspath(local_path(path)) if is_local(path) else path


def hub_url(repo_path: str) -> str:
    """The fsspec URL of a path on the Hugging Face hub: `datasets/HuggingFaceFW/fineweb` -> `hf://…`."""
    return HUB_SCHEME + repo_path.lstrip("/")


def is_hub(path: str) -> bool:
    return path.startswith(HUB_SCHEME)


def hub_commit(root: str, revision: str = "main") -> tuple[str, str]:
    """`root` (an hf:// URL of a repository or a folder in one) pinned to the commit that `revision` (a
    branch, tag or commit sha) names now, and that commit's sha. One call to the hub (`HfApi.repo_info`);
    offline it raises what huggingface_hub raises. Paths under the pinned root read that commit's files,
    whatever is pushed later: `hf://datasets/HuggingFaceFW/fineweb@<sha>/sample/10BT/000_00000.parquet`.
    """
    from huggingface_hub import HfApi

    if not is_hub(root):
        raise ValueError(f"{root} is not on the Hugging Face hub ({HUB_SCHEME}...)")
    parts = root[len(HUB_SCHEME):].strip("/").split("/")
    kinds = {"datasets": "dataset", "spaces": "space", "models": "model"}
    kind = kinds.get(parts[0])
    parts = parts[1:] if kind else parts
    if len(parts) < 2 or "@" in "/".join(parts[:2]):
        raise ValueError(f"{root} does not name a hub repository as "
                         f"{HUB_SCHEME}[datasets/]<owner>/<name>[/folder] (give the revision separately, "
                         "not as @revision)")
    repo_id, rest = "/".join(parts[:2]), parts[2:]
    sha = HfApi().repo_info(repo_id, repo_type=kind or "model", revision=revision).sha
    prefix = [next(k for k, v in kinds.items() if v == kind)] if kind and kind != "model" else []
    return HUB_SCHEME + "/".join([*prefix, f"{repo_id}@{sha}", *rest]), sha


def for_tensorstore(path: str) -> str:
    """`path` as TensorStore (Orbax's array I/O) takes it: an absolute local path or the URL.

    TensorStore ignores `STORAGE_EMULATOR_HOST` (gcsfs honours it), so when it is set and `path` is on
    GCS this also sets `TENSORSTORE_GCS_HTTP_URL`; without that, tests would write to the real GCS.
    """
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if path.startswith(GCS_SCHEME) and emulator:
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = (emulator if SCHEME_SEPARATOR in emulator
                                                  else f"http://{emulator}")
    return absolute(path)


def tensorstore_kvstore(path: str) -> str:
    """`path` (a directory) as a TensorStore kvstore URL: `file:///abs/dir/` or `gs://bucket/dir/` (with the
    emulator set up as `for_tensorstore` does)."""
    url = for_tensorstore(path).rstrip("/") + "/"
    return FILE_SCHEME + url if is_local(path) else url


def filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem for `path` and the path as that filesystem spells it."""
    import fsspec

    if is_local(path):
        return fsspec.filesystem("file"), absolute(path)
    protocol = path.split(SCHEME_SEPARATOR, 1)[0]
    options: dict[str, Any] = {}
    if protocol in ("gs", "gcs") and os.environ.get("STORAGE_EMULATOR_HOST"):
        options["token"] = "anon"
    fs = fsspec.filesystem(protocol, **options)
    return fs, fs._strip_protocol(path)


def _unstrip(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """Back from a filesystem's bare path to a full URL."""
    return fs.unstrip_protocol(path) if fs.protocol not in ("file", ("file", "local")) else path


def parent(path: str) -> str:
    """The directory holding `path` (`gs://b/x/y` -> `gs://b/x`)."""
    return os.path.dirname(path.rstrip("/")) if is_local(path) else posixpath.dirname(path.rstrip("/"))


def join(base: str, *parts: str) -> str:
    if is_local(base):
        return os.path.join(local_path(base), *parts)
    return posixpath.join(base, *parts)


def open(path: str, mode: str = "rb", **kwargs) -> IO:  # noqa: A001 - mirrors builtins.open
    """Opens a file for reading or writing; writing creates parent directories."""
    if is_local(path) and mode in ("rb", "r") and not kwargs:      # what fsspec's local files do, without it
        return builtins.open(absolute(path), mode)
    fs, p = filesystem(path)
    if is_local(path) and ("w" in mode or "a" in mode):
        os.makedirs(os.path.dirname(p), exist_ok=True)
    return fs.open(p, mode, **kwargs)


def exists(path: str) -> bool:
    if is_local(path):
        return os.path.exists(absolute(path))
    fs, p = filesystem(path)
    return fs.exists(p)


GCS_HOST = "storage.googleapis.com"
CONNECT_TIMEOUT_S = 5.0


def check_reachable(path: str) -> None:
    """Raise OSError, naming the host, when `path`'s store cannot be reached, quickly: a gs:// path's
    host (the emulator's, when STORAGE_EMULATOR_HOST is set) must resolve and accept a connection within
    CONNECT_TIMEOUT_S, before gcsfs's own retries (about 50 s offline, with a traceback per attempt) are
    tried; then `exists(path)`, with those retries' log lines held back, gives the final word. Local
    paths and other schemes go straight to `exists`."""
    if not is_local(path) and path.split(SCHEME_SEPARATOR, 1)[0] in ("gs", "gcs"):
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        server = emulator if emulator and "//" in emulator else f"//{emulator or GCS_HOST}"
        url = urllib.parse.urlsplit(server)
        host, port = url.hostname or GCS_HOST, url.port or (80 if url.scheme == "http" else 443)
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as e:
            raise OSError(f"cannot connect to {host}:{port} for {path} ({type(e).__name__}: {e})") from None
    quiet = logging.getLogger("gcsfs")
    level, quiet.level = quiet.level, logging.CRITICAL + 1
    try:
        exists(path)
    finally:
        quiet.setLevel(level)


def modified(path: str) -> float:
    """When `path` was last written, in seconds since the epoch (the store's clock for GCS)."""
    fs, p = filesystem(path)
    if is_local(path):
        return os.stat(p).st_mtime
    fs.invalidate_cache(p)
    return fs.modified(p).timestamp()


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str) -> Any:
    return json.loads(read_bytes(path))


def write_bytes(path: str, data: bytes) -> None:
    """Writes `data` so that a reader sees the old file or the whole new one, never a part.

    Local files go to a temporary name in the same directory and are renamed. A GCS object
    only becomes visible when its upload completes, so it is written in place.
    """
    fs, p = filesystem(path)
    if is_local(path):
        os.replace(_written_beside(p, data), p)
    else:
        fs.pipe_file(p, data)


def _written_beside(p: str, data: bytes) -> str:
    """`data` written and synced to a new temporary file next to the local path `p`; returns its path."""
    os.makedirs(os.path.dirname(p), exist_ok=True)
    tmp = f"{p}.tmp-{uuid.uuid4().hex}"
    with builtins.open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def create_exclusive(path: str, data: bytes) -> bool:
    """Writes `data` to `path` only if nothing is there yet, atomically: True when this call created it,
    False when the path already existed (whoever made it). Two callers racing for one path: exactly one
    gets True. Local files are written under a temporary name and hard-linked into place (a link fails
    when the name exists); a GCS object is uploaded with the precondition `ifGenerationMatch=0`, which
    GCS refuses with 412 when the object exists."""
    fs, p = filesystem(path)
    if is_local(path):
        tmp = _written_beside(p, data)
        try:
            os.link(tmp, p)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    try:
        fs.pipe_file(p, data, mode="create")
    except FileExistsError:
        return False
    fs.invalidate_cache(p)
    return True


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sizes(directory: str) -> dict[str, int]:
    """Every file under `directory`, recursively: relative posix path -> size in bytes.

    One listing call, so checking a stage's manifest on GCS costs one request, not one per file.
    """
    if is_local(directory):
        return _local_sizes(absolute(directory))
    fs, p = filesystem(directory)
    fs.invalidate_cache(p)   # another process (a Beam worker, a concurrent run) may have written
    if not fs.exists(p):
        return {}
    found = fs.find(p, detail=True)
    root = p.rstrip("/") + "/"
    out = {}
    for name, info in found.items():
        if info.get("type") == "directory":
            continue
        rel = name[len(root):] if name.startswith(root) else posixpath.basename(name)
        out[rel.replace(os.sep, "/")] = int(info["size"])
    return out


def _local_sizes(root: str) -> dict[str, int]:
    """`sizes` of a local directory (or file) as fsspec's local `find` reports them, read with os."""
    if os.path.isfile(root):
        return {os.path.basename(root): os.path.getsize(root)}
    out = {}
    for folder, _, files in os.walk(root, followlinks=True):
        for name in files:
            full = os.path.join(folder, name)
            out[os.path.relpath(full, root).replace(os.sep, "/")] = os.path.getsize(full)
    return out


def checksums(directory: str) -> dict[str, str]:
    """Every file under `directory`, recursively: relative posix path -> "md5:<base64 digest>".

    A GCS listing carries each object's MD5 (computed by GCS when the object was written), so remote
    directories cost one listing and no reads; an object without one (a composite upload) gives
    "crc32c:<base64>" instead. Local files are read and hashed.
    """
    fs, p = filesystem(directory)
    fs.invalidate_cache(p)
    if not fs.exists(p):
        return {}
    root = p.rstrip("/") + "/"
    out = {}
    for name, info in fs.find(p, detail=True).items():
        if info.get("type") == "directory":
            continue
        rel = (name[len(root):] if name.startswith(root) else posixpath.basename(name)).replace(os.sep, "/")
        if is_local(directory):
            digest = hashlib.md5(usedforsecurity=False)
            with builtins.open(name, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            out[rel] = "md5:" + base64.b64encode(digest.digest()).decode()
        elif info.get("md5Hash"):
            out[rel] = f"md5:{info['md5Hash']}"
        else:
            out[rel] = f"crc32c:{info.get('crc32c', '')}"
    return out


def listdir(directory: str) -> list[str]:
    """Names (not paths) of the direct children of `directory`, sorted; [] if it is missing."""
    fs, p = filesystem(directory)
    fs.invalidate_cache(p)   # another process (a concurrent run) may have added or removed children
    if not fs.exists(p):
        return []
    return sorted(posixpath.basename(e.rstrip("/")) for e in fs.ls(p, detail=False))


def escape(path: str) -> str:
    """`path` as a glob pattern that matches only itself, for a literal directory that a pattern extends:
    `[`, `*` and `?` are wrapped in brackets (`gs://b/run[code]` -> `gs://b/run[[]code]`); a path without
    them comes back as it is, so keys built from listings of ordinary paths do not change.

        storage.versions(storage.join(storage.escape(checkpoint_dir), "*"))   # its files, not a sibling's
    """
    return _glob_module.escape(path)


def glob(pattern: str) -> list[str]:
    """Sorted full paths (with their scheme) matching a glob such as `gs://b/data/*.jsonl.gz`."""
    fs, p = filesystem(pattern)
    fs.invalidate_cache()   # fsspec reuses filesystems and their listings: a file added since must show
    return sorted(_unstrip(fs, m) for m in fs.glob(p))


def file_sizes(pattern: str) -> dict[str, int]:
    """Every regular file matching the glob `pattern` (full path, as `glob` spells it) -> its size in bytes,
    from one listing."""
    fs, p = filesystem(pattern)
    fs.invalidate_cache()
    found = fs.glob(p, detail=True)
    return {_unstrip(fs, name): int(info.get("size") or 0) for name, info in sorted(found.items())
            if info.get("type") != "directory"}


# What identifies a file's content in a listing, best first: a GCS object's generation (every upload of
# the object gets a new one), a hub file's git blob id (a hash of its content), an S3-style ETag, checksums.
CONTENT_IDS = ("generation", "blob_id", "ETag", "etag", "md5Hash", "crc32c")
MODIFIED = ("mtime", "updated", "LastModified", "last_modified")


def versions(pattern: str) -> dict[str, str]:
    """Every file matching the glob `pattern` (full path, as `glob` spells it) -> a string that changes
    when the file is rewritten, taken from one listing: no file is opened or read, so this costs what
    `glob` costs (plus one `stat` per local file).

        local   "size=<bytes>,mtime_ns=<modification time in ns>": touching a file counts as a rewrite
                (the content is not read), and a rewrite that keeps both size and time is not seen
        gs://   "generation=<n>"
        hf://   "blob_id=<git blob sha>": the file's content, whatever else changes in the repository
        other   the first of `CONTENT_IDS` the listing has, else its size and modification time
    """
    fs, p = filesystem(pattern)
    if is_local(pattern):
        out = {}
        for path in fs.glob(p):
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode):
                out[_unstrip(fs, path)] = f"size={st.st_size},mtime_ns={st.st_mtime_ns}"
        return dict(sorted(out.items()))
    fs.invalidate_cache()
    found = fs.glob(p, detail=True)
    return {_unstrip(fs, name): _version(_unstrip(fs, name), info)
            for name, info in sorted(found.items()) if info.get("type") != "directory"}


def _version(path: str, info: dict) -> str:
    for field in CONTENT_IDS:
        if info.get(field):
            return f"{field}={info[field]}"
    for field in MODIFIED:
        if info.get(field) is not None:
            return f"size={info.get('size')},{field}={info[field]}"
    raise ValueError(f"cannot tell whether {path} changed without reading it: its listing has only "
                     f"{sorted(info)}; expected one of {', '.join(CONTENT_IDS + MODIFIED)}")


def remove(path: str) -> None:
    """Removes a file or a whole directory tree; a missing path (or one a concurrent removal got to first) is
    fine, any other failure raises. `path` is taken literally, `[`, `*` and `?` included:

        storage.remove("gs://bucket/run[code]/clean/3f9a…/attempt-20261123T014501-1a2b3c")

    fsspec's `rm` would not do: it reads every path that holds one of those characters as a glob, even a
    list of exact paths, so on a root such as `gs://b/faults/0003-clean[code]-gcs` it matched nothing and
    raised FileNotFoundError. A GCS tree is instead listed by prefix (`find`, no pattern) and each object
    it holds deleted by its exact name, `REMOVE_CONCURRENCY` requests at a time."""
    if is_local(path):
        _remove_local(absolute(path))
        return
    fs, p = filesystem(path)
    fs.invalidate_cache(p)      # another process may have written under it since this one last listed
    objects = fs.find(p)        # the object `p`, or every object under `p/`: a listing by prefix
    try:
        _delete_exactly(fs, objects)
    finally:
        fs.invalidate_cache(p)


REMOVE_CONCURRENCY = 32     # delete requests in flight at once (one request per object)


def _remove_local(p: str) -> None:
    """`remove` of a local path: a file, a link or a directory tree (os calls take names literally)."""
    while os.path.lexists(p):
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.remove(p)
        except FileNotFoundError:   # a concurrent removal took part of it: the next pass removes the rest
            continue


def _delete_exactly(fs: fsspec.AbstractFileSystem, names: Sequence[str]) -> None:
    """Deletes each object of `names` by its exact name (no pattern is expanded); an object already gone is
    fine. Any other failure raises OSError naming the object and how many others failed."""
    import asyncio

    from fsspec import asyn

    if not names:
        return
    if not getattr(fs, "async_impl", False):
        outcomes: list[BaseException | None] = []
        for name in names:
            try:
                fs.rm_file(name)
                outcomes.append(None)
            except Exception as e:  # noqa: BLE001 - collected, then raised below naming the object
                outcomes.append(e)
    else:
        async def each() -> list:
            limit = asyncio.Semaphore(REMOVE_CONCURRENCY)

            async def one(name: str) -> None:
                async with limit:
                    await fs._rm_file(name)

            return await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
        outcomes = asyn.sync(fs.loop, each)
    failed = [(n, e) for n, e in zip(names, outcomes) if isinstance(e, BaseException)
              and not isinstance(e, FileNotFoundError) and "No such object" not in str(e)]
    if failed:
        name, error = failed[0]
        raise OSError(f"cannot delete {_unstrip(fs, name)} ({type(error).__name__}: {error})"
                      + (f"; {len(failed) - 1} more objects were not deleted" if len(failed) > 1 else "")
                      ) from error


def makedirs(path: str) -> None:
    fs, p = filesystem(path)
    fs.makedirs(p, exist_ok=True)


@contextlib.contextmanager
def local_files(paths: Sequence[str]) -> Iterator[list[str]]:
    """Local filenames holding the bytes of `paths`, in order, for code that needs a real file
    (memory-mapped token shards): local paths come back as they are, remote ones are copied into a
    temporary directory that is deleted when the block ends, however it ends.

        with storage.local_files(shard.paths("train-*.bin")) as files:
            tokens = llmc.read(files[0], mmap=True)
    """
    paths = list(paths)
    if all(is_local(p) for p in paths):
        yield [local_path(p) for p in paths]
        return
    with tempfile.TemporaryDirectory(prefix="refinery-files-") as tmp:
        out = []
        for i, path in enumerate(paths):
            if is_local(path):
                out.append(local_path(path))
                continue
            fs, remote = filesystem(path)
            local = os.path.join(tmp, f"{i:05d}-{posixpath.basename(path.rstrip('/'))}")
            fs.get_file(remote, local)
            if os.path.getsize(local) != fs.size(remote):
                raise OSError(f"copying {path} to {local} gave {os.path.getsize(local)} bytes, "
                              f"not {fs.size(remote)}")
            out.append(local)
        yield out


def upload(source: str, path: str) -> None:
    """Copies the local file `source` to `path` (any scheme)."""
    if is_local(path):
        dest = local_path(path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(source, dest)
        return
    fs, p = filesystem(path)
    fs.put_file(source, p)


def read_scheme_problem(path: str) -> str:
    """Why `path` is not somewhere inputs are read from (a local path, gs://bucket/..., hf://owner/name...),
    in words naming those, or ""."""
    if is_local(path) or path.startswith((GCS_SCHEME, HUB_SCHEME)):
        return ""
    return (f"{path!r}: expected a local path, {GCS_SCHEME}bucket/path or {HUB_SCHEME}owner/name[@<commit>]")


def scheme_problem(path: str) -> str:
    """Why `path` cannot hold files this pipeline writes (the cache root), in words that name the kinds that
    can, or "" when it can: a local path (or file:///path) or gs://bucket/prefix. Other fsspec URLs (hf://)
    may be read from, never written to.

        storage.scheme_problem("s4://bucket/x")   # "unknown URL scheme 's4'; expected a local path or ..."
    """
    if is_local(path):
        return ""
    scheme, _, rest = path.partition(SCHEME_SEPARATOR)
    kinds = f"a local path or {GCS_SCHEME}bucket/prefix"
    if scheme in ("gs", "gcs"):
        return "" if rest.strip("/") else f"{path!r} names no bucket; expected {kinds}"
    import fsspec

    if scheme in fsspec.available_protocols():
        return f"{scheme}{SCHEME_SEPARATOR} can be read from but is not written to here; expected {kinds}"
    return f"unknown URL scheme {scheme!r}; expected {kinds}"


def existing_directory(path: str) -> str:
    """The local directory that holds `path` now or would hold it once made: `path` itself when it exists,
    else the nearest directory above it that does. NotADirectoryError, naming it, when that is a regular file
    (nothing can ever be made under it). URLs come back as they are (a bucket has no directories)."""
    if not is_local(path):
        return path
    directory = absolute(path)
    while not os.path.exists(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory} is a file, not a directory")
    return directory


def unwritable(path: str) -> str:
    """Why no file can be made under the local directory `path` (`check_writable`), as "<reason>: <directory>"
    (the probe's own name says nothing to a user), or "" when one can."""
    try:
        check_writable(path)
    except OSError as e:
        return f"{e.strerror}: {os.path.dirname(e.filename)}" if e.strerror and e.filename else str(e)
    return ""


def check_writable(path: str) -> None:
    """Raise OSError (naming the directory and the reason) when files cannot be made under the local
    directory `path`: a probe file is created and removed in `existing_directory(path)` (so nothing is left
    behind, not even `path` itself), which shows a read-only directory, one under a regular file or a full
    disk before any work starts. URLs are not probed: writing an object costs a request, and
    `check_reachable` has already reached the bucket."""
    if not is_local(path):
        return
    probe = os.path.join(existing_directory(path), f".refinery-write-probe-{uuid.uuid4().hex}")
    with builtins.open(probe, "xb") as f:
        f.write(b"probe")
    os.remove(probe)
