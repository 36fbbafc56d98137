"""How training stops early on request: the signals that ask, the exception that says it stopped, and the
exit code a stopped process ends with. A leaf module (the standard library only) that every part of
training imports.

    from stages.train.stop import STOPPED_EXIT_CODE, TrainingStopped, stop_requests
    with stop_requests() as stop:            # SIGTERM and SIGINT now set `stop` instead of ending the process
        ...                                  # loop.py: after each step, if asked (on any process: every
                                             # process agrees, agreed_stop.py): checkpoint, then
        raise TrainingStopped(f"stopped at step 600 ({stop.reason}); ...")
    sys.exit(STOPPED_EXIT_CODE)              # worker.py: one line on stderr, no traceback

A stop is asked for by SIGTERM (a preemption), SIGINT (Ctrl-C) or `train.Config.stop_after` (tests). The
loop saves a checkpoint and raises `TrainingStopped`; a worker process turns it into `STOPPED_EXIT_CODE`,
and the launchers turn that exit code back into `TrainingStopped` (`launch.py`). `python -m pipeline`
reports it in one line and exits with the same code; rerunning the stage resumes from the checkpoint.
A second Ctrl-C stops at once, without saving (Python's KeyboardInterrupt).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)
STOPPED_EXIT_CODE = 75   # stopped at a checkpoint on request (EX_TEMPFAIL: rerun to resume)
REASONS = {signal.SIGTERM: "preempted: SIGTERM", signal.SIGINT: "interrupted: SIGINT (Ctrl-C)"}


class TrainingStopped(Exception):
    """Training stopped before its last step on request (SIGTERM, SIGINT, `train.Config.stop_after`) after
    saving a checkpoint: the attempt does not commit, and rerunning the stage resumes from that checkpoint."""

    resumable = True    # `python -m pipeline` reports it in one line, no traceback (pipeline/tasks.py)


class StopRequest(threading.Event):
    """Set when a signal asked training to stop; `signum` and `reason` say which (the first one)."""

    signum: int | None = None
    reason: str = ""


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """While the block runs, SIGTERM and SIGINT set the yielded request instead of ending the process (a
    second SIGINT raises KeyboardInterrupt, as Ctrl-C does by default); the previous handlers come back
    after it. Outside the main thread (where Python cannot take signals) it warns and the request is
    never set."""
    request = StopRequest()

    def handler(signum, frame):
        if request.is_set() and signum == signal.SIGINT:
            signal.default_int_handler(signum, frame)          # Ctrl-C again: stop at once, unsaved
        if not request.is_set():
            request.signum, request.reason = signum, REASONS[signum]
            again = " (Ctrl-C again stops at once, without saving)" if signum == signal.SIGINT else ""
            log.warning("%s: saving a checkpoint after this step and stopping%s", request.reason, again)
        request.set()

    previous = {}
    try:
        for signum in REASONS:
            previous[signum] = signal.signal(signum, handler)
    except ValueError:     # not the main thread
        log.warning("stop signal handlers not installed (not the main thread): SIGTERM and Ctrl-C will not "
                    "save a checkpoint")
    try:
        yield request
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
