"""The run plan: every stage's frozen Config, its cache key (computed when first asked for), and which
stages a run would execute.

    plan = config.load(["gin/tiny.gin"])   # gin -> Plan: pipeline/config.py
    plan.stages["tokenizer"].key   # sha256 of (name, VERSION, config, upstream keys[, inputs])
    pipeline.plan.to_run(plan, ["evaluate"], dag.forced("train"))   # train, evaluate + what is missing
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from pipeline import cache, dag


class InputsError(ValueError):
    """A stage's inputs cannot be listed (offline, a glob that matches nothing), so its key is unknown."""


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One stage of a plan: its config, and its cache key, computed when first asked for.

    A stage whose module defines `key_inputs(config)` (download) lists what it reads from outside the
    cache for its key, which can take a listing call or the network; configs, placeholders and the train
    plan need no key, so `make plan` works offline and loading a config stays cheap.
    """

    name: str
    config: Any
    version: str
    upstream_plans: tuple[StagePlan, ...] = dataclasses.field(default=(), repr=False, compare=False)
    # What the key covers, as gin (`config.key_gin`): written next to the stage's output as config.gin
    config_gin: str = dataclasses.field(default="", repr=False, compare=False)

    @property
    def upstream(self) -> tuple[str, ...]:
        return tuple(u.name for u in self.upstream_plans)

    @functools.cached_property
    def key(self) -> str:
        """sha256 of (name, VERSION, config, upstream keys, inputs); InputsError when the inputs cannot be
        listed, here or upstream."""
        return cache.stage_key(self.name, self.version, self.config,
                               {u.name: u.key for u in self.upstream_plans}, self.inputs)

    @property
    def inputs(self) -> Any:
        """What the stage reads from outside the cache (`key_inputs(config)`), or None for a stage that
        reads only its upstream stages."""
        value, error = self._inputs
        if error is not None:
            raise error
        return value

    @functools.cached_property
    def _inputs(self) -> tuple[Any, InputsError | None]:
        # The failure is kept too: every downstream key asks again, and listing again (offline: waiting
        # for the network again) would only repeat it.
        key_inputs = getattr(dag.module(self.name), "key_inputs", None)
        if key_inputs is None:
            return None, None
        try:
            return key_inputs(self.config), None
        except Exception as e:  # noqa: BLE001 - whatever stops the listing, the key is unknown: say why
            error = InputsError(f"{self.name}: cannot list what it reads, so its cache key and every key "
                                f"after it are unknown: {type(e).__name__}: {e}")
            error.__cause__ = e
            return None, error


@dataclasses.dataclass(frozen=True)
class Plan:
    cache_root: str
    stages: dict[str, StagePlan]   # in DAG order
    operative_gin: str             # gin's operative config of the whole run (each stage saves its config_gin)
    gin_files: tuple[str, ...]
    gin_params: tuple[str, ...]


def to_run(plan: Plan, targets: list[str], forced: list[str] = ()) -> list[str]:
    """The stages a run of `targets` would execute, in DAG order: the `forced` ones (`dag.forced`) and those
    the targets need that are not in the cache (a damaged one among them: `damaged`)."""
    return [s for s in dag.closure(*targets)
            if s in forced or cache.load(plan.cache_root, s, plan.stages[s].key) is None]


def damaged(plan: Plan, targets: list[str]) -> list[str]:
    """The stages the targets need whose commit is damaged (`cache.damaged`: a listed file deleted or
    truncated, a manifest that does not parse, a commit `status --verify` undid). Each is rebuilt, into the
    same key, as a target of its own: Luigi asks a task for its dependencies only when the task is not
    complete, so a committed export would hide a damaged evaluate for good ("missing", 0 stages ran). What
    was built from it stays: a key names one output, so the rebuilt stage holds what they read, and
    rebuilding them would retrain a model for a damaged shard file."""
    return [s for s in dag.closure(*targets) if cache.load(plan.cache_root, s, plan.stages[s].key) is None
            and cache.damaged(plan.cache_root, s, plan.stages[s].key)]
