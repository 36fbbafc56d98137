"""The stage cache: keys, the `_SUCCESS.json` commit, and what counts as done."""

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pipeline import cache, lease
from stages.io import storage
from tests.pipeline import fake_stage


def _run(root, config, key="k", upstream=None, stage="a"):
    return cache.run_stage(cache_root=root, stage=stage, key=key, config=config,
                           upstream=upstream or {}, fn=fake_stage.run)


def test_key_depends_on_name_version_config_and_upstream_only():
    c = fake_stage.Config(value=1)
    k = cache.stage_key("a", "1", c, {"up": "u1"})
    assert k == cache.stage_key("a", "1", fake_stage.Config(value=1), {"up": "u1"})
    assert len({k,
                cache.stage_key("b", "1", c, {"up": "u1"}),
                cache.stage_key("a", "2", c, {"up": "u1"}),
                cache.stage_key("a", "1", fake_stage.Config(value=2), {"up": "u1"}),
                cache.stage_key("a", "1", c, {"up": "u2"})}) == 5
    # Fields marked key=False (how a stage runs, not what it computes) do not change the key.
    assert k == cache.stage_key("a", "1", dataclasses.replace(c, log="/tmp/elsewhere"), {"up": "u1"})


def test_nested_configs_of_different_types_get_different_keys():
    @dataclasses.dataclass(frozen=True)
    class A:
        x: int = 1

    @dataclasses.dataclass(frozen=True)
    class B:
        x: int = 1

    assert cache.stage_key("s", "1", A(), {}) != cache.stage_key("s", "1", B(), {})


def test_commit_lists_every_file_with_its_size(root):
    done = _run(root, fake_stage.Config(value=3, name="a"))
    assert storage.read_text(done.file("out.txt")) == "a=3;"
    assert done.manifest["files"]["out.txt"] == 4
    assert done.manifest["key"] == "k" and done.manifest["wall_time_s"] >= 0
    assert "attempt-" in done.path and done.manifest["attempt"] in done.path
    assert cache.load(root, "a", "k") == done


def test_a_deleted_or_resized_file_means_not_done(root):
    done = _run(root, fake_stage.Config(value=3))
    storage.write_text(done.file("out.txt"), "changed size")
    assert cache.load(root, "a", "k") is None
    done = _run(root, fake_stage.Config(value=3))
    storage.remove(done.file("out.txt"))
    assert cache.load(root, "a", "k") is None


def test_a_failed_run_commits_nothing_and_the_next_commit_removes_its_attempt(root):
    with pytest.raises(RuntimeError, match="failed on purpose"):
        _run(root, fake_stage.Config(fail=True))
    stage_dir = cache.stage_dir(root, "a", "k")
    assert cache.load(root, "a", "k") is None
    leftovers = storage.listdir(stage_dir)
    # the failed attempt, and the lease it released (lease.py)
    assert [n for n in leftovers if n.startswith("attempt-")] == leftovers[1:] and len(leftovers) == 2
    assert lease.read(f"{stage_dir}/{lease.lease_name(1)}")["released"] is True
    done = _run(root, fake_stage.Config(value=1))
    # one commit: its manifest, its attempt, and only the latest lease (released)
    expected = [cache.MANIFEST, done.manifest["attempt"], lease.lease_name(2)]
    assert storage.listdir(stage_dir) == sorted(expected)


