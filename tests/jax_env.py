"""How JAX runs under the tests: on the CPU, compiling with XLA's backend optimizations off. Set in the
environment before JAX is imported (`apply()`), so that every process a test starts (a pipeline run, a
simulated-device script, two training processes over gloo) compiles its programs the same way and computes
the same bits as the test process.

    from tests import jax_env
    jax_env.apply()     # first, before anything imports jax: tests/conftest.py, tests/stage_digests.py

Why the optimizations are off: the suite compiles hundreds of small programs (the tiny model's steps,
evaluation's decoders, MoE steps on 8 simulated devices) and runs each a few times, so LLVM's optimization of
the CPU code costs far more than it saves: the 8-device expert-parallel equivalence of tests/train/test_moe.py
takes 81 s with them off and 187 s with them on (the 2-core dev VM, loaded alike). What is tested does not
change: `jax_disable_most_optimizations` sets XLA's backend optimization level to 0 and skips LLVM's expensive
passes: it is about the machine code XLA:CPU generates, and the tests that read compiled programs (their
collectives, XLA's memory analysis, the residuals saved for the backward pass, TPU ahead-of-time compiles)
pass under it as they do without it. What differs is the machine code of XLA:CPU's kernels, so the last bits
of a trained model differ from an optimized compile's (tests/stage_digests.py's `machine()` names the setting,
and numbers recorded under one are not judged under the other). Speed is measured in benchmarks/, never here,
and the benchmarks compile as a user does.

A test whose training runs long enough that optimized code pays for its compile (the mixture search's twin:
210 s off, 125 s on) is marked `@pytest.mark.optimized`, and tests/conftest.py compiles it, and every process
it starts, with the optimizations on. Measured test by test in whole runs of the suite on the 2-core dev VM:
every test optimized, 3,659 s of CPU time (user and system; other work beside it for a while); every test not,
3,360 s; the tests it slowed by more than 15 s marked, 3,209 s, 1,703 s wall. A program compiled once and
shared between tests (a function cache) is compiled as the first test to ask sets: a mark on a later test
does not reach it (jax's in-memory cache of a jitted function does not key on this setting), so a marked
test compiles its own (tests/train/test_long_context.py).

A variable already set is kept: `JAX_DISABLE_MOST_OPTIMIZATIONS=0 make test` runs the suite optimized.
"""

from __future__ import annotations

import os

ENV = {"JAX_PLATFORMS": "cpu", "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}
JAX_TRUE = ("y", "yes", "t", "true", "on", "1")     # what jax's config.bool_env reads as true


def apply() -> None:
    """Sets each of ENV's variables the environment does not already set."""
    for name, value in ENV.items():
        os.environ.setdefault(name, value)


def compiled_as() -> str:
    """How this process's XLA compiles, for a record of what computed a number: "" with the default
    optimizations, else the setting."""
    value = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS", "")
    return "JAX_DISABLE_MOST_OPTIMIZATIONS=1" if value.lower() in JAX_TRUE else ""
