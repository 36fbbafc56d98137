"""Mixture search (after RegMix, Liu et al. 2024): small proxy runs on random mixtures, a fit per yardstick
from the weights, and the predicted best mixture trained and measured against the best proxy and the uniform
one.

    make mixsearch MIXSEARCH=gin/mixsearch/prose_code.gin
    python -m pipeline mixsearch --gin gin/mixsearch/prose_code.gin [--gin-param 'mixsearch.proxies = 12']

A mixsearch file includes a mixture run (its train.Mixture names the sources; each proxy replaces its phases
with one phase at the drawn weights) and binds:

    mixsearch.proxies = 8          # N proxies: N distinct mixtures
    mixsearch.seed = 0             # the draw's seed: the same seed draws the same mixtures
    mixsearch.alpha = 1.0          # Dirichlet concentration over the sources (1: uniform over the simplex)
    mixsearch.target = "bpb/mean"  # the yardstick to optimise: a name from the sweep report, or bpb/mean
    mixsearch.seeds = 2            # seeds of each finalist: the prediction, the best proxy, uniform weights
    mixsearch.replicates = 2       # the first proxies trained again with another seed: the seed noise alone
    mixsearch.within_hull = False  # True: the optimum only inside the convex hull of the proxies' mixtures

What runs, in order: the data half (every source's download, clean and shard, the tokenizer, the yardsticks),
once; the proxies, one Luigi build in which only train and evaluate run per proxy (weights are training's:
every data key is shared); a fit per yardstick (pipeline/mixture_fit.py) and the target's optimum among the
feasible mixtures with its 95% prediction interval; then the three finalists with `seeds` seeds each (a
finalist's run that already exists is reused by key), judged by pipeline/sweep_report.py against the seed
spread. A mixture is feasible when every share is whole rows of a batch and no source is read past
train.Mixture.max_epochs by the shards' own counts: infeasible mixtures are never drawn nor predicted.

The statistics (`propose`, `predict`; the model is pipeline/mixture_fit.py's docstring):
- the N proxies are N distinct whole-row splits: a draw that rounds to a split already drawn is drawn again
  (the report counts them), and a search asking more than the batch can split into is refused before work;
- every proxy run trains with a seed of its own (proxy i: train.Config.seed = i - 1; the replicate of proxy i,
  one of the first `replicates`: N + i - 1), so every run is a distinct key and the residuals carry a new
  seed's effect: the interval is for one new run at a new seed;
- under two residual degrees of freedom (N + replicates - coefficients) no interval is given, and the report
  says why; a prediction outside the proxies' convex hull is flagged (`within_hull` keeps it inside).

The proxies are independent runs: `--workers N` (or a central luigid with `--scheduler`, several machines each
running the same command) trains them side by side. The report goes to `<cache_root>/mixsearch/<name>/`:
report.md, search.json, fit.png.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline import checks, config, sweep, sweep_report
from pipeline import plan as run_plan
from pipeline.search_bindings import MEAN_BPB, SEED_BINDING, MixSearch, proxies_needed
from stages import train as train_stage
from stages.io import storage
from stages.io.committed import by_source

# numpy and the fit (pipeline/mixture_fit.py) are imported where used: planning a search (`settings`, which
# the CLI's checks call before anything runs) needs neither
if TYPE_CHECKING:
    from pipeline import mixture_fit

PHASES = "train.Mixture.phases"
FINALISTS = ("predicted", "best proxy", "uniform")


def settings(gin_files: list[str], params: list[str]) -> tuple[MixSearch, run_plan.Plan]:
    """The search's settings (`mixsearch.*`, search_bindings.MixSearch) and the base plan; ConfigError naming
    the bad value: what MixSearch refuses on its own, and what this run decides, a run of fewer than two
    sources, fewer proxies than its sources' fit needs, a target none of its runs will have."""
    found, plan = config.load_settings("mixsearch", gin_files, params)
    train = plan.stages["train"].config
    files = ", ".join(gin_files)
    if train.mixture is None or len(plan.tree.sources) < 2:
        raise config.ConfigError(f"{files}: a mixture search needs a run with two or more sources "
                                 "(train.Mixture naming them, as gin/mixtures/prose_code.gin does)")
    need = proxies_needed(len(plan.tree.sources))
    if found.proxies < need:
        raise config.ConfigError(f"{files}: mixsearch.proxies = {found.proxies!r}; the fit over "
                                 f"{len(plan.tree.sources)} sources needs an int >= {need}")
    if found.proxies > (allowed := splits_allowed(train.global_batch, len(plan.tree.sources))):
        raise config.ConfigError(f"{files}: mixsearch.proxies = {found.proxies} distinct mixtures, but a "
                                 f"batch of {train.global_batch} rows splits {len(plan.tree.sources)} "
                                 f"sources ({', '.join(plan.tree.sources)}) in only {allowed:,} ways; lower "
                                 f"mixsearch.proxies to at most {allowed} or raise train.Config.global_batch")
    names = sweep_report.planned(plan.stages["yardsticks"].config)
    names += [MEAN_BPB] if any(n.startswith("bpb/") for n in names) else []
    if found.target not in names:
        raise config.ConfigError(f"{files}: mixsearch.target = {found.target!r} is not a yardstick these "
                                 f"runs will have (yardsticks.Config sets them); choose one of: "
                                 f"{', '.join(names)}")
    return found, plan


