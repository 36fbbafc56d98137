"""pipeline/mixture_fit.py: seeded draws that honour feasibility, and a fit that recovers a known optimum."""

import numpy as np
import pytest

from pipeline import mixture_fit as mf

SOURCES = ("code", "math", "web")


def _true(w):
    """A known score over three sources: best at (0.2, 0.3, 0.5), quadratic, lower is better."""
    w = np.atleast_2d(w)
    return 1.0 + 4.0 * np.sum((w - np.array([0.2, 0.3, 0.5])) ** 2, axis=1)


def test_draws_are_reproducible_from_the_seed_and_feasible_only():
    limit = lambda w: "code past its limit" if w["code"] > 0.4 else ""    # noqa: E731
    a, b = mf.draw(SOURCES, 12, seed=3, feasible=limit), mf.draw(SOURCES, 12, seed=3, feasible=limit)
    assert a == b and len(a) == 12 and a != mf.draw(SOURCES, 12, seed=4, feasible=limit)
    assert all(w["code"] <= 0.4 and sum(w.values()) == pytest.approx(1) for w in a)
    with pytest.raises(ValueError, match=r"only 0 of 2 mixtures .* the last refused: never"):
        mf.draw(SOURCES, 2, seed=0, feasible=lambda w: "never", max_tries=50)


def test_the_fit_recovers_a_known_optimum_from_a_dozen_noisy_proxies():
    rng = np.random.default_rng(0)
    draws = mf.draw(SOURCES, 12, seed=1, feasible=lambda w: "")
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
    draws = mf.draw(("code", "prose"), 20, seed=0, feasible=problem)
    assert all(mixsearch.rows(train, w)["code"] <= 4 for w in draws)
    assert draws == mf.draw(("code", "prose"), 20, seed=0, feasible=problem)


def test_the_three_source_plot_draws_each_proxys_held_out_prediction_with_the_fewest_proxies():
    """Seven proxies for three sources (the fit's 6 coefficients + 1): the plot uses the fit's own
    leave-one-out predictions (a refit on six could not be tested, and failed)."""
    from pipeline import mixsearch

    draws = mf.draw(SOURCES, 7, seed=2, feasible=lambda w: "")
    w = np.array([[d[s] for s in SOURCES] for d in draws])
    y = _true(w)
    fit = mf.Fit.of(w, y)
    rmse = float(np.sqrt(np.mean((y - fit.loo) ** 2)))
    assert fit.loo.shape == (7,) and fit.loo_rmse == pytest.approx(rmse)
    search = {"sources": list(SOURCES), "settings": {"target": "bpb/mean"},
              "proxies": [{"weights": d, "yardsticks": {"bpb/mean": float(v)}} for d, v in zip(draws, y)]}
    assert mixsearch.fit_png(search, fit)[:4] == b"\x89PNG"
