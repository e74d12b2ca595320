"""Small numpy measurements used to describe and test datasets."""
import numpy as np

from ..metrics import auc
from .store import BAG_PADDING


def rank_auc(labels, scores):
    """ROC AUC (hetu.metrics.auc, the rank-sum formula); both classes must be present."""
    value = auc(labels, scores)
    if np.isnan(value):
        raise ValueError("AUC needs both positive and negative labels")
    return value


def lookup_counts(sparse, num_embeddings):
    ids = np.asarray(sparse, dtype=np.int64).reshape(-1)
    return np.bincount(ids[ids != BAG_PADDING], minlength=num_embeddings)


def top_rows_lookup_share(sparse, num_embeddings, fraction=0.01):
    """Share of all lookups that go to the ``fraction`` most looked-up rows of the whole table
    (``ceil(fraction * num_embeddings)`` rows) - the figure an embedding cache cares about."""
    counts = lookup_counts(sparse, num_embeddings)
    top = max(1, int(np.ceil(fraction * num_embeddings)))
    hottest = np.partition(counts, len(counts) - top)[len(counts) - top:]
    return float(hottest.sum() / counts.sum())


def reuse_distances(sparse):
    """For each lookup of an id seen before in an earlier sample: samples since its previous
    lookup. ``sparse`` is [N] or [N, S] ids in stream order (bags' padding ignored); an id
    repeated within one sample counts once."""
    sparse = np.asarray(sparse, dtype=np.int64)
    if sparse.ndim == 1:
        sparse = sparse[:, None]
    ids = sparse.reshape(-1)
    samples = np.repeat(np.arange(len(sparse), dtype=np.int64), sparse.shape[1])
    samples, ids = samples[ids != BAG_PADDING], ids[ids != BAG_PADDING]
    order = np.lexsort((samples, ids))
    same_id = ids[order][1:] == ids[order][:-1]
    distances = np.diff(samples[order])[same_id]
    return distances[distances > 0]


def reuse_share_within(sparse, window):
    """Share of the reuses (``reuse_distances``) that come within ``window`` samples."""
    distances = reuse_distances(sparse)
    return float(np.mean(distances <= window)) if len(distances) else 0.0
