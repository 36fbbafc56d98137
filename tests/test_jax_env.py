"""The suite's JAX settings (tests/jax_env.py) hold in the test process and in every process a test starts,
so both compile alike and a comparison between them compares programs, not compiler settings.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_jax_env.py
"""

import os

import jax
import numpy as np
import pytest

from tests import jax_env, stage_digests
from tests.conftest import run_on_simulated_devices

SCRIPT = """
import json, os, jax
print("RESULT " + json.dumps({"off": jax.config.read("jax_disable_most_optimizations"),
                              "platform": jax.devices()[0].platform, "devices": jax.device_count(),
                              "xla_flags": os.environ.get("XLA_FLAGS", "")}))
"""
SUITE = " ".join(f for f in jax_env.SUITE_XLA_FLAGS if jax_env.known_to_xla(f))   # what apply() adds
SHARED = jax.jit(lambda x: 2 * x + 1)       # a function cached across tests, as the scorer's step is


@pytest.mark.skipif(not jax_env.compiled_as(), reason="the suite runs optimized (set so by hand)")
def test_the_test_process_and_a_process_it_starts_compile_alike():
    assert jax.config.read("jax_disable_most_optimizations")  # set before jax was imported
    flags = jax_env.xla_flags("--xla_force_host_platform_device_count=2")
    assert run_on_simulated_devices(SCRIPT, devices=2) == {"off": True, "platform": "cpu", "devices": 2,
                                                           "xla_flags": flags}
    assert os.environ["XLA_FLAGS"].split()[-len(SUITE.split()):] == SUITE.split()
    assert stage_digests.machine().endswith(f"XLA_FLAGS={os.environ['XLA_FLAGS']}, "
                                            "JAX_DISABLE_MOST_OPTIMIZATIONS=1")


def test_the_suites_xla_flags_are_ones_this_jaxlib_defines_and_a_made_up_one_is_not():
    assert SUITE, "every flag of SUITE_XLA_FLAGS is unknown to this jaxlib: the suite compiles slower"
    assert not jax_env.known_to_xla("--xla_cpu_no_such_flag_anywhere=true")


def test_xla_flags_already_set_are_kept_and_the_suites_added_after_them(monkeypatch):
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true --xla_cpu_max_isa=AVX2")
    jax_env.apply()
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_use_fusion_emitters=true --xla_cpu_max_isa=AVX2"
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
    jax_env.apply()
    jax_env.apply()          # twice: the same
    assert os.environ["XLA_FLAGS"] == f"--xla_cpu_max_isa=AVX2 {SUITE}"
    assert jax_env.xla_flags("--xla_force_host_platform_device_count=4") == (
        f"{SUITE} --xla_force_host_platform_device_count=4")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2 --xla_cpu_use_fusion_emitters=true")
    assert jax_env.xla_flags() == "--xla_cpu_use_fusion_emitters=true"     # a started process runs as set


def test_a_setting_already_in_the_environment_is_kept(monkeypatch):
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    jax_env.apply()
    assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "0" and jax_env.compiled_as() == ""


def test_a_function_shared_between_tests_is_compiled_and_cached_here():
    assert float(SHARED(np.float32(1))) == 3 and SHARED._cache_size() == 1


@pytest.mark.skipif(not jax_env.compiled_as(), reason="the suite runs optimized (set so by hand)")
@pytest.mark.optimized
def test_a_test_marked_optimized_compiles_a_function_shared_between_tests_anew():
    # the executable the test before compiled under the suite's setting is gone: JAX's in-memory caches do
    # not key on the setting, so this call compiles (or reads the persistent cache, which does) optimized
    assert SHARED._cache_size() == 0
    assert float(SHARED(np.float32(1))) == 3 and SHARED._cache_size() == 1


@pytest.mark.optimized
def test_a_test_marked_optimized_compiles_optimized_and_so_do_the_processes_it_starts():
    assert not jax.config.read("jax_disable_most_optimizations")
    result = run_on_simulated_devices(SCRIPT, devices=2)
    assert (result["off"], result["platform"], result["devices"]) == (False, "cpu", 2)


@pytest.mark.skipif(not jax_env.compiled_as(), reason="the suite runs optimized (set so by hand)")
def test_the_next_test_is_back_to_the_suites_setting():
    assert jax.config.read("jax_disable_most_optimizations")
    assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "1"
    assert SHARED._cache_size() == 0          # nothing the optimized test compiled is served here
