"""Sweeps: several override sets, each trained with one or more seeds, in one Luigi build; shared stages
run once; one report that says which differences are real (pipeline/sweep_report.py).

    make sweep SWEEP=gin/sweeps/min_chars.gin
    python -m pipeline sweep --gin gin/sweeps/lr.gin [--gin-param 'sweep.seeds = 3' ...]

A sweep file is a gin file that includes its base run and binds `sweep.variants`, a dict from
variant name to the bindings that make it, and optionally `sweep.seeds` and `sweep.cumulative`:

    include 'tiny.gin'
    sweep.variants = {
        "lr=3e-4": ["train.OptimizerConfig.learning_rate = 3e-4"],
        "lr=1e-3": ["train.OptimizerConfig.learning_rate = 1e-3"],
    }
    sweep.seeds = 2          # each variant trains with train.Config.seed = 0 and 1 (default 1: the base seed)
    sweep.cumulative = True  # each variant's bindings add to the ones before it (an ablation ladder)

Every run's stages whose keys coincide (everything upstream of what it changes) are the same Luigi
tasks, so they run once: the seeds of one variant share everything upstream of train by construction,
since the seed is a train binding. A run is named `<variant>/seed=<s>`; the report groups by variant.
It goes to `<cache_root>/sweeps/<sweep name>/`: comparison.md (the tables and verdicts),
comparison.json (per variant), verdicts.json (spreads and verdicts), comparison.png, curves.png.
"""

from __future__ import annotations

import dataclasses
import os

from pipeline import config, gin_errors, search_bindings
from pipeline import plan as run_plan

SEED_BINDING = "train.Config.seed"   # what a sweep's seed sets: parameter init and data order
# Each seed trains every variant once, and planning builds a config per run before anything starts: a bound
# keeps a typo (sweep.seeds = 1000000000) a one-line error instead of a planner that never finishes.
MAX_SEEDS = 100


@dataclasses.dataclass(frozen=True)
class Run:
    """One variant trained with one seed."""

    variant: str
    seed: int
    plan: run_plan.Plan

    @property
    def name(self) -> str:
        return f"{self.variant}/seed={self.seed}"


def settings(gin_files: list[str], params: list[str]) -> tuple[dict[str, list[str]], int]:
    """(variants: name -> bindings, seeds) read from the gin files; ConfigError naming the file and the
    binding when `sweep.variants` is not a dict of names to lists of binding strings or names one twice,
    `sweep.seeds` not an int in 1..MAX_SEEDS or `sweep.cumulative` not a bool. With `cumulative`, each
    variant's bindings are those of every variant before it (in the file's order) followed by its own."""
    config.load(gin_files, params)   # validates the base config and parses the sweep bindings
    files = ", ".join(gin_files)
    try:
        found, seeds, cumulative = search_bindings.sweep()
    except (ValueError, RuntimeError) as e:
        raise config.ConfigError(f"{files} binds no sweep.variants: {e}") from None
    if not isinstance(found, dict) or not found:
        raise config.ConfigError(f"{files}: sweep.variants must be a non-empty dict name -> [bindings], "
                                 f"got {found!r}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise config.ConfigError(f"{files}: sweep.seeds = {seeds!r} must be an int >= 1 and <= {MAX_SEEDS} "
                                 f"(each variant trains with {SEED_BINDING} = 0, 1, ..., seeds - 1; 1 keeps "
                                 "the base seed)")
    if not isinstance(cumulative, bool):
        raise config.ConfigError(f"{files}: sweep.cumulative = {cumulative!r} must be True (each variant "
                                 "adds its bindings to those of the variants before it) or False (default)")
    if problem := gin_errors.repeated_key(tuple(gin_files), tuple(params), "sweep.variants"):
        raise config.ConfigError(problem)
    out, before = {}, []
    for name, bindings in found.items():
        bindings = [bindings] if isinstance(bindings, str) else bindings
        if not isinstance(bindings, (list, tuple)) or not all(isinstance(b, str) for b in bindings):
            raise config.ConfigError(
                f"{files}: sweep.variants[{name!r}] = {bindings!r} is not a list of binding strings; write "
                f'{{{str(name)!r}: ["train.OptimizerConfig.learning_rate = 1e-3", ...]}}')
        out[str(name)] = before + list(bindings)
        before = out[str(name)] if cumulative else []
    return out, seeds


def variants(gin_files: list[str], params: list[str]) -> dict[str, list[str]]:
    """The sweep's variants (name -> every binding that makes it), read from the gin files."""
    return settings(gin_files, params)[0]


def runs(gin_files: list[str], params: list[str]) -> list[Run]:
    """Every variant x seed: the gin files, the overrides, the variant's bindings, then its seed (bound
    only when `sweep.seeds` > 1; one seed keeps the base config's), named for W&B (`_name_tracked_run`)."""
    found, seeds = settings(gin_files, params)
    sweep, out = sweep_name(gin_files), []
    for name, bindings in found.items():
        for seed in range(seeds):
            extra = [f"{SEED_BINDING} = {seed}"] if seeds > 1 else []
            try:
                plan = config.load(gin_files, params + bindings + extra)
            except config.ConfigError as e:
                raise config.ConfigError(f"sweep variant {name!r}: {e}") from None
            run = Run(name, plan.stages["train"].config.seed, plan)
            _name_tracked_run(plan, group=sweep, name=f"{name}-seed{run.seed}")
            out.append(run)
    return out


def _name_tracked_run(plan: run_plan.Plan, *, group: str, name: str) -> None:
    """The run's W&B group (the sweep's name) and name (`<variant>-seed<s>`), which only a tracked run reads
    (stages/io/tracking.py); tracking is out of the key, so the train key stays the same."""
    sp = plan.stages["train"]
    tracked = dataclasses.replace(sp.config.tracking, group=group, name=name)
    plan.stages["train"] = dataclasses.replace(sp, config=dataclasses.replace(sp.config, tracking=tracked))


def compare(name: str, sweep_runs: list[Run]) -> str:
    """Writes the report of finished runs (pipeline/sweep_report.py); returns the tables and the line that
    says which differences are real."""
    from pipeline import sweep_report

    return sweep_report.write(name, sweep_runs)


def sweep_name(gin_files: list[str]) -> str:
    return os.path.splitext(os.path.basename(gin_files[-1]))[0]