# ---------------------------------------------------------------------------------------------
# Mixtures as whole rows of a batch

def splits_allowed(batch: int, sources: int) -> int:
    """How many ways `batch` rows split among `sources` sources (a source may have none): C(batch + sources -
    1, sources - 1), the most distinct proxies a batch allows."""
    return math.comb(batch + sources - 1, sources - 1)


def rows(train, weights: dict[str, float]) -> dict[str, int]:
    """`weights` as whole rows of the batch of `train` (a train.Config; the largest remainder): what a proxy
    trains on."""
    return train_stage.one_phase(train, weights)[0]


def binding(mix_rows: dict[str, int]) -> str:
    return f"{PHASES} = ((0, {dict(sorted(mix_rows.items()))!r}),)"


def windows(plan: run_plan.Plan) -> dict[str, int]:
    """{source: training windows} by its committed shards' counts (the data half must have run)."""
    train = plan.stages["train"].config
    return train_stage.mixture_windows(train, by_source(checks.inputs(plan, "train"), "shard"))


def whole_rows(train, windows: dict[str, int]) -> Callable[[dict[str, float]], tuple[dict[str, int], str]]:
    """weights -> (their whole rows of a batch of `train` (a train.Config), "" or why a run at them cannot
    train on sources of `windows` training windows each: a share under one row, a source read past
    train.Mixture.max_epochs) (train.one_phase)."""
    return lambda weights: train_stage.one_phase(train, weights, windows)


def limits(train, windows: dict[str, int]) -> Callable[[dict[str, float]], str]:
    """weights -> "" or why a run of `train` at those weights, as whole rows, cannot train (`whole_rows`)."""
    whole = whole_rows(train, windows)
    return lambda weights: whole(weights)[1]


# ---------------------------------------------------------------------------------------------
# The statistics: which runs, and what their scores predict (pure: tests/pipeline/test_mixsearch.py simulates
# whole searches through these on known scores)

@dataclasses.dataclass(frozen=True)
class ProxyRun:
    """One proxy training run: the drawn split it trains on and its seed."""

    proxy: int                      # 1..N: the split's place in the draw
    seed: int                       # train.Config.seed: each run its own
    rows: dict[str, int]            # {source: rows of a batch}


def propose(sources, found: MixSearch, whole) -> tuple[mixture_fit.Drawn, list[ProxyRun]]:
    """The search's draw (`found.proxies` distinct whole-row splits, `whole` as `whole_rows` gives it) and
    its runs: proxy i with seed i - 1, then the first `found.replicates` proxies again with seeds N, N + 1,
    ...: no two runs share a key, and every run's seed is new to the others."""
    from pipeline import mixture_fit

    drawn = mixture_fit.draw(sources, found.proxies, found.seed, whole, found.alpha)
    n = len(drawn.splits)
    runs = [ProxyRun(i + 1, i, split) for i, split in enumerate(drawn.splits)]
    return drawn, runs + [ProxyRun(i + 1, n + i, drawn.splits[i]) for i in range(found.replicates)]


