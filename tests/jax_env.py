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
3,360 s; the tests it slowed by more than 15 s marked, 3,209 s, 1,703 s wall. JAX's in-memory caches of
traced and compiled programs do not key on this setting, so tests/conftest.py empties them as a marked test
starts and as it ends: a program shared between tests (the scorer's step, evaluation's decoder, cached by
model structure) is compiled as the test running it is marked, whichever test asked first. (Until it did,
the mixture search's twin scored every evaluation with the unoptimized step its module's fixture had
compiled: 116 s in the whole suite, 66-75 s since.)

XLA:CPU's older fusion emitters too, while the optimizations are off (`SUITE_XLA_FLAGS`): the default ones
generate each fusion through MLIR, which costs more to compile than the suite's programs run. gin/tiny.gin's
train step compiles in 1.6-2.0 s instead of 3.7-5.2, its init in 1.1 s instead of 1.4-2.0; the whole suite
took 1,243 s and 2,389 s of CPU with the flag, against 1,317-1,413 s and 2,522-2,723 s without it on the same
day (benchmarks/RESULTS.md, "XLA:CPU's emitters under the tests"). Like the optimization level it is about
machine code: what is tested does not change, the last bits of a trained model do (`stage_digests.machine()`
names XLA_FLAGS). A process a test starts with a device count of its own gets the suite's flags with it
(`xla_flags`, which tests/conftest.py's `run_on_simulated_devices` uses); `reproducible_cpu_env`'s runs keep
their own fixed flags (the trained-longer verdict's margins were measured so). A flag XLA_FLAGS already names
is kept as set, and one this jaxlib does not define is left out: XLA aborts every process on an unknown flag.

A variable already set is kept: `JAX_DISABLE_MOST_OPTIMIZATIONS=0 make test` runs the suite optimized, with
XLA:CPU's default emitters.
"""

from __future__ import annotations

import glob
import importlib.util
import mmap
import os

ENV = {"JAX_PLATFORMS": "cpu", "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}
JAX_TRUE = ("y", "yes", "t", "true", "on", "1")     # what jax's config.bool_env reads as true
SUITE_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false",)   # with the optimizations off


def apply() -> None:
    """Sets each of ENV's variables the environment does not already set, then, when the suite compiles with
    the optimizations off, adds to XLA_FLAGS each of SUITE_XLA_FLAGS that it does not set and jaxlib knows."""
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    if compiled_as():
        flags = os.environ.get("XLA_FLAGS", "").split()
        named = {_name(flag) for flag in flags}
        flags += [f for f in SUITE_XLA_FLAGS if _name(f) not in named and known_to_xla(f)]
        if flags:
            os.environ["XLA_FLAGS"] = " ".join(flags)


def xla_flags(*extra: str) -> str:
    """XLA_FLAGS for a process a test starts that sets its own (a simulated device count): `extra` after the
    flags of SUITE_XLA_FLAGS' names this process runs with, as `apply` or the environment set them, so that
    it compiles as the test process does."""
    suite = {_name(f) for f in SUITE_XLA_FLAGS}
    own = [f for f in os.environ.get("XLA_FLAGS", "").split() if _name(f) in suite]
    return " ".join(own + list(extra))


def _name(flag: str) -> str:
    """"--xla_cpu_max_isa=AVX2" -> "xla_cpu_max_isa"."""
    return flag.lstrip("-").split("=")[0]


def known_to_xla(flag: str) -> bool:
    """Whether the installed jaxlib's XLA defines `flag` ("--name=value"): its name is among the strings of
    jaxlib's libraries. Found without importing jax (which reads ENV as it is imported)."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.origin:
        return False
    name, folder = _name(flag).encode(), os.path.dirname(spec.origin)
    for path in sorted(glob.glob(os.path.join(folder, "*.so")) + glob.glob(os.path.join(folder, "*.dylib"))):
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as library:
            if library.find(name) != -1:
                return True
    return False


def compiled_as() -> str:
    """How this process's XLA compiles, for a record of what computed a number: "" with the default
    optimizations, else the setting (XLA_FLAGS, which `stage_digests.machine()` names, aside)."""
    value = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS", "")
    return "JAX_DISABLE_MOST_OPTIMIZATIONS=1" if value.lower() in JAX_TRUE else ""
