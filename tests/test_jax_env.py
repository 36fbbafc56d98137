"""The suite's JAX settings (tests/jax_env.py) hold in the test process and in every process a test starts,
so both compile alike and a comparison between them compares programs, not compiler settings.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_jax_env.py
"""

import os

import jax
import pytest

from tests import jax_env, stage_digests
from tests.conftest import run_on_simulated_devices

SCRIPT = """
import json, jax
print("RESULT " + json.dumps({"off": jax.config.read("jax_disable_most_optimizations"),
                              "platform": jax.devices()[0].platform}))
"""


@pytest.mark.skipif(not jax_env.compiled_as(), reason="the suite runs optimized (set so by hand)")
def test_the_test_process_and_a_process_it_starts_compile_alike():
    assert jax.config.read("jax_disable_most_optimizations")  # set before jax was imported
    assert run_on_simulated_devices(SCRIPT, devices=2) == {"off": True, "platform": "cpu"}
    assert stage_digests.machine().endswith(", JAX_DISABLE_MOST_OPTIMIZATIONS=1")


def test_a_setting_already_in_the_environment_is_kept(monkeypatch):
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    jax_env.apply()
    assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "0" and jax_env.compiled_as() == ""


@pytest.mark.optimized
def test_a_test_marked_optimized_compiles_optimized_and_so_do_the_processes_it_starts():
    assert not jax.config.read("jax_disable_most_optimizations")
    assert run_on_simulated_devices(SCRIPT, devices=2) == {"off": False, "platform": "cpu"}


@pytest.mark.skipif(not jax_env.compiled_as(), reason="the suite runs optimized (set so by hand)")
def test_the_next_test_is_back_to_the_suites_setting():
    assert jax.config.read("jax_disable_most_optimizations")
    assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "1"
