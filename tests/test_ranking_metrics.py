"""hetu.metrics.ranking_hits / ranking_summary: full-corpus HR@K and NDCG@K of held-out items, against
a per-user brute-force reference (ties, history exclusions) and a case worked by hand."""
import math

import numpy as np
import pytest

from hetu.metrics import ranking_hits, ranking_summary


def reference_rank(scores, target, history):
    """Items other than the target, not in the history (the target itself stays), scoring >= it."""
    excluded = {int(h) for h in history if h != -1} - {int(target)}
    return sum(1 for item, s in enumerate(scores)
               if item != target and item not in excluded and s >= scores[target])


def test_hand_checked():
    table = np.array([[1.0], [2.0], [3.0], [2.0], [0.0]])          # scores of user [1]: 1 2 3 2 0
    users = np.array([[1.0], [-1.0], [1.0], [1.0]])
    targets = np.array([1, 4, 4, 0])
    history = np.array([[2, 1, -1],      # 2 left out, 1 is the target: 3 ties with it and ranks ahead -> rank 1
                        [4, 4, -1],      # scores -1 -2 -3 -2 0: nothing ahead of 4 -> rank 0
                        [-1, -1, -1],    # everything ahead -> rank 4
                        [3, 3, 2]])      # 2 and 3 left out (3 twice): 1 ahead (score 2 >= 1) -> rank 1
    hits, ndcg = ranking_hits(users, table, targets, history, ks=(1, 2, 5))
    assert hits.tolist() == [[0, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]]
    third = 1 / math.log2(3)
    assert np.allclose(ndcg, [[0, third, third], [1, 1, 1], [0, 0, 1 / math.log2(6)], [0, third, third]],
                       rtol=1e-15, atol=0)
    assert hits.dtype == ndcg.dtype == np.float64
    summary = ranking_summary(hits, ndcg, (1, 2, 5))
    assert summary == pytest.approx({"hr@1": 0.25, "ndcg@1": 0.25, "hr@2": 0.75, "ndcg@2": (1 + 2 * third) / 4,
                                     "hr@5": 1.0, "ndcg@5": (1 + 2 * third + 1 / math.log2(6)) / 4, "users": 4})
    assert list(summary)[:2] == ["hr@1", "ndcg@1"]


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_against_brute_force(chunk):
    rng = np.random.default_rng(3)
    n, items, d, L = 60, 300, 4, 25
    # small integers: float32 products are exact, and many scores tie
    users = rng.integers(-2, 3, size=(n, d)).astype(np.float32)
    table = rng.integers(-2, 3, size=(items, d)).astype(np.float32)
    targets = rng.integers(0, items, size=n)
    history = rng.integers(0, items, size=(n, L))
    history[rng.random((n, L)) < 0.3] = -1
    history[::4, 0] = targets[::4]             # the target in its own history: not left out
    history[1::5, :] = -1                      # no history
    ks = (1, 10, 50, 200)
    hits, ndcg = ranking_hits(users, table, targets, history, ks=ks, chunk=chunk)
    scores = users.astype(np.float64) @ table.T.astype(np.float64)
    ties = 0
    for i in range(n):
        rank = reference_rank(scores[i], targets[i], history[i])
        ties += int((scores[i] == scores[i, targets[i]]).sum()) - 1
        assert hits[i].tolist() == [float(rank < k) for k in ks], i
        assert ndcg[i].tolist() == pytest.approx([1 / math.log2(rank + 2) if rank < k else 0.0 for k in ks]), i
    assert ties > n            # the data did exercise ties
    assert 0 < hits[:, 1].mean() < hits[:, 3].mean() < 1


def test_a_nan_target_ranks_last():
    table = np.array([[1.0], [np.nan], [2.0]], np.float32)
    hits, _ = ranking_hits(np.array([[1.0]]), table, np.array([1]), np.array([[2]]), ks=(1, 2))
    assert hits.tolist() == [[0.0, 1.0]]     # rank 1: item 2 is left out, item 0 is ahead


def test_arguments_are_checked():
    users, table = np.zeros((2, 3)), np.zeros((5, 3))
    with pytest.raises(ValueError, match="must share d"):
        ranking_hits(users, np.zeros((5, 4)), [0, 1], np.zeros((2, 1), np.int64))
    with pytest.raises(ValueError, match="a target outside the 5 items"):
        ranking_hits(users, table, [0, 5], np.zeros((2, 1), np.int64))
    with pytest.raises(ValueError, match="a history item outside"):
        ranking_hits(users, table, [0, 1], np.array([[0], [-2]]))
    with pytest.raises(ValueError, match=r"history \[n, L\]"):
        ranking_hits(users, table, [0, 1], np.zeros((3, 1), np.int64))
    with pytest.raises(ValueError, match="positive cut-offs"):
        ranking_hits(users, table, [0, 1], np.zeros((2, 1), np.int64), ks=(0,))
    with pytest.raises(ValueError, match=r"\[n, 3\]"):
        ranking_summary(np.zeros((2, 2)), np.zeros((2, 2)), (10, 50, 200))
    hits, ndcg = ranking_hits(np.zeros((0, 3)), table, [], np.zeros((0, 2), np.int64))
    assert hits.shape == (0, 3)
    assert math.isnan(ranking_summary(hits, ndcg)["hr@10"])
