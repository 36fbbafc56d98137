"""A training mixture: sources weighted by tokens, in phases by step, each under a repetition limit.

    train.Config.mixture = @train.Mixture()
    train.Mixture.phases = ((0, {"web": 0.7, "code": 0.3}),          # from step 0
                            (900, {"web": 0.5, "code": 0.5}))        # an annealing mix from step 900 on
    train.Mixture.max_epochs = 4.0

    mix = Mixture(phases=((0, {"web": 3, "code": 1}),))              # weights are normalized: 0.75 / 0.25
    mix.step_rows(step=7, global_batch=16)       # {"code": 4, "web": 12}: the rows step 7 takes of each
    mix.rows_before(step=7, global_batch=16)     # {"code": 28, "web": 84}: what steps 0..6 took

**Weights are by tokens.** Every row of a batch is one window of seq_len + 1 tokens, whatever source it
comes from, so a source's share of the rows is its share of the tokens the model trains on, and of the
compute. A weight by documents would not say that: a source of long files (code, books) and one of short
pages (web) at "50/50 by documents" train on whatever token split their lengths happen to give, and that
split moves whenever a filter changes the lengths.

**Rows per step, exactly.** Within a phase, the rows each source has given through the phase's n-th row
are the largest-remainder (Hamilton) apportionment of n rows by the phase's weights, in exact rationals,
ties to the source first by name; a step's rows are the difference of the apportionments at its two ends.
So at every step boundary each source has had its weight's share of the phase's rows to within one row,
a step's counts never depend on a later phase, and any step's counts cost O(sources), without replaying
the steps before it (`data.MixedTokenData` makes the batch of step b a pure function of seed, b and the
mixture). The differences are never negative when every source with a weight gets at least one row per
step (weight x global_batch >= 1), which `problem` requires.

**Repetition.** Each source is its own stream of windows with its own epochs; `epochs` says how many
passes a run makes over each, and a source past `max_epochs` is refused before any stage runs. The
default, 4, follows Muennighoff et al. (2023, "Scaling Data-Constrained Language Models"): up to about
four epochs of repeated data trained almost as well as unique data; beyond that returns fell fast.

No numpy or JAX here: planning and the checks before work import this module.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

SOURCE_NAME = re.compile(r"[a-z][a-z0-9_]*")   # a gin scope and a path component: web, code, fineweb_edu


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Weights by tokens over named sources, in phases: ((first step, {source: weight}), ...).

    gin gives `phases` as tuples of (int, dict); they are kept as ((step, ((source, weight), ...)), ...),
    sorted by source, so the config hashes and its cache key does not depend on the order a dict was
    written in. A source a phase leaves out has weight 0 in it.
    """

    phases: Any = ()
    max_epochs: float = 4.0         # passes over a source's training windows that a run may make

    def __post_init__(self):
        if not self.phases:
            raise ValueError('phases is empty; give at least one, from step 0: '
                             '((0, {"web": 0.7, "code": 0.3}),)')
        phases = []
        for i, phase in enumerate(self.phases):
            if not (isinstance(phase, (tuple, list)) and len(phase) == 2 and _is_weights(phase[1])):
                raise ValueError(f"phases[{i}] = {phase!r} is not (first step, {{source: weight}})")
            start, weights = phase[0], dict(phase[1])
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                raise ValueError(f"phases[{i}] starts at step {start!r}; a phase starts at an int step >= 0")
            phases.append((start, _weights(weights, f"phases[{i}]")))
        starts = [s for s, _ in phases]
        if starts[0] != 0:
            raise ValueError(f"the first phase starts at step {starts[0]}; it must start at step 0")
        if any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"phases start at steps {starts}; each must start after the one before")
        if not (isinstance(self.max_epochs, (int, float)) and math.isfinite(self.max_epochs)
                and self.max_epochs > 0):
            raise ValueError(f"max_epochs={self.max_epochs!r} must be a number > 0 (passes over a source)")
        object.__setattr__(self, "phases", tuple(phases))

    @property
    def sources(self) -> tuple[str, ...]:
        """Every source any phase names, sorted."""
        return tuple(sorted({name for _, weights in self.phases for name, _ in weights}))

    def fractions(self, phase: int) -> dict[str, Fraction]:
        """Phase `phase`'s weights, normalized to sum to 1 exactly, over every source (0 where left out)."""
        weights = {name: Fraction(w) for name, w in self.phases[phase][1]}
        total = sum(weights.values())
        return {name: weights.get(name, Fraction(0)) / total for name in self.sources}

    def phase_at(self, step: int) -> int:
        return max(i for i, (start, _) in enumerate(self.phases) if start <= step)

    def step_rows(self, step: int, global_batch: int) -> dict[str, int]:
        """The rows step `step` takes of each source (they sum to global_batch)."""
        p = self.phase_at(step)
        w, done = self.fractions(p), (step - self.phases[p][0]) * global_batch
        after, before = apportion(w, done + global_batch), apportion(w, done)
        return {name: after[name] - before[name] for name in self.sources}

    def rows_before(self, step: int, global_batch: int) -> dict[str, int]:
        """The rows steps 0 .. step - 1 took of each source: earlier phases whole, this one up to `step`."""
        out = dict.fromkeys(self.sources, 0)
        for p, (start, _) in enumerate(self.phases):
            if start >= step:
                break
            end = min(step, self._end(p, step))
            for name, rows in apportion(self.fractions(p), (end - start) * global_batch).items():
                out[name] += rows
        return out

    def phase_rows(self, steps: int, global_batch: int) -> list[tuple[int, int, dict[str, int]]]:
        """(first step, end step, rows of each source) of every phase a run of `steps` steps reaches."""
        return [(start, self._end(p, steps), apportion(self.fractions(p), (self._end(p, steps) - start) *
                                                       global_batch))
                for p, (start, _) in enumerate(self.phases) if start < steps]

    def epochs(self, steps: int, global_batch: int, windows: Mapping[str, int]) -> dict[str, float]:
        """Passes a run makes over each source's `windows` training windows (inf for a source of none that
        is asked for rows)."""
        asked = self.rows_before(steps, global_batch)
        return {name: (asked[name] / windows[name] if windows.get(name) else
                       (math.inf if asked[name] else 0.0)) for name in self.sources}

    def problem(self, *, steps: int, global_batch: int, windows: Mapping[str, int] | None = None,
                what: str = "train.Mixture") -> str:
        """Why this mixture cannot train (one line), or "". `windows`: each source's training windows
        (from its shard manifest, or an estimate), when known; without it the repetition limit is not
        checked."""
        for p, (start, _) in enumerate(self.phases):
            if start >= steps:
                return (f"{what}: phase {p} starts at step {start}, but the run has steps={steps}; drop the "
                        f"phase or train longer")
            for name, w in self.fractions(p).items():
                if 0 < w * global_batch < 1:
                    return (f"{what}: source {name!r} has weight {float(w):.4g} in phase {p}, less than one "
                            f"row of a {global_batch}-row batch; give it at least 1/{global_batch} = "
                            f"{1 / global_batch:.4g}, or 0, or raise train.Config.global_batch")
        if windows is not None:
            if missing := [s for s in self.sources if s not in windows]:
                return (f"{what} names source(s) {', '.join(map(repr, missing))} that the run does not have; "
                        f"its sources are: {', '.join(sorted(windows)) or 'none'}")
            for name, epochs in self.epochs(steps, global_batch, windows).items():
                if epochs > self.max_epochs:
                    return (f"{what}: source {name!r} would be read {epochs:.3g} times ({windows[name]:,} "
                            f"windows, {self.rows_before(steps, global_batch)[name]:,} asked for), past "
                            f"max_epochs={self.max_epochs:g}; lower its weight, raise "
                            f"train.Mixture.max_epochs, or give that source more data")
        return ""

    def _end(self, p: int, steps: int) -> int:
        return self.phases[p + 1][0] if p + 1 < len(self.phases) else steps


