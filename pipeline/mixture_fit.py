"""From proxy runs to a predicted mixture: draw distinct mixtures, fit a score on them, find the best weights,
and say where one new run there will land.

    drawn = draw(("code", "prose"), n=8, seed=0, whole=split)   # split(weights) -> ({source: rows}, problem)
    drawn.splits, drawn.redrawn, drawn.refused                   # 8 distinct splits; draws that were not kept
    fit = Fit.of(weights, scores)      # weights (R, K) one row a run on the simplex (a mixture may repeat:
                                       # replicates), scores (R,)
    fit.loo_rmse, fit.predict(w), fit.interval(w)          # interval: None under MIN_DOF residual dof
    best = optimum(fit, sources, lower_is_better=True, feasible=..., hull=weights)   # hull: optional
    inside(points, weights)            # (M,) bool: in the convex hull of the runs' mixtures

The model is Scheffé's quadratic mixture polynomial, the standard model of mixture experiments:

    score(w) = sum_i b_i w_i + sum_{i<j} b_ij w_i w_j          (no intercept: the w_i sum to 1)

`b_i` is the score of source i alone; `b_ij` how far a pair's blend departs from the straight line between
them (the curvature that makes an interior optimum possible). It has p = K + K(K-1)/2 coefficients: 3 for two
sources, 6 for three, so a handful of proxies fits it, where RegMix's gradient-boosted trees need hundreds
(Liu et al. 2024 trained 512), and a linear model (RegMix's other choice) can only ever put the optimum on a
corner. Data Mixing Laws' exponential form `c + k exp(t . w)` is monotone along every direction too. A small
ridge penalty (on the pair terms only) keeps it stable when proxies are few.

The noise, and what the interval covers. Every run trains with a seed of its own (pipeline/mixsearch.py), so
one run's score is

    y = f(w) + e,    Var(e) = seed variance + misfit variance

f the quadratic; the seed variance is how far a new seed moves the score at one mixture (initialization and
data order), the misfit what the quadratic misses at w. The residuals estimate Var(e) with R - p degrees of
freedom (R runs): s^2 = RSS / (R - p) (`sigma`, `dof`). A mixture trained twice, with two seeds (a replicate),
measures the seed variance alone: the spread within such groups ("pure error", one degree of freedom a
replicate: `seed_sd`, `seed_dof`); what the residuals hold beyond it is the misfit (`misfit_sd`). A new run
at w, with a new seed, lands within

    predict(w) +- t(0.975, R - p) * s * sqrt(1 + x' (X'X + ridge)^-1 x)        x = features(w)

95% of the time where the model holds: the new run's own noise (the 1) and the fit's error at w (the
leverage). Proxies sharing one seed would not do: the fit absorbs a shift common to every run, so that seed's
effect would be in no residual, and the interval would miss a new seed (tests/pipeline/test_mixsearch.py
simulates both). Under MIN_DOF residual degrees of freedom there is no interval: t(0.975, 1) = 12.7 rests on
one residual. Leave-one-out leaves out a whole mixture, its replicates with it (a replicate left in would
predict its twin). The interval is for the model's world: outside the runs' convex hull (`inside`) the
quadratic extrapolates, and the search says so.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

RIDGE = 1e-4            # on the pair terms, relative to the mean square of their features: stable, ~unbiased
CANDIDATES = 20_000     # mixtures the optimum is searched over (plus every grid point at step 1/20)
MIN_DOF = 2             # residual degrees of freedom an interval needs
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Drawn:
    """What `draw` kept, and what it drew and did not keep."""

    splits: list[dict[str, int]]    # n distinct splits, in the order drawn
    redrawn: int                    # draws that rounded to a split drawn before
    refused: int                    # draws that could not train (the problem `whole` named)


def draw(sources: Sequence[str], n: int, seed: int,
         whole: Callable[[dict[str, float]], tuple[Mapping[str, int], str]],
         alpha: float = 1.0, max_tries: int = 10_000) -> Drawn:
    """`n` distinct mixtures drawn from a symmetric Dirichlet(alpha) over `sources` with
    `np.random.default_rng(seed)`. `whole(weights)` gives what a draw trains on (its whole rows of a batch)
    and "" or why it cannot train (a source past its repetition limit); a draw is kept when it can train and
    its split is not one kept before: two draws that round alike would be one training run counted twice. The
    same (sources, n, seed, alpha, whole) draw the same splits. ValueError when `max_tries` draws do not
    give `n`."""
    rng = np.random.default_rng(seed)
    out, seen, redrawn, refused, last = [], set(), 0, 0, ""
    for _ in range(max_tries):
        w = dict(zip(sources, (float(x) for x in rng.dirichlet([alpha] * len(sources)))))
        split, problem = whole(w)
        if problem:
            refused, last = refused + 1, problem
        elif (key := tuple(sorted(split.items()))) in seen:
            redrawn += 1
        else:
            seen.add(key)
            out.append(dict(split))
            if len(out) == n:
                return Drawn(out, redrawn, refused)
    raise ValueError(f"only {len(out)} of {n} distinct mixtures drawn over {list(sources)} in {max_tries} "
                     f"tries ({redrawn} repeated a split drawn before, {refused} could not train; the last "
                     f"refused: {last or 'none'})")


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
    """Scheffé's quadratic fitted to (weights, scores), one row a run: its leave-one-mixture-out error, its
    residual and seed noise, and the prediction interval of one new run (the module docstring's model)."""

    coef: np.ndarray          # (p,) p = K + K(K-1)/2
    k: int                    # sources
    loo: np.ndarray           # (R,) each run's prediction by a fit without its mixture
    loo_rmse: float           # their root mean square error
    spread: float             # the scores' own standard deviation (what a fit that learned nothing gets)
    sigma: float              # residual standard error (seed noise and misfit), `dof` degrees of freedom
    dof: int                  # R - p
    inverse: np.ndarray       # (p, p) (X'X + penalty)^-1
    seed_sd: float | None     # the spread within replicated mixtures (seed noise alone); None without any
    seed_dof: int             # R - distinct mixtures
    misfit_sd: float | None   # sqrt(max(0, sigma^2 - seed_sd^2)): what the residuals hold beyond the seeds

    @classmethod
    def of(cls, weights, scores) -> Fit:
        w, y = np.asarray(weights, dtype=np.float64), np.asarray(scores, dtype=np.float64)
        if w.ndim != 2 or len(w) != len(y):
            raise ValueError(f"weights {w.shape} and scores {y.shape} do not pair up")
        k, x = w.shape[1], features(w)
        p = x.shape[1]
        _, group = np.unique(w, axis=0, return_inverse=True)
        group = group.reshape(-1)                      # (R,) each run's mixture
        distinct = int(group.max()) + 1
        if distinct <= p:
            raise ValueError(f"{distinct} distinct mixtures cannot fit and test a model of {p} coefficients "
                             f"over {k} sources: draw at least {p + 1}")
        coef = _solve(x, y, k)
        loo = np.empty(len(y))
        for g in range(distinct):
            out = group == g
            loo[out] = x[out] @ _solve(x[~out], y[~out], k)
        dof = len(y) - p
        sigma = float(np.sqrt(np.sum((y - x @ coef) ** 2) / dof))
        means = np.bincount(group, weights=y) / np.bincount(group)
        seed_dof = len(y) - distinct
        seed_sd = float(np.sqrt(np.sum((y - means[group]) ** 2) / seed_dof)) if seed_dof else None
        misfit_sd = None if seed_sd is None else float(np.sqrt(max(0.0, sigma ** 2 - seed_sd ** 2)))
        return cls(coef, k, loo, float(np.sqrt(np.mean(np.square(y - loo)))), float(np.std(y)), sigma, dof,
                   np.linalg.inv(x.T @ x + _penalty(x, k)), seed_sd, seed_dof, misfit_sd)

    def predict(self, w) -> np.ndarray:
        return features(w) @ self.coef

    @property
    def no_interval(self) -> str:
        """"" when the fit gives an interval; else why not, in one sentence."""
        if self.dof >= MIN_DOF:
            return ""
        p = n_coefficients(self.k)
        return (f"{self.dof} residual degree of freedom ({self.dof + p} runs, {p} coefficients); an interval "
                f"needs at least {MIN_DOF} (t(0.975, 1) = 12.7 would rest on one residual)")

    def interval(self, w, level: float = LEVEL) -> tuple[float, float] | None:
        """The `level` prediction interval of one new run's score, at a new seed, at mixture `w` (K,); None
        under MIN_DOF residual degrees of freedom (`no_interval` says why)."""
        from scipy import stats

        if self.no_interval:
            return None
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


def inside(points, hull, tol: float = 1e-9) -> np.ndarray:
    """(M,) bool: whether each of `points` (M, K) lies in the convex hull of `hull` (H, K), mixtures on one
    simplex. The hull may be flat (three sources' mixtures on a line): a point must lie on its span too."""
    from scipy.spatial import ConvexHull

    pts, h = np.atleast_2d(np.asarray(points, np.float64)), np.unique(np.atleast_2d(hull), axis=0)
    centre = h.mean(axis=0)
    _, s, vt = np.linalg.svd(h - centre)
    basis = vt[: int(np.sum(s > 1e-9 * max(float(s[0]) if len(s) else 0.0, 1.0)))]   # (d, K) the hull's span
    a, b = (h - centre) @ basis.T, (pts - centre) @ basis.T                             # (H, d), (M, d)
    on_span = np.linalg.norm((pts - centre) - b @ basis, axis=1) <= tol
    if basis.shape[0] == 0:
        return on_span
    if basis.shape[0] == 1:
        return on_span & (b[:, 0] >= a.min() - tol) & (b[:, 0] <= a.max() + tol)
    facets = ConvexHull(a).equations                                   # (F, d + 1): normal . x + offset <= 0
    return on_span & np.all(b @ facets[:, :-1].T + facets[:, -1] <= tol, axis=1)


@functools.lru_cache(maxsize=8)
def candidates(k: int, seed: int = 0) -> np.ndarray:
    """Mixtures of `k` sources to search: every point of the simplex grid at step 1/20, and uniform draws
    (read-only: one array a k, computed once)."""
    grid = [c for c in itertools.product(range(21), repeat=k) if sum(c) == 20] if k <= 4 else []
    rng = np.random.default_rng(seed)
    out = np.vstack([np.asarray(grid, dtype=np.float64).reshape(-1, k) / 20,
                     rng.dirichlet([1.0] * k, CANDIDATES)])
    out.setflags(write=False)
    return out


def optimum(fit: Fit, sources: Sequence[str], *, lower_is_better: bool,
            feasible: Callable[[dict[str, float]], str], hull=None) -> dict[str, float]:
    """The feasible candidate mixture with the best predicted score; with `hull` ((H, K) mixtures, the runs'),
    only candidates in their convex hull, the hull's own mixtures among them."""
    pool = candidates(len(sources))
    if hull is not None:
        hull = np.atleast_2d(np.asarray(hull, dtype=np.float64))
        pool = np.vstack([hull, pool[inside(pool, hull)]])
    score = fit.predict(pool) if lower_is_better else -fit.predict(pool)          # (M,) lower is better

    def order():                                  # the best first (usually feasible), then sorted: by need
        yield (first := int(np.argmin(score)))
        yield from (int(j) for j in np.argsort(score, kind="stable") if j != first)

    for i in order():
        w = dict(zip(sources, (float(x) for x in pool[i])))
        if not feasible(w):
            return w
    where = " in the runs' convex hull" if hull is not None else ""
    raise ValueError(f"no feasible mixture of {list(sources)} among {len(pool)} candidates{where}")
