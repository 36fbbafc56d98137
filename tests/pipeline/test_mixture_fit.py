"""pipeline/mixture_fit.py: seeded draws that honour feasibility, and a fit that recovers a known optimum."""

import numpy as np
import pytest

from pipeline import mixture_fit as mf

SOURCES = ("code", "math", "web")


def _true(w):
    """A known score over three sources: best at (0.2, 0.3, 0.5), quadratic, lower is better."""
    w = np.atleast_2d(w)
    return 1.0 + 4.0 * np.sum((w - np.array([0.2, 0.3, 0.5])) ** 2, axis=1)


def _as_is(limit=lambda w: ""):
    """A draw's `whole`: weights kept as they are (no rows), refused by `limit`."""
    return lambda w: (w, limit(w))


def test_draws_are_reproducible_from_the_seed_and_feasible_only():
    limit = lambda w: "code past its limit" if w["code"] > 0.4 else ""    # noqa: E731
    a, b = (mf.draw(SOURCES, 12, seed=3, whole=_as_is(limit)) for _ in range(2))
    assert a == b and len(a.splits) == 12 and a != mf.draw(SOURCES, 12, seed=4, whole=_as_is(limit))
    assert all(w["code"] <= 0.4 and sum(w.values()) == pytest.approx(1) for w in a.splits)
    assert a.refused > 0 and a.redrawn == 0          # continuous weights never repeat
    with pytest.raises(ValueError, match=r"only 0 of 2 distinct mixtures .* 50 could not train; the last "
                                         r"refused: never"):
        mf.draw(SOURCES, 2, seed=0, whole=_as_is(lambda w: "never"), max_tries=50)


def test_draws_that_round_to_a_split_drawn_before_are_drawn_again():
    """Two draws that round alike would be one training run counted twice: each split is kept once, the
    repeats counted; asking more splits than exist runs out of tries, saying so."""
    tenths = lambda w: ({s: round(x * 10) for s, x in w.items()}, "")      # noqa: E731
    drawn = mf.draw(("a", "b"), 5, seed=0, whole=tenths)
    keys = [tuple(sorted(d.items())) for d in drawn.splits]
    assert len(set(keys)) == 5 and drawn.redrawn > 0 and drawn.refused == 0
    # the draw is the first 5 distinct roundings of the seeded Dirichlet's stream
    rng, first = np.random.default_rng(0), []
    while len(first) < 5:
        x = rng.dirichlet([1.0, 1.0])
        key = (("a", round(x[0] * 10)), ("b", round(x[1] * 10)))
        first += [key] if key not in first else []
    assert keys == first
    with pytest.raises(ValueError, match=r"only 2 of 3 distinct mixtures .* repeated a split drawn before"):
        mf.draw(("a", "b"), 3, seed=0, whole=lambda w: ({"a": int(w["a"] > 0.5)}, ""), max_tries=200)


def test_the_fit_recovers_a_known_optimum_from_a_dozen_noisy_proxies():
    rng = np.random.default_rng(0)
    draws = mf.draw(SOURCES, 12, seed=1, whole=_as_is()).splits
    w = np.array([[d[s] for s in SOURCES] for d in draws])
    y = _true(w) + rng.normal(0, 0.005, len(w))
    fit = mf.Fit.of(w, y)
    assert fit.loo_rmse < 0.2 * fit.spread                 # it learned the shape, not the mean
    best = mf.optimum(fit, SOURCES, lower_is_better=True, feasible=lambda w: "")
    assert np.abs(np.array([best[s] for s in SOURCES]) - [0.2, 0.3, 0.5]).max() < 0.06
    low, high = fit.interval([best[s] for s in SOURCES])
    assert low <= float(fit.predict([best[s] for s in SOURCES])[0]) <= high and high - low < 0.05
    assert low < float(_true([best[s] for s in SOURCES])[0]) < high
    # moving weight toward web (under-weighted at the uniform point) helps; toward code hurts
    effects = fit.effects(SOURCES)
    assert effects["web"] < 0 < effects["code"]


