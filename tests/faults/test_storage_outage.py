"""The GCS server goes away in the middle of a run: gcsfs retries, the run fails with a line that names the
unreachable cache root, nothing is marked done, and once the server is back the rerun completes.

    make faults                     (runs this after the seeded kills)
    REFINERY_OUTAGE=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/faults/test_storage_outage.py

It is not part of `make test`: each request gcsfs retries takes about 35 s of back-off before it gives up,
and a stage makes several, so one outage costs about two minutes.
"""

import os
import signal
import subprocess
import sys

import pytest

from pipeline import cache, config
from tests import emulator_process
from tests.conftest import REPO
from tests.test_end_to_end import SMALL

pytestmark = pytest.mark.skipif(not os.environ.get("REFINERY_OUTAGE"),
                                reason="a two-minute storage outage: make faults runs it (REFINERY_OUTAGE=1)")


def test_a_storage_outage_mid_run_fails_clearly_commits_nothing_and_the_rerun_completes(tmp_path,
                                                                                      monkeypatch):
    server, url = emulator_process.start(data_dir=str(tmp_path))    # on disk: a restart finds the objects
    port = int(url.rsplit(":", 1)[1])
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    from stages.io import storage

    fs, _ = storage.filesystem("gs://outage")
    fs.mkdir("outage")
    root = "gs://outage/refinery"
    params = [f'pipeline.Settings.cache_root = "{root}"', *SMALL]
    argv = [sys.executable, "-m", "pipeline", "run", "--stage", "shard", "--gin", f"{REPO}/gin/tiny.gin",
            *[a for p in params for a in ("--gin-param", p)]]
    env = dict(os.environ, PYTHONPATH=REPO)
    run = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in run.stderr:
        if "running clean" in line:           # download committed; clean is reading and writing
            break
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)
    out, err = run.communicate(timeout=900)
    assert run.returncode == 1, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("FAILED after ")
    assert lines[-2].startswith(f"error: cannot reach the cache root {root}: ") and "rerun once" in lines[-2]

    server, _ = emulator_process.start(port, data_dir=str(tmp_path))
    try:
        plan = config.load([f"{REPO}/gin/tiny.gin"], params)
        assert cache.load(root, "download", plan.stages["download"].key) is not None
        assert all(cache.load(root, s, plan.stages[s].key) is None for s in ("clean", "tokenizer", "shard"))
        rerun = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert all(cache.load(root, s, plan.stages[s].key) is not None
                   for s in ("download", "clean", "tokenizer", "shard"))
    finally:
        server.terminate()
        server.wait(timeout=30)
