"""The sweep's seeds and its report (pipeline/sweep.py, pipeline/sweep_report.py) on fabricated eval.json
and metrics.jsonl: what is a real difference, the one-seed case, the own split marked not comparable."""

import json

import pytest

from pipeline import config, sweep, sweep_report
from stages.io import storage
from tests.conftest import REPO

DATA = {"download": "d0", "clean": "c0", "tokenizer": "t0", "shard": "s0"}


def _eval(bpb: float, acc: float, loss: float = 5.0, width: float = 0.05) -> dict:
    """An eval.json with one reference set, one task (4 choices) and the aggregate."""
    def metric(x):
        return {"value": x, "low": x - width, "high": x + width}
    centered = (acc - 0.25) / 0.75
    return {"loss": loss, "bits_per_byte": loss / 3,
            "reference_bpb": {"fables": {"bpb": bpb, "low": bpb - width, "high": bpb + width,
                                         "docs": 10, "bytes": 1000}},
            "tasks": {"piqa": {"items": 20, "random_baseline": 0.25, "acc": metric(acc),
                               "acc_norm": metric(acc), "centered": metric(centered),
                               "centered_norm": metric(centered)}},
            "aggregate": {"metric": "centered", "tasks": ["piqa"], **metric(centered)}}


def _rows(final_bpb: float) -> list[dict]:
    return [{"step": 2, "loss": 6.0},
            {"step": 4, "loss": 5.0, "eval_loss": 5.5, "yardstick/bpb/fables": final_bpb + 1,
             "yardstick/acc_norm/piqa": 0.25, "yardstick/aggregate": 0.0},
            {"step": 8, "loss": 4.0, "eval_loss": 5.0, "yardstick/bpb/fables": final_bpb,
             "yardstick/acc_norm/piqa": 0.3, "yardstick/aggregate": 0.05}]


def _result(variant, seed, bpb, acc, data=None, loss=5.0, width=0.05):
    return sweep_report.Result(variant, seed, _eval(bpb, acc, loss, width), _rows(bpb), dict(data or DATA))


def _comparison(decision, b, name, a=None):
    a = a or decision["variants"][0]
    return next(c for c in decision["comparisons"] if (c["a"], c["b"], c["yardstick"]) == (a, b, name))


def test_yardstick_names_match_the_in_loop_keys():
    assert list(sweep_report.yardsticks(_eval(2.0, 0.4))) == [
        "bpb/fables", "acc_norm/piqa", "centered/piqa", "aggregate"]
    assert {k[len(sweep_report.IN_LOOP_PREFIX):] for k in _rows(2.0)[1] if k.startswith("yardstick/")} <= set(
        sweep_report.yardsticks(_eval(2.0, 0.4)))


def test_a_difference_is_real_only_when_it_exceeds_the_largest_seed_range():
    results = [_result("base", 0, 2.00, 0.40), _result("base", 1, 2.02, 0.44),      # bpb range 0.02, acc 0.04
               _result("better", 0, 1.90, 0.41), _result("better", 1, 1.91, 0.43),  # bpb -0.105: real
               _result("same", 0, 2.01, 0.39), _result("same", 1, 2.03, 0.45)]      # acc range 0.06
    d = sweep_report.decide(results)
    bpb = d["yardsticks"]["bpb/fables"]
    assert bpb["spread"] == pytest.approx(0.02)
    assert bpb["variants"]["better"]["mean"] == pytest.approx(1.905)
    assert bpb["variants"]["better"]["seeds"] == {0: 1.90, 1: 1.91}
    assert bpb["variants"]["better"]["low"] == pytest.approx(1.855)       # the seeds' intervals, averaged
    assert d["yardsticks"]["acc_norm/piqa"]["spread"] == pytest.approx(0.06)   # the widest variant's range
    real = _comparison(d, "better", "bpb/fables")
    assert real["verdict"] == "real" and real["better"] == "better"
    assert real["difference"] == pytest.approx(-0.105)
    assert _comparison(d, "same", "bpb/fables")["verdict"] == "within the seed-to-seed spread"   # +0.01
    assert _comparison(d, "better", "acc_norm/piqa")["verdict"] == "within the seed-to-seed spread"
    # "same" is also compared with the variant before it: 2.02 - 1.905 = 0.115 > 0.02, and worse
    later = _comparison(d, "same", "bpb/fables", a="better")
    assert later["verdict"] == "real" and later["better"] == "worse"
    assert {(c["a"], c["b"], c["yardstick"]) for c in d["real"]} == {
        ("base", "better", "bpb/fables"), ("better", "same", "bpb/fables")}
    line = sweep_report.summary(d)
    assert "2 of 12 differences exceed" in line and "better vs base: bpb/fables -0.105 (better" in line


