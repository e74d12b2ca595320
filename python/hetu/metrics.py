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


RANKING_KS = (10, 50, 200)
RANKING_CHUNK_SCORES = 1 << 25   # scores held at once by ranking_hits (float32: 128 MiB)


def ranking_hits(user_vectors, item_table, targets, history, ks=RANKING_KS, chunk=None):
    """Full-corpus ranking of each user's held-out item: (hits, ndcg), float64 [n, len(ks)].

    User i's scores are user_vectors[i] @ item_table.T over the whole catalog (float32, computed
    ``chunk`` users at a time: by default as many as keep RANKING_CHUNK_SCORES scores). The items
    of its history row (history [n, L], -1 padding), other than the target itself, are left out
    of the ranking. The target's rank is the number of the other items left in whose score is at
    least the target's (an item scoring equal to the target ranks ahead of it; a NaN score
    ranks ahead of nothing, and a NaN target ranks behind every item). hit@K = rank < K,
    ndcg@K = 1 / log2(rank + 2) where rank < K, else 0."""
    users = np.asarray(user_vectors, dtype=np.float32)
    table = np.asarray(item_table, dtype=np.float32)
    targets = np.asarray(targets, dtype=np.int64).reshape(-1)
    history = np.asarray(history, dtype=np.int64)
    ks = np.asarray([int(k) for k in ks], dtype=np.int64)
    if users.ndim != 2 or table.ndim != 2 or users.shape[1] != table.shape[1]:
        raise ValueError(f"user_vectors [n, d] and item_table [items, d] must share d: got "
                         f"{list(users.shape)} and {list(table.shape)}")
    n, num_items = len(users), len(table)
    if len(targets) != n or history.ndim != 2 or len(history) != n:
        raise ValueError(f"targets [n] and history [n, L] must have a row per user ({n}): got "
                         f"{list(targets.shape)} and {list(history.shape)}")
    if n and (targets.min() < 0 or targets.max() >= num_items):
        raise ValueError(f"a target outside the {num_items} items: {targets.min()}..{targets.max()}")
    if history.size and (history.min() < -1 or history.max() >= num_items):
        raise ValueError(f"a history item outside the {num_items} items (or -1, the padding): "
                         f"{history.min()}..{history.max()}")
    if len(ks) == 0 or ks.min() < 1:
        raise ValueError(f"ks must be positive cut-offs, got {ks.tolist()}")
    chunk = max(1, RANKING_CHUNK_SCORES // max(1, num_items)) if chunk is None else int(chunk)
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 user, got {chunk}")
    ranks = np.empty(n, dtype=np.int64)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        scores = users[start:stop] @ table.T
        target = targets[start:stop]
        target_score = scores[np.arange(stop - start), target][:, None]
        # the history's distinct items other than the target: each left out once
        seen = np.sort(history[start:stop], axis=1)
        left_out = (seen != -1) & (seen != target[:, None])
        left_out[:, 1:] &= seen[:, 1:] != seen[:, :-1]
        seen_scores = np.take_along_axis(scores, np.where(left_out, seen, 0), axis=1)
        ahead = (scores >= target_score).sum(axis=1) - 1 - ((seen_scores >= target_score) & left_out).sum(axis=1)
        unscored = np.isnan(target_score[:, 0])
        ranks[start:stop] = np.where(unscored, num_items - 1 - left_out.sum(axis=1), ahead)
    hits = ranks[:, None] < ks[None, :]
    ndcg = np.where(hits, 1.0 / np.log2(ranks[:, None] + 2.0), 0.0)
    return hits.astype(np.float64), ndcg


def ranking_summary(hits, ndcg, ks=RANKING_KS):
    """{"hr@K": mean hit@K, "ndcg@K": mean ndcg@K, ... for each K of ks, "users": n} of
    ranking_hits' per-user results (NaN means for no users)."""
    hits, ndcg = np.asarray(hits, dtype=np.float64), np.asarray(ndcg, dtype=np.float64)
    ks = [int(k) for k in ks]
    if hits.shape != ndcg.shape or hits.ndim != 2 or hits.shape[1] != len(ks):
        raise ValueError(f"hits and ndcg must both be [n, {len(ks)}] (one column per k of {ks}): got "
                         f"{list(hits.shape)} and {list(ndcg.shape)}")
    summary = {}
    for c, k in enumerate(ks):
        summary[f"hr@{k}"] = float(hits[:, c].mean()) if len(hits) else float("nan")
        summary[f"ndcg@{k}"] = float(ndcg[:, c].mean()) if len(ndcg) else float("nan")
    summary["users"] = len(hits)
    return summary
