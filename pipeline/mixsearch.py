"""Mixture search (after RegMix, Liu et al. 2024): small proxy runs on random mixtures, a fit per yardstick
from the weights, and the predicted best mixture trained and measured against the best proxy and the uniform
one.

    make mixsearch MIXSEARCH=gin/mixsearch/prose_code.gin
    python -m pipeline mixsearch --gin gin/mixsearch/prose_code.gin [--gin-param 'mixsearch.proxies = 12']

A mixsearch file includes a mixture run (its train.Mixture names the sources; each proxy replaces its phases
with one phase at the drawn weights) and binds:

    mixsearch.proxies = 8          # N proxy runs
    mixsearch.seed = 0             # the draw's seed: the same seed draws the same mixtures
    mixsearch.alpha = 1.0          # Dirichlet concentration over the sources (1: uniform over the simplex)
    mixsearch.target = "bpb/mean"  # the yardstick to optimise: a name from the sweep report, or bpb/mean
    mixsearch.seeds = 2            # seeds of each finalist: the prediction, the best proxy, uniform weights

What runs, in order: the data half (every source's download, clean and shard, the tokenizer, the yardsticks),
once; N proxies, one Luigi build in which only train and evaluate run per proxy (weights are training's: every
data key is shared); a fit per yardstick (pipeline/mixture_fit.py) and the target's optimum among the feasible
mixtures with its 95% prediction interval; then the three finalists with `seeds` seeds each (a finalist's run
that already exists, such as the best proxy's seed 0, is reused by key), judged by pipeline/sweep_report.py
against the seed spread. A mixture is feasible when every share is whole rows of a batch and no source is read
past train.Mixture.max_epochs by the shards' own counts: infeasible mixtures are never drawn nor predicted.

The proxies are independent runs: `--workers N` (or a central luigid with `--scheduler`, several machines each
running the same command) trains them side by side. The report goes to `<cache_root>/mixsearch/<name>/`:
report.md, search.json, fit.png.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable

from pipeline import checks, config, sweep, sweep_report
from pipeline import plan as run_plan
from pipeline.search_bindings import MEAN_BPB, SEED_BINDING, MixSearch, proxies_needed
from stages import train as train_stage
from stages.io import storage
from stages.io.committed import by_source

# numpy and the fit (pipeline/mixture_fit.py) are imported where used: planning a search (`settings`, which
# the CLI's checks call before anything runs) needs neither

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
    names = sweep_report.planned(plan.stages["yardsticks"].config)
    names += [MEAN_BPB] if any(n.startswith("bpb/") for n in names) else []
    if found.target not in names:
        raise config.ConfigError(f"{files}: mixsearch.target = {found.target!r} is not a yardstick these "
                                 f"runs will have (yardsticks.Config sets them); choose one of: "
                                 f"{', '.join(names)}")
    return found, plan


# ---------------------------------------------------------------------------------------------
# Mixtures as whole rows of a batch

def rows(train, weights: dict[str, float]) -> dict[str, int]:
    """`weights` as whole rows of the batch of `train` (a train.Config; the largest remainder): what a proxy
    trains on."""
    return train_stage.one_phase(train, weights)[0]


def binding(mix_rows: dict[str, int]) -> str:
    return f"{PHASES} = ((0, {dict(sorted(mix_rows.items()))!r}),)"


def feasibility(plan: run_plan.Plan) -> Callable[[dict[str, float]], str]:
    """weights -> "" or why they cannot train: a share under one row, or a source read past
    train.Mixture.max_epochs by its committed shards' counts."""
    train = plan.stages["train"].config
    return limits(train, train_stage.mixture_windows(train, by_source(checks.inputs(plan, "train"), "shard")))


def limits(train, windows: dict[str, int]) -> Callable[[dict[str, float]], str]:
    """weights -> "" or why a run of `train` (a train.Config) at those weights, as whole rows, cannot train on
    sources of `windows` training windows each (train.one_phase)."""
    return lambda weights: train_stage.one_phase(train, weights, windows)[1]


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
    problem = feasibility(base)
    train = base.stages["train"].config
    batch = train.global_batch
    drawn = mixture_fit.draw(sources, found.proxies, found.seed, problem, found.alpha)
    draws = [rows(train, w) for w in drawn]
    proxies = [_run(gin_files, params, f"proxy {i + 1}", r) for i, r in enumerate(draws)]
    ran["proxies"] = _build([p.plan for p in proxies], ["evaluate"], workers, scheduler, "the proxies")
    results = sweep_report.collect(proxies)
    scores = [with_mean(sweep_report.yardsticks(r.evaluation)) for r in results]
    names = [n for n in scores[0] if all(n in s for s in scores)]
    if found.target not in names:
        raise ValueError(f"mixsearch.target = {found.target!r} is not a yardstick of these runs; they have: "
                         f"{', '.join(names)}")
    w = np.array([[r[s] / batch for s in sources] for r in draws])
    fits = {n: mixture_fit.Fit.of(w, [s[n]["value"] for s in scores]) for n in names}
    lower = sweep_report.lower_is_better(found.target)
    best_w = mixture_fit.optimum(fits[found.target], sources, lower_is_better=lower, feasible=problem)
    predicted = rows(train, best_w)
    target_values = [s[found.target]["value"] for s in scores]
    best_proxy = draws[int(np.argmin(target_values) if lower else np.argmax(target_values))]
    uniform = rows(train, dict.fromkeys(sources, 1.0))
    finalists = [_run(gin_files, params, name, r, seed, found.seeds)
                 for name, r in zip(FINALISTS, (predicted, best_proxy, uniform))
                 for seed in range(found.seeds)]
    ran["finalists"] = _build([f.plan for f in finalists], ["evaluate"], workers, scheduler, "the finalists")
    at = [predicted[s] / batch for s in sources]
    search = {
        "sources": list(sources), "settings": dataclasses.asdict(found), "global_batch": batch,
        "steps": train.steps, "seq_len": train.seq_len,
        "proxies": [{"rows": d, "weights": {s: d[s] / batch for s in sources},
                     "yardsticks": {n: s[n]["value"] for n in names}} for d, s in zip(draws, scores)],
        "fits": {n: {"loo_rmse": f.loo_rmse, "spread": f.spread, "coef": f.coef.tolist(),
                     "effects": f.effects(sources), "lower_is_better": sweep_report.lower_is_better(n)}
                 for n, f in fits.items()},
        "prediction": {"rows": predicted, "weights": dict(zip(sources, at)),
                       "score": float(fits[found.target].predict([at])[0]),
                       "interval": fits[found.target].interval(at)},
        "finalists": dict(zip(FINALISTS, (predicted, best_proxy, uniform))),
        "ran": ran,           # {build: the nodes that ran in it}
    }
    decision = sweep_report.decide(_with_mean_results(sweep_report.collect(finalists)))
    return write(sweep.sweep_name(gin_files), base.cache_root, search, decision, fits[found.target])


