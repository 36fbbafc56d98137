"""The sweep report: variants compared on the yardsticks, seed by seed, with a verdict on every difference.

    python -m pipeline sweep --gin gin/sweeps/min_chars.gin          # builds the runs, then writes this
    sweep_report.write("min_chars", sweep.runs(gin_files, params))    # again, from the cache alone

It goes to `<cache_root>/sweeps/<name>/`:

    comparison.md    the yardstick table, the verdicts, the own-split table, both figures
    comparison.json  per variant: its seeds, each yardstick (mean, interval, per seed), own-split means
    verdicts.json    per yardstick its seed-to-seed spread; every comparison's difference and verdict
    comparison.png   one panel per yardstick group: a bar per variant (mean over seeds) with its interval
                     and a dot per seed
    curves.png       the in-loop yardsticks of train's metrics.jsonl over steps: seeds thin, mean bold

Yardsticks are what evaluate scores the same way for every variant (eval.json): each reference set's bits
per byte (`bpb/<set>`, lower is better), each task's `acc_norm/<task>` and `centered/<task>` and the
`aggregate` (higher is better). Train logs them in the loop under the same names prefixed `yardstick/`.

How a difference is judged, per yardstick:
- a variant's value is the mean over its seeds; its interval is evaluate's 95% bootstrap interval over
  items, averaged over the seeds (the noise of a finite evaluation set, not of training);
- the seed-to-seed spread is the largest range (max - min over seeds) of any one variant: how far apart
  two trainings of the same data and config landed;
- every variant is compared with the first (the baseline) and with the one before it; a difference of
  means is **real** only when its size exceeds the spread and the two variants' intervals do not
  overlap (few seeds understate the spread; the intervals say what a finite item set scores by chance).
  With one seed no spread is measured, so no difference can be called real; nor when every variant's
  seeds scored exactly alike (a spread of 0, as a near-chance model on a few items gives): a zero spread
  measures nothing.

The variants' own validation loss is a training diagnostic: shown apart, and marked not comparable across
data variants when their data differ upstream of train (any of download, clean, tokenizer, shard keys),
since then each scores a different text with a different tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import math

from pipeline import cache, dag
from stages.io import figures, storage

IN_LOOP_PREFIX = "yardstick/"          # train's metrics.jsonl: f"yardstick/{name}" on evaluation steps
TASK_METRICS = ("acc_norm", "centered")
GROUPS = ("bpb", *TASK_METRICS, "aggregate")   # the yardstick groups, one panel each, in this order
OWN_SPLIT = ("loss", "bits_per_byte")
OWN_CURVE = "eval_loss"                # train's in-loop loss on its own validation split
NOT_COMPARABLE = "not comparable across data variants"
DATA_STAGES = tuple(dag.closure("shard"))   # train's data and own validation split: what a data variant is


@dataclasses.dataclass(frozen=True)
class Result:
    """One finished run: what evaluate scored and train logged, and the keys of the data it trained on."""

    variant: str
    seed: int
    evaluation: dict                    # evaluate's eval.json
    metrics: list[dict]                 # train's metrics.jsonl rows
    data_keys: dict[str, str]           # {node upstream of train (clean; clean[code] in a mixture): its key}


def collect(runs) -> list[Result]:
    """The committed outputs of `runs` (pipeline.sweep.Run); ValueError naming a run whose train or
    evaluate stage is not in the cache."""
    out = []
    for run in runs:
        plan = run.plan
        done = {stage: cache.load(plan.cache_root, stage, plan.stages[stage].key)
                for stage in ("train", "evaluate")}
        missing = [stage for stage, d in done.items() if d is None]
        if missing:
            raise ValueError(f"sweep run {run.name!r}: {', '.join(missing)} not in the cache "
                             f"{plan.cache_root}; run the sweep first")
        lines = storage.read_text(done["train"].file("metrics.jsonl")).splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        out.append(Result(run.variant, run.seed, storage.read_json(done["evaluate"].file("eval.json")), rows,
                          {node: sp.key for node, sp in plan.stages.items() if sp.stage in DATA_STAGES}))
    return out


def yardsticks(evaluation: dict) -> dict[str, dict]:
    """{name: {"value", "low", "high"}} of one eval.json, names as in GROUPS: `bpb/<set>`,
    `acc_norm/<task>`, `centered/<task>`, `aggregate`."""
    out = {}
    for name, r in evaluation.get("reference_bpb", {}).items():
        out[f"bpb/{name}"] = {"value": r["bpb"], "low": r["low"], "high": r["high"]}
    for metric in TASK_METRICS:
        for task, t in evaluation.get("tasks", {}).items():
            out[f"{metric}/{task}"] = {k: t[metric][k] for k in ("value", "low", "high")}
    if a := evaluation.get("aggregate"):
        out["aggregate"] = {k: a[k] for k in ("value", "low", "high")}
    return out


def planned(yardsticks_config) -> list[str]:
    """The names `yardsticks` gives the eval.json of a run whose yardsticks stage has `yardsticks_config` (a
    `yardsticks.Config`), in GROUPS' order: known from the config, before anything runs."""
    sets = [*yardsticks_config.reference_sets, *(name for name, _ in yardsticks_config.reference_files)]
    tasks = yardsticks_config.tasks
    return _ordered({*(f"bpb/{s}" for s in sets), *(f"{m}/{t}" for m in TASK_METRICS for t in tasks),
                     *(["aggregate"] if tasks else [])})


