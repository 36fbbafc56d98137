"""From proxy runs to a predicted mixture: draw weights, fit a score on them, and find the best weights.

    draws = draw(("code", "prose"), n=8, seed=0, feasible=lambda w: True)   # Dirichlet, seeded
    fit = Fit.of(weights, scores)              # weights (N, K) rows on the simplex, scores (N,)
    fit.loo_rmse, fit.predict(w), fit.interval(w)
    best = optimum(fit, sources, lower_is_better=True, feasible=...)

The model is Scheffé's quadratic mixture polynomial, the standard model of mixture experiments:

    score(w) = sum_i b_i w_i + sum_{i<j} b_ij w_i w_j          (no intercept: the w_i sum to 1)

`b_i` is the score of source i alone; `b_ij` how far a pair's blend departs from the straight line between
them (the curvature that makes an interior optimum possible). It has K + K(K-1)/2 coefficients: 3 for two
sources, 6 for three, so a handful of proxies fits it, where RegMix's gradient-boosted trees need hundreds
(Liu et al. 2024 trained 512), and a linear model (RegMix's other choice) can only ever put the optimum on a
corner. Data Mixing Laws' exponential form `c + k exp(t . w)` is monotone along every direction too. A small
ridge penalty (on the pair terms only) keeps it stable when proxies are few; its held-out error (leave one
out) is reported, and its interval is least squares' prediction interval for one new run at those weights
(residual error with N - p degrees of freedom, Student's t), which needs at least p + 1 proxies.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

import numpy as np

RIDGE = 1e-4            # on the pair terms, relative to the mean square of their features: stable, ~unbiased
CANDIDATES = 20_000     # mixtures the optimum is searched over (plus every grid point at step 1/20)


def draw(sources: Sequence[str], n: int, seed: int, feasible: Callable[[dict[str, float]], str],
         alpha: float = 1.0, max_tries: int = 10_000) -> list[dict[str, float]]:
    """`n` mixtures drawn from a symmetric Dirichlet(alpha) over `sources` with `np.random.default_rng(seed)`,
    each kept only when `feasible(weights)` returns "" (its problem otherwise: a source past its repetition
    limit, a share under one row a step). The same (sources, n, seed, alpha, feasible) draw the same list."""
    rng = np.random.default_rng(seed)
    out, last = [], ""
    for _ in range(max_tries):
        w = dict(zip(sources, (float(x) for x in rng.dirichlet([alpha] * len(sources)))))
        if not (last := feasible(w)):
            out.append(w)
            if len(out) == n:
                return out
    raise ValueError(f"only {len(out)} of {n} mixtures drawn over {list(sources)} in {max_tries} tries were "
                     f"feasible; the last refused: {last}")


def features(w: np.ndarray) -> np.ndarray:
    """(N, K) weights -> (N, K + K(K-1)/2): each w_i, then each w_i w_j (i < j)."""
    w = np.atleast_2d(np.asarray(w, dtype=np.float64))
    pairs = [w[:, i] * w[:, j] for i, j in itertools.combinations(range(w.shape[1]), 2)]
    return np.column_stack([w, *pairs]) if pairs else w


def n_coefficients(k: int) -> int:
    return k + k * (k - 1) // 2


def _penalty(x: np.ndarray, k: int) -> np.ndarray:
    penalty = np.zeros(x.shape[1])
    if x.shape[1] > k:
        penalty[k:] = RIDGE * max(float(np.mean(x[:, k:] ** 2)), 1e-12) * len(x)
    return np.diag(penalty) + 1e-12 * np.eye(x.shape[1])


def _solve(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    return np.linalg.solve(x.T @ x + _penalty(x, k), x.T @ y)


@dataclasses.dataclass(frozen=True)
class Fit:
    """Scheffé's quadratic fitted to (weights, scores): its leave-one-out error and prediction interval."""

    coef: np.ndarray          # (p,) p = K + K(K-1)/2
    k: int                    # sources
    loo: np.ndarray           # (N,) each proxy's prediction by a fit without it
    loo_rmse: float           # their root mean square error
    spread: float             # the scores' own standard deviation (what a fit that learned nothing gets)
    sigma: float              # residual standard error, N - p degrees of freedom
    dof: int
    inverse: np.ndarray       # (p, p) (X'X + penalty)^-1

    @classmethod
    def of(cls, weights, scores) -> Fit:
        w, y = np.asarray(weights, dtype=np.float64), np.asarray(scores, dtype=np.float64)
        if w.ndim != 2 or len(w) != len(y):
            raise ValueError(f"weights {w.shape} and scores {y.shape} do not pair up")
        k, x = w.shape[1], features(w)
        if len(y) <= x.shape[1]:
            raise ValueError(f"{len(y)} proxies cannot fit and test a model of {x.shape[1]} coefficients "
                             f"over {k} sources: draw at least {x.shape[1] + 1}")
        coef = _solve(x, y, k)
        loo = np.array([float((features(w[i]) @ _solve(np.delete(x, i, 0), np.delete(y, i), k))[0])
                        for i in range(len(y))])
        dof = len(y) - x.shape[1]
        sigma = float(np.sqrt(np.sum((y - x @ coef) ** 2) / dof))
        return cls(coef, k, loo, float(np.sqrt(np.mean(np.square(y - loo)))), float(np.std(y)), sigma, dof,
                   np.linalg.inv(x.T @ x + _penalty(x, k)))

    def predict(self, w) -> np.ndarray:
        return features(w) @ self.coef

    def interval(self, w, level: float = 0.95) -> tuple[float, float]:
        """The `level` prediction interval of one new run's score at mixture `w` (K,)."""
        from scipy import stats

        x = features(w)[0]
        leverage = float(x @ self.inverse @ x)
        half = float(stats.t.ppf(0.5 + level / 2, self.dof)) * self.sigma * float(np.sqrt(1 + leverage))
        centre = float(x @ self.coef)
        return centre - half, centre + half

    def effects(self, sources: Sequence[str]) -> dict[str, float]:
        """Per source, the predicted change of the score when its weight rises from the uniform mixture by
        0.1 (the others giving it up in proportion): which sources matter, and in which direction."""
        center = np.full(self.k, 1 / self.k)
        base = float(self.predict(center)[0])
        out = {}
        for i, name in enumerate(sources):
            moved = center * (1 - 0.1 / (1 - center[i]) * (np.arange(self.k) != i))
            moved[i] = center[i] + 0.1
            out[name] = float(self.predict(moved)[0]) - base
        return out


def candidates(k: int, seed: int = 0) -> np.ndarray:
    """Mixtures of `k` sources to search: every point of the simplex grid at step 1/20, and uniform draws."""
    grid = [c for c in itertools.product(range(21), repeat=k) if sum(c) == 20] if k <= 4 else []
    rng = np.random.default_rng(seed)
    return np.vstack([np.asarray(grid, dtype=np.float64).reshape(-1, k) / 20,
                      rng.dirichlet([1.0] * k, CANDIDATES)])


def optimum(fit: Fit, sources: Sequence[str], *, lower_is_better: bool,
            feasible: Callable[[dict[str, float]], str]) -> dict[str, float]:
    """The feasible candidate mixture with the best predicted score."""
    pool = candidates(len(sources))
    order = np.argsort(fit.predict(pool) if lower_is_better else -fit.predict(pool), kind="stable")
    for i in order:
        w = dict(zip(sources, (float(x) for x in pool[i])))
        if not feasible(w):
            return w
    raise ValueError(f"no feasible mixture of {list(sources)} among {len(pool)} candidates")
