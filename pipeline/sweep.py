"""Sweeps: several override sets in one Luigi build, shared stages run once, one comparison report.

    make sweep SWEEP=gin/sweeps/lr.gin
    python -m pipeline sweep --gin gin/sweeps/lr.gin [--gin-param ...]

A sweep file is a gin file that includes its base run and binds `sweep.variants`, a dict from
variant name to the bindings that make it:

    include 'tiny.gin'
    sweep.variants = {
        "lr=3e-4": ["train.OptimizerConfig.learning_rate = 3e-4"],
        "lr=1e-3": ["train.OptimizerConfig.learning_rate = 1e-3"],
    }

Every variant's stages whose keys coincide (everything upstream of what it changes) are the same
Luigi tasks, so they run once. The report goes to `<cache_root>/sweeps/<sweep name>/`:
`comparison.md`, `comparison.json` and `comparison.png`.
"""

from __future__ import annotations

import os

import gin
from pipeline import cache, config, dag
from pipeline import plan as run_plan
from stages.io import figures, storage

METRICS = ("loss", "perplexity", "bits_per_byte", "tokens_per_s")


@gin.configurable("sweep")
def _sweep(variants=gin.REQUIRED):
    return variants


def variants(gin_files: list[str], params: list[str]) -> dict[str, list[str]]:
    """The sweep's variants (name -> bindings), read from the gin files; ConfigError naming the file and
    the variant when `sweep.variants` is not a dict of names to lists of binding strings."""
    config.load(gin_files, params)   # validates the base config and parses the sweep binding
    files = ", ".join(gin_files)
    try:
        found = _sweep()
    except (ValueError, RuntimeError) as e:
        raise config.ConfigError(f"{files} binds no sweep.variants: {e}") from None
    if not isinstance(found, dict) or not found:
        raise config.ConfigError(f"{files}: sweep.variants must be a non-empty dict name -> [bindings], "
                                 f"got {found!r}")
    out = {}
    for name, bindings in found.items():
        bindings = [bindings] if isinstance(bindings, str) else bindings
        if not isinstance(bindings, (list, tuple)) or not all(isinstance(b, str) for b in bindings):
            raise config.ConfigError(
                f"{files}: sweep.variants[{name!r}] = {bindings!r} is not a list of binding strings; write "
                f'{{{str(name)!r}: ["train.OptimizerConfig.learning_rate = 1e-3", ...]}}')
        out[str(name)] = list(bindings)
    return out


def plans(gin_files: list[str], params: list[str]) -> dict[str, run_plan.Plan]:
    """Each variant's plan: the gin files, the overrides, then the variant's bindings."""
    out = {}
    for name, bindings in variants(gin_files, params).items():
        try:
            out[name] = config.load(gin_files, params + bindings)
        except config.ConfigError as e:
            raise config.ConfigError(f"sweep variant {name!r}: {e}") from None
    return out


def compare(name: str, by_variant: dict[str, run_plan.Plan]) -> str:
    """Writes the comparison report of finished variants; returns the markdown table."""
    last = list(dag.STAGES)[-1]
    rows = {}
    for variant, plan in by_variant.items():
        done = cache.load(plan.cache_root, last, plan.stages[last].key)
        rows[variant] = storage.read_json(done.file("eval.json")) if done else {}
    root = next(iter(by_variant.values())).cache_root
    out = storage.join(root, "sweeps", name)
    table = ["| variant | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for variant, m in rows.items():
        table.append(f"| {variant} | " + " | ".join(_fmt(m.get(k)) for k in METRICS) + " |")
    text = "\n".join(table)
    storage.write_json(storage.join(out, "comparison.json"), rows)
    storage.write_text(storage.join(out, "comparison.md"),
                       f"# Sweep {name}\n\n{text}\n\n![val loss by variant](comparison.png)\n")
    storage.write_bytes(storage.join(out, "comparison.png"), _plot(rows))
    return text + f"\n\nreport: {storage.join(out, 'comparison.md')}"


def sweep_name(gin_files: list[str]) -> str:
    return os.path.splitext(os.path.basename(gin_files[-1]))[0]


def _plot(rows: dict[str, dict]) -> bytes:
    names = list(rows)
    fig, ax = figures.figure(width=max(4, 1.2 * len(names)))
    ax.bar(names, [rows[n].get("loss", float("nan")) for n in names], color="#4477aa")
    ax.set(title="Validation loss by variant", ylabel="nats / token")
    ax.tick_params(axis="x", rotation=30)
    return figures.png(fig)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:,.4g}" if isinstance(x, float) else str(x)
