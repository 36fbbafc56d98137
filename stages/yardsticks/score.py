"""Scores tokenized yardsticks with a model: the numbers eval.json and the in-loop metrics rows hold.

    from stages.train import scoring
    from stages.yardsticks import score, tokenized
    y = tokenized.load(committed_yardsticks)
    result = score.score(scoring.Scorer(net, prefix_id=y.eos_id), y)
    result["reference_bpb"]["aesop_fables"]      # {"bpb", "low", "high", "docs", "bytes"}
    result["tasks"]["piqa"]["acc_norm"]          # {"value", "low", "high"}
    score.in_loop_row(result)                    # {"yardstick/bpb/aesop_fables": 3.4, ...}

Every request of every yardstick goes to the scorer in one call per kind (rolling documents, then task
requests), so they are packed together into the fewest fixed-shape batches. The scorer is duck-typed
(`loglikelihood`, `loglikelihood_rolling_many`, `length`): no JAX is imported here.
"""

from __future__ import annotations

import numpy as np

from stages.yardstick_data import reference
from stages.yardsticks import task_metrics

PREFIX = "yardstick/"       # the in-loop metrics' names: yardstick/bpb/<set>, yardstick/acc_norm/<task>, ...


def score(scorer, yardsticks) -> dict:
    """{"reference_bpb": {set: {...}}, "tasks": {task: {...}}, "aggregate": {...},
    "truncated_continuations": n} of a `tokenized.Yardsticks` (no tasks: only reference_bpb)."""
    names = list(yardsticks.reference)
    documents = [doc for name in names for doc in yardsticks.reference[name]]
    logprobs = scorer.loglikelihood_rolling_many([list(doc.ids) for doc in documents]) if documents else []
    out: dict = {"reference_bpb": {}}
    start = 0
    for name in names:
        docs = yardsticks.reference[name]
        out["reference_bpb"][name] = reference.bits_per_byte_of(logprobs[start:start + len(docs)],
                                                                [doc.bytes for doc in docs])
        start += len(docs)
    if yardsticks.tasks:
        out.update(tasks(scorer, yardsticks.tasks))
    return out


def tasks(scorer, items_by_task: dict) -> dict:
    """{"tasks", "aggregate", "truncated_continuations"} (`task_metrics.score_tasks`) of tokenized items
    {task: [tokenized.Item]}. The scorer is as long as training's sequences, the positions the model has
    learned: a longer request loses the start of its context, as in lm-eval, and a continuation longer than
    that keeps its first tokens (counted in "truncated_continuations")."""
    requests, owners, truncated = [], [], 0        # owners[r]: (task, item index) of request r
    for name, items in items_by_task.items():
        for i, item in enumerate(items):
            for context, continuation in item.requests:
                if len(continuation) > scorer.length:
                    continuation, truncated = continuation[:scorer.length], truncated + 1
                requests.append((list(context), list(continuation)))
                owners.append((name, i))
    logliks = {name: [[] for _ in items] for name, items in items_by_task.items()}
    for (name, i), (logprob, _) in zip(owners, scorer.loglikelihood(requests)):
        logliks[name][i].append(logprob)
    arrays = {name: [np.asarray(choices, np.float64) for choices in per_item]     # (choices,) per item
              for name, per_item in logliks.items()}
    return {**task_metrics.score_tasks(items_by_task, arrays), "truncated_continuations": truncated}


def in_loop_row(result: dict) -> dict[str, float]:
    """The flat metrics of a `score` result, for metrics.jsonl and TensorBoard: yardstick/bpb/<set>,
    yardstick/acc_norm/<task>, yardstick/centered/<task> and yardstick/aggregate (mean centered accuracy)."""
    row = {f"{PREFIX}bpb/{name}": r["bpb"] for name, r in result["reference_bpb"].items()}
    for name, t in result.get("tasks", {}).items():
        row[f"{PREFIX}acc_norm/{name}"] = t["acc_norm"]["value"]
        row[f"{PREFIX}centered/{name}"] = t["centered"]["value"]
    if result.get("aggregate", {}).get("tasks"):
        row[f"{PREFIX}aggregate"] = result["aggregate"]["value"]
    return row
