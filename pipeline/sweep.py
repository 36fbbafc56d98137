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

from pipeline import config, gin_errors
from pipeline import plan as run_plan
from pipeline.search_bindings import SEED_BINDING, Sweep


@dataclasses.dataclass(frozen=True)
class Run:
    """One variant trained with one seed."""

    variant: str
    seed: int
    plan: run_plan.Plan

    @property
    def name(self) -> str:
        return f"{self.variant}/seed={self.seed}"


def settings(gin_files: list[str], params: list[str]) -> Sweep:
    """The sweep's settings (`sweep.*`, search_bindings.Sweep), read from the gin files after their base run
    is validated; ConfigError naming the binding, what is valid and the files when `sweep.variants` is not
    a dict of names to lists of binding strings or names one twice, `sweep.seeds` not an int in
    1..search_bindings.MAX_SEEDS or `sweep.cumulative` not a bool."""
    found, _ = config.load_settings("sweep", gin_files, params)
    if problem := gin_errors.repeated_key(tuple(gin_files), tuple(params), "sweep.variants"):
        raise config.ConfigError(problem)
    return found


def variants(gin_files: list[str], params: list[str]) -> dict[str, list[str]]:
    """The sweep's variants (name -> every binding that makes it, `Sweep.bindings`), read from the gin
    files."""
    return settings(gin_files, params).bindings()


def runs(gin_files: list[str], params: list[str]) -> list[Run]:
    """Every variant x seed: the gin files, the overrides, the variant's bindings, then its seed (bound
    only when `sweep.seeds` > 1; one seed keeps the base config's), named for W&B (`_name_tracked_run`)."""
    found = settings(gin_files, params)
    sweep, out = sweep_name(gin_files), []
    for name, bindings in found.bindings().items():
        for seed in range(found.seeds):
            extra = [f"{SEED_BINDING} = {seed}"] if found.seeds > 1 else []
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
    (stages/train/tracking.py); tracking is out of the key, so the train key stays the same."""
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