def test_beyond_the_seed_spread_but_inside_the_evaluations_intervals_is_not_real():
    # Two seeds that happened to agree closely (spread 0.01) and a 0.10 difference: more than the spread, but
    # 100 items give intervals +-0.15 wide that overlap, so a finite item set could have made it by chance.
    def runs(width):
        return [_result(v, seed, 2.0, acc + seed / 100, width=width) for v, acc in (("a", 0.40), ("b", 0.50))
                for seed in (0, 1)]
    d = sweep_report.decide(runs(0.15))
    assert _comparison(d, "b", "acc_norm/piqa")["verdict"] == "within the evaluation's 95% intervals"
    assert _comparison(sweep_report.decide(runs(0.03)), "b", "acc_norm/piqa")["verdict"] == "real"


def test_a_difference_equal_to_the_spread_is_not_real():
    d = sweep_report.decide([_result("a", 0, 2.0, 0.5), _result("a", 1, 2.5, 0.5),
                             _result("b", 0, 2.5, 0.5), _result("b", 1, 3.0, 0.5)])
    assert _comparison(d, "b", "bpb/fables")["verdict"] != "real"      # |0.5| is not > 0.5
    # accuracies of 20 items: 0.3 - 0.2 is 0.0999..., the means differ by 0.1000...: equal, not real
    d = sweep_report.decide([_result("a", 0, 2.0, 0.25), _result("a", 1, 2.0, 0.35),
                             _result("b", 0, 2.0, 0.35), _result("b", 1, 2.0, 0.45)])
    assert _comparison(d, "b", "acc_norm/piqa")["verdict"] == "within the seed-to-seed spread"
    assert "none is real" in sweep_report.summary(d)


def test_seeds_that_agree_exactly_decide_nothing():
    d = sweep_report.decide([_result("a", 0, 2.0, 0.3), _result("a", 1, 2.1, 0.3),
                             _result("b", 0, 1.0, 0.5), _result("b", 1, 1.0, 0.5)])
    assert d["yardsticks"]["acc_norm/piqa"]["spread"] == 0
    assert _comparison(d, "b", "acc_norm/piqa")["verdict"].startswith("cannot decide (the seeds agreed")
    assert _comparison(d, "b", "bpb/fables")["verdict"] == "real"         # -1.05 against a spread of 0.1
    assert sweep_report.summary(d).endswith("; 3 undecided (yardsticks whose seeds agreed exactly)")


def test_one_seed_measures_no_spread_and_decides_nothing():
    d = sweep_report.decide([_result("a", 0, 2.0, 0.3), _result("b", 0, 1.0, 0.9)])
    assert all(t["spread"] is None for t in d["yardsticks"].values())
    assert d["real"] == [] and {c["verdict"] for c in d["comparisons"]} == {
        "cannot decide (one seed: no spread measured)"}
    assert "one seed per variant" in sweep_report.summary(d)
    assert "cannot decide" in sweep_report.markdown("x", d)


