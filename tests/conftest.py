"""Shared fixtures. Tests never reach the network; Beam runs in-process with FnApiRunner."""

import fcntl
import glob
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import uuid

import pytest

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# CPU tests on a machine with libtpu (the dev extra brings it, for ahead-of-time TPU compiles): without
# JAX_PLATFORMS=cpu every process that imports JAX tries to start a TPU runtime and prints its errors (TPU
# topologies still compile with it set); and XLA's backend optimizations off (tests/jax_env.py says why).
from tests import jax_env  # noqa: E402 - first: before anything imports jax

jax_env.apply()
# One XLA compilation cache for the whole session, read by this process and every subprocess (JAX takes
# these from the environment): the tiny model's programs, compiled by dozens of tests and pipeline runs,
# compile once.
# An executable is a function of its program, the XLA flags and the machine (the key holds all three), so a
# cached one computes the same bits (tests/train/test_loop.py checks bitwise agreement across processes).
# REFINERY_TEST_XLA_CACHE names a directory to keep (and reuse) between sessions; by default a fresh one.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ.get("REFINERY_TEST_XLA_CACHE") or \
        tempfile.mkdtemp(prefix="refinery-test-xla-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
from tests import emulator_process  # noqa: E402 - after the environment above

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `make test` runs the suite on two workers, a module at a time (pytest-xdist, --dist loadfile: a module's
# fixtures are built once), handing each free worker the next module in collection order. The modules whose
# tests take longest go first, so that the two workers finish together rather than one running a long module
# alone at the end. Measured with `--durations`, slowest first; a module not listed keeps its place after
# them.
HEAVY_FIRST = ("test_end_to_end.py", "train/test_moe.py", "test_mixture_end_to_end.py", "train/test_loop.py",
               "faults/test_faults.py", "stages/test_yardsticks.py", "train/test_stop.py",
               "train/test_long_context.py", "stages/test_hostile_input.py",
               "pipeline/test_sweep_fineweb_recipe.py", "train/test_aot.py", "stages/test_warc.py",
               "train/test_sharded_training.py", "train/test_sharding.py", "train/test_tracking.py",
               "train/test_offload.py", "train/test_planner.py", "pipeline/test_reference_model.py")


assert all(os.path.exists(os.path.join(REPO, "tests", name)) for name in HEAVY_FIRST), HEAVY_FIRST


def run_files() -> list[str]:
    """Every file a user runs, relative to gin/: the run files, their twins, the mixtures and the searches."""
    return sorted(os.path.relpath(p, f"{REPO}/gin") for folder in ("", "twins/", "mixtures/", "mixsearch/")
                  for p in glob.glob(f"{REPO}/gin/{folder}*.gin"))


def pytest_configure(config):
    # pytest-xdist's default (`--loadscope-reorder`) hands out a `--dist loadfile` run's modules by their
    # number of tests, most first, whatever the collection order: keep that order, HEAVY_FIRST's (below).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {os.path.join(REPO, "tests", name): i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))       # stable: the rest keep their order


@pytest.fixture(autouse=True)
def compiled_as_marked(request, monkeypatch):
    """A test marked `optimized` compiles with XLA's backend optimizations on, in its process and every
    process it starts (tests/jax_env.py: the suite's default is off). Fixtures of a wider scope (the session's
    tiny run, a module's DAG) were built before this one, under the default, so what they compute does not
    depend on which test asked first.

    JAX's in-memory caches of traced and compiled programs do not key on the setting, so they are emptied
    as the test starts and as it ends: a function cached across tests (the scorer's step, evaluation's
    decoder) then compiles as this test asks, and a later test gets none of its executables. Each compile
    after that is looked up in the session's persistent compilation cache first, whose key holds the
    setting."""
    if request.node.get_closest_marker("optimized") is None or not jax_env.compiled_as():
        yield
        return
    import jax

    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    jax.config.update("jax_disable_most_optimizations", False)
    jax.clear_caches()
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", True)
        jax.clear_caches()


@pytest.fixture(scope="session")
def gcs_server():
    """A real GCS JSON-API server (gcp-storage-emulator) on loopback, for the whole session.

    Yields its URL; `STORAGE_EMULATOR_HOST` points gcsfs at it while it runs.
    """
    # The emulator, plus the download headers TensorStore needs (see tests/gcs_emulator.py).
    with emulator_process.running() as url:
        yield url


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The whole tiny DAG (tests/tiny_run.py), run once per session on a cache of its own; tests copy its
    commits (`tiny_run.copy_to(root)`) rather than computing the same keys again.

    Once for all of `make test`'s workers too: the first to ask runs it under a lock in the directory they
    share (`session_dir`), the others wait for it and read what it ran (or why it failed)."""
    from tests import tiny_run as tiny

    where = session_dir(tmp_path_factory) / "tiny"
    where.mkdir(exist_ok=True)
    ran, failed = where / "ran.json", where / "failed.txt"
    with open(where / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)             # released when the file closes
        if failed.exists():
            raise RuntimeError(f"(another worker's) {failed.read_text()}")
        if not ran.exists():
            try:
                run = tiny.run_tiny(str(where / "cache"))
            except RuntimeError as e:
                failed.write_text(str(e))
                raise
            ran.write_text(json.dumps(run.ran))
        return tiny.TinyRun(str(where / "cache"), json.loads(ran.read_text()))


def session_dir(tmp_path_factory) -> pathlib.Path:
    """The test session's base temporary directory, which every pytest-xdist worker of the session shares
    (each worker's own base is a folder in it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture
def gcs_bucket(gcs_server):
    """A fresh bucket on the emulator: yields `gs://<bucket>`."""
    from stages.io import storage

    name = f"test-{uuid.uuid4().hex[:10]}"
    fs, _ = storage.filesystem(f"gs://{name}")
    fs.mkdir(name)
    yield f"gs://{name}"


def run_on_simulated_devices(script: str, devices: int = 8, timeout: int = 600):
    """Runs `script` in a fresh Python whose JAX sees `devices` CPU devices (the count is fixed when JAX
    starts, so it cannot be changed inside the test process) and returns the JSON the script printed on
    its last line starting with "RESULT "."""
    env = dict(os.environ, XLA_FLAGS=jax_env.xla_flags(f"--xla_force_host_platform_device_count={devices}"),
               JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


def reproducible_cpu_env() -> tuple[dict, object]:
    """(env, preexec_fn) for a subprocess whose JAX computes the same bits on any x86-64 machine: XLA:CPU
    splits a reduction (and a matmul's inner dimension) over its thread pool, one thread per CPU the process
    may use, and vectorizes for the instruction set it finds, so the order in which a sum's parts are added
    (and with it a trained model) depends on the machine's CPU count and ISA. One CPU and AVX2 at most fix
    both; the same jax version and config then train the same model (tests/train/test_loop.py checks two
    trainings agree bit for bit on one machine)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    env.pop("XLA_FLAGS", None)                      # a device count from elsewhere would change the program
    if platform.machine() in ("x86_64", "AMD64"):
        env["XLA_FLAGS"] = "--xla_cpu_max_isa=AVX2"
    one_cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None

    def pin():
        if one_cpu is not None:
            os.sched_setaffinity(0, {one_cpu})
    return env, pin
