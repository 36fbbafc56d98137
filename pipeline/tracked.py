"""After a run: each tracked training's W&B run gets the DAG around it (stages/train/tracking.py).

    tracked.annotate(plan, result.run_id)      # pipeline/__main__.py, after `run` and `sweep`

The training logged its metrics while it ran; only here is the whole plan known. For every train node whose
`train.Tracking` is on and which this invocation committed (or whose evaluation or export it did), the W&B run
its committed `wandb.json` names gets, in its config, the key and one-line summary (`stages/<node>/key`,
`stages/<node>/summary`) of every stage it read and of its evaluation and export (a stage not built yet: its
key, where it will be, and the summary "(not built yet)"), the gin each key covers (`gin/<node>`), and in its
summary the evaluation's figures (`eval/...`, from eval.json). A tracker that fails here is a warning: every
stage is committed.
"""

from __future__ import annotations

import logging

from pipeline import dag
from pipeline import plan as run_plan
from stages.io import storage
from stages.train import tracking

log = logging.getLogger(__name__)
NOT_BUILT = "(not built yet)"     # the summary of a stage the W&B config names by its planned key only


def annotate(plan: run_plan.Plan, run_id: str) -> list[str]:
    """Adds the stages and the evaluation to each tracked training's W&B run whose training, evaluation or
    export the invocation `run_id` committed (a sweep's other variants, and stages it found cached, are left
    as they are); returns the train nodes done."""
    done = []
    for node, sp in plan.stages.items():
        if sp.stage != "train" or not sp.config.tracking.enabled:
            continue
        readers = [n for n in plan.tree.downstream(node) if dag.stage_of(n) == "evaluate"]
        trained = plan.committed(node)
        if trained is None or tracking.STATE not in trained.files or not any(
                (c := plan.committed(n)) is not None and c.manifest.get("run_id") == run_id
                for n in after(plan, node)):
            continue
        try:
            state = storage.read_json(trained.file(tracking.STATE))
            tracking.annotate(sp.config.tracking, state, config=dag_config(plan, after(plan, node)),
                              summary=evaluation(plan, readers))
        except Exception as e:  # noqa: BLE001 - the stages are committed; the tracker's failure is reported
            log.warning("%s: could not add the stages and the evaluation to W&B run %s: %s: %s", node,
                        trained.key[:12], type(e).__name__, e)
            continue
        done.append(node)
    return done


def after(plan: run_plan.Plan, train: str) -> list[str]:
    """The train node `train` and every node that reads it (its evaluations and exports): the W&B run of the
    training is annotated when this invocation committed any of them, and names each one's key."""
    return plan.tree.downstream(train)


def dag_config(plan: run_plan.Plan, nodes: list[str]) -> dict:
    """{"stages": {node: {"key", "summary"}}, "gin": {node: text}} of `nodes` and everything they read. A node
    not committed (an export a `--stage evaluate` run left out) has its planned key, where it will be, and the
    summary NOT_BUILT."""
    stages, gin = {}, {}
    for node in plan.tree.closure(*nodes):
        committed = plan.committed(node)
        stages[node] = ({"key": committed.key, "summary": _summary(node, committed)} if committed is not None
                        else {"key": plan.stages[node].key, "summary": NOT_BUILT})
        gin[node] = plan.stages[node].config_gin
    return {"stages": stages, "gin": gin}


def evaluation(plan: run_plan.Plan, readers: list[str]) -> dict:
    """{"eval": eval.json} of the evaluation of the training ({"eval/<node>": ...} for each of several)."""
    found = {}
    for node in readers:
        committed = plan.committed(node)
        if committed is not None and "eval.json" in committed.files:
            found[node] = storage.read_json(committed.file("eval.json"))
    if len(found) == 1:
        return {"eval": next(iter(found.values()))}
    return {f"eval/{node}": figures for node, figures in found.items()}


def _summary(node: str, committed) -> str:
    summarize = getattr(dag.module(dag.stage_of(node)), "summary", None)
    try:
        return summarize(committed) if summarize else ""
    except Exception as e:  # noqa: BLE001 - a summary is a courtesy: say why it is missing
        return f"(no summary: {type(e).__name__}: {e})"
