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
import re
import socket
import threading
import time
from collections.abc import Iterator

from stages.io import storage

log = logging.getLogger(__name__)

PREFIX, SUFFIX = "_lease-", ".json"
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
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(held, stop, ttl_s / 4), daemon=True,
                               name=f"lease-{held.number}")
    renewer.start()
    try:
        yield held
    finally:
        stop.set()
        renewer.join()
        with contextlib.suppress(OSError):
            storage.write_json(held.path, held.record | {"released": True, "heartbeat": time.time()})


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


def _renew(held: Held, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        held.record["heartbeat"] = time.time()
        try:
            storage.write_json(held.path, held.record)
        except OSError as e:     # storage hiccup: the next renewal tries again; ttl_s covers a few misses
            log.warning("could not renew lease %s: %s", held.path, e)


def remove_old(key_dir: str, keep: int) -> None:
    """Remove the lease files numbered below `keep` (called by the run that committed the key)."""
    for number in lease_numbers(key_dir):
        if number < keep:
            storage.remove(storage.join(key_dir, lease_name(number)))