def test_own_split_is_marked_not_comparable_when_data_differ_upstream_of_train():
    same = sweep_report.decide([_result("a", 0, 2.0, 0.3), _result("b", 0, 2.0, 0.3, loss=4.0)])
    assert same["own_split"]["comparable"]
    assert sweep_report.NOT_COMPARABLE not in sweep_report.markdown("x", same)
    other = {**DATA, "clean": "c1", "tokenizer": "t1", "shard": "s1"}
    d = sweep_report.decide([_result("a", 0, 2.0, 0.3), _result("b", 0, 2.0, 0.3, data=other, loss=4.0)])
    assert not d["own_split"]["comparable"]
    assert d["own_split"]["differs_at"] == ["clean", "tokenizer", "shard"]
    assert d["own_split"]["variants"]["b"]["loss"]["mean"] == 4.0
    text = sweep_report.markdown("x", d)
    own = text[text.index("## Own validation split"):]
    assert sweep_report.NOT_COMPARABLE in own.splitlines()[0] and "clean, tokenizer, shard keys differ" in own
    assert "| b | 4.0000 (4.0000) |" in own


def test_a_mixture_sweep_shows_each_sources_bits_per_byte_in_the_own_split_table():
    """Weights are training's: the variants share every data node, so their sources' own splits compare, and
    the table shows the trade-off between sources."""
    data = {"clean[code]": "c", "clean[web]": "w", "tokenizer": "t", "shard[code]": "sc", "shard[web]": "sw"}

    def mixed(variant, seed, code_bpb, web_bpb):
        r = _result(variant, seed, 2.0, 0.3, data=data)
        sources = {"code": {"bits_per_byte": code_bpb, "loss": 4.0},
                   "web": {"bits_per_byte": web_bpb, "loss": 5.0}}
        evaluation = {**r.evaluation, "sources": sources}
        return sweep_report.Result(variant, seed, evaluation, r.metrics, r.data_keys)

    d = sweep_report.decide([mixed("code=10%", 0, 2.4, 1.9), mixed("code=50%", 0, 2.0, 2.1)])
    own = d["own_split"]
    assert own["comparable"] and own["metrics"] == ["loss", "bits_per_byte", "bits_per_byte[code]",
                                                    "bits_per_byte[web]"]
    assert own["variants"]["code=50%"]["bits_per_byte[code]"]["mean"] == 2.0
    table = sweep_report.markdown("mix", d)
    assert "| variant | loss | bits_per_byte | bits_per_byte[code] | bits_per_byte[web] |" in table
    assert "| code=10% | 5.0000 (5.0000) | 1.6667 (1.6667) | 2.4000 (2.4000) | 1.9000 (1.9000) |" in table


