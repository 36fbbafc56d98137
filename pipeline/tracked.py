"""After a run: each tracked training's W&B run gets the DAG around it (stages/io/tracking.py).

    tracked.annotate(plan, result.run_id)      # pipeline/__main__.py, after `run` and `sweep`

The training logged its metrics while it ran; only here is the whole plan known. For every train node whose
`train.Tracking` is on and which this invocation committed (or whose evaluation it did), the W&B run its
committed `wandb.json` names gets, in its config, every stage's key and one-line summary (`stages/<node>/key`,
`stages/<node>/summary`) and the gin each key covers (`gin/<node>`), and in its summary the evaluation's
figures (`eval/...`, from eval.json). A tracker that fails here is a warning: every stage is committed.
"""

from __future__ import annotations

import logging

from pipeline import dag
from pipeline import plan as run_plan
from stages.io import storage, tracking

log = logging.getLogger(__name__)


def annotate(plan: run_plan.Plan, run_id: str) -> list[str]:
    """Adds the stages and the evaluation to each tracked training's W&B run whose training or evaluation
    the invocation `run_id` committed (a sweep's other variants, and stages it found cached, are left as
    they are); returns the train nodes done."""
    done = []
    for node, sp in plan.stages.items():
        if sp.stage != "train" or not sp.config.tracking.enabled:
            continue
        readers = [n for n in plan.tree.downstream(node) if dag.stage_of(n) == "evaluate"]
        trained = plan.committed(node)
        if trained is None or tracking.STATE not in trained.files or not any(
                (c := plan.committed(n)) is not None and c.manifest.get("run_id") == run_id
                for n in (node, *readers)):
            continue
        try:
            state = storage.read_json(trained.file(tracking.STATE))
            tracking.annotate(sp.config.tracking, state, config=dag_config(plan, [node, *readers]),
                              summary=evaluation(plan, readers))
        except Exception as e:  # noqa: BLE001 - the stages are committed; the tracker's failure is reported
            log.warning("%s: could not add the stages and the evaluation to W&B run %s: %s: %s", node,
                        trained.key[:12], type(e).__name__, e)
            continue
        done.append(node)
    return done


def dag_config(plan: run_plan.Plan, nodes: list[str]) -> dict:
    """{"stages": {node: {"key", "summary"}}, "gin": {node: text}} of `nodes` and everything they read."""
    stages, gin = {}, {}
    for node in plan.tree.closure(*nodes):
        committed = plan.committed(node)
        if committed is None:
            continue
        stages[node] = {"key": committed.key, "summary": _summary(node, committed)}
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
