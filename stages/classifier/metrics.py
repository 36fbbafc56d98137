"""How well scores separate two classes: ROC AUC (rank-based, ties averaged), the ROC curve, and precision
and recall at a threshold.

    roc_auc([1, 0, 1, 0, 1], [0.9, 0.8, 0.8, 0.3, 0.1])     # 7/12: 3.5 of 6 (positive, negative) pairs
    precision_recall([1, 0, 1], [0.9, 0.6, 0.2], 0.5)      # (0.5, 0.5)

ROC AUC is the probability that a random positive scores above a random negative, a tie counting one
half: the Mann-Whitney U statistic over n1 * n0, from the ranks of all scores with tied scores given the
mean of the ranks they span, (sum of the positives' ranks - n1 (n1 + 1) / 2) / (n1 n0). It reads only
the order of the scores, so it says how well a keep-the-top-fraction selection separates the classes
whatever the threshold.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def roc_auc(labels: Sequence[int], scores: Sequence[float]) -> float | None:
    """ROC AUC of `scores` for `labels` (1 positive, 0 negative); None when a class is empty."""
    y = np.asarray(labels, bool)                        # (N,)
    ranks = _average_ranks(np.asarray(scores, np.float64))    # (N,) 1-based, ties averaged
    n1 = int(y.sum())
    n0 = y.size - n1
    if not n1 or not n0:
        return None
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _average_ranks(scores: np.ndarray) -> np.ndarray:
    """(N,) float64: each score's 1-based rank in ascending order, tied scores sharing their mean rank."""
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])     # (G,) first index of each tie group
    ends = np.r_[starts[1:], ordered.size]                               # (G,) one past its last
    ranks = np.empty(scores.size, np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)   # ranks start+1..end: their mean
    return ranks


def roc_curve(labels: Sequence[int], scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rates, true positive rates), each (G + 1,): the ROC curve through (0, 0) and one
    point per distinct score, from the highest down, predicting positive at score >= it."""
    y = np.asarray(labels, bool)
    s = np.asarray(scores, np.float64)
    order = np.argsort(-s, kind="stable")
    y, s = y[order], s[order]
    last = np.flatnonzero(np.r_[s[1:] != s[:-1], True])      # (G,) the last index of each distinct score
    tp = np.cumsum(y)[last]
    fp = np.cumsum(~y)[last]
    n1, n0 = max(int(y.sum()), 1), max(int((~y).sum()), 1)
    return np.r_[0.0, fp / n0], np.r_[0.0, tp / n1]


def precision_recall(labels: Sequence[int], scores: Sequence[float],
                     threshold: float = 0.5) -> tuple[float | None, float | None]:
    """(precision, recall) predicting positive at score >= `threshold`; None where nothing is predicted
    positive (precision) or there are no positives (recall)."""
    y = np.asarray(labels, bool)
    predicted = np.asarray(scores, np.float64) >= threshold
    tp = int((predicted & y).sum())
    precision = tp / int(predicted.sum()) if predicted.any() else None
    recall = tp / int(y.sum()) if y.any() else None
    return precision, recall
