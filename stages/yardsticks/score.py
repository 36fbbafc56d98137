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
(`loglikelihood`, `loglikelihood_rolling_many`, `max_length`): no JAX is imported here.
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
    bits = reference.document_bits(scorer, [doc.ids for doc in documents])               # (N,)
    out: dict = {"reference_bpb": {}}
    start = 0
    for name in names:
        docs = yardsticks.reference[name]
        out["reference_bpb"][name] = reference.bits_per_byte_of(bits[start:start + len(docs)],
                                                                [doc.bytes for doc in docs])
        start += len(docs)
    if yardsticks.tasks:
        out.update(tasks(scorer, yardsticks.tasks))
    return out


def tasks(scorer, items_by_task: dict) -> dict:
    """{"tasks", "aggregate", "truncated_continuations"} (`task_metrics.score_tasks`) of tokenized items
    {task: [tokenized.Item]}, each choice's log-likelihood from `logliks`."""
    arrays, truncated = logliks(scorer, items_by_task)
    return {**task_metrics.score_tasks(items_by_task, arrays), "truncated_continuations": truncated}


def logliks(scorer, items_by_task: dict) -> tuple[dict[str, list[np.ndarray]], int]:
    """({task: per item, each choice's log-likelihood (choices,) float64}, continuations cut) of tokenized
    items. A request is scored by lm-eval's HF rule at the scorer's max_length (`scoring.truncate`: the
    context cut from the left). A continuation longer than max_length, which lm-eval refuses, keeps its
    first max_length tokens and is counted: training's in-loop scorer is as long as its sequences; the
    evaluate stage refuses such an item before scoring (its max_length holds every answer, as lm-eval's)."""
    requests, owners, truncated = [], [], 0        # owners[r]: (task, item index) of request r
    for name, items in items_by_task.items():
        for i, item in enumerate(items):
            for context, continuation in item.requests:
                if len(continuation) > scorer.max_length:
                    continuation, truncated = continuation[:scorer.max_length], truncated + 1
                requests.append((list(context), list(continuation)))
                owners.append((name, i))
    found = {name: [[] for _ in items] for name, items in items_by_task.items()}
    for (name, i), (logprob, _) in zip(owners, scorer.loglikelihood(requests)):
        found[name][i].append(logprob)
    return ({name: [np.asarray(choices, np.float64) for choices in per_item]        # (choices,) per item
             for name, per_item in found.items()}, truncated)


def longest_continuation(items_by_task: dict) -> tuple[int, str, str]:
    """(tokens, task, item id) of the longest continuation among tokenized items; (0, "", "") for none."""
    return max(((len(cont), name, item.id) for name, items in items_by_task.items() for item in items
                for _, cont in item.requests), default=(0, "", ""))


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
