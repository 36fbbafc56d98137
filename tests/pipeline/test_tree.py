"""Several sources make the DAG a tree (pipeline/dag.py): each source's own download -> clean -> shard, one
tokenizer over all, training and what follows over every shard. Counted stage runs on the real stage names
with fake stages (tests/pipeline/fake_stage.py), and the keys of the real prose + code run file."""

import re

import pytest

from pipeline import __main__ as cli
from pipeline import checks, config, dag, tasks

FAKE = "tests.pipeline.fake_stage"
# The real tree's shape under other names (gin registers a configurable once per name, and the real stages'
# names must keep their real configurables for the tests after these)
STAGES = {"fetch": (FAKE, ()), "wash": (FAKE, ("fetch",)), "vocab": (FAKE, ("wash",)),
          "cut": (FAKE, ("wash", "vocab")), "fit": (FAKE, ("cut", "vocab")), "judge": (FAKE, ("fit", "cut"))}
PER_SOURCE = ("fetch", "wash", "cut")


@pytest.fixture
def tree_run(monkeypatch, tmp_path):
    monkeypatch.setattr(dag, "STAGES", STAGES)
    monkeypatch.setattr(dag, "PER_SOURCE", PER_SOURCE)
    log = tmp_path / "runs.log"
    base = [f'pipeline.Settings.cache_root = "{tmp_path / "cache"}"']
    base += [f'{s}.Config.name = "{s}"' for s in STAGES] + [f'{s}.Config.log = "{log}"' for s in STAGES]

    def build(*params, **kw):
        result = tasks.build([config.load([], base + list(params))], **kw)
        assert result.ok, result.summary
        text = log.read_text() if log.exists() else ""
        log.write_text("")
        return sorted(text.split())

    return build


def _sources(*names: str) -> list[str]:
    """The bindings of a run with these sources: the list, and each source's stages named after their node."""
    return [f"fit.Config.sources = {tuple(names)!r}",
            *(f'{src}/{s}.Config.name = "{s}[{src}]"' for src in names for s in PER_SOURCE)]


TWO = _sources("code", "web")


def test_the_tree_of_two_sources():
    t = dag.tree(("code", "web"))
    assert list(t.nodes) == ["download[code]", "download[web]", "classifier", "score[code]", "score[web]",
                             "clean[code]", "clean[web]", "tokenizer", "shard[code]", "shard[web]",
                             "yardsticks", "train", "evaluate", "export"]
    assert t.upstream("score[web]") == ("download[web]", "classifier")    # one classifier scores every source
    assert t.upstream("clean[web]") == ("score[web]",)
    assert t.upstream("shard[web]") == ("clean[web]", "tokenizer")
    assert t.upstream("tokenizer") == ("clean[code]", "clean[web]")
    assert t.upstream("evaluate") == ("train", "shard[code]", "shard[web]", "tokenizer", "yardsticks",
                                      "clean[code]", "clean[web]")
    # a source's own stage reads its chain by stage name, as in a one-source run; fan-in keeps the source
    assert t.input_names("shard[web]") == {"clean[web]": "clean", "tokenizer": "tokenizer"}
    assert t.input_names("tokenizer") == {"clean[code]": "clean[code]", "clean[web]": "clean[web]"}
    assert t.select("clean") == ["clean[code]", "clean[web]"] and t.select("clean[web]") == ["clean[web]"]
    with pytest.raises(ValueError, match=r"unknown stage 'clean\[docs\]'; stages are: download\[code\], "):
        t.select("clean[docs]")
    # one source and no reference model: the DAG, less the stages that read a reference
    assert dag.tree().nodes == {s: (s, tuple(u for u in ups if u not in dag.OPTIONAL))
                                for s, (_, ups) in dag.STAGES.items() if s not in dag.OPTIONAL}


def test_a_weight_change_reruns_only_training_and_what_follows(tree_run):
    assert tree_run(*TWO) == sorted(["fetch[code]", "fetch[web]", "wash[code]", "wash[web]", "vocab",
                                    "cut[code]", "cut[web]", "fit", "judge"])
    assert tree_run(*TWO) == []
    assert tree_run(*TWO, "fit.Config.value = 3") == ["fit", "judge"]


def test_one_sources_cleaning_reruns_its_chain_and_what_reads_it_never_the_other_sources_text(tree_run):
    tree_run(*TWO)
    # The tokenizer samples every source's clean text, so it follows; every shard then holds new token ids.
    # The other source's download and clean are never touched.
    assert tree_run(*TWO, "code/wash.Config.value = 5") == sorted(
        ["wash[code]", "vocab", "cut[code]", "cut[web]", "fit", "judge"])


def test_adding_a_source_reuses_the_chain_a_one_source_run_built(tree_run):
    tree_run(*_sources("web"))
    # one named source: its chain's keys are a one-source run's (its stages read each other by stage name)
    ran = tree_run(*TWO)
    assert "fetch[web]" not in ran and "wash[web]" not in ran
    assert ran == sorted(["fetch[code]", "wash[code]", "vocab", "cut[code]", "cut[web]", "fit", "judge"])


def test_force_and_stage_name_a_sources_node_or_every_sources(tree_run, tmp_path, capsys):
    tree_run(*TWO)
    assert tree_run(*TWO, force=["cut[web]"]) == ["cut[web]", "fit", "judge"]
    assert tree_run(*TWO, force=["cut"]) == ["cut[code]", "cut[web]", "fit", "judge"]
    assert tree_run(*TWO, targets=["wash[code]"], force=["wash[code]"]) == ["wash[code]"]
    names = [f'{s}.Config.name = "{s}"' for s in STAGES]
    root = f'pipeline.Settings.cache_root = "{tmp_path / "cache"}"'
    (tmp_path / "run.gin").write_text("\n".join([root, *TWO, *names]) + "\n")
    assert cli.main(["status", "--gin", str(tmp_path / "run.gin")]) == 0
    rows = [line.split()[:3] for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows] == list(dag.tree(("code", "web")).nodes)
    assert {r[2] for r in rows} == {"cached"}
    assert cli.main(["run", "--gin", str(tmp_path / "run.gin"), "--stage", "wash[docs]"]) == 2
    assert "error: unknown stage 'wash[docs]'" in capsys.readouterr().err


