"""Evaluation metrics computed on the host."""
import numpy as np


def auc(labels, scores):
    """Area under the ROC curve by the rank-sum formula, ties given their average rank."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # Average rank within each run of equal scores.
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def accuracy(labels, scores, threshold=0.5):
    labels = np.asarray(labels).reshape(-1) > 0.5
    return float(np.mean((np.asarray(scores).reshape(-1) > threshold) == labels))


def logloss(labels, scores, eps=1e-7):
    """Mean binary cross-entropy of probabilities `scores` (clipped to [eps, 1 - eps])."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(scores, dtype=np.float64).reshape(-1), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log1p(-p)))
