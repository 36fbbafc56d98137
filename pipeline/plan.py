"""The run plan: every stage's frozen Config, its cache key (computed when first asked for), and which
stages a run would execute.

    plan = config.load(["gin/tiny.gin"])   # gin -> Plan: pipeline/config.py
    plan.stages["tokenizer"].key   # sha256 of (name, VERSION, config, upstream keys[, inputs])
    pipeline.plan.to_run(plan, ["evaluate"], plan.tree.forced("train"))   # train, evaluate + what is missing
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
    plan need no key, so `make plan` works offline and loading a config stays cheap. A stage whose module
    defines `keyed(config)` (score) keys what that returns instead of its whole config: the part of it that
    changes the stage's output (score's key covers how clean measures, never its thresholds).
    """

    name: str
    config: Any
    version: str
    upstream_plans: tuple[StagePlan, ...] = dataclasses.field(default=(), repr=False, compare=False)
    # What the key covers, as gin (`config.key_gin`): written next to the stage's output as config.gin
    config_gin: str = dataclasses.field(default="", repr=False, compare=False)
    # Each upstream node -> the name the stage reads it by, and its key covers it by (`dag.Tree.input_names`)
    input_names: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def stage(self) -> str:
        """The stage this node is (`clean` for `clean[code]`): its code, and its directory in the cache."""
        return dag.stage_of(self.name)

    @property
    def upstream(self) -> tuple[str, ...]:
        return tuple(u.name for u in self.upstream_plans)

    @functools.cached_property
    def key(self) -> str:
        """sha256 of (name, VERSION, config, upstream keys, inputs); InputsError when the inputs cannot be
        listed, here or upstream."""
        # By stage name, and upstream stages by the names the stage reads them by: a source's own chain has
        # the keys a one-source run of that source gives it.
        keyed = getattr(dag.module(self.name), "keyed", None)
        return cache.stage_key(self.stage, self.version, self.config if keyed is None else keyed(self.config),
                               {self.input_names.get(u.name, u.name): u.key for u in self.upstream_plans},
                               self.inputs)

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
    tree: dag.Tree = dataclasses.field(default_factory=dag.tree)   # the nodes: one per stage, or per source

    def committed(self, node: str) -> cache.Committed | None:
        """The node's committed output (`cache.load`), or None."""
        sp = self.stages[node]
        return cache.load(self.cache_root, sp.stage, sp.key)


def to_run(plan: Plan, targets: list[str], forced: list[str] = ()) -> list[str]:
    """The stages a run of `targets` would execute, in DAG order: the `forced` ones (`dag.forced`) and those
    the targets need that are not in the cache (a damaged one among them: `damaged`)."""
    return [s for s in plan.tree.closure(*targets) if s in forced or plan.committed(s) is None]


def damaged(plan: Plan, targets: list[str]) -> list[str]:
    """The stages the targets need whose commit is damaged (`cache.damaged`: a listed file deleted or
    truncated, a manifest that does not parse, a commit `status --verify` undid). Each is rebuilt, into the
    same key, as a target of its own: Luigi asks a task for its dependencies only when the task is not
    complete, so a committed export would hide a damaged evaluate for good ("missing", 0 stages ran). What
    was built from it stays: a key names one output, so the rebuilt stage holds what they read, and
    rebuilding them would retrain a model for a damaged shard file."""
    return [s for s in plan.tree.closure(*targets) if plan.committed(s) is None
            and cache.damaged(plan.cache_root, plan.stages[s].stage, plan.stages[s].key)]