def test_the_prose_code_run_file_keys_follow_the_tree():
    """The real run file: a weight change moves only train, evaluate and export; a code cleaning change
    leaves prose's download and clean alone; prose's chain has the keys of the one-source embedded run."""
    gin = ["gin/mixtures/prose_code.gin"]
    plan = config.load(gin)
    assert plan.tree.sources == ("code", "prose")
    keys = {n: sp.key for n, sp in plan.stages.items()}
    reweighed = config.load(gin, ['train.Mixture.phases = ((0, {"prose": 0.5, "code": 0.5}),)'])
    assert [n for n, sp in reweighed.stages.items() if sp.key != keys[n]] == ["train", "evaluate", "export"]
    recleaned = config.load(gin, ["code/clean.Config.min_chars = 300"])
    changed = [n for n, sp in recleaned.stages.items() if sp.key != keys[n]]
    assert "clean[code]" in changed
    assert not {"download[code]", "download[prose]", "clean[prose]", "score[prose]"} & set(changed)
    assert "score[code]" not in changed       # a threshold: code's selection reruns, never its scoring
    assert checks.cannot_run(plan, ["train", "evaluate"]) == ""       # what a run checks before work
    for source in ("code", "prose"):      # each source's shard guards one training sequence
        guard = plan.stages[f"shard[{source}]"].config.min_val_tokens
        assert guard >= plan.stages["train"].config.seq_len + 1
    one = config.load(["gin/tiny.gin"])
    assert keys["download[prose]"] == one.stages["download"].key
    assert keys["clean[prose]"] == one.stages["clean"].key
    assert keys["score[prose]"] == one.stages["score"].key


def test_a_binding_in_a_scope_no_stage_reads_is_one_error_line():
    """A misspelled source would otherwise clean with the defaults, silently."""
    with pytest.raises(config.ConfigError) as e:
        config.load(["gin/mixtures/prose_code.gin"], ["cdoe/clean.Config.min_chars = 5"])
    assert str(e.value) == ("cdoe/clean.Config.min_chars is bound in gin scope 'cdoe', which no stage reads: "
                            "'cdoe' is not a source of this run (its sources are code, prose; train.Mixture "
                            "names them) and no @cdoe/... reference uses it")
    config.load(["gin/tiny.gin"], ['c4/download.Files.paths = ["x.jsonl"]',      # a referenced scope is read
                                   'yardsticks.Config.reference_files = {"c4": @c4/download.Files()}'])


def test_the_web_code_math_run_file_pins_each_source_and_plans_its_tokens_offline(capsys):
    """The real three-source run file: each hub source at a commit, prose filters off for code and math
    only, and `make plan` (offline, cache root a placeholder) prints the tokens asked per source and phase."""
    gin = ["gin/mixtures/web_code_math.gin"]
    plan = config.load(gin)
    assert plan.tree.sources == ("code", "math", "web")
    chains = {f"{s}[{src}]" for s in dag.PER_SOURCE if s not in dag.OPTIONAL for src in plan.tree.sources}
    assert chains <= set(plan.stages)
    pinned = re.compile(r"[0-9a-f]{40}")
    for src in ("web", "math"):
        assert pinned.fullmatch(plan.stages[f"download[{src}]"].config.source.revision), src
    (code_files,) = plan.stages["download[code]"].config.source.paths
    assert pinned.search(code_files.split("@", 1)[1].split("/", 1)[0])
    cleans = {src: plan.stages[f"clean[{src}]"].config for src in plan.tree.sources}
    assert cleans["web"].gopher_quality is not None and cleans["web"].fineweb_quality is not None
    assert all(cleans[s].gopher_quality is None and cleans[s].language_id is None for s in ("code", "math"))
    assert not cleans["code"].tidy_whitespace and cleans["web"].tidy_whitespace
    assert cli.main(["plan", "--gin", *gin, "--no-compile"]) == 0
    out = capsys.readouterr().out
    asked = {(row.split()[0], row.split()[2]): int(row.split()[4].replace(",", ""))
             for row in out.splitlines() if re.match(r"\s+[01]\s+\d+-\d+\s+(web|code|math)\s", row)}
    train = plan.stages["train"].config
    assert sum(asked.values()) == train.steps * train.global_batch * train.seq_len
    assert asked["1", "code"] > asked["0", "code"] * (2_400 / 21_600)      # the anneal raises code's share


def test_the_web_code_math_search_plans_one_proxy_on_the_runs_own_data():
    """gin/mixsearch/web_code_math.gin: a proxy-scale model on exactly the data nodes of the 1B mixture run
    (the search adds training only), with enough proxies for a three-source fit."""
    from pipeline import mixsearch, mixture_fit

    found, search = mixsearch.settings(["gin/mixsearch/web_code_math.gin"], [])
    run = config.load(["gin/mixtures/web_code_math.gin"])
    data = [n for n in run.tree.closure("train") if n != "train"]
    assert [search.stages[n].config for n in data] == [run.stages[n].config for n in data]
    assert found.proxies > mixture_fit.n_coefficients(3) and found.target == "bpb/mean"
    proxy, final = search.stages["train"].config, run.stages["train"].config
    assert proxy.model.d_model * 4 == final.model.d_model and proxy.steps * 12 == final.steps
