"""Multiple-choice metrics from per-choice log-likelihoods, each with a 95% bootstrap interval over items.

    from stages.yardstick_data import tasks
    from stages.yardsticks import task_metrics
    items = tasks.load(["hellaswag", "piqa"], max_items=1000)
    # one (choices,) array per item
    logliks = {name: [scorer(item.requests()) for item in its] for name, its in items.items()}
    result = task_metrics.score_tasks(items, logliks)
    result["tasks"]["piqa"]["acc"]   # {"value": 0.61, "low": 0.58, "high": 0.64}
    result["aggregate"]              # mean centered accuracy over the tasks, with its interval

Per task:
- `acc`: the gold choice has the highest log-likelihood.
- `acc_norm`: the same on log-likelihood per character of the scored continuation, its leading space
  counted (" Paris": 6): OLMES' acc_per_char (OLMo's `acc_per_char`). It is NOT lm-eval's acc_norm.
- `acc_norm_lm_eval`: lm-evaluation-harness 0.4.13's acc_norm, to compare with the harness: per character
  of the choice as its `doc_to_choice` gives it, without the target delimiter (the one space before it:
  "Paris": 5; `ConfigurableTask.process_results` divides by `len(choice)`). Every choice `tasks.py` renders
  is that delimiter then lm-eval's choice text, so the divisor is `scored_chars() - 1`. The two can credit
  different choices where the choices' lengths differ (issue 24 saw 13 of 800 items change). For a
  partial-evaluation task (WinoGrande: one continuation for every choice) both equal acc.
- `centered`, `centered_norm`: acc and acc_norm centered on the random baseline, as DCLM's CORE does per
  task: (acc - b) / (1 - b) with b = mean over items of 1/k (k choices; ARC has items with 3 and 5). 0 is
  chance, 1 is perfect, below 0 worse than chance.
Exact ties split the credit (a scorer returning equal numbers gets 1/k per item, i.e. chance; lm-eval's argmax
would credit the first choice). Intervals are percentiles of BOOTSTRAP_RESAMPLES resamples of the items drawn
with BOOTSTRAP_SEED; the aggregate's resample draws items within each task (stratified), then averages tasks.
Pure numpy: no model and no JAX here.
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
METRICS = ("acc", "acc_norm", "centered", "centered_norm", "acc_norm_lm_eval")
LM_EVAL_DELIMITER = " "   # lm-eval's default target_delimiter: before each choice, not in acc_norm's length
_CHUNK = 100  # resamples drawn at once: (100, items) indices stay small for HellaSwag's 10k items


def score_tasks(items_by_task: dict, logliks_by_task: dict, *, resamples: int = BOOTSTRAP_RESAMPLES,
                seed: int = BOOTSTRAP_SEED, aggregate_metric: str = "centered") -> dict:
    """{"tasks": {task: score_task(...)}, "aggregate": {"metric", "tasks", "value", "low", "high"}}."""
    if set(items_by_task) != set(logliks_by_task):
        raise ValueError(f"tasks with items {sorted(items_by_task)} but log-likelihoods for "
                         f"{sorted(logliks_by_task)}: they must be the same tasks")
    if aggregate_metric not in METRICS:
        raise ValueError(f"aggregate_metric={aggregate_metric!r}; valid: {list(METRICS)}")
    scores, draws = {}, []
    for name in items_by_task:
        per_item = _per_item(items_by_task[name], logliks_by_task[name])
        scores[name] = _summarize(per_item, resamples, seed)
        draws.append(_bootstrap(per_item, resamples, seed)[aggregate_metric])  # (resamples,)
    names = list(items_by_task)
    value = float(np.mean([scores[n][aggregate_metric]["value"] for n in names])) if names else float("nan")
    low, high = _interval(np.mean(draws, axis=0)) if names else (float("nan"), float("nan"))
    return {"tasks": scores,
            "aggregate": {"metric": aggregate_metric, "tasks": names,
                          "value": value, "low": low, "high": high}}


def score_task(items, logliks, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """{"items", "random_baseline", and per METRICS {"value", "low", "high"}} for one task.

    `logliks[i]` is item i's (choices,) array of summed log-likelihoods, in `items[i].requests()` order.
    """
    return _summarize(_per_item(items, logliks), resamples, seed)


def _per_item(items, logliks) -> dict[str, np.ndarray]:
    """Per item (n,): credit under acc, acc_norm and lm-eval's acc_norm, and 1/k."""
    if len(items) != len(logliks):
        raise ValueError(f"{len(items)} items but {len(logliks)} log-likelihood arrays: one array per item")
    if not items:
        raise ValueError("no items to score")
    acc, norm, lm_eval_norm, chance = (np.empty(len(items)) for _ in range(4))
    for i, (item, ll) in enumerate(zip(items, logliks)):
        ll = np.asarray(ll, dtype=np.float64)  # (choices,)
        if ll.shape != (len(item.choices),) or not np.all(np.isfinite(ll)):
            raise ValueError(f"item {item.id}: log-likelihoods {ll.tolist()} must be "
                             f"{len(item.choices)} finite numbers, one per choice")
        acc[i] = _credit(ll, item.gold)
        chars = np.asarray(item.scored_chars(), dtype=np.float64)                     # (choices,)
        norm[i] = _credit(ll / chars, item.gold)
        # without the delimiter; a choice that is the delimiter alone keeps 1 (lm-eval would divide by 0)
        lm_eval_norm[i] = _credit(ll / np.maximum(chars - len(LM_EVAL_DELIMITER), 1.0), item.gold)
        chance[i] = 1.0 / len(item.choices)
    return {"acc": acc, "acc_norm": norm, "acc_norm_lm_eval": lm_eval_norm, "chance": chance}


def _credit(scores: np.ndarray, gold: int) -> float:
    best = scores == scores.max()
    return float(best[gold]) / float(best.sum())


def _centered(acc, baseline):
    return (acc - baseline) / (1.0 - baseline)


def _metrics(acc, norm, baseline, lm_eval_norm) -> dict:
    return {"acc": acc, "acc_norm": norm, "centered": _centered(acc, baseline),
            "centered_norm": _centered(norm, baseline), "acc_norm_lm_eval": lm_eval_norm}


def _summarize(per_item: dict, resamples: int, seed: int) -> dict:
    baseline = float(per_item["chance"].mean())
    values = _metrics(per_item["acc"].mean(), per_item["acc_norm"].mean(), baseline,
                      per_item["acc_norm_lm_eval"].mean())
    draws = _bootstrap(per_item, resamples, seed)
    out = {"items": len(per_item["acc"]), "random_baseline": baseline}
    for name in METRICS:
        low, high = _interval(draws[name])
        out[name] = {"value": float(values[name]), "low": low, "high": high}
    return out


def _bootstrap(per_item: dict, resamples: int, seed: int) -> dict[str, np.ndarray]:
    """Every metric on `resamples` resamples of the items, (resamples,) each."""
    if resamples < 1:
        raise ValueError(f"resamples={resamples}: must be at least 1")
    rng = np.random.default_rng(seed)
    n = len(per_item["acc"])
    means = {k: [] for k in per_item}
    for start in range(0, resamples, _CHUNK):
        idx = rng.integers(0, n, size=(min(_CHUNK, resamples - start), n))  # (chunk, n)
        for k, v in per_item.items():
            means[k].append(v[idx].mean(axis=1))
    acc, norm, chance, lm_eval_norm = (np.concatenate(means[k])
                                       for k in ("acc", "acc_norm", "chance", "acc_norm_lm_eval"))
    return _metrics(acc, norm, chance, lm_eval_norm)


def _interval(draws: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)
