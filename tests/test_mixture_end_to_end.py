"""The prose + code mixture (gin/mixtures/prose_code.gin) through the whole tree, small: each source's own
download, clean and shard, one tokenizer, training on the mixture, evaluation per source and per domain,
export. One run shared by the tests of this file; each later command is counted from its status table."""

import contextlib
import io
import json

import pytest

from pipeline import __main__ as cli
from pipeline import config, sweep
from stages.io import storage
from stages.train import CHARS_PER_TOKEN_GUESS
from tests.conftest import REPO
from tests.tiny_run import MIX_GIN as GIN
from tests.tiny_run import MIX_SMALL

# The sweep twins' evaluations sample one prompt, as the mixture run's do (SMALL, tests/tiny_run.py): these
# tests check scores and reports, and the mixture run has compiled that prompt's decoder programs already.
ONE_PROMPT = next(p for p in MIX_SMALL if p.startswith("evaluate.Config.prompts"))
TREE = ["download[code]", "download[prose]", "classifier", "score[code]", "score[prose]", "clean[code]",
        "clean[prose]", "tokenizer", "shard[code]", "shard[prose]", "yardsticks", "train", "evaluate",
        "export"]


def _argv(root, *extra):
    return ["--gin", GIN, "--gin-param", f'pipeline.Settings.cache_root = "{root}"',
            *[a for p in MIX_SMALL + list(extra) for a in ("--gin-param", p)]]


def _ran(out: str) -> list[str]:
    rows = [line.split() for line in out.splitlines()[1:]]
    return [row[0] for row in rows if len(row) > 2 and row[2] == "ran"]


