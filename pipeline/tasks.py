"""One Luigi task per stage, and `build()`, which runs a plan's targets and reports what happened.

A task's only significant parameter is its stage key, so the Luigi task id is a function of the
key: two plans (sweep variants) that share upstream stages share those tasks, and the scheduler
runs each once. The plan itself is looked up by a non-significant `plan_id` in this process's
registry (Luigi's `workers>1` forks, so the registry travels with the workers).

Luigi decides "done" through `complete()`, which reads the stage's `_SUCCESS.json` and checks
every listed file's size. A forced task is complete once its key holds a commit made during this
invocation: under a lease taken after `build()` noted the key's newest lease (`cache.lease_now`), by this
run or by a concurrent one. The same rule decides whether `run()` computes or takes a concurrent run's
commit (`cache.run_stage(since=...)`), so Luigi's check before a downstream task runs never finds a
dependency "unfulfilled" because another forced run committed it meanwhile. A task reads its upstream
stages through `cache.reading`, pinned until it has committed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import Iterable

import luigi

from pipeline import cache, dag
from pipeline import plan as run_plan
from pipeline.config import Plan
from stages.io.refusal import Refusal

log = logging.getLogger(__name__)

_PLANS: dict[str, Plan] = {}


class StageTask(luigi.Task):
    stage: str = ""                                           # set by each subclass
    key = luigi.Parameter(description="the stage's cache key")
    # The plan's node this task runs (`clean[code]`; the stage's name in a one-source run). Not significant:
    # two sources whose chains have one key share one task, which runs once.
    node = luigi.Parameter(significant=False, default="")
    plan_id = luigi.Parameter(significant=False, visibility=luigi.parameter.ParameterVisibility.PRIVATE)
    run_id = luigi.Parameter(significant=False, default="")

    @property
    def plan(self) -> Plan:
        return _PLANS[self.plan_id]

    def requires(self):
        """Each node this one reads, by the name its stage reads it by (`dag.Tree.input_names`)."""
        sp = self.plan.stages[self.node or self.stage]
        return {sp.input_names.get(u, u): plan_task(self.plan, u, self.plan_id, self.run_id)
                for u in sp.upstream}

    @property
    def since(self) -> int | None:
        """For a forced task, the key's newest lease number when this invocation began; else None."""
        return _FORCED.get(self.run_id, {}).get((self.plan.cache_root, self.stage, self.key))

    def committed(self) -> cache.Committed | None:
        return cache.load(self.plan.cache_root, self.stage, self.key)

    def complete(self) -> bool:
        done = self.committed()
        if done is None:
            return False
        since = self.since
        return since is None or done.manifest.get("run_id") == self.run_id or cache.made_after(done, since)

    def run(self):
        plan = self.plan
        owner = f"run {self.run_id} of {self.stage} {self.key[:12]}"
        with contextlib.ExitStack() as pins:
            upstream = {u: pins.enter_context(cache.reading(plan.cache_root, t.stage, t.key, owner=owner))
                        for u, t in self.requires().items()}
            missing = [u for u, c in upstream.items() if c is None]
            if missing:
                raise RuntimeError(f"{self.stage}: upstream {missing} not committed")
            log.info("running %s (key %s)", self.node or self.stage, self.key[:12])
            self._run(upstream)

    def _run(self, upstream: dict[str, cache.Committed]) -> None:
        plan = self.plan
        try:
            cache.run_stage(cache_root=plan.cache_root, stage=self.stage, key=self.key,
                            config=plan.stages[self.node or self.stage].config, upstream=upstream,
                            fn=dag.module(self.stage).run,
                            extra_files={"config.gin": plan.stages[self.node or self.stage].config_gin},
                            run_id=self.run_id, since=self.since)
        except Exception as e:
            node = self.node or self.stage
            if getattr(e, "resumable", False):    # stopped on request after saving (training's preemption)
                _STOPPED.setdefault(self.run_id, []).append(f"{node}: {e}")
            elif isinstance(e, Refusal):          # a guard declined: reported in one line, no traceback
                _REFUSED.setdefault(self.run_id, []).append(f"{node}: {e}")
            else:
                _CRASHED.setdefault(self.run_id, []).append(node)
            raise


_CLASSES: dict[str, type[StageTask]] = {}


def plan_task(plan: Plan, node: str, plan_id: str, run_id: str) -> StageTask:
    """The task of one of `plan`'s nodes."""
    sp = plan.stages[node]
    return task_class(sp.stage)(key=sp.key, plan_id=plan_id, run_id=run_id, node=node)


def task_class(stage: str) -> type[StageTask]:
    """The Luigi task class of a stage, named after it (Download, Clean, ...), derived from the DAG."""
    if stage not in _CLASSES:
        _CLASSES[stage] = type(stage.title().replace("_", ""), (StageTask,),
                               {"stage": stage, "__module__": __name__})
    return _CLASSES[stage]

