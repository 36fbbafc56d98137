"""Per-key leases (pipeline/lease.py), locally and on the GCS emulator (whose wrapper enforces
`ifGenerationMatch` as GCS does, tests/gcs_emulator.py)."""

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from pipeline import cache, lease
from stages.io import storage


def test_exclusive_create_lets_exactly_one_of_many_racers_win(root):
    path = f"{root}/k/_lease-000001.json"
    wins, barrier = [], threading.Barrier(6)

    def race(i):
        barrier.wait()
        if storage.create_exclusive(path, json.dumps({"racer": i}).encode()):
            wins.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert json.loads(storage.read_bytes(path)) == {"racer": wins[0]}     # the winner's bytes, whole
    assert storage.create_exclusive(path, b"late") is False


def test_a_held_key_makes_the_next_run_wait_and_a_released_one_is_taken_at_once(root):
    key_dir = f"{root}/stage/k"
    order = []
    with lease.hold(key_dir, owner="first", poll_s=0.05) as first:
        waiter = threading.Thread(target=lambda: _hold_briefly(key_dir, order))
        waiter.start()
        time.sleep(0.5)
        assert order == [] and waiter.is_alive()           # waiting while "first" is live
        order.append("first done")
    waiter.join(timeout=30)
    assert order == ["first done", "second held"]
    assert first.number == 1 and lease.lease_numbers(key_dir) == [1, 2]
    assert all(lease.read(f"{key_dir}/{lease.lease_name(n)}")["released"] for n in (1, 2))


def _hold_briefly(key_dir, order):
    with lease.hold(key_dir, owner="second", poll_s=0.05) as held:
        assert held.number == 2
        order.append("second held")


def test_a_lease_of_a_dead_process_on_this_host_is_free_at_once_and_an_old_heartbeat_anywhere(root):
    key_dir = f"{root}/stage/k"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    now = time.time()
    records = {
        1: {"owner": "killed", "host": socket.gethostname(), "pid": int(dead.stdout), "heartbeat": now,
            "ttl_s": 60},
        2: {"owner": "vanished host", "host": "elsewhere", "pid": 1, "heartbeat": now - 120, "ttl_s": 60},
    }
    for record in records.values():
        assert not lease.live(record), record
        assert lease.live(record | {"heartbeat": now, "host": "elsewhere"})     # elsewhere, fresh: live
    storage.write_json(f"{key_dir}/{lease.lease_name(1)}", records[1])
    with lease.hold(key_dir, owner="rerun", poll_s=0.05) as held:                # no wait for the ttl
        assert held.number == 2


def test_a_holder_that_was_taken_over_does_not_commit(root):
    key_dir = cache.stage_dir(root, "a", "k")

    def stalls_and_is_taken_over(config, inputs, out_dir, work_dir):
        storage.write_text(f"{out_dir}/out.txt", "stale")
        storage.write_json(f"{key_dir}/{lease.lease_name(2)}", {"owner": "newer", "host": "elsewhere",
                                                                "pid": 1, "heartbeat": time.time()})

    with pytest.raises(lease.LeaseLost, match="taken over by lease 2"):
        cache.run_stage(cache_root=root, stage="a", key="k", config={}, upstream={},
                        fn=stalls_and_is_taken_over)
    assert cache.load(root, "a", "k") is None and not storage.exists(f"{key_dir}/{cache.MANIFEST}")


def test_a_run_that_waited_reuses_the_commit_it_waited_for(root):
    calls = []

    def slow(config, inputs, out_dir, work_dir):
        calls.append(config["who"])
        time.sleep(1.0)
        storage.write_text(f"{out_dir}/out.txt", config["who"])

    results = {}

    def run(who):
        results[who] = cache.run_stage(cache_root=root, stage="a", key="k", config={"who": who}, upstream={},
                                       fn=slow)

    threads = [threading.Thread(target=run, args=(who,)) for who in ("x", "y")]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(timeout=60)
    assert len(calls) == 1                                   # one computed it, the other waited and reused
    assert results["x"].path == results["y"].path and results["x"].manifest == results["y"].manifest
    assert [n for n in storage.listdir(cache.stage_dir(root, "a", "k")) if n.startswith("attempt-")] == [
        results["x"].manifest["attempt"]]


def test_pins_name_the_attempts_live_readers_hold_and_dead_ones_are_pruned(root):
    key_dir = f"{root}/stage/k"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    storage.write_json(f"{key_dir}/{lease.PIN}killed{lease.SUFFIX}",
                       {"attempt": "attempt-old", "owner": "killed", "host": socket.gethostname(),
                        "pid": int(dead.stdout), "heartbeat": time.time(), "ttl_s": 60})
    with lease.pin(key_dir, "attempt-1", owner="reader") as path:
        assert lease.read(path)["attempt"] == "attempt-1"
        assert lease.pinned(key_dir) == {"attempt-1"}
        assert len([n for n in storage.listdir(key_dir) if n.startswith(lease.PIN)]) == 2
        assert lease.pinned(key_dir, prune=True) == {"attempt-1"}
        assert [n for n in storage.listdir(key_dir) if n.startswith(lease.PIN)] == [path.rsplit("/", 1)[1]]
    assert lease.pinned(key_dir) == set() and storage.listdir(key_dir) == []