def lower_is_better(name: str) -> bool:
    return name.split("/")[0] == "bpb"


def decide(results: list[Result]) -> dict:
    """The report's content, computed from the runs alone (the module docstring says how):
    {"variants", "seeds", "yardsticks": {name: {"lower_is_better", "spread", "variants": {variant:
    {"mean", "low", "high", "seeds": {seed: value}}}}}, "comparisons": [{"a", "b", "yardstick",
    "difference" (b - a), "spread", "verdict", "better"}], "real": [the real ones], "own_split": {...}}."""
    variants = list(dict.fromkeys(r.variant for r in results))
    by_variant = {v: sorted((r for r in results if r.variant == v), key=lambda r: r.seed) for v in variants}
    names = _ordered({name for r in results for name in yardsticks(r.evaluation)})
    table = {}
    for name in names:
        per_variant = {}
        for v, runs in by_variant.items():
            scored = [(r.seed, ys[name]) for r in runs if name in (ys := yardsticks(r.evaluation))]
            if scored:
                per_variant[v] = {"mean": _mean([y["value"] for _, y in scored]),
                                  "low": _mean([y["low"] for _, y in scored]),
                                  "high": _mean([y["high"] for _, y in scored]),
                                  "seeds": {s: y["value"] for s, y in scored}}
        ranges = [max(p["seeds"].values()) - min(p["seeds"].values())
                  for p in per_variant.values() if len(p["seeds"]) > 1]
        table[name] = {"lower_is_better": lower_is_better(name), "variants": per_variant,
                       "spread": max(ranges) if ranges else None}
    comparisons = []
    for a, b in pairs(variants):
        for name in names:
            got = table[name]["variants"]
            if a in got and b in got:
                comparisons.append(_verdict(a, b, name, got[a], got[b], table[name]))
    return {"variants": variants, "seeds": {v: [r.seed for r in runs] for v, runs in by_variant.items()},
            "yardsticks": table, "comparisons": comparisons,
            "real": [c for c in comparisons if c["verdict"] == "real"],
            "own_split": own_split(by_variant)}


def pairs(variants: list[str]) -> list[tuple[str, str]]:
    """(a, b) to compare: every variant with the first (the baseline), then with the one before it."""
    first = [(variants[0], v) for v in variants[1:]]
    return first + [(a, b) for a, b in zip(variants[1:], variants[2:])]


def own_split(by_variant: dict[str, list[Result]]) -> dict:
    """Each variant's own validation loss and bits per byte (mean over seeds, and per seed), whether the
    variants are comparable on them, and the stages upstream of train whose keys differ."""
    results = [r for runs in by_variant.values() for r in runs]
    nodes = list(dict.fromkeys(node for r in results for node in r.data_keys))
    differs = [node for node in nodes if len({r.data_keys.get(node) for r in results}) > 1]
    metrics = own_metrics(results)
    return {"comparable": not differs, "differs_at": differs, "metrics": metrics,
            "variants": {v: {metric: {"mean": _mean([own_value(r.evaluation, metric) for r in runs]),
                                      "seeds": {r.seed: own_value(r.evaluation, metric) for r in runs}}
                             for metric in metrics}
                         for v, runs in by_variant.items()}}


