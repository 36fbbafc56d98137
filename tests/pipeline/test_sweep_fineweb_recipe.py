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

TWIN = f"{REPO}/gin/twins/fineweb_recipe.gin"
# As small as still trains, scores and logs in-loop yardsticks: 6 variants x 2 seeds are 12 trainings.
SMALL = [
    "train.Config.steps = 6", "train.Config.global_batch = 4", "train.Config.seq_len = 64",
    "train.Config.eval_every = 3", "train.Config.log_every = 3", "train.Config.checkpoint_every = 6",
    "train.OptimizerConfig.warmup_steps = 2", "evaluate.Config.max_new_tokens = 4",
    "evaluate.Config.prompts = ('The',)", "evaluate.Config.max_eval_batches = 2",
    "yardsticks.Config.tasks = ('arc_easy', 'piqa')", "yardsticks.Config.max_items_per_task = 20",
    "yardsticks.Config.in_loop_items_per_task = 8",
]


@pytest.fixture
def compile_once(tmp_path):
    """Twelve trainings and evaluations of one shape compile each program once (JAX's persistent cache,
    for this test only): compiling, not training, is most of a tiny run's time."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    settings = {"jax_compilation_cache_dir": str(tmp_path / "xla"),
                "jax_persistent_cache_min_compile_time_secs": 0,
                "jax_persistent_cache_min_entry_size_bytes": 0}
    before = {name: getattr(jax.config, name) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


@pytest.mark.slow
def test_the_fineweb_recipe_twin_sweeps_six_variants_with_two_seeds_and_decides(tmp_path, capsys,
                                                                                  compile_once):
    warc_pages.crawl(tmp_path / "crawl")
    root = str(tmp_path / "cache")
    params = [f'pipeline.Settings.cache_root = "{root}"', f'download.Warc.paths = ["{tmp_path}/crawl/*.gz"]',
              *SMALL]
    assert cli.main(["sweep", "--gin", TWIN, *[a for p in params for a in ("--gin-param", p)]]) == 0
    out = capsys.readouterr().out
    variants = list(sweep.variants([TWIN], params))
    assert variants == ["none", "url+language", "+gopher", "+c4", "+fineweb", "+minhash"]
    # download once; every data stage once per variant; train and evaluate once per variant and seed
    for stage, count in [("download", 1), ("clean", 6), ("shard", 6), ("train", 12), ("evaluate", 12)]:
        assert len(storage.listdir(f"{root}/{stage}")) == count, stage
    report = f"{root}/sweeps/fineweb_recipe"
    md = storage.read_text(f"{report}/comparison.md")
    for heading in ("## Yardsticks", "## Verdicts", "## Own validation split"):
        assert heading in md
    assert all(f"| {v} |" in md for v in variants) and "| +minhash vs +fineweb |" in md
    assert "bpb/aesop_fables" in md and "aggregate" in md and "seed-to-seed spread" in md
    own = md[md.index("## Own validation split"):]
    assert "not comparable across data variants" in own.splitlines()[0]
    verdicts = storage.read_json(f"{report}/verdicts.json")
    assert all(t["spread"] is not None and t["spread"] >= 0 for t in verdicts["yardsticks"].values())
    assert {c["verdict"] for c in verdicts["comparisons"]} <= {
        "real", "within the seed-to-seed spread", "within the evaluation's 95% intervals",
        "cannot decide (the seeds agreed exactly: no spread measured)"}
    assert len(verdicts["comparisons"]) == 9 * len(verdicts["yardsticks"])
    per_variant = storage.read_json(f"{report}/comparison.json")
    assert set(per_variant) == set(variants) and all(v["seeds"] == [0, 1] for v in per_variant.values())
    for png in ("comparison.png", "curves.png"):
        assert storage.read_bytes(f"{report}/{png}")[:4] == b"\x89PNG"
    assert "verdict: " in out and f"report: {report}/comparison.md" in out
