"""The settings of the commands that run many plans, `sweep.*` (pipeline/sweep.py) and `mixsearch.*`
(pipeline/mixsearch.py): frozen dataclasses that validate themselves, as every stage's Config does.

    settings = config.build("sweep", gin_files, params)      # after config.load(gin_files, params)
    settings.seeds, settings.bindings()                      # 2, {"lr=1e-3": [...], ...}

pipeline/config.py registers them with gin (`CONFIGURABLES`: the gin name -> the class) beside the stages'
configs, so every command and test that loads a sweep or mixsearch file knows their bindings (`make plan
GIN=gin/sweeps/lr.gin` plans its base run), and builds them the same way: each value checked against its
field's type, then the class's own `__post_init__`; an error names the binding, what would be valid and the
gin files. What depends on the plan (a search's proxies for its number of sources, its target among the
yardsticks the runs will have) is checked by the command, which has the plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

MEAN_BPB = "bpb/mean"          # the mean of every reference set's bits per byte (mixsearch's default target)
SEED_BINDING = "train.Config.seed"   # what a sweep's seed sets: parameter init and data order
# Each seed trains every variant once, and planning builds a config per run before anything starts: a bound
# keeps a typo (sweep.seeds = 1000000000) a one-line error instead of a planner that never finishes.
MAX_SEEDS = 100


def _seeds_problem(seeds: Any, what: str) -> str:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        return (f"seeds={seeds!r} must be an int >= 1 and <= {MAX_SEEDS} (each {what} trains with "
                f"{SEED_BINDING} = 0, 1, ..., seeds - 1; 1 keeps the base seed)")
    return ""


@dataclasses.dataclass(frozen=True)
class Sweep:
    """`sweep.*`: what a sweep file binds.

        sweep.variants = {"lr=3e-4": ["train.OptimizerConfig.learning_rate = 3e-4"],
                          "lr=1e-3": ["train.OptimizerConfig.learning_rate = 1e-3"]}
        sweep.seeds = 2          # each variant trains with train.Config.seed = 0 and 1 (1: the base seed)
        sweep.cumulative = True  # each variant's bindings add to those of the variants before it

    gin gives `variants` as a dict name -> [binding, ...] (one binding may be a bare string); it is kept as
    ((name, (binding, ...)), ...) in the order the file wrote it, so the settings hash like any Config.
    """

    variants: Any = ()
    seeds: int = 1
    cumulative: bool = False

    def __post_init__(self):
        pairs = tuple(self.variants.items()) if isinstance(self.variants, Mapping) else self.variants
        if not (isinstance(pairs, (tuple, list)) and pairs
                and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs)):
            raise ValueError(f"variants={self.variants!r} must be a non-empty dict name -> [bindings]; bind "
                             'sweep.variants = {"lr=1e-3": ["train.OptimizerConfig.learning_rate = 1e-3"]}')
        variants = []
        for name, bindings in pairs:
            bindings = (bindings,) if isinstance(bindings, str) else bindings
            if not isinstance(bindings, (list, tuple)) or not all(isinstance(b, str) for b in bindings):
                raise ValueError(f"variants[{name!r}]={bindings!r} is not a list of binding strings; write "
                                 f'{{{str(name)!r}: ["train.OptimizerConfig.learning_rate = 1e-3", ...]}}')
            variants.append((str(name), tuple(bindings)))
        object.__setattr__(self, "variants", tuple(variants))
        if problem := _seeds_problem(self.seeds, "variant"):
            raise ValueError(problem)
        if not isinstance(self.cumulative, bool):
            raise ValueError(f"cumulative={self.cumulative!r} must be True (each variant adds its bindings "
                             "to those of the variants before it) or False (the default)")

    def bindings(self) -> dict[str, list[str]]:
        """Each variant's name -> every binding that makes it: its own, or with `cumulative` those of every
        variant before it (in the file's order) followed by its own."""
        out, before = {}, []
        for name, bindings in self.variants:
            out[name] = before + list(bindings)
            before = out[name] if self.cumulative else []
        return out


def proxies_needed(sources: int) -> int:
    """The fewest proxies a search over `sources` sources can fit and test its fit with: one per
    coefficient of pipeline/mixture_fit.py's quadratic mixture model (one a source, one a pair of sources),
    and one more. Its interval needs one more run still (two residual degrees of freedom): a proxy or a
    replicate."""
    return sources + sources * (sources - 1) // 2 + 1


@dataclasses.dataclass(frozen=True)
class MixSearch:
    """`mixsearch.*`: what a mixture search file binds (pipeline/mixsearch.py's docstring says what each
    does): `mixsearch.proxies = 8`, `.seed = 0`, `.alpha = 1.0`, `.target = "bpb/mean"`, `.seeds = 2`,
    `.replicates = 2`, `.within_hull = False`. `proxies` is checked here against the fewest any search needs
    (two sources); the command checks it against its run's sources and the distinct splits its batch allows,
    and `target` against the yardsticks its runs will have."""

    proxies: int = 8
    seed: int = 0
    alpha: float = 1.0
    target: str = MEAN_BPB
    seeds: int = 2
    replicates: int = 2
    within_hull: bool = False

    def __post_init__(self):
        least = proxies_needed(2)
        if isinstance(self.proxies, bool) or not isinstance(self.proxies, int) or self.proxies < least:
            raise ValueError(f"proxies={self.proxies!r} must be an int >= {least}, the fewest a fit over two "
                             f"sources needs (k sources: k + k(k-1)/2 + 1)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be an int >= 0 (one seed draws one set of mixtures)")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or \
                not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha={self.alpha!r} must be a number > 0 (the Dirichlet's concentration: 1 "
                             "draws uniformly over the mixtures, below 1 favours few sources, above 1 even "
                             "shares)")
        if not (isinstance(self.target, str) and self.target.strip()):
            raise ValueError(f"target={self.target!r} must name a yardstick of the runs' reports: "
                             f"{MEAN_BPB!r} (the default), 'bpb/<reference set>' or '<metric>/<task>'")
        if problem := _seeds_problem(self.seeds, "finalist"):
            raise ValueError(problem)
        if isinstance(self.replicates, bool) or not isinstance(self.replicates, int) or \
                not 0 <= self.replicates <= self.proxies:
            raise ValueError(f"replicates={self.replicates!r} must be an int >= 0 and <= proxies="
                             f"{self.proxies} (the first `replicates` proxies train again with a seed of "
                             "their own: the seed noise alone, and residual degrees of freedom)")
        if not isinstance(self.within_hull, bool):
            raise ValueError(f"within_hull={self.within_hull!r} must be True (search the optimum only inside "
                             "the convex hull of the proxies' mixtures) or False (the whole simplex, the "
                             "default: a prediction outside the hull is flagged)")


# The gin name of each (`sweep.seeds = 2`), for pipeline/config.py to register and build.
CONFIGURABLES = {"sweep": Sweep, "mixsearch": MixSearch}