def own_metrics(results: list[Result]) -> list[str]:
    """OWN_SPLIT, then each source's bits per byte in a mixture (`bits_per_byte[code]`): how the mixture
    traded one source's text for another's."""
    sources = sorted({s for r in results for s in r.evaluation.get("sources", {})})
    return [*OWN_SPLIT, *(f"bits_per_byte[{s}]" for s in sources)]


def own_value(evaluation: dict, metric: str):
    """An eval.json's value of an `own_metrics` name, or None."""
    name, _, source = metric.partition("[")
    if source:
        return evaluation.get("sources", {}).get(source.rstrip("]"), {}).get(name)
    return evaluation.get(metric)


def summary(decision: dict) -> str:
    """One line: which differences are real, or why none is."""
    if not any(t["spread"] is not None for t in decision["yardsticks"].values()):
        return ("verdict: one seed per variant: no seed-to-seed spread measured, so no difference can be "
                "called real (set sweep.seeds = 2 or more)")
    undecided = sum(c["verdict"].startswith("cannot decide") for c in decision["comparisons"])
    tail = f"; {undecided} undecided (yardsticks whose seeds agreed exactly)" if undecided else ""
    if not decision["real"]:
        return ("verdict: no difference between variants exceeds both the seed-to-seed spread of its "
                f"yardstick and the evaluation's intervals: none is real{tail}")
    shown = [f"{c['b']} vs {c['a']}: {c['yardstick']} {c['difference']:+.3f} ({c['better']}, spread "
             f"{c['spread']:.3f})" for c in decision["real"]]
    return (f"verdict: {len(shown)} of {len(decision['comparisons'])} differences exceed the seed-to-seed "
            f"spread and the evaluation's intervals (real): " + "; ".join(shown) + tail)


