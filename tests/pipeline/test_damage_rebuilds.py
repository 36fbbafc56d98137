"""A damaged stage is rebuilt by the next run, into the same key, and what was built from it is kept (a key
names one output); a stage removed whole is not rebuilt.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_damage_rebuilds.py

On the fake DAG of test_tasks.py (a -> b -> c, a -> d), b plays evaluate under export: a stage with a
committed stage after it. Luigi asks a task for its dependencies only when the task is not complete, so a
damaged b under a committed c stayed "missing" and the run reported 0 stages ran (`pipeline.plan.damaged`,
`tasks.build`).
"""

from __future__ import annotations

import pytest

from pipeline import __main__ as cli
from pipeline import cache, config, dag, tasks
from pipeline import plan as run_plan
from stages.io import storage
from tests.pipeline.test_tasks import fake_dag  # noqa: F401 - the fixture


def _damage(root: str, key: str, how: str) -> None:
    done = cache.load(root, "b", key)
    if how == "a listed file deleted":
        storage.remove(done.file("out.txt"))
    elif how == "a listed file truncated":
        storage.write_text(done.file("out.txt"), "a=")
    elif how == "a manifest that does not parse":
        storage.write_text(f"{cache.stage_dir(root, 'b', key)}/{cache.MANIFEST}", "{not json")
    elif how == "undone by status --verify":
        cache.uncommit(root, "b", key)


@pytest.mark.parametrize("how", ["a listed file deleted", "a listed file truncated",
                                 "a manifest that does not parse", "undone by status --verify"])
def test_a_damaged_stage_is_rebuilt_and_what_was_built_from_it_is_kept(fake_dag, how):  # noqa: F811
    base, runs = fake_dag
    plan = config.load([], base)
    assert tasks.build([plan], dag.sinks(list(dag.tree().nodes))).ok
    runs()
    key = plan.stages["b"].key
    _damage(plan.cache_root, key, how)
    assert cache.damaged(plan.cache_root, "b", key)
    assert run_plan.damaged(plan, ["c", "d"]) == ["b"]
    # What the pre-run checks and the command line's "nothing to do" see: b alone.
    assert run_plan.to_run(plan, ["c", "d"]) == ["b"]
    c_commit = cache.load(plan.cache_root, "c", plan.stages["c"].key).manifest["attempt"]
    result = tasks.build([plan], ["c", "d"])
    assert result.ok and result.ran == ["b"] and runs() == ["b"]
    assert cache.load(plan.cache_root, "c", plan.stages["c"].key).manifest["attempt"] == c_commit
    assert storage.read_text(cache.load(plan.cache_root, "c", plan.stages["c"].key).file("out.txt")) == \
        "a=0;b=0;c=0;"
    assert not cache.damaged(plan.cache_root, "b", key)
    assert tasks.build([plan], ["c", "d"]).ran == [] and runs() == []


def test_the_command_line_reports_the_rebuild_and_status_agrees(fake_dag, capsys):  # noqa: F811
    base, runs = fake_dag
    argv = ["run"] + [f"--gin-param={p}" for p in base]
    assert cli.main(argv) == 0
    runs()
    plan = config.load([], base)
    _damage(plan.cache_root, plan.stages["b"].key, "a listed file deleted")
    capsys.readouterr()
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "done in" in out and "1 stage(s) ran" in out, out
    assert runs() == ["b"]
    assert cli.main(["status"] + [f"--gin-param={p}" for p in base]) == 0
    table = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[2] for line in table] == ["cached"] * 4


def test_a_stage_removed_whole_to_save_space_is_not_rebuilt(fake_dag):  # noqa: F811
    """Removing a key's directory frees space (README): nothing is damaged, and c never reads b again."""
    base, runs = fake_dag
    plan = config.load([], base)
    assert tasks.build([plan], ["c", "d"]).ok
    runs()
    storage.remove(cache.stage_dir(plan.cache_root, "b", plan.stages["b"].key))
    assert not cache.damaged(plan.cache_root, "b", plan.stages["b"].key)
    assert "c" not in run_plan.to_run(plan, ["c", "d"])
    assert tasks.build([plan], ["c", "d"]).ran == [] and runs() == []
    assert tasks.build([plan], ["b"]).ran == ["b"] and runs() == ["b"]
