"""Small numpy measurements used to describe and test datasets."""
import numpy as np


def rank_auc(labels, scores):
    """ROC AUC by the rank-sum (Mann-Whitney) formula, ties given their average rank."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    num_pos = int(labels.sum())
    num_neg = len(labels) - num_pos
    if num_pos == 0 or num_neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # average rank over each run of equal scores
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    average = (starts + ends + 1) / 2.0  # 1-based average rank of positions [start, end)
    ranks[order] = np.repeat(average, ends - starts)
    return float((ranks[labels].sum() - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg))


def lookup_counts(sparse, num_embeddings):
    return np.bincount(np.asarray(sparse, dtype=np.int64).reshape(-1), minlength=num_embeddings)


def top_rows_lookup_share(sparse, num_embeddings, fraction=0.01):
    """Share of all lookups that go to the ``fraction`` most looked-up rows of the whole table
    (``ceil(fraction * num_embeddings)`` rows) - the figure an embedding cache cares about."""
    counts = lookup_counts(sparse, num_embeddings)
    top = max(1, int(np.ceil(fraction * num_embeddings)))
    hottest = np.partition(counts, len(counts) - top)[len(counts) - top:]
    return float(hottest.sum() / counts.sum())
