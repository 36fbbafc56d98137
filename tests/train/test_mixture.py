"""The mixture's arithmetic (stages/train/mixture.py) and the batches it gives (data.MixedTokenData)."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.io import llmc
from stages.train import data
from stages.train.mixture import Mixture, apportion

SEQ = 8


def _stream(tmp_path, name, n_tokens, vocab_size=1000):
    """A source whose tokens say where they come from: token t of source i is i * 100_000 + t (uint32
    shards), so a window names its source and position."""
    offset = {"code": 100_000, "math": 200_000, "web": 300_000}[name]
    path = str(tmp_path / f"{name}.bin")
    llmc.write(path, [np.arange(n_tokens) + offset], vocab_size=2**20)
    manifest = {"dtype": llmc.dtype_for(2**20).name, "vocab_size": 2**20, "eos_id": 1}
    return data.TokenStream([path], manifest)


def _source_of(row) -> str:
    return {1: "code", 2: "math", 3: "web"}[int(row[0]) // 100_000]


@pytest.fixture
def streams(tmp_path):
    return {"web": _stream(tmp_path, "web", 8 * 50 + 1), "code": _stream(tmp_path, "code", 8 * 13 + 1),
            "math": _stream(tmp_path, "math", 8 * 7 + 1)}


def _data(streams, mix, **kw):
    return data.MixedTokenData(streams, mix, seq_len=SEQ, **({"global_batch": 16, "seed": 5} | kw))


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.integers(1, 1000), min_size=1, max_size=5),
       batch=st.integers(8, 64), steps=st.integers(1, 300))
def test_realized_shares_are_within_one_row_of_the_weights_after_every_step(weights, batch, steps):
    names = ["a", "b", "c", "d", "e"][:len(weights)]
    if min(weights) * batch < sum(weights):         # a source under one row a step is refused (next test)
        return
    mix = Mixture(phases=((0, dict(zip(names, weights))),))
    w = mix.fractions(0)
    total = dict.fromkeys(names, 0)
    for step in range(steps):
        rows = mix.step_rows(step, batch)
        assert sum(rows.values()) == batch and min(rows.values()) >= 0
        for name in names:
            total[name] += rows[name]
            assert abs(total[name] - w[name] * (step + 1) * batch) < 1
    assert total == mix.rows_before(steps, batch)


def test_a_weight_under_one_row_per_step_and_a_late_phase_are_refused_before_work():
    mix = Mixture(phases=((0, {"web": 0.99, "code": 0.01}),))
    assert "source 'code' has weight 0.01 in phase 0, less than one row of a 16-row batch" in \
        mix.problem(steps=100, global_batch=16)
    assert mix.problem(steps=100, global_batch=128) == ""
    late = Mixture(phases=((0, {"web": 1}), (500, {"web": 1, "code": 1})))
    assert "phase 1 starts at step 500, but the run has steps=100" in late.problem(steps=100, global_batch=16)


@pytest.mark.parametrize("phases, why", [
    ((), "phases is empty"),
    (((5, {"web": 1}),), "must start at step 0"),
    (((0, {"web": 1}), (0, {"code": 1})), "each must start after the one before"),
    (((0, {"Web": 1}),), "source name 'Web'"),
    (((0, {"web": -1}),), "weight -1 of source 'web'"),
    (((0, {"web": 0, "code": 0}),), "every weight is 0"),
    (((0, [0.5, 0.5]),), "is not (first step, {source: weight})"),
])
def test_a_malformed_mixture_says_what_is_wrong(phases, why):
    with pytest.raises(ValueError, match=None) as e:
        Mixture(phases=phases)
    assert why in str(e.value)


def test_apportion_is_largest_remainder_with_ties_to_the_first_name():
    third = Fraction(1, 3)
    assert apportion({"a": third, "b": third, "c": third}, 4) == {"a": 2, "b": 1, "c": 1}
    assert apportion({"a": Fraction(7, 10), "b": Fraction(3, 10)}, 16) == {"a": 11, "b": 5}   # 11.2, 4.8


def test_each_source_is_read_in_its_own_shuffled_epochs(streams):
    mix = Mixture(phases=((0, {"web": 2, "code": 1, "math": 1}),))
    d = _data(streams, mix)
    rows = np.concatenate([d.batch(s) for s in range(10)])               # 160 rows: 80 web, 40 code, 40 math
    by_source = {name: [tuple(r) for r in rows if _source_of(r) == name] for name in ("web", "code", "math")}
    assert {k: len(v) for k, v in by_source.items()} == {"web": 80, "code": 40, "math": 40}
    for name, m in (("code", 13), ("math", 7)):
        windows = {tuple(streams[name].window(w, SEQ)) for w in range(m)}
        got = by_source[name]
        for e in range(len(got) // m):          # every whole epoch holds each window once
            assert set(got[e * m:(e + 1) * m]) == windows
    # the slots are shuffled within a step, not grouped by source
    assert [_source_of(r) for r in d.batch(0)] != sorted(_source_of(r) for r in d.batch(0))


def test_batches_before_a_phase_boundary_are_identical_with_and_without_that_phase(streams):
    one = Mixture(phases=((0, {"web": 3, "code": 1}),))
    two = Mixture(phases=((0, {"web": 3, "code": 1}), (6, {"web": 1, "code": 1, "math": 2})))
    a, b = _data(streams, one), _data(streams, two)
    for step in range(6):
        assert a.batch(step).tobytes() == b.batch(step).tobytes()
    assert a.batch(6).tobytes() != b.batch(6).tobytes()
    assert sorted(_source_of(r) for r in b.batch(6)) == ["code"] * 4 + ["math"] * 8 + ["web"] * 4


def test_a_resumed_run_and_a_two_process_run_see_the_single_process_batches(streams):
    mix = Mixture(phases=((0, {"web": 5, "code": 2, "math": 1}), (4, {"web": 1, "code": 1})))
    whole = [_data(streams, mix).batch(s) for s in range(9)]
    resumed = _data(streams, mix)                  # a fresh object at step 5: no iterator state to restore
    assert all(resumed.batch(s).tobytes() == whole[s].tobytes() for s in range(5, 9))
    halves = [_data(streams, mix, process_index=i, process_count=2) for i in range(2)]
    for s in range(9):
        assert np.concatenate([h.batch(s) for h in halves]).tobytes() == whole[s].tobytes()


def test_adding_a_source_leaves_the_order_of_another_sources_windows_alone(streams):
    alone = _data(streams, Mixture(phases=((0, {"web": 1, "code": 1}),)))
    more = _data(streams, Mixture(phases=((0, {"web": 1, "code": 1, "math": 2}),)))
    assert [tuple(alone.window("code", k)) for k in range(30)] == \
        [tuple(more.window("code", k)) for k in range(30)]


def test_epochs_and_the_repetition_limit():
    mix = Mixture(phases=((0, {"web": 3, "code": 1}),), max_epochs=2.0)
    windows = {"web": 1200, "code": 100}
    assert mix.epochs(100, 16, windows) == {"code": 4.0, "web": 1.0}       # 400 and 1200 rows
    problem = mix.problem(steps=100, global_batch=16, windows=windows)
    assert problem == ("train.Mixture: source 'code' would be read 4 times (100 windows, 400 asked for), "
                       "past max_epochs=2; lower its weight, raise train.Mixture.max_epochs, or give that "
                       "source more data")
    assert mix.problem(steps=50, global_batch=16, windows=windows) == ""
    assert "names source(s) 'code' that the run does not have" in \
        mix.problem(steps=50, global_batch=16, windows={"web": 1200})


def test_phase_rows_split_the_run_at_each_phase():
    mix = Mixture(phases=((0, {"web": 1}), (10, {"web": 1, "code": 1})))
    assert mix.phase_rows(30, 8) == [(0, 10, {"code": 0, "web": 80}), (10, 30, {"code": 80, "web": 80})]
    assert mix.rows_before(30, 8) == {"code": 80, "web": 160}


def test_a_mixture_survives_the_worker_spec_round_trip(tmp_path):
    from stages.train import spec
    from stages.train.stage_config import Config

    mix = Mixture(phases=((0, {"web": 0.7, "code": 0.3}), (90, {"web": 1.0})), max_epochs=2.5)
    cfg = Config(steps=100, global_batch=16, mixture=mix)
    shard = spec.Committed("shard", "k", "/c/shard/k/a", {"manifest.json": 10}, {})
    path = str(tmp_path / "spec.json")
    spec.write(spec.WorkerSpec(cfg, shard, "/o", "/w", sources={"code": shard, "web": shard}), path)
    back = spec.read(path)
    assert back.config.mixture == mix and back.config == cfg
    assert list(back.sources) == ["code", "web"]
