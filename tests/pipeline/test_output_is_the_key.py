"""A key names one output (issue 15): the data half of gin/tiny.gin run twice, on two cache roots and with
different settings that no key covers, gives the same keys and byte-identical commits, config.gin included;
the second run's Beam stages run on 2 worker processes (gin/data/local_workers.gin), the first's in the
stage's own process. And each stage's config.gin is the gin of exactly what its key covers: loading it
gives the same keys.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_output_is_the_key.py
"""

import dataclasses
import os
import threading

import psutil
import pytest

import gin
from pipeline import cache, config, dag, tasks
from stages.io import storage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "gin", "tiny.gin")
DATA = ("download", "clean", "tokenizer", "shard")
# The first 300 standard-library modules of the embedded corpus (as tests/pipeline/test_concurrent_force.py),
# so the data half takes seconds
SMALL = ["download.Embedded.max_files = 300", "tokenizer.Config.vocab_size = 1024",
         "shard.Config.allow_small_val = True"]
# What no data stage's key covers: the Beam runner's worker processes (with LOCAL_WORKERS), a downstream
# stage's bindings (evaluate's is part of evaluate's key; training's log interval, launcher and hardware
# are part of none)
LOCAL_WORKERS = os.path.join(REPO, "gin", "data", "local_workers.gin")
OTHER = ["beam_runner.Runner.local_workers = 2",
         "evaluate.Config.max_new_tokens = 7", "train.Config.log_every = 5",
         'train.LaunchConfig.kind = "local"', "train.HardwareConfig.mfu = 0.5",
         "tokenizer.Config.allow_large_vocab = True"]


def _plan(root, *extra):
    files = [TINY, LOCAL_WORKERS] if extra == tuple(OTHER) else [TINY]
    return config.load(files, [f'pipeline.Settings.cache_root = "{root}"', *SMALL, *extra])


class _Workers:
    """The Beam SDK worker processes (`sdk_worker_main`) this process starts while in the `with` block."""

    def __init__(self):
        self.seen: set[int] = set()
        self._stop = threading.Event()

    def _watch(self):
        me = psutil.Process()
        while not self._stop.wait(0.2):
            for child in me.children(recursive=True):
                try:
                    if "apache_beam.runners.worker.sdk_worker_main" in " ".join(child.cmdline()):
                        self.seen.add(child.pid)
                except psutil.Error:         # gone between the listing and the look
                    pass

    def __enter__(self):
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _files(done):
    return {name: storage.read_bytes(path) for name, path in zip(sorted(done.files), done.paths())}


def test_config_gin_holds_what_the_key_covers_and_loads_to_the_same_keys(tmp_path):
    plan, other = _plan(tmp_path / "a"), _plan(tmp_path / "b", *OTHER)
    for stage in DATA:
        assert plan.stages[stage].key == other.stages[stage].key, stage
        assert plan.stages[stage].config_gin == other.stages[stage].config_gin, stage
    gin_text = plan.stages["shard"].config_gin
    assert "cache_root" not in gin_text and "Settings" not in gin_text            # no run-wide setting
    assert "Runner" not in gin_text and "allow_small_val" not in gin_text         # no key=False field
    assert "evaluate." not in gin_text and "train." not in gin_text               # no downstream stage
    assert "download.Embedded.max_files = 300" in gin_text                        # a nested config's binding
    assert "tokenizer.Config.vocab_size = 1024" in gin_text                       # an upstream's binding
    gin_text = other.stages["evaluate"].config_gin
    assert "evaluate.Config.max_new_tokens = 7" in gin_text and "train.ModelConfig.d_model = 128" in gin_text
    assert not any(word in gin_text for word in ("log_every", "LaunchConfig", "HardwareConfig", "Runner"))
    # Read as a run file, each stage's config.gin gives that stage's key and its upstream stages' keys.
    for stage in plan.stages:
        path = tmp_path / f"{stage}.gin"
        path.write_text(plan.stages[stage].config_gin)
        again = config.load([str(path)])
        for s in dag.closure(stage):
            assert again.stages[s].key == plan.stages[s].key, (stage, s)


@pytest.mark.slow
def test_the_data_half_twice_gives_the_same_keys_and_the_same_bytes(tmp_path):
    plans = [_plan(tmp_path / "a"), _plan(tmp_path / "b", *OTHER)]
    assert [plans[0].stages[s].key for s in DATA] == [plans[1].stages[s].key for s in DATA]
    assert plans[1].stages["clean"].config.runner.local_workers == 2
    workers = []
    for plan in plans:
        with _Workers() as seen:
            result = tasks.build([plan], ["shard"])
        assert result.ok, result.summary
        workers.append(len(seen.seen))
    print(f"Beam SDK worker processes: {workers}")
    # one process, then the Beam stages' bundles on worker processes (2 a stage: download, clean, shard)
    assert workers[0] == 0 and workers[1] >= 2, workers
    differ = []
    for stage in DATA:
        a, b = (_files(cache.load(p.cache_root, stage, p.stages[stage].key)) for p in plans)
        assert "config.gin" in a and sorted(a) == sorted(b), stage
        differ += [f"{stage} {name}" for name in a if a[name] != b[name]]
    assert not differ, f"differ between two runs of one key: {differ}"


@dataclasses.dataclass(frozen=True)
class _Source:
    path: str = ""
    n: int = 1


@dataclasses.dataclass(frozen=True)
class _Config:
    source: _Source = _Source()
    sources: tuple = ()
    formats: dict = dataclasses.field(default_factory=dict)
    workers: int = dataclasses.field(default=1, metadata={"key": False})


def test_one_class_bound_twice_with_different_values_is_scoped_and_reads_back():
    """Gin binds a class once: a second, different instance of it in one key is written under a scope."""
    registry = {"keygin.Source": _Source, "keygin.Config": _Config}
    for name, cls in registry.items():
        if not config._is_registered(name):
            gin.external_configurable(cls, name=name.split(".")[1], module="keygin")
    value = _Config(_Source("p", 2), (_Source("q", 3), _Source("p", 2), _Source("r", 4)), {"a": (1,)}, 7)
    text = config.key_gin("keygin", {"keygin": value}, registry)
    assert "workers" not in text and "keygin_Config_sources_0/keygin.Source.path = 'q'" in text
    gin.clear_config()
    gin.parse_config(text)
    assert gin.get_configurable("keygin.Config")() == dataclasses.replace(value, workers=1)
