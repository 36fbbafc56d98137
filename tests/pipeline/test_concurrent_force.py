"""Two concurrent `--force` runs of one stage (issue 15): both finish, the key ends with one commit, and the
outputs are those of an undisturbed run. What "force" means under concurrency is in docs/ARCHITECTURE.md
("The stage cache"): a forced stage takes a commit made during the run (by it or a concurrent run) and
recomputes an older one; a commit leaves an attempt that a downstream stage is reading (pinned) in place.

    .venv/bin/python -m pytest -q tests/pipeline/test_concurrent_force.py
"""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pipeline import cache, config, dag, lease, tasks
from stages.io import storage

FAKE = "tests.pipeline.fake_stage"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _wait_for(what, condition, timeout_s=60.0):
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _one_commit(root, stage, key):
    """The key's directory holds one manifest, the one attempt it names, leases, and nothing else."""
    done = cache.load(root, stage, key)
    assert done is not None, f"{stage} is not committed"
    names = storage.listdir(cache.stage_dir(root, stage, key))
    assert [n for n in names if not n.startswith(lease.PREFIX)] == [cache.MANIFEST, done.manifest["attempt"]]
    return done


def test_a_forced_run_leaves_the_attempt_a_concurrent_forced_run_is_reading(root, monkeypatch, tmp_path):
    """Deterministic, locally and on the GCS emulator: run A forces a and its downstream b holds a's attempt
    open; run B forces a meanwhile and commits it; then A's b reads. The code before issue 15 deleted A's
    attempt of a there (FileNotFoundError)."""
    monkeypatch.setattr(dag, "STAGES", {"a": (FAKE, ()), "b": (FAKE, ("a",))})
    hold = tmp_path / "hold"
    hold.mkdir()
    params = [f'pipeline.Settings.cache_root = "{root}"', 'a.Config.name = "a"',
              'b.Config.name = "b"', f'b.Config.hold = "{hold}"']
    plan = config.load([], params)
    key = {s: plan.stages[s].key for s in ("a", "b")}
    (hold / "go").write_text("")
    assert tasks.build([plan], ["b"]).ok                                    # undisturbed
    undisturbed = {s: storage.read_text(cache.load(root, s, key[s]).file("out.txt")) for s in key}
    (hold / "go").unlink()
    (hold / "b.reading").unlink()

    results = {}

    def forced(name):
        results[name] = tasks.build([config.load([], params)], ["b"], force=["a"])

    run_a = threading.Thread(target=forced, args=("A",))
    run_a.start()
    _wait_for("A's b to read a", (hold / "b.reading").exists)
    read_by_a = cache.load(root, "a", key["a"]).manifest["attempt"]
    run_b = threading.Thread(target=forced, args=("B",))
    run_b.start()
    # B began after A's commit of a, so it computes a again and commits it while A's b holds the old one.
    _wait_for("B's commit of a", lambda: cache.load(root, "a", key["a"]).manifest["attempt"] != read_by_a)
    assert storage.exists(storage.join(cache.stage_dir(root, "a", key["a"]), read_by_a))     # pinned: kept
    (hold / "go").write_text("")
    for run in (run_a, run_b):
        run.join(timeout=120)
    assert results["A"].ok, results["A"].summary
    assert results["B"].ok, results["B"].summary
    for stage in key:
        done = _one_commit(root, stage, key[stage])
        assert storage.read_text(done.file("out.txt")) == undisturbed[stage]


def test_a_forced_task_is_complete_with_a_commit_made_during_its_run_by_any_run(monkeypatch, tmp_path):
    """Luigi's check of a dependency before a task runs: another forced run's fresh commit counts (no
    "Unfulfilled dependencies at run time", no recompute), a commit from before the run does not."""
    monkeypatch.setattr(dag, "STAGES", {"a": (FAKE, ()), "b": (FAKE, ("a",))})
    plan = config.load([], [f'pipeline.Settings.cache_root = "{tmp_path / "cache"}"'])
    root, key = plan.cache_root, plan.stages["a"].key

    def commit(run_id):          # a forced run's commit: over whatever the key holds
        cache.run_stage(cache_root=root, stage="a", key=key, config=plan.stages["a"].config, upstream={},
                        fn=dag.module("a").run, run_id=run_id, since=cache.lease_now(root, "a", key))

    commit("before")
    run_id = "this-run"
    monkeypatch.setitem(tasks._PLANS, "p", plan)
    monkeypatch.setitem(tasks._FORCED, run_id, {(root, "a", key): cache.lease_now(root, "a", key)})
    task = tasks.task_class("a")(key=key, plan_id="p", run_id=run_id)
    assert not task.complete()                               # committed before this run began: recompute
    commit("a concurrent forced run")
    assert task.complete()                                   # committed during it, by another run: done
    assert tasks.task_class("a")(key=key, plan_id="p", run_id="unforced").complete()


# gin/tiny.gin's data stages on a third of its corpus (the first 300 standard-library modules), to keep the
# test short: the race is the same
SMALL = ["download.Embedded.max_files = 300", "tokenizer.Config.vocab_size = 1024",
         "shard.Config.allow_small_val = True"]
DRIVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pipeline import config, tasks
    root, go, force = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    params = [f'pipeline.Settings.cache_root = "{root}"'] + SMALL
    plan = config.load(["gin/tiny.gin"], params)
    plan.stages["shard"].key               # keys computed (the corpus listed) before the start line
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.01)
    result = tasks.build([plan], ["shard"], force=force)
    print(result.summary if not result.ok else f"ran {result.ran}", flush=True)
    sys.exit(0 if result.ok else 1)
""").replace("SMALL", repr(SMALL))


@pytest.mark.slow
def test_two_concurrent_forced_runs_of_the_tiny_data_stages_finish_with_one_commit(tmp_path):
    """The issue's case on the real data stages of gin/tiny.gin: two runs forcing tokenizer (and so shard,
    which reads it) start at the same instant on one local cache root."""
    root, go = str(tmp_path / "cache"), tmp_path / "go"
    env = os.environ | {"JAX_PLATFORMS": "cpu"}

    def start(*force):
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, root, str(go), *force], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    go.write_text("")
    undisturbed = start()                                     # download, clean, tokenizer, shard
    assert undisturbed.wait(timeout=300) == 0, undisturbed.stdout.read()
    plan = config.load(["gin/tiny.gin"], [f'pipeline.Settings.cache_root = "{root}"'] + SMALL)
    key = {s: plan.stages[s].key for s in ("tokenizer", "shard")}
    before = {s: cache.load(root, s, key[s]) for s in key}
    undisturbed = {s: _outputs(before[s]) for s in key}

    go.unlink()
    runs = [start("tokenizer"), start("tokenizer")]
    go.write_text("")
    outputs = [(proc.wait(timeout=300), proc.stdout.read()) for proc in runs]
    assert [code for code, _ in outputs] == [0, 0], "\n\n".join(out[-3000:] for _, out in outputs)
    for stage in key:
        done = _one_commit(root, stage, key[stage])
        assert done.manifest["attempt"] != before[stage].manifest["attempt"]          # forced: recomputed
        assert _outputs(done) == undisturbed[stage]                                 # identical outputs


def _outputs(done):
    """Every file of a commit, as bytes: a data stage's output is a function of its key."""
    return {name: storage.read_bytes(path) for name, path in zip(sorted(done.files), done.paths())}