def predict(sources, batch: int, runs: list[ProxyRun], scores, whole, *, lower_is_better: bool,
            within_hull: bool = False) -> tuple[mixture_fit.Fit, dict]:
    """The fit of `scores` (one a run of `runs`) and its optimum as whole rows of a `batch`, {"rows",
    "weights", "score", "interval" ([low, high], or None), "no_interval" ("" or why none), "inside_hull"}:
    the interval for one new run there at a new seed, the optimum searched inside the runs' convex hull only
    with `within_hull`. `whole` as `whole_rows` gives it."""
    import numpy as np

    from pipeline import mixture_fit

    w = np.array([[r.rows[s] / batch for s in sources] for r in runs])       # (R, K)
    fit = mixture_fit.Fit.of(w, scores)
    hull = w if within_hull else None

    def allowed(weights: dict[str, float]) -> str:
        split, problem = whole(weights)
        if problem or hull is None or mixture_fit.inside([[split[s] / batch for s in sources]], hull)[0]:
            return problem
        return "outside the proxies' convex hull once whole rows"

    split = whole(mixture_fit.optimum(fit, sources, lower_is_better=lower_is_better, feasible=allowed,
                                      hull=hull))[0]
    at = [split[s] / batch for s in sources]
    interval = fit.interval(at)
    return fit, {"rows": split, "weights": dict(zip(sources, at)), "score": float(fit.predict([at])[0]),
                 "interval": None if interval is None else list(interval),
                 "no_interval": fit.no_interval and f"{fit.no_interval}: add a proxy (mixsearch.proxies) or "
                                                    "a replicate (mixsearch.replicates)",
                 "inside_hull": bool(mixture_fit.inside([at], w)[0])}


# ---------------------------------------------------------------------------------------------
# The search

def run(gin_files: list[str], params: list[str], *, workers: int = 1, scheduler: str | None = None) -> str:
    """The whole search (see the module docstring); returns the report's summary lines. RuntimeError when a
    build fails."""
    import numpy as np

    from pipeline import mixture_fit

    found, base = settings(gin_files, params)
    sources = base.tree.sources
    data = [n for n in base.tree.closure("train") if n != "train"]
    ran = {"data": _build([base], data, workers, scheduler, "the data half")}
    base = config.load(gin_files, params)         # the same plan, now with its shards committed
    train = base.stages["train"].config
    batch = train.global_batch
    whole = whole_rows(train, windows(base))
    drawn, runs = propose(sources, found, whole)
    proxies = proxy_plans(gin_files, params, runs)
    ran["proxies"] = _build([p.plan for p in proxies], ["evaluate"], workers, scheduler, "the proxies")
    results = sweep_report.collect(proxies)
    scores = [with_mean(sweep_report.yardsticks(r.evaluation)) for r in results]
    names = [n for n in scores[0] if all(n in s for s in scores)]
    if found.target not in names:
        raise ValueError(f"mixsearch.target = {found.target!r} is not a yardstick of these runs; they have: "
                         f"{', '.join(names)}")
    lower = sweep_report.lower_is_better(found.target)
    target_values = [s[found.target]["value"] for s in scores]
    fit, prediction = predict(sources, batch, runs, target_values, whole, lower_is_better=lower,
                              within_hull=found.within_hull)
    w = [[r.rows[s] / batch for s in sources] for r in runs]
    fits = {n: fit if n == found.target else mixture_fit.Fit.of(w, [s[n]["value"] for s in scores])
            for n in names}
    by_proxy = {}                                 # the best proxy by its mean over its runs
    for r, v in zip(runs, target_values):
        by_proxy.setdefault(r.proxy, []).append(v)
    means = {p: float(np.mean(v)) for p, v in by_proxy.items()}
    best_proxy = drawn.splits[(min if lower else max)(means, key=means.get) - 1]
    uniform = rows(train, dict.fromkeys(sources, 1.0))
    finalist_seeds = list(range(found.seeds)) if found.seeds > 1 else [train.seed]
    finalists = [_run(gin_files, params, name, r, seed if found.seeds > 1 else None)
                 for name, r in zip(FINALISTS, (prediction["rows"], best_proxy, uniform))
                 for seed in finalist_seeds]
    ran["finalists"] = _build([f.plan for f in finalists], ["evaluate"], workers, scheduler, "the finalists")
    values = [{n: s[n]["value"] for n in names} for s in scores]
    search = {**record(sources, found, train, drawn, runs, values, fits, prediction),
              "finalists": dict(zip(FINALISTS, (prediction["rows"], best_proxy, uniform))),
              "finalist_seeds": finalist_seeds,
              "ran": ran}           # {build: the nodes that ran in it}
    decision = sweep_report.decide(_with_mean_results(sweep_report.collect(finalists)))
    return write(sweep.sweep_name(gin_files), base.cache_root, search, decision, fit)