def _run(gin_files, params, name: str, mix_rows: dict[str, int], seed: int | None = None,
         seeds: int = 1) -> sweep.Run:
    extra = [binding(mix_rows)] + ([f"{SEED_BINDING} = {seed}"] if seeds > 1 else [])
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
    line = (f"mixsearch: {len(search['proxies'])} proxies; predicted best for {target}: {weights}, "
            f"{p['score']:.4f} predicted [{p['interval'][0]:.4f}, {p['interval'][1]:.4f}]")
    if measured:
        line += "; measured " + ", ".join(f"{v} {m:.4f}" for v, m in measured.items())
    return line + "\n" + sweep_report.summary(decision)


def markdown(name: str, search: dict, decision: dict) -> str:
    sources, target = search["sources"], search["settings"]["target"]
    s = search["settings"]
    names = list(search["fits"])
    tokens = search["steps"] * search["global_batch"] * search["seq_len"]
    lines = [f"# Mixture search: {name}", "",
             f"{len(search['proxies'])} proxies over {', '.join(sources)}, drawn from a Dirichlet(alpha = "
             f"{s['alpha']:g}) with seed {s['seed']}, each {search['steps']} steps of "
             f"{search['global_batch']} x {search['seq_len']} tokens ({tokens:,} tokens a proxy). Weights "
             "are whole rows of a batch; mixtures that would read a source past its repetition limit are not "
             "drawn.", "", "## Proxies", "",
             "| proxy | " + " | ".join(sources) + " | " + " | ".join(names) + " |",
             "|---|" + "---|" * (len(sources) + len(names))]
    for i, p in enumerate(search["proxies"]):
        lines.append(f"| {i + 1} | " + " | ".join(f"{p['weights'][x]:.3f}" for x in sources) + " | " +
                     " | ".join(f"{p['yardsticks'][n]:.4f}" for n in names) + " |")
    lines += ["", "## Fits: Scheffé's quadratic mixture model, one per yardstick", "",
              "Held-out error is leave-one-out: each proxy predicted by a fit without it. A fit whose "
              "held-out error is not well under the scores' own spread has not learned the weights' "
              "effect. The effect of a source: the predicted change when its weight rises by 0.1 from the "
              "uniform mixture.", "",
              "| yardstick | held-out RMSE | scores' spread | " +
              " | ".join(f"effect of +0.1 {x}" for x in sources) + " |",
              "|---|---|---|" + "---|" * len(sources)]
    for n, f in search["fits"].items():
        lines.append(f"| {n} | {f['loo_rmse']:.4f} | {f['spread']:.4f} | " +
                     " | ".join(f"{f['effects'][x]:+.4f}" for x in sources) + " |")
    p = search["prediction"]
    direction = "lower" if sweep_report.lower_is_better(target) else "higher"
    lines += ["", "## Prediction", "",
              f"Target {target} ({direction} is better): the best feasible mixture by the fit is " +
              ", ".join(f"{x} {p['weights'][x]:.3f}" for x in sources) +
              f", predicted {p['score']:.4f} (95% prediction interval for one run "
              f"{p['interval'][0]:.4f} to {p['interval'][1]:.4f}).", "",
              "## Measured: the prediction against the best proxy and the uniform mixture", "",
              "| finalist | " + " | ".join(sources) + " |", "|---|" + "---|" * len(sources)]
    for f, r in search["finalists"].items():
        lines.append(f"| {f} | " + " | ".join(f"{r[x] / search['global_batch']:.3f}" for x in sources) + " |")
    report = sweep_report.markdown(name, decision)
    lines += ["", report[report.index("\n") + 1:].strip(), "", "![fit](fit.png)", ""]
    return "\n".join(lines)


def fit_png(search: dict, fit) -> bytes:
    """The target's fit: with two sources, the score against the first source's weight (proxies, the fitted
    curve and its prediction band, the prediction); with more, each proxy's held-out prediction against its
    score."""
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
        band = np.array([fit.interval(p) for p in pts])
        ax.fill_between(grid, band[:, 0], band[:, 1], alpha=0.2, label="95% prediction interval")
        ax.plot(grid, fit.predict(pts), label="fit")
        ax.scatter(xs[:, 0], ys, color="black", zorder=3, label="proxies")
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