def apportion(weights: Mapping[str, Fraction], n: int) -> dict[str, int]:
    """n rows split by `weights` (exact, summing to 1) with the largest-remainder method: each name gets
    floor(w * n), and the rows left over go one each to the largest remainders, ties to the first name."""
    quotas = {name: w * n for name, w in weights.items()}
    out = {name: math.floor(q) for name, q in quotas.items()}
    left = n - sum(out.values())
    for name in sorted(quotas, key=lambda k: -(quotas[k] - out[k]))[:left]:   # sorted() is stable
        out[name] += 1
    return out


def _is_weights(value: Any) -> bool:
    """A {source: weight} dict, or the ((source, weight), ...) pairs a Mixture keeps (and JSON gives back)."""
    return isinstance(value, Mapping) or (isinstance(value, (tuple, list)) and all(
        isinstance(p, (tuple, list)) and len(p) == 2 for p in value))


def _weights(weights: Mapping, where: str) -> tuple[tuple[str, float], ...]:
    if not weights:
        raise ValueError(f"{where} has no sources; weigh at least one: {{\"web\": 1.0}}")
    out = []
    for name, w in weights.items():
        if not (isinstance(name, str) and SOURCE_NAME.fullmatch(name)):
            raise ValueError(f"{where}: source name {name!r} is not lowercase letters, digits and _ "
                             "starting with a letter (it is a gin scope and a directory name)")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"{where}: weight {w!r} of source {name!r} must be a finite number >= 0")
        out.append((name, float(w)))
    if not sum(w for _, w in out) > 0:
        raise ValueError(f"{where}: every weight is 0; give at least one source a weight > 0")
    return tuple(sorted(out))