def record(sources, found: MixSearch, train, drawn: mixture_fit.Drawn, runs: list[ProxyRun],
           scores: list[dict[str, float]], fits: dict[str, mixture_fit.Fit], prediction: dict) -> dict:
    """search.json's statistics (the report is written from them): the settings and the shape of a run
    (`train`, a train.Config), the draw, each proxy run with its yardsticks (`scores`, one {name: value} a
    run), each yardstick's fit, the target's prediction (`predict`)."""
    batch = train.global_batch
    return {
        "sources": list(sources), "settings": dataclasses.asdict(found), "global_batch": batch,
        "steps": train.steps, "seq_len": train.seq_len,
        "draws": {"proxies": len(drawn.splits), "redrawn": drawn.redrawn, "refused": drawn.refused,
                  "replicates": found.replicates},
        "proxies": [{"proxy": r.proxy, "seed": r.seed, "rows": r.rows,
                     "weights": {s: r.rows[s] / batch for s in sources}, "yardsticks": dict(y)}
                    for r, y in zip(runs, scores)],
        "fits": {n: {"loo_rmse": f.loo_rmse, "spread": f.spread, "sigma": f.sigma, "dof": f.dof,
                     "seed_sd": f.seed_sd, "seed_dof": f.seed_dof, "misfit_sd": f.misfit_sd,
                     "coef": f.coef.tolist(), "effects": f.effects(sources),
                     "lower_is_better": sweep_report.lower_is_better(n)}
                 for n, f in fits.items()},
        "prediction": prediction,
    }


def proxy_plans(gin_files: list[str], params: list[str], runs: list[ProxyRun]) -> list[sweep.Run]:
    """Each proxy run's plan: the run file at its split and seed (sweep.Run "proxy <i>" with that seed)."""
    return [_run(gin_files, params, f"proxy {r.proxy}", r.rows, r.seed) for r in runs]


def _run(gin_files, params, name: str, mix_rows: dict[str, int], seed: int | None = None) -> sweep.Run:
    """The plan of one run at `mix_rows` (with train.Config.seed = `seed` unless None: the file's own)."""
    extra = [binding(mix_rows)] + ([f"{SEED_BINDING} = {seed}"] if seed is not None else [])
    plan = config.load(gin_files, params + extra)
    return sweep.Run(name, plan.stages["train"].config.seed, plan)


def _build(plans, targets, workers, scheduler, what: str) -> list[str]:
    from pipeline import tasks  # Luigi: imported when something is built, as the CLI does

    result = tasks.build(plans, targets, workers=workers, scheduler=scheduler)
    if not result.ok:
        raise RuntimeError(f"mixture search: {what} failed:\n{result.summary}")
    return list(result.ran)


def with_mean(found: dict[str, dict]) -> dict[str, dict]:
    """A run's yardsticks plus `bpb/mean`, the mean of its reference sets' bits per byte (and of their
    interval ends), when it has any."""
    import numpy as np

    bpb = [v for n, v in found.items() if n.startswith("bpb/")]
    if not bpb:
        return found
    return {**found, MEAN_BPB: {k: float(np.mean([v[k] for v in bpb])) for k in ("value", "low", "high")}}


def _with_mean_results(results: list[sweep_report.Result]) -> list[sweep_report.Result]:
    """Results whose eval.json carries bpb/mean as one more reference set, so the verdicts judge it too."""
    out = []
    for r in results:
        mean = with_mean(sweep_report.yardsticks(r.evaluation)).get(MEAN_BPB)
        evaluation = r.evaluation if mean is None else {
            **r.evaluation, "reference_bpb": {**r.evaluation.get("reference_bpb", {}),
                                              "mean": {"bpb": mean["value"], "low": mean["low"],
                                                       "high": mean["high"]}}}
        out.append(dataclasses.replace(r, evaluation=evaluation))
    return out


# ---------------------------------------------------------------------------------------------
# The report

def write(name: str, cache_root: str, search: dict, decision: dict, target_fit) -> str:
    out = storage.join(cache_root, "mixsearch", name)
    text = markdown(name, search, decision)
    storage.write_text(storage.join(out, "report.md"), text)
    storage.write_json(storage.join(out, "search.json"), {**search, "verdicts": decision})
    storage.write_bytes(storage.join(out, "fit.png"), fit_png(search, target_fit))
    return "\n".join([summary(search, decision), f"report: {storage.join(out, 'report.md')}"])


