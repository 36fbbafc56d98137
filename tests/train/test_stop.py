"""Stopping training on request: SIGTERM and Ctrl-C (SIGINT) both save a checkpoint, end in one line and
the stop exit code; a second Ctrl-C stops at once.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q tests/train/test_stop.py
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from pipeline import cache
from stages.train import checkpoint, stop
from tests.conftest import REPO
from tests.train.test_loop import _write_shards


def test_stop_requests_take_sigterm_and_ctrl_c_and_put_the_old_handlers_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with stop.stop_requests() as requested:
        assert not requested.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)                   # Python runs the handler between bytecodes of the main thread
        assert requested.is_set() and requested.reason == "interrupted: SIGINT (Ctrl-C)"
        os.kill(os.getpid(), signal.SIGTERM)   # a later signal does not change what asked first
        time.sleep(0.1)
        assert requested.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C again: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert {s: signal.getsignal(s) for s in before} == before
    with stop.stop_requests() as requested:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert requested.reason == "preempted: SIGTERM"


# Trains the test_loop model "forever" (every step logged) with the launcher named in argv[3], in this
# process ("inprocess") or in a worker process ("local", one process). The test interrupts it.
SCRIPT = """
import dataclasses, sys
from pipeline import cache
from stages.train.launch import LaunchConfig
from stages.train.stop import STOPPED_EXIT_CODE, TrainingStopped
from tests.train import test_loop as t
shard = cache.load(sys.argv[1], "shard", "synthetic")
cfg = dataclasses.replace(t.CONFIG, steps=100000, log_every=1, checkpoint_every=100000, eval_every=0,
                          launcher=LaunchConfig(kind=sys.argv[3], num_processes=1))
try:
    t._train(sys.argv[2], shard, cfg)
except TrainingStopped as e:
    print("STOPPED", e, flush=True)
    sys.exit(STOPPED_EXIT_CODE)
"""


@pytest.fixture(scope="module")
def shard_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache"))
    cache.run_stage(cache_root=root, stage="shard", key="synthetic", config={}, upstream={}, fn=_write_shards)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["inprocess", "local"])
def test_ctrl_c_during_training_saves_a_checkpoint_and_ends_in_one_line(tmp_path, shard_root, launcher):
    """inprocess: the training loop in the process that gets Ctrl-C. local: the launcher gets it and
    passes it on to its worker, which saves and exits with the stop code; the launcher then stops."""
    root = str(tmp_path / "cache")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, shard_root, root, launcher], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
    try:
        deadline = time.time() + 300
        while not [p for p in glob.glob(f"{root}/train/k/attempt-*/metrics.jsonl") if os.path.getsize(p)]:
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)                       # until the first step's metrics row: training is on
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == stop.STOPPED_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if launcher == "inprocess":
        stopped = int(re.search(r"STOPPED stopped at step (\d+) \(interrupted: SIGINT \(Ctrl-C\)\)", out)[1])
    else:
        assert "STOPPED all 1 training processes stopped at a checkpoint" in out, out
        worker_lines = [line for line in err.splitlines() if line.startswith("training worker: ")]
        assert len(worker_lines) == 1, err[-3000:]            # the worker's one line
        stopped = int(re.search(r"stopped at step (\d+) \(interrupted: SIGINT", worker_lines[0])[1])
    saved = checkpoint.Checkpointer(f"{root}/train/k/work/checkpoints")
    assert saved.all_steps() == [stopped] and stopped >= 1
    saved.close()