def test_the_optimum_respects_feasibility_and_direction():
    w = np.array([[1, 0], [0, 1], [0.5, 0.5], [0.25, 0.75], [0.75, 0.25]])
    y = w[:, 0]                      # score rises with the first source's share
    fit = mf.Fit.of(w, y)
    assert mf.optimum(fit, ("a", "b"), lower_is_better=False, feasible=lambda w: "")["a"] == pytest.approx(1)
    cap = lambda w: "a past its limit" if w["a"] > 0.6 else ""          # noqa: E731
    capped = mf.optimum(fit, ("a", "b"), lower_is_better=False, feasible=cap)
    assert 0.55 <= capped["a"] <= 0.6


def test_a_search_draws_whole_rows_within_every_sources_repetition_limit():
    """pipeline/mixsearch.py's feasibility on the real Mixture: 100 steps of 16 rows, code holding 200 windows
    and a limit of 2 epochs: code may have at most 4 rows a step, and a share under one row is no share."""
    import dataclasses

    from pipeline import mixsearch
    from stages.train import Config, Mixture

    train = dataclasses.replace(Config(), steps=100, global_batch=16,
                                mixture=Mixture(phases=((0, {"code": 1, "prose": 1}),), max_epochs=2.0))
    problem = mixsearch.limits(train, {"code": 200, "prose": 100_000})
    assert mixsearch.rows(train, {"code": 0.3, "prose": 0.7}) == {"code": 5, "prose": 11}
    assert "past max_epochs=2" in problem({"code": 0.3, "prose": 0.7})
    assert problem({"code": 0.25, "prose": 0.75}) == ""
    assert mixsearch.rows(train, {"code": 0.02, "prose": 0.98}) == {"code": 0, "prose": 16}
    whole = mixsearch.whole_rows(train, {"code": 200, "prose": 100_000})
    mix = {"code": 0.3, "prose": 0.7}
    assert whole(mix) == ({"code": 5, "prose": 11}, problem(mix))
    drawn = mf.draw(("code", "prose"), 5, seed=0, whole=whole)
    assert all(d["code"] <= 4 and sum(d.values()) == 16 for d in drawn.splits) and drawn.refused > 0
    assert drawn == mf.draw(("code", "prose"), 5, seed=0, whole=whole)


def test_the_three_source_plot_draws_each_proxys_held_out_prediction_with_the_fewest_proxies():
    """Seven proxies for three sources (the fit's 6 coefficients + 1): the plot uses the fit's own
    leave-one-out predictions (a refit on six could not be tested, and failed)."""
    from pipeline import mixsearch

    draws = mf.draw(SOURCES, 7, seed=2, whole=_as_is()).splits
    w = np.array([[d[s] for s in SOURCES] for d in draws])
    y = _true(w)
    fit = mf.Fit.of(w, y)
    rmse = float(np.sqrt(np.mean((y - fit.loo) ** 2)))
    assert fit.loo.shape == (7,) and fit.loo_rmse == pytest.approx(rmse)
    search = {"sources": list(SOURCES), "settings": {"target": "bpb/mean"},
              "proxies": [{"weights": d, "yardsticks": {"bpb/mean": float(v)}} for d, v in zip(draws, y)]}
    assert mixsearch.fit_png(search, fit)[:4] == b"\x89PNG"


