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


def top_rows_lookup_share(sparse, num_embeddings, fraction=0.01, id_range=None):
    """Share of all lookups that go to the ``fraction`` most looked-up rows of the whole table
    (``ceil(fraction * num_embeddings)`` rows) - the figure an embedding cache cares about.
    ``sparse`` is an id array, or a function that returns a fresh iterable of id arrays (chunks
    read from disk). Ids are counted ``id_range`` rows of the table at a time (one pass over
    the ids each), so memory is O(id_range) whatever the table's rows; None: all in one pass."""
    chunks = sparse if callable(sparse) else (lambda: (sparse,))
    width_max = num_embeddings if id_range is None else id_range
    # per range only the histogram of counts is kept: (count, number of rows with it)
    values, rows = [], []
    for low in range(0, num_embeddings, width_max):
        width = min(width_max, num_embeddings - low)
        counts = np.zeros(width, dtype=np.int64)
        for ids in chunks():
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            # padding (-1) is below every range
            counts += np.bincount(ids[(ids >= low) & (ids < low + width)] - low,
                                  minlength=width)
        # most rows of a large table are never looked up: their zeros are counted, not sorted
        looked_up = counts[counts > 0]
        value, multiplicity = np.unique(looked_up, return_counts=True)
        values.append(np.r_[0, value])
        rows.append(np.r_[width - len(looked_up), multiplicity])
    value, inverse = np.unique(np.concatenate(values), return_inverse=True)
    multiplicity = np.zeros(len(value), dtype=np.int64)
    np.add.at(multiplicity, inverse, np.concatenate(rows))
    value, multiplicity = value[::-1], multiplicity[::-1]      # hottest first
    top = max(1, int(np.ceil(fraction * num_embeddings)))
    taken = np.clip(top - (np.cumsum(multiplicity) - multiplicity), 0, multiplicity)
    return float((value * taken).sum() / (value * multiplicity).sum())


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