def summary(search: dict, decision: dict) -> str:
    target = search["settings"]["target"]
    p = search["prediction"]
    got = decision["yardsticks"].get(target, {}).get("variants", {})
    measured = {v: got[v]["mean"] for v in FINALISTS if v in got}
    weights = ", ".join(f"{s} {w:.0%}" for s, w in p["weights"].items())
    runs = len(search["proxies"])
    line = (f"mixsearch: {search['draws']['proxies']} proxies, {runs} runs; predicted best for {target}: "
            f"{weights}, {p['score']:.4f} predicted " +
            (f"[{p['interval'][0]:.4f}, {p['interval'][1]:.4f}]" if p["interval"] else "(no interval: "
             f"{p['no_interval']})"))
    if not p["inside_hull"]:
        line += "; OUTSIDE the proxies' convex hull (extrapolated)"
    if measured:
        line += "; measured " + ", ".join(f"{v} {m:.4f}" for v, m in measured.items())
    return line + "\n" + sweep_report.summary(decision)


def _hull_words(search: dict) -> str:
    """Where the proxies are: with two sources the range of the first one's share they cover."""
    sources = search["sources"]
    if len(sources) != 2:
        return "the convex hull of the proxies' mixtures"
    shares = [p["weights"][sources[0]] for p in search["proxies"]]
    return f"the proxies' convex hull ({sources[0]} {min(shares):.3f} to {max(shares):.3f})"


def _noise_words(f: dict) -> str:
    """A fit's residual standard error and, with replicates, the seed noise alone."""
    out = f"residual sd {f['sigma']:.4f} with {f['dof']} dof, seed noise and misfit together"
    if f["seed_sd"] is not None:
        pairs = f"{f['seed_dof']} replicate pair" + ("s" if f["seed_dof"] != 1 else "")
        out += f"; the seed noise alone, from {pairs}: sd {f['seed_sd']:.4f}"
    return out