# run_id -> (cache root, stage, key) of each stage forced in that invocation -> its newest lease number
# when the invocation began (`cache.lease_now`): a commit under a later lease is this invocation's
_FORCED: dict[str, dict[tuple[str, str, str], int]] = {}
# run_id -> "<stage>: <message>" for stages that stopped on request (preemption) and resume on a rerun
_STOPPED: dict[str, list[str]] = {}
# run_id -> "<stage>: <message>" for stages whose guard refused (`stages.io.refusal.Refusal`), and the stages
# that failed otherwise (their tracebacks are logged). Both are filled in this process: with workers > 1 Luigi
# runs tasks in forked processes, and a refusal there is logged in one line where it happens instead.
_REFUSED: dict[str, list[str]] = {}
_CRASHED: dict[str, list[str]] = {}
_BUILDER = [0]      # the pid that called `build`: a record logged in another (a forked worker) is not seen


@dataclasses.dataclass
class BuildResult:
    ok: bool
    run_id: str
    summary: str              # Luigi's own summary
    ran: list[str]            # stages (of the targets' closures) committed by this invocation
    stopped: list[str] = dataclasses.field(default_factory=list)   # stages stopped on request: rerun resumes
    refused: list[str] = dataclasses.field(default_factory=list)   # "<stage>: <why>": a guard declined
    crashed: list[str] = dataclasses.field(default_factory=list)   # stages that failed otherwise


def build(plans: Iterable[Plan], targets: Iterable[str] | None = None, *, force: Iterable[str] = (),
          workers: int = 1, scheduler: str | None = None) -> BuildResult:
    """Runs `targets` for every plan, building what they need (None: every node); `force` ones rerun even
    when cached, together with everything downstream of them. Both name nodes (`clean[code]`) or stages (every
    source's instance: `dag.Tree.select_all`). A damaged node the targets need is rebuilt on its own
    (`pipeline.plan.damaged`)."""
    plans = list(plans)
    run_id = uuid.uuid4().hex
    per_plan = [(plan, plan.tree.select_all(targets), plan.tree.forced(*plan.tree.select_all(force)))
                for plan in plans]
    _FORCED[run_id] = {(plan.cache_root, sp.stage, sp.key): cache.lease_now(plan.cache_root, sp.stage, sp.key)
                       for plan, nodes, forced in per_plan for node in plan.tree.closure(*nodes)
                       if node in forced for sp in (plan.stages[node],)}
    tasks = []
    for plan, nodes, _ in per_plan:
        plan_id = uuid.uuid4().hex
        _PLANS[plan_id] = plan
        # A damaged node is a target of its own: Luigi stops at the first complete task, so a committed
        # export would hide a damaged evaluate for good.
        if broken := run_plan.damaged(plan, nodes):
            log.warning("damaged in the cache: %s; rebuilding it into the same key",
                        ", ".join(f"{s} {plan.stages[s].key[:12]}" for s in broken))
        for node in [*nodes, *(s for s in broken if s not in nodes)]:
            tasks.append(plan_task(plan, node, plan_id, run_id))
    _configure_luigi()
    kwargs = {"workers": workers, "detailed_summary": True, "log_level": "WARNING"}
    if scheduler:
        host, _, port = scheduler.rpartition(":")
        kwargs.update(scheduler_host=host or "localhost", scheduler_port=int(port))
    else:
        kwargs["local_scheduler"] = True
    result = luigi.build(tasks, **kwargs)
    ok = result.status in (luigi.LuigiStatusCode.SUCCESS, luigi.LuigiStatusCode.SUCCESS_WITH_RETRY)
    ran = []
    try:
        for plan, nodes, _ in per_plan:
            for node in plan.tree.closure(*nodes):
                done = plan.committed(node)
                if done is not None and done.manifest.get("run_id") == run_id and node not in ran:
                    ran.append(node)
    except OSError as e:      # the cache went away during the run (a failed build says so, in one line)
        log.warning("cannot read back what this run committed: %s", e)
        ok = False
    return BuildResult(ok, run_id, result.summary_text, ran, _STOPPED.pop(run_id, []),
                       _REFUSED.pop(run_id, []), _CRASHED.pop(run_id, []))


def _configure_luigi() -> None:
    config = luigi.configuration.get_config()
    # Verify a task's output after run(), so a stage that "succeeds" without committing fails.
    config.set("worker", "check_complete_on_run", "true")
    # Luigi's own CLI exits 0 when a task fails; we read the status from build() instead.
    config.set("worker", "no_install_shutdown_handler", "true")
    # Luigi's own handler printed every failure a second time ("ERROR: ..." beside the root logger's line).
    config.set("core", "no_configure_logging", "true")
    _BUILDER[0] = os.getpid()
    for name in ("luigi-interface", "luigi"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietStops) for f in logger.filters):
            logger.addFilter(_QuietStops())


class _QuietStops(logging.Filter):
    """Drops Luigi's traceback for a stage that stopped on request (an exception with `resumable = True`,
    such as training's preemption) or that refused (`Refusal`, a guard's verdict): expected ends, which the
    command line reports in one line (`BuildResult.stopped`, `.refused`). In a forked worker (workers > 1),
    whose lists the command line never sees, a refusal is logged there as that one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, Refusal) and os.getpid() != _BUILDER[0]:
            args = record.args if isinstance(record.args, tuple) else ()
            stage = next((f"{a.node or a.stage}: " for a in args if isinstance(a, StageTask)), "")
            record.msg, record.args, record.exc_info, record.exc_text = f"error: {stage}{exc}", (), None, None
            return True
        return not (getattr(exc, "resumable", False) or isinstance(exc, Refusal))