def test_a_killed_stage_leaves_nothing_that_counts_as_done(tmp_path):
    root = str(tmp_path / "cache")
    script = textwrap.dedent(f"""
        import time
        from pipeline import cache
        from stages.io import storage
        def slow(config, inputs, out_dir, work_dir):
            storage.write_text(storage.join(out_dir, "part-0.txt"), "half")
            print("wrote", flush=True)
            time.sleep(60)
        cache.run_stage(cache_root={root!r}, stage="a", key="k", config={{}}, upstream={{}}, fn=slow)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.stdout.readline().strip() == "wrote"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert cache.load(root, "a", "k") is None
    assert not storage.exists(storage.join(cache.stage_dir(root, "a", "k"), cache.MANIFEST))
    time.sleep(0.01)
    # The killed run held the key's lease; its process is gone, so the rerun takes the key at once.
    done = _run(root, fake_stage.Config(value=2))
    assert done.files == {"out.txt": 4}
    assert [n for n in storage.listdir(cache.stage_dir(root, "a", "k")) if n.startswith("attempt-")] == [
        done.manifest["attempt"]]


def test_work_dir_survives_a_failed_attempt_and_is_removed_by_the_commit(root):
    def resumable(config, inputs, out_dir, work_dir):
        assert work_dir == storage.join(cache.stage_dir(root, "t", "k"), cache.WORK)
        seen = storage.exists(storage.join(work_dir, "progress.txt"))
        storage.write_text(storage.join(work_dir, "progress.txt"), "step 60")
        storage.write_text(storage.join(out_dir, "out.txt"), f"resumed={seen}")
        if config["fail"]:
            raise RuntimeError("preempted")

    with pytest.raises(RuntimeError, match="preempted"):
        cache.run_stage(cache_root=root, stage="t", key="k", config={"fail": True}, upstream={}, fn=resumable)
    done = cache.run_stage(cache_root=root, stage="t", key="k", config={"fail": False}, upstream={},
                           fn=resumable)
    assert storage.read_text(done.file("out.txt")) == "resumed=True"
    left = storage.listdir(cache.stage_dir(root, "t", "k"))
    assert left == sorted([cache.MANIFEST, done.manifest["attempt"], lease.lease_name(2)])


def test_committed_paths_come_from_the_manifest_not_the_directory(tmp_path):
    done = _run(str(tmp_path), fake_stage.Config())
    storage.write_text(storage.join(done.path, "stray.txt"), "not in the manifest")
    assert done.paths("*.txt") == [storage.join(done.path, "out.txt")]
    with pytest.raises(FileNotFoundError, match="has no 'stray.txt'"):
        done.file("stray.txt")


def test_inputs_enter_the_key_only_when_a_stage_states_them():
    c = fake_stage.Config(value=1)
    k = cache.stage_key("a", "1", c, {})
    assert cache.stage_key("a", "1", c, {}, inputs=None) == k                 # no hook: the key of old
    with_inputs = cache.stage_key("a", "1", c, {}, inputs={"/d/x": "size=1,mtime_ns=5"})
    assert len({k, with_inputs, cache.stage_key("a", "1", c, {}, inputs={"/d/x": "size=1,mtime_ns=6"}),
                cache.stage_key("a", "1", c, {}, inputs={})}) == 4


DAMAGED_MANIFESTS = {
    "random bytes": bytes(range(256)) * 3,
    "empty object": b"{}",
    "a list": b"[1, 2, 3]",
    "truncated": b'{"attempt": "attempt-x", "files": {"out.txt": 4',
    "attempt outside the key": b'{"attempt": "../../elsewhere", "files": {"out.txt": 4}}',
    "file outside the attempt": b'{"attempt": "attempt-x", "files": {"../../../etc/passwd": 4}}',
    "absolute file": b'{"attempt": "attempt-x", "files": {"/etc/passwd": 4}}',
    "size not a number": b'{"attempt": "attempt-x", "files": {"out.txt": "4"}}',
    "no files": b'{"attempt": "attempt-x", "files": {}}',
}


@pytest.mark.parametrize("damage", DAMAGED_MANIFESTS)
def test_a_damaged_manifest_is_not_done_names_its_file_and_is_rebuilt(damage, tmp_path, caplog):
    root = str(tmp_path / "cache")
    _run(root, fake_stage.Config(value=3))
    manifest = storage.join(cache.stage_dir(root, "a", "k"), cache.MANIFEST)
    storage.write_bytes(manifest, DAMAGED_MANIFESTS[damage])
    with caplog.at_level(logging.WARNING, logger="pipeline.cache"):
        assert cache.load(root, "a", "k") is None
    assert manifest in caplog.text and "will be rebuilt" in caplog.text
    rebuilt = _run(root, fake_stage.Config(value=3))
    assert cache.load(root, "a", "k") == rebuilt and storage.read_text(rebuilt.file("out.txt")) == "x=3;"


def test_a_file_rewritten_in_place_at_the_same_size_is_found_by_verify_and_rebuilt(root):
    done = _run(root, fake_stage.Config(value=3))
    assert set(done.manifest["checksums"]) == set(done.files) and cache.verify(done) == []
    storage.write_text(done.file("out.txt"), "x=4;")                  # same size, other bytes
    damaged = cache.load(root, "a", "k")
    assert damaged is not None                                        # sizes alone cannot tell
    problems = cache.verify(damaged)
    assert len(problems) == 1 and problems[0].startswith(done.file("out.txt") + ": checksum ")
    kept = cache.uncommit(root, "a", "k")
    assert cache.load(root, "a", "k") is None and storage.exists(kept)
    rebuilt = _run(root, fake_stage.Config(value=3))
    assert storage.read_text(rebuilt.file("out.txt")) == "x=3;" and cache.verify(rebuilt) == []


def test_garbage_is_the_attempts_no_manifest_names_under_keys_no_live_lease_holds(root):
    with pytest.raises(RuntimeError, match="failed on purpose"):
        _run(root, fake_stage.Config(fail=True), key="never")             # an attempt nothing names
    done = _run(root, fake_stage.Config(value=1), key="done")
    crashed = storage.join(cache.stage_dir(root, "a", "done"), "attempt-20260101T000000-deadbeef")
    storage.write_text(storage.join(crashed, "part.txt"), "left by a crashed run")
    found = cache.garbage(root)
    never = [n for n in storage.listdir(cache.stage_dir(root, "a", "never")) if n.startswith("attempt-")]
    assert sorted(found) == sorted([crashed, storage.join(cache.stage_dir(root, "a", "never"), never[0])])
    assert done.path not in found
    with lease.hold(cache.stage_dir(root, "a", "never"), owner="a live run"):
        assert cache.garbage(root) == [crashed]                       # a live run's key is left alone
    for path in found:
        storage.remove(path)
    assert cache.garbage(root) == [] and cache.load(root, "a", "done") == done


def test_a_root_named_with_glob_characters_is_cleaned_up_by_the_commit_and_by_gc(root, capsys):
    from pipeline import __main__ as cli
    from tests import tiny_run

    root = storage.join(root, "0003-clean[code]-*?")     # the fault harness's roots are named after nodes
    key_dir = cache.stage_dir(root, "a", "k")
    crashed = storage.join(key_dir, "attempt-20260101T000000-deadbeef")
    storage.write_text(storage.join(crashed, "part.txt"), "left by a crashed run")
    first = _run(root, fake_stage.Config(value=1))
    assert not storage.exists(crashed)                              # the commit removed the stale attempt
    second = _force(root)
    assert not storage.exists(first.path) and cache.load(root, "a", "k") == second
    storage.remove(second.path)                                     # a committed attempt, removed whole
    assert storage.sizes(second.path) == {} and cache.load(root, "a", "k") is None
    storage.write_text(storage.join(crashed, "part.txt"), "left by another crash")
    assert cache.garbage(root) == [crashed]
    assert cli.main(["status", "--gc", *tiny_run.argv(root)]) == 0     # `make gc`
    out = capsys.readouterr().out
    assert f"gc: removing {crashed}" in out and "gc: 1 stale attempt(s) removed" in out
    assert not storage.exists(crashed) and cache.garbage(root) == []


@pytest.mark.parametrize("stage, key", [("a", "../../etc"), ("../a", "k"), ("a", "k/../../x"), ("a", ""),
                                        ("a/b", "k"), ("a", "/abs"), ("a", ".."), ("a", "k\\x")])
def test_a_stage_name_or_key_cannot_reach_outside_the_cache_root(stage, key, tmp_path):
    with pytest.raises(ValueError, match="not a plain name"):
        cache.stage_dir(str(tmp_path), stage, key)
    with pytest.raises(ValueError, match="refusing to write outside the cache root"):
        cache.run_stage(cache_root=str(tmp_path / "cache"), stage=stage, key=key, config={}, upstream={},
                        fn=fake_stage.run)
    assert not (tmp_path / "etc").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def _force(root, value=3):
    """A forced run's commit of ("a", "k"): computed again over whatever the key holds."""
    return cache.run_stage(cache_root=root, stage="a", key="k", config=fake_stage.Config(value=value),
                           upstream={}, fn=fake_stage.run, since=cache.lease_now(root, "a", "k"))


def test_a_pinned_attempt_outlives_a_recommit_and_its_last_reader_removes_it(root):
    first = _run(root, fake_stage.Config(value=3))
    key_dir = cache.stage_dir(root, "a", "k")
    with cache.reading(root, "a", "k", owner="one") as one, cache.reading(root, "a", "k", owner="two") as two:
        assert one == two == first and lease.pinned(key_dir) == {first.manifest["attempt"]}
        second = _force(root)                                       # a concurrent forced run commits
        assert second.path != first.path and cache.load(root, "a", "k") == second
        assert storage.read_text(first.file("out.txt")) == "x=3;"   # still readable: pinned
        assert first.path not in cache.garbage(root)
    # the last reader removed the attempt the recommit superseded, and its pin
    assert [n for n in storage.listdir(key_dir) if not n.startswith(lease.PREFIX)] == sorted(
        [cache.MANIFEST, second.manifest["attempt"]])
    with cache.reading(root, "a", "missing", owner="reader") as none:
        assert none is None


def test_a_forced_run_takes_only_a_commit_made_under_a_later_lease(root):
    first = _run(root, fake_stage.Config(value=3))
    since = cache.lease_now(root, "a", "k")
    assert cache.made_after(first, since - 1) and not cache.made_after(first, since)
    forced = _force(root)
    assert forced.path != first.path and cache.made_after(forced, since)
    reused = cache.run_stage(cache_root=root, stage="a", key="k", config=fake_stage.Config(value=3),
                             upstream={}, fn=fake_stage.run, since=since)
    assert reused == forced                           # committed after `since`: taken, not computed again


def test_load_reads_the_manifest_again_when_a_commit_lands_while_it_lists(tmp_path, monkeypatch):
    root = str(tmp_path / "cache")
    first = _run(root, fake_stage.Config(value=3))
    sizes, recommitted = storage.sizes, []

    def sizes_then_recommit(directory):
        found = sizes(directory)
        if not recommitted:                  # the commit lands between the manifest read and this listing
            recommitted.append("once")
            recommitted.append(_force(root))
        return found if storage.exists(directory) else {}

    monkeypatch.setattr(storage, "sizes", sizes_then_recommit)
    assert cache.load(root, "a", "k") == recommitted[1] != first
