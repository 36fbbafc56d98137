"""Per-key leases: at most one run computes a stage's key at a time; the others wait for its commit.

    with lease.hold(key_dir, owner="run 3f2a…") as held:      # waits while another live run holds it
        ...                                                   # compute, then before committing:
        held.check()                                          # raises LeaseLost if it was taken over

A lease is a small JSON file in the key's directory, numbered: `<key>/_lease-000001.json`, then
`_lease-000002.json` for the next holder. The highest number is the current lease. It says who holds
it (host, pid, an owner string), when it was last renewed (`heartbeat`, the holder's clock) and
whether it was `released`. A lease is live while it is not released, its heartbeat is younger than
`ttl_s`, and (on this host) its process exists: a run killed with SIGKILL on this machine frees its
keys at once; a run on another host that vanished frees them after `ttl_s`.

Taking a key: when the current lease is absent, released or dead, create the next number with an
exclusive create (`storage.create_exclusive`: a hard link locally, `ifGenerationMatch=0` on GCS), so
of two runs that both saw lease 3 expire exactly one gets lease 4 and the other sees it live and
waits. Nothing is ever deleted or overwritten to take a key, so no run can remove another's fresh
lease. The holder renews its own file from a thread every `ttl_s / 4`; a holder that finds a higher
number than its own has been taken over (it stalled for longer than `ttl_s`) and must not commit.
Old lease files are removed by the holder that commits (`cache.run_stage`).

Pins: a run that reads a committed attempt (a downstream stage reading its inputs) holds a pin on it,
`<key>/_pin-<random>.json` (the attempt it reads, owner, host, pid, heartbeat, ttl), live by the same rule
as a lease and renewed the same way. A commit removes the attempts it supersedes only when no live pin
names them (`pinned`), so a forced rerun never deletes an attempt a concurrent run is reading; the last
reader of a superseded attempt removes it when it lets go (`cache.reading`).

Why not the Luigi central scheduler alone: it dedupes tasks only among the runs that use the same
scheduler process, and `make pipeline` uses a local scheduler per run. Two users (or a user and a
sweep, or two TPU hosts) pointing at one bucket share nothing but the bucket, so the lock has to
live there too (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import posixpath
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator

from stages.io import storage

log = logging.getLogger(__name__)

PREFIX, SUFFIX = "_lease-", ".json"
PIN = "_pin-"           # <key>/_pin-<random>.json: a live reader of one committed attempt
_NAME = re.compile(rf"^{PREFIX}(\d+){re.escape(SUFFIX)}$")
TTL_S = 60.0            # a lease whose heartbeat is older than this is dead (another host's clock)
POLL_S = 1.0            # how often a waiting run looks again


class LeaseLost(RuntimeError):
    """This run's lease was taken over by another run: it must not commit."""


def lease_name(number: int) -> str:
    return f"{PREFIX}{number:06d}{SUFFIX}"


def lease_numbers(key_dir: str) -> list[int]:
    """The numbers of the lease files in `key_dir`, ascending."""
    return sorted(int(m.group(1)) for name in storage.listdir(key_dir) if (m := _NAME.match(name)))


@dataclasses.dataclass
class Held:
    key_dir: str
    number: int
    record: dict

    @property
    def path(self) -> str:
        return storage.join(self.key_dir, lease_name(self.number))

    def check(self) -> None:
        """Raise LeaseLost when a later lease exists: another run took this key over."""
        newer = [n for n in lease_numbers(self.key_dir) if n > self.number]
        if newer:
            raise LeaseLost(f"{self.key_dir}: this run's lease {self.number} was taken over by lease "
                            f"{newer[-1]} (this run stalled for longer than {self.record['ttl_s']:.0f} s?); "
                            "not committing")


def read(path: str) -> dict | None:
    """A lease file's record, or None when it cannot be read as one (being written, or damaged)."""
    try:
        record = json.loads(storage.read_bytes(path))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("heartbeat"), (int, float)) else None


def live(record: dict | None, now: float | None = None) -> bool:
    """Whether a lease record still holds its key (see the module docstring)."""
    if record is None or record.get("released"):
        return False
    now = time.time() if now is None else now
    if now - record["heartbeat"] > float(record.get("ttl_s", TTL_S)):
        return False
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        return _process_exists(record["pid"])
    return True


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # another user's process: it exists
        return True
    return True


