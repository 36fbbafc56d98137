"""gin/twins/fineweb_recipe.gin end to end: FineWeb's recipe added one step at a time to a crawl this test
writes, each variant trained with two seeds, and the report that decides (pipeline/sweep_report.py).

    .venv/bin/python -m pytest tests/pipeline/test_sweep_fineweb_recipe.py -m slow
"""

import pytest

from pipeline import __main__ as cli
from pipeline import sweep
from stages.io import storage
from tests.conftest import REPO
from tests.stages import warc_pages
from tests.tiny_run import SCORING

TWIN = f"{REPO}/gin/twins/fineweb_recipe.gin"
VARIANTS = ["none", "url+language", "+gopher", "+c4", "+fineweb", "+minhash"]
# As small as still trains, scores and logs in-loop yardsticks.
SMALL = [
    "train.Config.steps = 6", "train.Config.global_batch = 4", "train.Config.seq_len = 64",
    "train.Config.eval_every = 3", "train.Config.log_every = 3", "train.Config.checkpoint_every = 6",
    "train.OptimizerConfig.warmup_steps = 2", *SCORING, "yardsticks.Config.tasks = ('arc_easy', 'piqa')",
]


def _params(root, crawl) -> list[str]:
    return [f'pipeline.Settings.cache_root = "{root}"', f'download.Warc.paths = ["{crawl}/*.gz"]', *SMALL]


def test_the_fineweb_recipe_twin_plans_six_variants_with_two_seeds_sharing_what_they_can(tmp_path):
    """The whole ladder from config alone: six variants of two seeds are twelve runs that share one download,
    differ in every data stage from clean on (six of each) and train and evaluate once per run."""
    warc_pages.crawl(tmp_path / "crawl")                    # download's key covers the files it reads
    runs = sweep.runs([TWIN], _params(tmp_path / "cache", tmp_path / "crawl"))
    assert list(sweep.variants([TWIN], _params(tmp_path / "cache", tmp_path / "crawl"))) == VARIANTS
    assert [(r.variant, r.seed) for r in runs] == [(v, s) for v in VARIANTS for s in (0, 1)]
    for stage, count in [("download", 1), ("clean", 6), ("tokenizer", 6), ("shard", 6), ("train", 12),
                         ("evaluate", 12)]:
        assert len({r.plan.stages[stage].key for r in runs}) == count, stage


@pytest.mark.slow
@pytest.mark.optimized      # six trainings and evaluations: optimized pays (74 -> 65 s)
def test_the_fineweb_recipe_twin_sweeps_its_ladder_with_two_seeds_and_decides(tmp_path, capsys):
    """Three of the twin's six steps end to end (the first two and the last, each with every binding below
    it: what the ladder makes of them), two seeds each: six trainings, not twelve, and the same report. The
    last step carries every binding of the ladder, so each filter the skipped steps add still runs."""
    warc_pages.crawl(tmp_path / "crawl")
    root = str(tmp_path / "cache")
    params = _params(root, tmp_path / "crawl")
    ladder = sweep.variants([TWIN], params)
    chosen = {v: ladder[v] for v in (VARIANTS[0], VARIANTS[1], VARIANTS[-1])}
    params += [f"sweep.variants = {chosen!r}", "sweep.cumulative = False"]
    assert cli.main(["sweep", "--gin", TWIN, *[a for p in params for a in ("--gin-param", p)]]) == 0
    out = capsys.readouterr().out
    variants = list(chosen)
    # download once; every data stage once per variant; train and evaluate once per variant and seed
    for stage, count in [("download", 1), ("clean", 3), ("shard", 3), ("train", 6), ("evaluate", 6)]:
        assert len(storage.listdir(f"{root}/{stage}")) == count, stage
    report = f"{root}/sweeps/fineweb_recipe"
    md = storage.read_text(f"{report}/comparison.md")
    for heading in ("## Yardsticks", "## Verdicts", "## Own validation split"):
        assert heading in md
    assert all(f"| {v} |" in md for v in variants) and "| +minhash vs url+language |" in md
    assert "bpb/aesop_fables" in md and "aggregate" in md and "seed-to-seed spread" in md
    own = md[md.index("## Own validation split"):]
    assert "not comparable across data variants" in own.splitlines()[0]
    verdicts = storage.read_json(f"{report}/verdicts.json")
    assert all(t["spread"] is not None and t["spread"] >= 0 for t in verdicts["yardsticks"].values())
    assert {c["verdict"] for c in verdicts["comparisons"]} <= {
        "real", "within the seed-to-seed spread", "within the evaluation's 95% intervals",
        "cannot decide (the seeds agreed exactly: no spread measured)"}
    # each variant against the first, then against the one before it: 2 + 1 pairs
    assert len(verdicts["comparisons"]) == 3 * len(verdicts["yardsticks"])
    per_variant = storage.read_json(f"{report}/comparison.json")
    assert set(per_variant) == set(variants) and all(v["seeds"] == [0, 1] for v in per_variant.values())
    for png in ("comparison.png", "curves.png"):
        assert storage.read_bytes(f"{report}/{png}")[:4] == b"\x89PNG"
    assert "verdict: " in out and f"report: {report}/comparison.md" in out
