"""Luigi wiring on a small fake DAG (a -> b -> c, a -> d): reruns skip finished work, overrides
rerun only what they touch, forcing propagates downstream, failures exit non-zero."""

import pytest

from pipeline import __main__ as cli
from pipeline import cache, config, dag, tasks
from stages.io import storage

FAKE = "tests.pipeline.fake_stage"


@pytest.fixture
def fake_dag(monkeypatch, tmp_path):
    monkeypatch.setattr(dag, "STAGES", {"a": (FAKE, ()), "b": (FAKE, ("a",)), "c": (FAKE, ("b",)),
                                        "d": (FAKE, ("a",))})
    log = tmp_path / "runs.log"
    (tmp_path / "empty.gin").write_text("# the bindings come from --gin-param\n")
    monkeypatch.setattr(config, "GIN_DIR", str(tmp_path))   # the CLI's default is GIN_DIR/tiny.gin
    (tmp_path / "tiny.gin").write_text("")
    base = [f'pipeline.Settings.cache_root = "{tmp_path / "cache"}"']
    base += [f'{s}.Config.name = "{s}"' for s in "abcd"] + [f'{s}.Config.log = "{log}"' for s in "abcd"]

    def runs():
        text = log.read_text() if log.exists() else ""
        log.write_text("")
        return sorted(text.split())

    return base, runs


def _build(params, **kw):
    result = tasks.build([config.load([], params)], dag.sinks(list(dag.STAGES)), **kw)
    assert result.ok, result.summary
    return result


def test_rerun_does_nothing_and_an_override_reruns_only_what_it_touches(fake_dag):
    base, runs = fake_dag
    assert _build(base).ran == ["a", "b", "c", "d"]
    assert runs() == ["a", "b", "c", "d"]
    assert _build(base).ran == [] and runs() == []
    assert _build(base + ["b.Config.value = 7"]).ran == ["b", "c"]
    assert runs() == ["b", "c"]
    plan = config.load([], base + ["b.Config.value = 7"])
    out = cache.load(plan.cache_root, "c", plan.stages["c"].key)
    assert storage.read_text(out.file("out.txt")) == "a=0;b=7;c=0;"


def test_a_deleted_output_file_reruns_that_stage_when_it_is_needed(fake_dag):
    base, runs = fake_dag
    _build(base)
    runs()
    plan = config.load([], base)
    storage.remove(cache.stage_dir(plan.cache_root, "b", plan.stages["b"].key))
    # c is finished and never reads b again: deleting an intermediate stage's directory to save space is safe
    # (a file deleted from inside a commit is damage, rebuilt with c: test_damage_rebuilds.py).
    assert _build(base).ran == []
    assert tasks.build([plan], ["b"]).ran == ["b"]
    assert runs() == ["b"]


def test_force_reruns_the_stage_and_everything_downstream_only(fake_dag):
    base, runs = fake_dag
    _build(base)
    runs()
    assert _build(base, force=["b"]).ran == ["b", "c"]
    assert runs() == ["b", "c"]


def test_variants_sharing_upstream_stages_run_them_once(fake_dag):
    base, runs = fake_dag
    plans = [config.load([], base + [f"c.Config.value = {v}"]) for v in (1, 2, 3)]
    result = tasks.build(plans, ["c", "d"])
    assert result.ok
    assert runs() == ["a", "b", "c", "c", "c", "d"]


def test_cli_exits_nonzero_when_a_stage_fails(fake_dag, capsys):
    base, _ = fake_dag
    argv = ["run"] + [f"--gin-param={p}" for p in base] + ["--gin-param=c.Config.fail = True"]
    assert cli.main(argv) == 1
    assert "FAILED" in capsys.readouterr().err
    plan = config.load([], base)
    assert cache.load(plan.cache_root, "b", plan.stages["b"].key) is not None  # upstream work kept


def test_cli_stage_and_force_and_t5x_aliases(fake_dag, capsys):
    base, runs = fake_dag
    t5x = [f"--gin.{p}" for p in base]
    assert cli.main(["run", "--stage", "b"] + t5x) == 0
    assert runs() == ["a", "b"]
    assert cli.main(["run", "--stage", "b", "--force"] + t5x) == 0
    assert runs() == ["b", "c"]
    out = capsys.readouterr().out
    assert "ran" in out and "reused" in out
    assert cli.main(["status"] + t5x) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:4] == ["stage", "key", "status", "size"]
    assert [line.split()[2] for line in table.splitlines()[1:]] == ["cached", "cached", "cached", "missing"]


def test_cli_reports_bad_config_before_running(fake_dag, capsys):
    base, runs = fake_dag
    assert cli.main(["run", "--overrides", " ".join(base) + " b.Config.valeu=3"]) == 2
    err = capsys.readouterr().err
    assert "b.Config has no parameter 'valeu'" in err and "Did you mean value?" in err
    assert runs() == []
    assert cli.main(["run", "--stage", "nope"]) == 2
    assert "unknown stage 'nope'; stages are: a, b, c, d" in capsys.readouterr().err


def test_overrides_string_keeps_gin_quotes():
    assert cli._split_overrides('a.b=1 c.d="x y"  e.f=\'z\'') == ['a.b=1', 'c.d="x y"', "e.f='z'"]
    assert cli._split_overrides('a.b = 1 c.d= "x"') == ["a.b = 1", 'c.d= "x"']
    assert cli._split_overrides('f.paths=["a b", "c"]  g=(1, 2)') == ['f.paths=["a b", "c"]', "g=(1, 2)"]
    assert cli._split_overrides("") == []


def test_a_stage_that_reads_files_keys_them_and_reruns_with_everything_after_it_when_they_change(
        fake_dag, tmp_path, capsys):
    """The generic hook: a stage module's `key_inputs(config)` goes into its key (here stage a's files)."""
    base, runs = fake_dag
    (tmp_path / "in").mkdir()
    (tmp_path / "in/x.txt").write_text("one;")
    reads = base + [f'a.Config.reads = "{tmp_path}/in/*.txt"']
    assert _build(reads).ran == ["a", "b", "c", "d"] and runs() == ["a", "b", "c", "d"]
    assert _build(reads).ran == []                                            # rerun: nothing changed
    (tmp_path / "in/x.txt").write_text("two;")
    assert _build(reads).ran == ["a", "b", "c", "d"]                           # rewritten: every key moves
    assert runs() == ["a", "b", "c", "d"]
    plan = config.load([], reads)
    assert storage.read_text(cache.load(plan.cache_root, "c", plan.stages["c"].key).file("out.txt")) == (
        "two;a=0;b=0;c=0;")
    assert plan.stages["a"].inputs == storage.versions(f"{tmp_path}/in/*.txt")
    assert plan.stages["b"].inputs is None

    # Inputs that cannot be listed: `plan` shows the keys as unknown and says why; status and run stop.
    gone = base + [f'a.Config.reads = "{tmp_path}/nowhere/*.txt"']
    assert cli.main(["plan"] + [f"--gin-param={p}" for p in gone]) == 0
    out = capsys.readouterr().out
    assert [line.split()[1:3] for line in out.splitlines()[1:5]] == [["?", "unknown"]] * 4
    assert "note: a: cannot list what it reads, so its cache key and every key after it are unknown" in out
    assert "nowhere/*.txt' matches no files" in out
    for command in ("status", "run"):
        assert cli.main([command] + [f"--gin-param={p}" for p in gone]) == 2
        assert "error: a: cannot list what it reads" in capsys.readouterr().err
    assert runs() == []
