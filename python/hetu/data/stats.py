"""Small numpy measurements used to describe and test datasets."""
import numpy as np

from ..metrics import auc


def rank_auc(labels, scores):
    """ROC AUC (hetu.metrics.auc, the rank-sum formula); both classes must be present."""
    value = auc(labels, scores)
    if np.isnan(value):
        raise ValueError("AUC needs both positive and negative labels")
    return value


def lookup_counts(sparse, num_embeddings):
    return np.bincount(np.asarray(sparse, dtype=np.int64).reshape(-1), minlength=num_embeddings)


def top_rows_lookup_share(sparse, num_embeddings, fraction=0.01):
    """Share of all lookups that go to the ``fraction`` most looked-up rows of the whole table
    (``ceil(fraction * num_embeddings)`` rows) - the figure an embedding cache cares about."""
    counts = lookup_counts(sparse, num_embeddings)
    top = max(1, int(np.ceil(fraction * num_embeddings)))
    hottest = np.partition(counts, len(counts) - top)[len(counts) - top:]
    return float(hottest.sum() / counts.sum())