@contextlib.contextmanager
def hold(key_dir: str, *, owner: str, ttl_s: float = TTL_S, poll_s: float = POLL_S) -> Iterator[Held]:
    """Wait until this run holds `key_dir`'s lease, renew it while the block runs, release it after."""
    held = acquire(key_dir, owner=owner, ttl_s=ttl_s, poll_s=poll_s)
    try:
        with _renewed(held.path, held.record, ttl_s):
            yield held
    finally:
        with contextlib.suppress(OSError):
            storage.write_json(held.path, held.record | {"released": True, "heartbeat": time.time()})


@contextlib.contextmanager
def pin(key_dir: str, attempt: str, *, owner: str, ttl_s: float = TTL_S) -> Iterator[str]:
    """Mark `attempt` (a committed attempt's name) as being read until the block ends; yields the pin's path.
    The caller checks, after pinning, that the manifest still names `attempt` (see `cache.reading`)."""
    path = storage.join(key_dir, f"{PIN}{uuid.uuid4().hex[:12]}{SUFFIX}")
    record = {"attempt": attempt, "owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
              "ttl_s": ttl_s, "heartbeat": time.time()}
    storage.write_json(path, record)
    try:
        with _renewed(path, record, ttl_s):
            yield path
    finally:
        try:
            storage.remove(path)
        except OSError as e:    # a pin left behind dies with its heartbeat (ttl_s); the next commit prunes it
            log.warning("could not remove the pin %s (%s: %s); it expires %.0f s after its last heartbeat",
                        path, type(e).__name__, e, ttl_s)


def pinned(key_dir: str, *, prune: bool = False) -> set[str]:
    """The attempts of `key_dir` that a live pin names. With `prune`, the files of dead pins (their reader
    was killed) are removed on the way (the committing run does this)."""
    out = set()
    for name in storage.listdir(key_dir):
        if name.startswith(PIN) and name.endswith(SUFFIX):
            path = storage.join(key_dir, name)
            record = read(path)
            if live(record):
                out.add(str(record.get("attempt")))
            elif prune and not (record is None and _young(path, TTL_S)):   # unreadable, young: being written
                storage.remove(path)
    return out


def acquire(key_dir: str, *, owner: str, ttl_s: float = TTL_S, poll_s: float = POLL_S) -> Held:
    waited_for = None
    while True:
        numbers = lease_numbers(key_dir)
        current = numbers[-1] if numbers else 0
        record = read(storage.join(key_dir, lease_name(current))) if current else None
        if current and record is None and _young(storage.join(key_dir, lease_name(current)), ttl_s):
            time.sleep(poll_s)          # being written this instant (a GCS upload), or damaged: look again
            continue
        if not live(record):
            mine = {"owner": owner, "host": socket.gethostname(), "pid": os.getpid(), "ttl_s": ttl_s,
                    "heartbeat": time.time(), "acquired": time.time()}
            if storage.create_exclusive(storage.join(key_dir, lease_name(current + 1)),
                                        json.dumps(mine, sort_keys=True).encode()):
                if waited_for is not None:
                    log.info("%s: free after waiting for %s", key_dir, waited_for)
                return Held(key_dir, current + 1, mine)
            continue                    # another run took that number first: read it and wait
        if waited_for != record.get("owner"):
            waited_for = record.get("owner")
            log.warning("%s is being computed by another run (%s, host %s, pid %s); waiting for it to "
                        "commit or stop", key_dir, record.get("owner"), record.get("host"), record.get("pid"))
        time.sleep(poll_s)


def _young(path: str, ttl_s: float) -> bool:
    """An unreadable lease file counts as live for `ttl_s` after it was last written."""
    with contextlib.suppress(OSError):
        return time.time() - storage.modified(path) < ttl_s
    return False


@contextlib.contextmanager
def _renewed(path: str, record: dict, ttl_s: float) -> Iterator[None]:
    """Renews `record` (a lease's or a pin's) at `path` every `ttl_s / 4` from a thread during the block."""
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(path, record, stop, ttl_s / 4), daemon=True,
                               name=f"renew {posixpath.basename(path)}")
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()


def _renew(path: str, record: dict, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        record["heartbeat"] = time.time()
        try:
            storage.write_json(path, record)
        except OSError as e:     # storage hiccup: the next renewal tries again; ttl_s covers a few misses
            log.warning("could not renew %s: %s", path, e)


def remove_old(key_dir: str, keep: int) -> None:
    """Remove the lease files numbered below `keep` (called by the run that committed the key)."""
    for number in lease_numbers(key_dir):
        if number < keep:
            storage.remove(storage.join(key_dir, lease_name(number)))
