"""A stage that refuses at run time (a guard's `Refusal`) ends the command with its message once, as one
`error:` line without a traceback, the way a mistake found before work does; a crash keeps its traceback,
printed once.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_refusals.py

The message used to appear twice inside two full tracebacks (Luigi's own `ERROR:` handler and the
`luigi-interface` logger) before `FAILED after N s`. Each case runs the real command line in a fresh process
(its logging is what a user sees) on a two-stage DAG: `first` writes, `second` refuses or crashes
(tests/pipeline/refusing_stage.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stages import tokenizer
from stages.io.refusal import Refusal
from tests.conftest import REPO
from tests.pipeline.refusing_stage import MESSAGE

DRIVER = """
import sys
from pipeline import __main__ as cli, dag
stage = "tests.pipeline.refusing_stage"
dag.STAGES.clear()
dag.STAGES.update({"first": (stage, ()), "second": (stage, ("first",))})
sys.exit(cli.main(sys.argv[1:]))
"""


def _run(tmp_path, how: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "empty.gin").write_text("")
    argv = [sys.executable, "-c", DRIVER, "run", "--gin", str(tmp_path / "empty.gin"),
            "--gin-param", f'pipeline.Settings.cache_root="{tmp_path / "cache"}"',
            "--gin-param", f'second.Config.how="{how}"', *args]
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_refusal_is_one_error_line_without_a_traceback(workers, tmp_path):
    """With --workers 2 Luigi runs each task in a forked process; the refusal is still one line."""
    out = _run(tmp_path, "refuse", "--workers", workers)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.count(MESSAGE) == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    line = next(line for line in out.stderr.splitlines() if MESSAGE in line)
    assert line.endswith(f"error: second: {MESSAGE}"), line
    assert out.stderr.splitlines()[-1].startswith("FAILED after ")
    if workers == "1":         # nothing failed but the refusal: no Luigi summary to read past
        assert out.stderr.splitlines()[-2] == f"error: second: {MESSAGE}"
        assert "Luigi Execution Summary" not in out.stderr
    assert "first" in out.stdout and "missing" in out.stdout       # the table: first ran, second did not


def test_a_crash_keeps_its_traceback_printed_once(tmp_path):
    out = _run(tmp_path, "crash")
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.count("Traceback (most recent call last)") == 1, out.stderr
    assert out.stderr.count("RuntimeError: an unexpected failure in the refusing stage") == 1, out.stderr
    assert "Luigi Execution Summary" in out.stderr and out.stderr.splitlines()[-1].startswith("FAILED after ")


def test_the_data_guards_refuse_rather_than_crash():
    """The tokenizer's vocabulary guard raises a Refusal (still a ValueError, for code that catches one)."""
    config = tokenizer.Config(vocab_size=4096)
    sentences = ["the cat sat on the mat", "the cat sat on the mat"]
    with pytest.raises(Refusal, match="tokenizer.Config.vocab_size=4,096 is out of proportion") as e:
        tokenizer.check_vocab_size(config, sentences, {"sampled_chars": 44}, "two sentences")
    assert isinstance(e.value, ValueError)
