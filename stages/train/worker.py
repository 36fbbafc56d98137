"""One training process: `python -m stages.train.worker SPEC`.

The launchers in `stages/train/launch.py` start one of these per process (or call `main` in-process).
SPEC is the JSON `spec.json` the training stage writes into its work directory (`stages/train/spec.py`):
the resolved configs travel by value, because gin bindings never reach other processes, and as data
only, because every host of a slice reads it from a bucket that others may be able to write.
A stop request (SIGTERM, Ctrl-C: `stop.py`) saves a checkpoint and ends the process with one line and
`STOPPED_EXIT_CODE`; a second Ctrl-C (or one before training starts) ends it at once, one line and 130.
"""

from __future__ import annotations

import os
import sys

from stages.train import native, spec
from stages.train.stop import STOPPED_EXIT_CODE, TrainingStopped


def main(spec_path: str) -> dict:
    s = spec.read(spec_path)     # first: a bad spec fails every process before any joins the job
    process_index, process_count = init_distributed()
    from stages.train import loop

    return loop.train(s.config, s.shard, s.out_dir, s.work_dir, yardsticks=s.yardsticks, sources=s.sources,
                      process_index=process_index, process_count=process_count)


def init_distributed() -> tuple[int, int]:
    """Joins the multi-process job when a launcher asked for one; returns (process index, count)."""
    import jax

    if os.environ.get("REFINERY_COORDINATOR"):
        # Local multi-process runs (and the tests): CPU collectives over gloo.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(os.environ["REFINERY_COORDINATOR"],
                                   num_processes=int(os.environ["REFINERY_NUM_PROCESSES"]),
                                   process_id=int(os.environ["REFINERY_PROCESS_ID"]))
    elif os.environ.get("REFINERY_DISTRIBUTED") == "auto":
        jax.distributed.initialize()   # TPU VM slices: the runtime knows the topology
    native.backends_initialized()      # no TPU here: one line, not libtpu's dozen
    return jax.process_index(), jax.process_count()


if __name__ == "__main__":
    # One write a line: stderr is unbuffered, and `print` writes the text and its newline apart, so the
    # lines of processes that stop together could run into one another.
    try:
        main(sys.argv[1])
    except TrainingStopped as e:       # an expected end, not a crash: one line, no traceback
        sys.stderr.write(f"training worker: {e}\n")
        sys.exit(STOPPED_EXIT_CODE)
    except KeyboardInterrupt:          # Ctrl-C twice, or before training began: stop at once
        sys.stderr.write("training worker: interrupted at once (Ctrl-C); nothing saved since the last "
                         "checkpoint\n")
        sys.exit(130)                  # 128 + SIGINT, as a shell reports it