def markdown(name: str, search: dict, decision: dict) -> str:
    sources, target = search["sources"], search["settings"]["target"]
    s = search["settings"]
    d = search["draws"]
    names = list(search["fits"])
    tokens = search["steps"] * search["global_batch"] * search["seq_len"]
    runs = len(search["proxies"])
    lines = [f"# Mixture search: {name}", "",
             f"{d['proxies']} proxies over {', '.join(sources)}: distinct mixtures drawn from a "
             f"Dirichlet(alpha = {s['alpha']:g}) with seed {s['seed']} as whole rows of a batch "
             f"({d['redrawn']} draw{'s' if d['redrawn'] != 1 else ''} redrawn: they rounded to a mixture "
             f"already drawn; {d['refused']} refused: past a source's repetition limit). Each proxy trains "
             f"with a seed of its own, and the first {d['replicates']} again with another (replicates: the "
             f"seed noise alone): {runs} runs of {search['steps']} steps of {search['global_batch']} x "
             f"{search['seq_len']} tokens ({tokens:,} tokens a run).", "", "## Proxies", "",
             "| proxy | seed | " + " | ".join(sources) + " | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * (len(sources) + len(names))]
    for p in search["proxies"]:
        lines.append(f"| {p['proxy']} | {p['seed']} | " +
                     " | ".join(f"{p['weights'][x]:.3f}" for x in sources) + " | " +
                     " | ".join(f"{p['yardsticks'][n]:.4f}" for n in names) + " |")
    lines += ["", "## Fits: Scheffé's quadratic mixture model, one per yardstick", "",
              "Held-out error is leave-one-out: each proxy (with its replicate) predicted by a fit without "
              "it. A fit whose held-out error is not well under the scores' own spread has not learned the "
              "weights' effect. The residual sd is a run's noise about the fit (every run has its own seed: "
              "seed noise and the quadratic's misfit); replicate pairs measure the seed noise alone. The "
              "effect of a source: the predicted change when its weight rises by 0.1 from the uniform "
              "mixture.", "",
              "| yardstick | held-out RMSE | scores' spread | residual sd (dof) | seed sd (pairs) | " +
              " | ".join(f"effect of +0.1 {x}" for x in sources) + " |",
              "|---|---|---|---|---|" + "---|" * len(sources)]
    for n, f in search["fits"].items():
        seed_sd = "-" if f["seed_sd"] is None else f"{f['seed_sd']:.4f} ({f['seed_dof']})"
        lines.append(f"| {n} | {f['loo_rmse']:.4f} | {f['spread']:.4f} | {f['sigma']:.4f} ({f['dof']}) | "
                     f"{seed_sd} | " + " | ".join(f"{f['effects'][x]:+.4f}" for x in sources) + " |")
    p = search["prediction"]
    direction = "lower" if sweep_report.lower_is_better(target) else "higher"
    where = f" within {_hull_words(search)}" if s.get("within_hull") else ""
    lines += ["", "## Prediction", "",
              f"Target {target} ({direction} is better): the best feasible mixture by the fit{where} is " +
              ", ".join(f"{x} {p['weights'][x]:.3f}" for x in sources) + f", predicted {p['score']:.4f}. " +
              (f"95% prediction interval for one new run there, at a new seed: {p['interval'][0]:.4f} to "
               f"{p['interval'][1]:.4f} (Student's t; {_noise_words(search['fits'][target])})."
               if p["interval"] else f"**No interval**: {p['no_interval']}.")]
    if p["inside_hull"]:
        lines += ["", f"It lies inside {_hull_words(search)}."]
    else:
        lines += ["", f"**Outside {_hull_words(search)}**: the quadratic is extrapolated where no proxy "
                  "trained, and the interval assumes it holds there; `mixsearch.within_hull = True` searches "
                  "only inside it."]
    lines += ["", "## Measured: the prediction against the best proxy and the uniform mixture", "",
              "| finalist | " + " | ".join(sources) + " |", "|---|" + "---|" * len(sources)]
    for f, r in search["finalists"].items():
        lines.append(f"| {f} | " + " | ".join(f"{r[x] / search['global_batch']:.3f}" for x in sources) + " |")
    seeds = decision["yardsticks"].get(target, {}).get("variants", {}).get("predicted", {}).get("seeds", {})
    if p["interval"] and seeds:
        low, high = p["interval"]
        within = sum(low <= v <= high for v in seeds.values())
        lines += ["", f"The prediction's own runs on {target}: " +
                  ", ".join(f"seed {k} {v:.4f}" for k, v in seeds.items()) +
                  f": {within} of {len(seeds)} inside its 95% interval."]
    report = sweep_report.markdown(name, decision)
    lines += ["", report[report.index("\n") + 1:].strip(), "", "![fit](fit.png)", ""]
    return "\n".join(lines)


def fit_png(search: dict, fit) -> bytes:
    """The target's fit: with two sources, the score against the first source's weight (proxy runs, the fitted
    curve and its prediction band when it has one, the prediction); with more, each run's held-out prediction
    against its score."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources, target = search["sources"], search["settings"]["target"]
    xs = np.array([[p["weights"][s] for s in sources] for p in search["proxies"]])
    ys = np.array([p["yardsticks"][target] for p in search["proxies"]])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    if len(sources) == 2:
        grid = np.linspace(0, 1, 101)
        pts = np.column_stack([grid, 1 - grid])
        if not fit.no_interval:
            band = np.array([fit.interval(p) for p in pts])
            ax.fill_between(grid, band[:, 0], band[:, 1], alpha=0.2, label="95% interval: a new seed's run")
        ax.plot(grid, fit.predict(pts), label="fit")
        ax.scatter(xs[:, 0], ys, color="black", zorder=3, label="proxy runs")
        w = search["prediction"]["weights"][sources[0]]
        ax.axvline(w, linestyle="--", color="tab:red", label=f"predicted best ({sources[0]} {w:.2f})")
        ax.set_xlabel(f"weight of {sources[0]} (by tokens; {sources[1]} the rest)")
    else:
        loo = fit.loo
        ax.scatter(ys, loo, color="black")
        lo, hi = float(min(ys.min(), loo.min())), float(max(ys.max(), loo.max()))
        ax.plot([lo, hi], [lo, hi], color="gray", linewidth=0.8)
        ax.set_xlabel(f"measured {target}")
        ax.set_ylabel(f"held-out prediction of {target}")
    if len(sources) == 2:
        ax.set_ylabel(target)
        ax.legend(fontsize=8)
    ax.set_title(f"mixture search: {target}")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()