def markdown(name: str, decision: dict) -> str:
    """comparison.md: how to read it, the yardsticks, the verdicts, the own split, the figures."""
    variants, table = decision["variants"], decision["yardsticks"]
    seeds = sorted({len(s) for s in decision["seeds"].values()})
    names = list(table)
    lines = [f"# Sweep {name}", "",
             f"{len(variants)} variants x {'/'.join(map(str, seeds))} seed(s). A cell: mean over seeds "
             "[95% interval over items, averaged over seeds]; then each seed's value. The seed-to-seed "
             "spread of a yardstick is the largest max - min over the seeds of any one variant. A difference "
             "of means is **real** only when its size exceeds that spread (a spread of 0 decides nothing) "
             "and the two variants' intervals do not overlap.",
             "",
             summary(decision), "", "## Yardsticks", "",
             "| variant | " + " | ".join(f"{n} ({'lower' if table[n]['lower_is_better'] else 'higher'} "
                                         "is better)" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for v in variants:
        lines.append(f"| {v} | " + " | ".join(_cell(table[n]["variants"].get(v)) for n in names) + " |")
    lines.append("| seed-to-seed spread | " + " | ".join(_num(table[n]["spread"]) for n in names) + " |")
    lines += ["", "## Verdicts", "",
              "Difference of means (second minus first); **real** when its size exceeds the spread and the "
              "intervals do not overlap.", "",
              "| comparison | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    cells = {(c["a"], c["b"], c["yardstick"]): c for c in decision["comparisons"]}
    for a, b in pairs(variants):
        row = [_verdict_cell(cells.get((a, b, n))) for n in names]
        lines.append(f"| {b} vs {a} | " + " | ".join(row) + " |")
    own = decision["own_split"]
    mark = (f"**{NOT_COMPARABLE}**: the variants' data differ upstream of train "
            f"({', '.join(own['differs_at'])} keys differ), so each scores its own validation text with its "
            "own tokenizer; compare them on the yardsticks above." if not own["comparable"] else
            "Every variant trained on the same data (the same shard key), so these are comparable too.")
    heading = "a training diagnostic" + ("" if own["comparable"] else f": {NOT_COMPARABLE}")
    lines += ["", f"## Own validation split ({heading})", "", mark, "",
              "| variant | " + " | ".join(own["metrics"]) + " |", "|---|" + "---|" * len(own["metrics"])]
    for v in variants:
        row = [f"{_num(m['mean'], '.4f')} ({', '.join(_num(x, '.4f') for x in m['seeds'].values())})"
               for m in (own["variants"][v][metric] for metric in own["metrics"])]
        lines.append(f"| {v} | " + " | ".join(row) + " |")
    lines += ["", "![yardsticks by variant: mean over seeds, interval, seeds as dots](comparison.png)", "",
              "![in-loop curves: seeds thin, mean over seeds bold](curves.png)", ""]
    return "\n".join(lines)


def write(name: str, runs) -> str:
    """Writes the report of the finished `runs` (pipeline.sweep.Run) under `<cache_root>/sweeps/<name>/`;
    returns the markdown tables, the verdict line and where the report is."""
    results = collect(runs)
    out = storage.join(runs[0].plan.cache_root, "sweeps", name)
    return write_results(name, results, out)


def write_results(name: str, results: list[Result], out: str) -> str:
    """`write`, from results already collected (tests fabricate them), into the folder `out`."""
    decision = decide(results)
    per_variant = {v: {"seeds": decision["seeds"][v],
                       **{m: decision["own_split"]["variants"][v][m]["mean"]
                          for m in decision["own_split"]["metrics"]},
                       "yardsticks": {n: t["variants"][v] for n, t in decision["yardsticks"].items()
                                      if v in t["variants"]}}
                   for v in decision["variants"]}
    storage.write_json(storage.join(out, "comparison.json"), per_variant)
    storage.write_json(storage.join(out, "verdicts.json"),
                       {k: decision[k] for k in ("yardsticks", "comparisons", "real", "own_split")})
    text = markdown(name, decision)
    storage.write_text(storage.join(out, "comparison.md"), text)
    storage.write_bytes(storage.join(out, "comparison.png"), bars_png(decision))
    curves = curves_png(results, decision["own_split"]["comparable"])
    storage.write_bytes(storage.join(out, "curves.png"), curves)
    tables = text[text.index("## Yardsticks"):text.index("\n![")].rstrip()
    return f"{tables}\n\n{summary(decision)}\nreport: {storage.join(out, 'comparison.md')}"


# ---------------------------------------------------------------------------------------------
# figures

def bars_png(decision: dict) -> bytes:
    """One panel per yardstick group: per yardstick a bar per variant (mean over seeds) with its interval
    as an error bar and each seed's value as a dot."""
    table, variants = decision["yardsticks"], decision["variants"]
    groups = [g for g in GROUPS if any(n.split("/")[0] == g for n in table)] or ["(none)"]
    widths = [max(2.5, 0.9 + 0.3 * len(variants) * sum(n.split("/")[0] == g for n in table)) for g in groups]
    fig, axes = figures.figure(width=sum(widths), height=3.8, ncols=len(groups))
    axes = axes if len(groups) > 1 else [axes]
    step = 0.8 / max(len(variants), 1)
    for ax, group in zip(axes, groups):
        names = [n for n in table if n.split("/")[0] == group]
        for i, v in enumerate(variants):
            xs, got = [], []
            for x, n in enumerate(names):
                if v in table[n]["variants"]:
                    xs.append(x - 0.4 + step * (i + 0.5))
                    got.append(table[n]["variants"][v])
            means = [g["mean"] for g in got]
            errors = [[max(g["mean"] - g["low"], 0) for g in got],     # (2, n): below and above the mean
                      [max(g["high"] - g["mean"], 0) for g in got]]
            ax.bar(xs, means, width=step * 0.9, color=f"C{i}", label=v, yerr=errors, capsize=2,
                   error_kw={"elinewidth": 0.8})
            for x, g in zip(xs, got):
                ax.plot([x] * len(g["seeds"]), list(g["seeds"].values()), "k.", markersize=3)
        ax.set_xticks(range(len(names)), [n.split("/", 1)[-1] for n in names], rotation=30, ha="right")
        better = "lower" if group == "bpb" else "higher"
        ax.set_title(f"{group} ({better} is better)", fontsize=9)
        if group in ("centered", "aggregate"):
            ax.axhline(0, color="gray", linewidth=0.6)     # chance
        if group == "bpb" and names:
            lows = [g["low"] for n in names for g in table[n]["variants"].values()]
            ax.set_ylim(bottom=max(0.0, min(lows) * 0.9))
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))     # outside: bars fill panels
    return figures.png(fig)


def curves_png(results: list[Result], comparable: bool) -> bytes:
    """The in-loop yardsticks (and the own-split eval loss) over steps, one panel each: per variant a thin
    line per seed and a bold one for the mean over the seeds where all of them logged that step."""
    keys = {k for r in results for row in r.metrics for k in row if k.startswith(IN_LOOP_PREFIX)}
    panels = [IN_LOOP_PREFIX + n for n in _ordered({k[len(IN_LOOP_PREFIX):] for k in keys})]
    if any(OWN_CURVE in row for r in results for row in r.metrics):
        panels.append(OWN_CURVE)
    panels = panels or ["loss"]
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, _ = figures.figure(width=3.4 * ncols, height=2.8 * nrows)
    fig.clear()
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    variants = list(dict.fromkeys(r.variant for r in results))
    for ax, key in zip(axes, panels):
        for i, v in enumerate(variants):
            series = [{row["step"]: row[key] for row in r.metrics if key in row}
                      for r in results if r.variant == v]
            for s in series:
                steps = sorted(s)
                ax.plot(steps, [s[t] for t in steps], color=f"C{i}", linewidth=0.7, alpha=0.45)
            common = sorted(set.intersection(*(set(s) for s in series))) if series else []
            ax.plot(common, [_mean([s[t] for s in series]) for t in common], color=f"C{i}", linewidth=2,
                    label=v)
        title = key[len(IN_LOOP_PREFIX):] if key.startswith(IN_LOOP_PREFIX) else f"own split: {key}"
        if key in (OWN_CURVE, "loss") and not comparable:
            title += f"\n({NOT_COMPARABLE})"
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in axes[len(panels):]:
        ax.axis("off")
    axes[0].legend(fontsize=6)
    return figures.png(fig)


# ---------------------------------------------------------------------------------------------
# small helpers

def _verdict(a: str, b: str, name: str, got_a: dict, got_b: dict, yardstick: dict) -> dict:
    difference = got_b["mean"] - got_a["mean"]
    spread = yardstick["spread"]
    if spread is None:
        verdict = "cannot decide (one seed: no spread measured)"
    elif spread == 0:     # every variant's seeds scored alike (a coarse metric, few items): nothing to exceed
        verdict = "cannot decide (the seeds agreed exactly: no spread measured)"
    elif abs(difference) <= spread + 1e-9:
        # accuracies are k/items, so a difference often equals the spread: a rounding error must not exceed it
        verdict = "within the seed-to-seed spread"
    elif got_a["low"] <= got_b["high"] and got_b["low"] <= got_a["high"]:
        # beyond two seeds' spread (which few seeds understate) but not beyond what a finite set of items
        # scores by chance: the evaluation's own 95% intervals overlap
        verdict = "within the evaluation's 95% intervals"
    else:
        verdict = "real"
    better = (difference < 0) == yardstick["lower_is_better"] if difference else None
    return {"a": a, "b": b, "yardstick": name, "difference": difference, "spread": spread, "verdict": verdict,
            "better": None if better is None else ("better" if better else "worse")}


def _ordered(names: set[str]) -> list[str]:
    """Yardstick names grouped in GROUPS' order, then by name; unknown groups last."""
    rank = {g: i for i, g in enumerate(GROUPS)}
    return sorted(names, key=lambda n: (rank.get(n.split("/")[0], len(GROUPS)), n))


def _mean(values: list) -> float | None:
    values = [x for x in values if x is not None]
    return sum(values) / len(values) if values else None


def _num(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _cell(got: dict | None) -> str:
    if got is None:
        return "-"
    return (f"{got['mean']:.3f} [{got['low']:.3f}, {got['high']:.3f}]; seeds "
            + ", ".join(f"{x:.3f}" for x in got["seeds"].values()))


def _verdict_cell(c: dict | None) -> str:
    if c is None:
        return "-"
    if c["verdict"] == "real":
        return f"{c['difference']:+.3f} **real, {c['better'] or 'equal'}**"
    if c["verdict"].startswith("cannot decide"):
        return f"{c['difference']:+.3f} cannot decide"
    if c["verdict"].startswith("within the evaluation"):
        return f"{c['difference']:+.3f} within the intervals"
    return f"{c['difference']:+.3f} within spread"
