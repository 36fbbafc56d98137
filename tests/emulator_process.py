"""Start the tests' GCS emulator (tests/gcs_emulator.py) in a process of its own and wait until it listens.

    proc, url = emulator_process.start()                       # a free loopback port, objects in memory
    proc, url = emulator_process.start(port, data_dir=tmp)     # objects on disk under tmp: a restart on the
                                                               # same port and directory finds them again
Point gcsfs at it with `STORAGE_EMULATOR_HOST=url`; stop it with `proc.terminate()`. Or, for a block:

    with emulator_process.running() as url:                    # STORAGE_EMULATOR_HOST=url inside
        ...
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gcs_emulator.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int | None = None, *, data_dir: str | None = None,
          timeout_s: float = 30) -> tuple[subprocess.Popen, str]:
    port = port or free_port()
    where = ["-q"] if data_dir else ["--in-memory"]
    env = dict(os.environ, STORAGE_BASE=data_dir) if data_dir else None
    proc = subprocess.Popen([sys.executable, LAUNCHER, "start", "--host=127.0.0.1", f"--port={port}", *where],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"the GCS emulator did not start on port {port}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def running(port: int | None = None, *, data_dir: str | None = None) -> Iterator[str]:
    """`start()`, with STORAGE_EMULATOR_HOST pointing gcsfs at it inside the block; afterwards the emulator
    is stopped and the variable is what it was."""
    proc, url = start(port, data_dir=data_dir)
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = url
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old
