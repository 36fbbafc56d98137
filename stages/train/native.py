"""What native libraries print on file descriptor 2, held back where it is noise.

    with native.stderr_captured() as said:
        ...                                  # libtpu's C++ logging goes to a temporary file
    text = said()                            # after the block: all of it, to show when it matters

    worker.init_distributed() -> native.backends_initialized()   # JAX's platforms, probed quietly

libtpu (installed with the `dev` extra so `make plan` can compile for TPU slices) loads with JAX on any
machine and, where there is no TPU, prints a dozen lines from C++ (accelerator type, worker hostnames,
`E0000 ... INVALID_ARGUMENT`) and JAX logs "Unable to initialize backend 'tpu'". On a laptop or CI
machine that is every training run's first output: `backends_initialized` replaces it with one line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile

log = logging.getLogger(__name__)
XLA_BRIDGE_LOGGER = "jax._src.xla_bridge"     # where JAX warns that a platform failed to initialize


@contextlib.contextmanager
def stderr_captured():
    """Hold what native code writes to file descriptor 2 while the block runs; yields a function that
    returns it (complete once the block has ended)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        text = ""

        def said() -> str:
            return text

        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")


def backends_initialized() -> str:
    """Initialize JAX's platforms (the first `jax.devices()`) and return the platform in use. Unless
    JAX_PLATFORMS names the platforms (then nothing is probed), a TPU probe that found no TPU is one INFO
    line instead of libtpu's output; anything else native code printed is passed on as it was."""
    import jax

    if os.environ.get("JAX_PLATFORMS"):
        return jax.devices()[0].platform
    bridge = logging.getLogger(XLA_BRIDGE_LOGGER)
    level = bridge.level
    bridge.setLevel(logging.ERROR)
    try:
        with stderr_captured() as said:
            platform = jax.devices()[0].platform
    except Exception:
        sys.stderr.write(said())
        raise
    finally:
        bridge.setLevel(level)
    text = said()
    if platform != "tpu" and "TPU" in text:
        log.info("libtpu is installed but found no TPU here: running on %s (JAX_PLATFORMS=%s skips the "
                 "probe)", platform, platform)
    elif text.strip():
        sys.stderr.write(text)
    return platform