def test_the_report_files(tmp_path):
    other = {**DATA, "shard": "s1"}
    results = [_result("base", 0, 2.00, 0.40), _result("base", 1, 2.02, 0.44),
               _result("+x", 0, 1.90, 0.41, other), _result("+x", 1, 1.91, 0.43, other)]
    # one run logged fewer steps: the mean curve keeps the steps every seed logged
    results[3] = sweep_report.Result("+x", 1, results[3].evaluation, results[3].metrics[:2], other)
    text = sweep_report.write_results("demo", results, str(tmp_path))
    assert "| base |" in text and "| +x vs base |" in text and "**real, better**" in text
    assert text.splitlines()[-2].startswith("verdict: 1 of 4 differences exceed")
    per_variant = storage.read_json(str(tmp_path / "comparison.json"))
    assert set(per_variant) == {"base", "+x"} and per_variant["base"]["loss"] == 5.0
    assert per_variant["+x"]["yardsticks"]["aggregate"]["seeds"].keys() == {"0", "1"}
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts["yardsticks"]["bpb/fables"]["spread"] == pytest.approx(0.02)
    assert not verdicts["own_split"]["comparable"]
    md = (tmp_path / "comparison.md").read_text()
    assert "](comparison.png)" in md and "](curves.png)" in md and "seed-to-seed spread" in md
    for png in ("comparison.png", "curves.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_seeds_bind_the_train_seed_and_share_every_stage_upstream_of_train(tmp_path):
    gin = tmp_path / "s.gin"
    gin.write_text(f"include '{REPO}/gin/tiny.gin'\nsweep.seeds = 3\n"
                   "sweep.variants = {'a': [], 'b': ['clean.Config.min_chars = 900']}\n")
    runs = sweep.runs([str(gin)], [])
    assert [r.name for r in runs] == [f"{v}/seed={s}" for v in "ab" for s in range(3)]
    assert [r.plan.stages["train"].config.seed for r in runs] == [0, 1, 2] * 2
    for variant in "ab":
        mine = [r.plan for r in runs if r.variant == variant]
        assert len({p.stages["shard"].config for p in mine}) == 1
        assert len({p.stages["train"].config for p in mine}) == 3
    assert runs[0].plan.stages["clean"].config != runs[3].plan.stages["clean"].config


def test_one_seed_keeps_the_base_seed(tmp_path):
    gin = tmp_path / "s.gin"
    gin.write_text(f"include '{REPO}/gin/tiny.gin'\ntrain.Config.seed = 7\nsweep.variants = {{'a': []}}\n")
    assert [r.name for r in sweep.runs([str(gin)], [])] == ["a/seed=7"]


@pytest.mark.parametrize("seeds, expect", [
    ("0", "sweep: seeds=0 must be an int >= 1 and <= 100 (each variant trains with train.Config.seed = 0, "),
    ("101", "sweep: seeds=101 must be an int >= 1 and <= 100"),
    ("2.5", "sweep.seeds = 2.5 has type float; expected int"),      # the type first, as for every Config
    ("True", "sweep.seeds = True has type bool; expected int"),
    ("'2'", "sweep.seeds = '2' has type str; expected int")])
def test_bad_seeds_are_named_with_what_is_valid(tmp_path, seeds, expect):
    gin = tmp_path / "s.gin"
    gin.write_text(f"include '{REPO}/gin/tiny.gin'\nsweep.seeds = {seeds}\nsweep.variants = {{'a': []}}\n")
    with pytest.raises(config.ConfigError) as e:
        sweep.runs([str(gin)], [])
    assert expect in str(e.value) and f"(gin files: {gin};" in str(e.value), str(e.value)


def test_cumulative_variants_add_their_bindings_to_those_before(tmp_path):
    gin = tmp_path / "s.gin"
    gin.write_text(f"include '{REPO}/gin/tiny.gin'\nsweep.cumulative = True\n"
                   "sweep.variants = {'a': ['clean.Config.min_chars = 300'],\n"
                   "  'b': ['clean.Config.dedup = False'], 'c': ['clean.Config.min_chars = 400']}\n")
    found = sweep.variants([str(gin)], [])
    assert found["c"] == ["clean.Config.min_chars = 300", "clean.Config.dedup = False",
                          "clean.Config.min_chars = 400"]
    gin.write_text(gin.read_text().replace("True", "1"))
    with pytest.raises(config.ConfigError, match="sweep.cumulative = 1 has type int; expected bool"):
        sweep.variants([str(gin)], [])


def test_the_fineweb_recipe_ladder_adds_one_step_at_a_time():
    runs = sweep.runs([f"{REPO}/gin/sweeps/fineweb_recipe.gin"], [])
    clean = {r.variant: r.plan.stages["clean"].config for r in runs if r.seed == 0}
    steps = ["url_filter", "language_id", "gopher_repetition", "gopher_quality", "c4_quality",
             "fineweb_quality", "minhash"]
    on = {v: [name for name in (*steps, "pii_masking") if getattr(c, name)] for v, c in clean.items()}
    assert on == {"none": [], "url+language": steps[:2], "+gopher": steps[:4], "+c4": steps[:5],
                  "+fineweb": steps[:6], "+minhash": steps}
    assert sorted({r.seed for r in runs}) == [0, 1]
    assert storage.exists(f"{REPO}/gin/twins/fineweb_recipe.gin")