@pytest.fixture(scope="module")
def mixture_run(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mixture") / "cache")
    out = io.StringIO()        # the CLI's status table, read back: a module fixture has no capsys
    with contextlib.redirect_stdout(out):
        code = cli.main(["run", *_argv(root)])
    assert code == 0, out.getvalue()[-3000:]
    return root, out.getvalue()


def _plan(root, *extra):
    return config.load([GIN], [f'pipeline.Settings.cache_root = "{root}"', *MIX_SMALL, *extra])


def test_the_whole_tree_runs_and_each_source_is_scored_on_its_own(mixture_run):
    root, out = mixture_run
    assert _ran(out) == TREE
    plan = _plan(root)
    done = {node: plan.committed(node) for node in plan.stages}
    assert all(done.values()), [n for n, d in done.items() if d is None]
    evaluation = storage.read_json(done["evaluate"].file("eval.json"))
    assert set(evaluation["sources"]) == {"code", "prose"}
    for s in evaluation["sources"].values():
        assert s["bits_per_byte"] > 0 and s["tokens"] > 0 and s["val_bytes"] > 0
        assert 0 < s["clean"]["docs_kept"] <= s["clean"]["docs_in"]      # each source's cleaning, beside it
    # pooled: every source's evaluated tokens
    assert evaluation["tokens"] == sum(s["tokens"] for s in evaluation["sources"].values())
    assert "stdlib_code" in evaluation["reference_bpb"] and "aesop_fables" in evaluation["reference_bpb"]
    assert set(evaluation["contamination"]) == {"code", "prose"}
    report = storage.read_text(done["evaluate"].file("report.md"))
    assert "## Sources (each one's validation split)" in report and "| code |" in report
    # the sampler's realized shares: 12 steps x 4 rows at 0.75 / 0.25 -> exactly 36 and 12 rows
    summary = storage.read_json(done["train"].file("summary.json"))
    assert {s: m["rows"] for s, m in summary["mixture"].items()} == {"code": 12, "prose": 36}
    # and at every logged step (log_every 3, eval_every 6, and the first step alone) the rows and tokens each
    # source has given so far: 1 row of code and 3 of prose a step, 64 tokens a row
    rows = [json.loads(line) for line in storage.read_text(done["train"].file("metrics.jsonl")).splitlines()]
    assert [r["step"] for r in rows] == [1, 3, 6, 9, 12]
    for r in rows:
        assert {k: v for k, v in r.items() if k.startswith("mixture/")} == {
            "mixture/code/rows": r["step"], "mixture/code/tokens": 64 * r["step"],
            "mixture/prose/rows": 3 * r["step"], "mixture/prose/tokens": 3 * 64 * r["step"]}
    assert storage.read_json(done["export"].file("config.json"))["architectures"] == ["LlamaForCausalLM"]
    # the tokenizer sampled both sources: each holds less than its half of sample_chars (20M), so it gave all
    # it has (water-filling), and stats.json records the shares realised, not the half asked
    stats = storage.read_json(done["tokenizer"].file("stats.json"))
    sampled = {s: v["sampled_chars"] for s, v in stats["sources"].items()}
    assert set(sampled) == {"code", "prose"} and all(v["exhausted"] for v in stats["sources"].values())
    assert sum(sampled.values()) == stats["sampled_chars"] < 20_000_000 // 2
    assert {s: v["share"] for s, v in stats["sources"].items()} == pytest.approx(
        {s: c / stats["sampled_chars"] for s, c in sampled.items()}, abs=1e-6)
    # the card names every stage the model was made from, each source's with its own key (download[code]:
    # three reads from the export, through clean[code] and score[code]), the classifier once
    card = storage.read_text(done["export"].file("README.md"))
    for node in TREE[:-1]:
        assert f"| {node} | `{plan.stages[node].key}` |" in card


def test_a_weight_change_reruns_train_evaluate_and_export_only(mixture_run, capsys):
    root, _ = mixture_run
    weights = 'train.Mixture.phases = ((0, {"prose": 0.5, "code": 0.5}),)'
    assert cli.main(["run", *_argv(root, weights)]) == 0
    assert _ran(capsys.readouterr().out) == ["train", "evaluate", "export"]
    summary = storage.read_json(_plan(root, weights).committed("train").file("summary.json"))
    assert {s: m["rows"] for s, m in summary["mixture"].items()} == {"code": 24, "prose": 24}


def test_a_source_past_its_repetition_limit_is_refused_before_work(mixture_run, capsys):
    root, _ = mixture_run
    argv = _argv(root, "train.Mixture.max_epochs = 0.0001")
    assert cli.main(["run", *argv]) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: train: train.Mixture: source 'code' would be read ")
    assert "past max_epochs=0.0001; lower its weight, raise train.Mixture.max_epochs" in err[0]
    assert _plan(root, "train.Mixture.max_epochs = 0.0001").committed("train") is None
    # make plan shows the same numbers: tokens asked and held per source, the epochs, the refusal
    assert cli.main(["plan", *argv]) == 0
    table = capsys.readouterr().out
    assert "mixture (train.Mixture, by tokens" in table and "REFUSED: train.Mixture: source" in table


def test_plan_estimates_a_sources_tokens_from_its_cleaning_before_it_is_sharded(mixture_run, capsys):
    root, _ = mixture_run

    def plan_rows(argv) -> dict[str, list[str]]:
        assert cli.main(["plan", *argv]) == 0
        return {line.split()[2]: line.split() for line in capsys.readouterr().out.splitlines()
                if line.startswith("  0 ")}

    held = plan_rows(_argv(root))                       # every shard cached: their manifests' counts
    assert not any(r[5].startswith("~") for r in held.values())
    # code's cleaning changed: a new clean[code] is built; the tokenizer follows it, so no shard is cached
    argv = _argv(root, "code/clean.Config.min_chars = 300")
    assert cli.main(["run", *argv, "--stage", "clean[code]"]) == 0
    capsys.readouterr()
    guessed = plan_rows(argv)        # no tokenizer either: 4 characters a token assumed, and marked so
    assert all(r[5].startswith("~") and r[6] == "estimate" and r[7].startswith("~") for r in guessed.values())
    ratio = int(guessed["prose"][5][1:].replace(",", "")) / int(held["prose"][5].replace(",", ""))
    assert 0.5 < ratio < 2.0         # the estimate (4 characters a token) is near the shards' real count


def test_plan_estimates_a_sources_tokens_from_the_tokenizers_measure_once_the_tokenizer_exists(mixture_run,
                                                                                             capsys):
    """A shard setting changed: the tokenizer is cached, the shards are not. make plan divides each source's
    cleaned characters by the characters a token the tokenizer measured on its sample of that source: within
    10% of the tokens the shards hold, where 4 characters a token is far off for code; no "estimate" mark."""
    root, _ = mixture_run
    override = "shard.Config.tokens_per_shard = 30_000"
    plan = _plan(root, override)
    assert plan.committed("tokenizer") is not None and plan.committed("shard[code]") is None
    stats = storage.read_json(plan.committed("tokenizer").file("stats.json"))
    assert cli.main(["plan", *_argv(root, override)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[2]: line.split() for line in out.splitlines() if line.startswith("  0 ")}
    assert "  estimate: " not in out and "characters a token as the tokenizer measured them" in out
    for source, row in rows.items():
        manifest = storage.read_json(_plan(root).committed(f"shard[{source}]").file("manifest.json"))
        # the estimate does not take off the validation split (shard.Config.val_fraction)
        held = sum(split["tokens"] for split in manifest["splits"].values())
        estimate = int(row[5].removeprefix("~").replace(",", ""))
        assert row[5].startswith("~") and "estimate" not in row and abs(estimate / held - 1) < 0.10, \
            (source, estimate, held)
        chars = storage.read_json(plan.committed(f"clean[{source}]").file("stats.json"))["chars_kept"]
        assert estimate == int(chars / stats["sources"][source]["chars_per_token"] / 64) * 64
    # what the guess would have said: both sources (docstrings and code at vocab 800) make ~2.2 characters a
    # token, so 4 would put their tokens at ~0.56 of the real count
    assert all(stats["sources"][s]["chars_per_token"] < 0.6 * CHARS_PER_TOKEN_GUESS for s in rows)


def test_status_shows_the_tree(mixture_run, capsys):
    root, _ = mixture_run
    assert cli.main(["status", *_argv(root)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows] == TREE and {r[2] for r in rows} == {"cached"}


@pytest.mark.slow
@pytest.mark.optimized      # trains long enough that XLA's optimized code pays (tests/jax_env.py)
def test_the_code_share_twin_sweeps_two_shares_with_two_seeds_and_shows_the_trade_off(mixture_run, capsys):
    """gin/twins/code_share.gin on the data the mixture run built (the twin's data sizes are MIX_SMALL's),
    its two extreme shares (four trainings, not six: the middle share runs the same code): no data node runs
    again, each variant and seed trains and evaluates, and the report's own-split table holds each source's
    bits per byte beside verdicts against the seed spread."""
    root, _ = mixture_run
    before = {stage: len(storage.listdir(f"{root}/{stage}")) for stage in ("download", "clean", "shard")}
    trained = len(storage.listdir(f"{root}/train"))
    twin = f"{REPO}/gin/twins/code_share.gin"
    variants = {v: ws for v, ws in sweep.variants([twin], []).items() if v in ("code=10%", "code=50%")}
    params = [f'pipeline.Settings.cache_root = "{root}"', f"sweep.variants = {variants!r}", ONE_PROMPT]
    assert cli.main(["sweep", "--gin", twin, *[a for p in params for a in ("--gin-param", p)]]) == 0
    out = capsys.readouterr().out
    assert {stage: len(storage.listdir(f"{root}/{stage}")) for stage in before} == before
    assert len(storage.listdir(f"{root}/train")) == trained + 4
    report = f"{root}/sweeps/code_share"
    md = storage.read_text(f"{report}/comparison.md")
    own = md[md.index("## Own validation split"):]
    assert "| variant | loss | bits_per_byte | bits_per_byte[code] | bits_per_byte[prose] |" in own
    assert all(f"| {v} |" in own for v in variants)
    verdicts = storage.read_json(f"{report}/verdicts.json")
    assert verdicts["own_split"]["comparable"]
    assert "bpb/stdlib_code" in verdicts["yardsticks"] and "bpb/aesop_fables" in verdicts["yardsticks"]
    assert "verdict: " in out


@pytest.mark.slow
@pytest.mark.optimized      # trains long enough that XLA's optimized code pays (tests/jax_env.py)
def test_the_mixsearch_twin_trains_only_proxies_and_finalists_and_reports_the_prediction(mixture_run, capsys):
    """gin/twins/mixsearch_prose_code.gin on the data the mixture run built: four proxies at distinct
    mixtures, the first again with another seed, and the finalists (one seed) train and evaluate, each run a
    key of its own; no data node runs again, and the report has the proxies, the fits with their held-out
    error and seed noise, the prediction with its interval (5 runs, 3 coefficients: 2 residual degrees of
    freedom) and the measured finalists."""
    root, _ = mixture_run
    before = {stage: len(storage.listdir(f"{root}/{stage}")) for stage in ("download", "clean", "shard")}
    trained = set(storage.listdir(f"{root}/train"))
    twin = f"{REPO}/gin/twins/mixsearch_prose_code.gin"
    params = [f'pipeline.Settings.cache_root = "{root}"', "mixsearch.seeds = 1", ONE_PROMPT]
    assert cli.main(["mixsearch", "--gin", twin, *[a for p in params for a in ("--gin-param", p)]]) == 0
    out = capsys.readouterr().out
    assert {stage: len(storage.listdir(f"{root}/{stage}")) for stage in before} == before
    search = storage.read_json(f"{root}/mixsearch/mixsearch_prose_code/search.json")
    # a run is its (split, seed): every proxy run its own, the finalists' seed 0 proxy 1's
    finalists = {(tuple(sorted(r.items())), seed) for r in search["finalists"].values()
                 for seed in search["finalist_seeds"]}
    proxies = {(tuple(sorted(p["rows"].items())), p["seed"]) for p in search["proxies"]}
    assert len(proxies) == len(search["proxies"]) == 5 and len({split for split, _ in proxies}) == 4
    assert search["draws"]["proxies"] == 4 and search["draws"]["replicates"] == 1
    # the nodes each build ran: every data node was cached; per proxy run and new finalist, train and evaluate
    assert search["ran"] == {"data": [], "proxies": ["train", "evaluate"],
                             "finalists": ["train", "evaluate"] if finalists - proxies else []}
    new = set(storage.listdir(f"{root}/train")) - trained      # one training per distinct (split, seed)
    assert len(new) == len(proxies | finalists)
    assert all(sum(p["rows"].values()) == search["global_batch"] for p in search["proxies"])
    fit = search["fits"]["bpb/mean"]
    assert fit["dof"] == 2 and fit["seed_dof"] == 1 and fit["seed_sd"] is not None
    low, high = search["prediction"]["interval"]
    assert low <= search["prediction"]["score"] <= high
    md = storage.read_text(f"{root}/mixsearch/mixsearch_prose_code/report.md")
    for heading in ("## Proxies", "## Fits", "## Prediction", "## Measured", "## Verdicts"):
        assert heading in md, heading
    assert "| bpb/mean |" in md and "| predicted |" in md and "| uniform |" in md
    assert storage.read_bytes(f"{root}/mixsearch/mixsearch_prose_code/fit.png")[:4] == b"\x89PNG"
    assert "mixsearch: 4 proxies, 5 runs; predicted best for bpb/mean" in out
    assert ("OUTSIDE the proxies' convex hull" in out) != search["prediction"]["inside_hull"]


@pytest.mark.slow
def test_a_killed_sources_clean_reruns_to_the_undisturbed_outputs(mixture_run, tmp_path):
    """The fault harness on the tree (tests/faults/harness.py, `--dag mixture`): clean[code] killed after its
    files are written and before its commit, on a cache holding what it reads; nothing partial counts as
    done, `pipeline status` agrees, and the rerun's clean[code] equals the undisturbed run's, no document
    lost. The reference's data nodes are this file's run (the same keys)."""
    from tests.faults.harness import DAGS, Case, Harness
    from tests.tiny_run import MIXTURE, TinyRun

    harness = Harness(str(tmp_path), spec=DAGS["mixture"], shared=TinyRun(mixture_run[0], [], MIXTURE))
    r = harness.run(Case("clean[code]", "commit", seed=0))
    logs = f"(logs: {r.log_dir})"
    assert r.killed and r.landed == "clean[code]" and r.partial, logs
    assert r.done_but_partial == [] and r.status_disagrees == [] and r.leftovers == [], logs
    assert r.rerun_ok and r.differences == [] and r.records_lost == 0, logs
