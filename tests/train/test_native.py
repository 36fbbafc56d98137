"""Training on a machine without a TPU, with libtpu installed (the `dev` extra brings it): one line, not
libtpu's dozen (stages/train/native.py)."""

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

PROBE = ("import logging; logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s'); "
         "from stages.train import worker; print(worker.init_distributed())")


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_a_tpu_probe_that_finds_no_tpu_is_one_line():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}       # as `make pipeline` runs
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "(0, 1)", out.stderr
    assert out.stderr.strip() == ("stages.train.native: libtpu is installed but found no TPU here: "
                                  "running on cpu (JAX_PLATFORMS=cpu skips the probe)"), out.stderr


def test_told_the_platform_nothing_is_probed_or_said():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "(0, 1)" and out.stderr == "", out.stderr


def test_what_native_code_prints_is_held_and_returned():
    from stages.train import native

    with native.stderr_captured() as said:
        os.write(2, b"from C++\n")
    assert said() == "from C++\n"