def test_replicates_measure_the_seed_noise_and_leave_one_out_leaves_their_mixture_out():
    """A mixture trained twice (two seeds) is one mixture: its pair's spread is the seed noise alone (one
    degree of freedom a pair), and leave-one-out predicts both runs without either (a twin left in would
    predict its replicate)."""
    w = np.array([[0.0, 1.0], [0.25, 0.75], [0.5, 0.5], [0.75, 0.25], [1.0, 0.0], [0.25, 0.75], [0.5, 0.5]])
    y = 3.0 + 0.2 * (w[:, 0] - 0.6) ** 2 + np.array([0.0, 0.01, -0.02, 0.0, 0.0, -0.01, 0.02])
    fit = mf.Fit.of(w, y)
    assert fit.dof == 7 - 3 and fit.seed_dof == 2
    pairs = [(1, 5), (2, 6)]
    assert fit.seed_sd == pytest.approx(np.sqrt(sum((y[a] - y[b]) ** 2 / 2 for a, b in pairs) / 2))
    assert fit.misfit_sd == pytest.approx(np.sqrt(max(0.0, fit.sigma ** 2 - fit.seed_sd ** 2)))
    for a, b in pairs:
        keep = [i for i in range(7) if i not in (a, b)]
        alone = mf.Fit.of(w[keep], y[keep])
        assert fit.loo[a] == pytest.approx(float(alone.predict(w[a])[0]))
        assert fit.loo[b] == pytest.approx(fit.loo[a])
    assert mf.Fit.of(w[:5], y[:5]).seed_sd is None and mf.Fit.of(w[:5], y[:5]).misfit_sd is None


def test_under_two_residual_degrees_of_freedom_there_is_no_interval():
    """p + 1 runs leave one residual: no interval, and the fit says why; one run more gives one. Fewer than
    p + 1 distinct mixtures (a replicate does not count) cannot be fitted and tested."""
    w = np.array([[0.0, 1.0], [0.3, 0.7], [0.6, 0.4], [1.0, 0.0], [0.3, 0.7]])
    y = np.array([3.0, 2.9, 2.95, 3.1, 2.92])
    one = mf.Fit.of(w[:4], y[:4])
    assert one.dof == 1 and one.interval([0.5, 0.5]) is None
    assert one.no_interval.startswith("1 residual degree of freedom (4 runs, 3 coefficients); an interval "
                                      "needs at least 2")
    two = mf.Fit.of(w, y)
    low, high = two.interval([0.5, 0.5])
    assert two.no_interval == "" and low < float(two.predict([0.5, 0.5])[0]) < high
    with pytest.raises(ValueError, match="3 distinct mixtures cannot fit and test a model of 3 coefficients"):
        mf.Fit.of(w[[0, 1, 2, 4]], y[[0, 1, 2, 4]])


def test_inside_the_convex_hull_of_mixtures():
    tri = np.array([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6]])
    points = np.array([[1 / 3, 1 / 3, 1 / 3], [0.6, 0.2, 0.2], [0.4, 0.4, 0.2], [0.7, 0.2, 0.1],
                       [0.1, 0.1, 0.8]])
    assert mf.inside(points, tri).tolist() == [True, True, True, False, False]
    line = np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])          # a flat hull: a segment of the triangle
    assert mf.inside([[0.25, 0.5, 0.25], [0.3, 0.4, 0.3], [0.6, 0.4, 0.0]], line).tolist() == [True, False,
                                                                                              False]
    two = np.array([[0.25, 0.75], [0.5, 0.5], [0.375, 0.625]])
    assert mf.inside([[0.25, 0.75], [0.4, 0.6], [0.5625, 0.4375], [0.0, 1.0]], two).tolist() == [
        True, True, False, False]


def test_the_optimum_within_the_hull_stays_there():
    """A score falling toward the first source: over the whole simplex its corner, within the runs' hull
    the hull's edge nearest it."""
    w = np.array([[0.2, 0.8], [0.3, 0.7], [0.4, 0.6], [0.5, 0.5], [0.3, 0.7]])
    fit = mf.Fit.of(w, 3.0 - 0.5 * w[:, 0] + 0.1 * w[:, 0] ** 2)
    free = mf.optimum(fit, ("a", "b"), lower_is_better=True, feasible=lambda w: "")
    held = mf.optimum(fit, ("a", "b"), lower_is_better=True, feasible=lambda w: "", hull=w)
    assert free["a"] == pytest.approx(1.0) and held["a"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no feasible mixture .* in the runs' convex hull"):
        mf.optimum(fit, ("a", "b"), lower_is_better=True, feasible=lambda w: "never", hull=w)
