"""The sequence ops (hetu.ops.sequence) against PyTorch and finite differences, and per-sample
dropout masks that do not depend on the batch a sample is in."""
import numpy as np
import pytest

import hetu as ht
from gradcheck import check_gradients
from hetu.data.sequences import distinct_candidates

L, N, D = 4, 3, 5


def history_ids(rng, batch, items=7):
    """ids rows [inputs | targets | distinct negatives] with padding, a position without a target,
    and negatives equal to the target; the negatives' index [batch, L, N]; the negatives."""
    lengths = rng.integers(1, L + 1, batch)
    inputs = np.full((batch, L), -1, np.int64)
    targets = np.full((batch, L), -1, np.int64)
    for s, n in enumerate(lengths):
        seq = rng.integers(0, items, n + 1)
        inputs[s, :n] = seq[:n]
        targets[s, :n] = seq[1:]
    negatives = rng.integers(0, items, (batch, L, N))
    negatives[targets < 0] = -1
    negatives[0, 0, 0] = targets[0, 0]   # a negative that is the target: left out
    candidates, index = distinct_candidates(negatives, items)
    return np.concatenate([inputs, targets, candidates], axis=1), index, lengths, negatives


def torch_sampled_softmax(torch, user, rows, ids, index, neg_ids, temperature):
    F = torch.nn.functional
    b = user.shape[0]
    target_ids = ids[:, L:2 * L]
    target = F.normalize(rows[:, L:2 * L], dim=-1, eps=1e-6)
    candidates = F.normalize(rows[:, 2 * L:], dim=-1, eps=1e-6)
    negs = candidates[torch.arange(b)[:, None, None], index.clamp(min=0)]
    pos = (user * target).sum(-1, keepdim=True) / temperature
    neg = torch.einsum("bld,blnd->bln", user, negs) / temperature
    left_out = (neg_ids < 0) | (neg_ids == target_ids[..., None])
    neg = neg.masked_fill(left_out, float("-inf"))
    logits = torch.cat([pos, neg], dim=-1)
    loss = -torch.log_softmax(logits, dim=-1)[..., 0]
    return torch.where(target_ids >= 0, loss, torch.zeros_like(loss))


def test_sampled_softmax_against_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    ids, index, _, negatives = history_ids(rng, 6)
    user = rng.standard_normal((6, L, D)).astype(np.float32)
    user /= np.linalg.norm(user, axis=-1, keepdims=True)
    rows = rng.standard_normal((6, ids.shape[1], D)).astype(np.float32)
    u, r, i = ht.Variable("u", dtype=np.float32), ht.Variable("r", dtype=np.float32), ht.Variable("i", dtype=np.int64)
    x = ht.Variable("x", dtype=np.int64)
    loss = ht.sampled_softmax_loss_op(u, r, i, x, L, temperature=0.1)
    weights = rng.standard_normal((6, L)).astype(np.float32)
    total = ht.reduce_sum_op(loss * ht.Variable("w", value=weights, trainable=False))
    du, dr = ht.gradients(total, [u, r])
    out = ht.Executor([loss, du, dr]).run(feed_dict={u: user, r: rows, i: ids, x: index},
                                          convert_to_numpy_ret_vals=True)

    tu = torch.tensor(user, requires_grad=True)
    tr = torch.tensor(rows, requires_grad=True)
    ref = torch_sampled_softmax(torch, tu, tr, torch.tensor(ids), torch.tensor(index), torch.tensor(negatives), 0.1)
    (ref * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(out[0], ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[1], tu.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[2], tr.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert np.all(out[0][ids[:, L:2 * L] < 0] == 0)
    assert np.all(out[2][:, :L] == 0), "the inputs' columns get no gradient from the loss"


def test_sampled_softmax_finite_differences():
    rng = np.random.default_rng(1)
    ids, index, _, _ = history_ids(rng, 2)
    user = rng.standard_normal((2, L, D)).astype(np.float32)
    rows = rng.standard_normal((2, ids.shape[1], D)).astype(np.float32)
    check_gradients(lambda u, r, i, x: ht.sampled_softmax_loss_op(u, r, i, x, L, temperature=0.5),
                    [user, rows, ids, index], wrt=[0, 1], eps=1e-2, rtol=3e-2, atol=3e-3)


def test_last_valid_and_mask():
    rng = np.random.default_rng(2)
    ids, _, lengths, _ = history_ids(rng, 5)
    x = rng.standard_normal((5, L, D)).astype(np.float32)
    xv, iv = ht.Variable("x", dtype=np.float32), ht.Variable("ids", dtype=np.int64)
    last = ht.last_valid_op(xv, iv, L)
    mask = ht.sequence_mask_op(iv, L)
    (dx,) = ht.gradients(ht.reduce_sum_op(last), [xv])
    got_last, got_mask, got_dx = ht.Executor([last, mask, dx]).run(feed_dict={xv: x, iv: ids},
                                                                  convert_to_numpy_ret_vals=True)
    np.testing.assert_array_equal(got_last, x[np.arange(5), lengths - 1])
    np.testing.assert_array_equal(got_mask, (np.arange(L)[None] < lengths[:, None]).astype(np.float32))
    want = np.zeros_like(x)
    want[np.arange(5), lengths - 1] = 1
    np.testing.assert_array_equal(got_dx, want)


class RowsLoader(ht.Dataloader):
    """A loader whose batch is given rows of its data, as a worker's share of a global batch."""

    def __init__(self, data, rows):
        super().__init__(data, len(rows), "train", prefetch=0)
        self.rows = np.asarray(rows, np.int64)

    def indices(self, step):
        return self.rows


def test_per_sample_dropout_depends_on_the_sample_alone():
    data = np.ones((10, 12), np.float32)

    def masks(rows, seed=5):
        x = ht.dataloader_op([RowsLoader(data, rows)])
        dropped = ht.dropout_op(x, 0.5, per_sample=True, name="dropout")
        return ht.Executor({"train": [dropped]}, seed=seed).run("train", convert_to_numpy_ret_vals=True,
                                                                 training=True)[0]
    both = masks([3, 7])
    alone = masks([7])
    np.testing.assert_array_equal(both[1], alone[0])
    assert not np.array_equal(both[0], both[1]), "two samples draw different masks"
    assert not np.array_equal(masks([7], seed=6), alone), "another seed draws another mask"
    kept = (both != 0).mean()
    assert 0.2 < kept < 0.8
    assert set(np.unique(both)) <= {0.0, 2.0}


_CANDIDATES_DIGEST = """
import hashlib, numpy as np, hetu as ht
rng = np.random.default_rng(3)
user = rng.standard_normal((9, 7, 13)).astype(np.float32)
rows = rng.standard_normal((9, 4 + 21, 13)).astype(np.float32)
rows[0, 5] = 0   # a zero row: normalised by eps
index = rng.integers(-1, 21, (9, 7, 6))
out = np.empty(index.shape, np.float32)
ht._C.candidate_logits(user, rows, 4, index, out)
duser, drows = np.empty_like(user), np.full_like(rows, 7.0)
ht._C.candidate_logits_grad(rng.standard_normal(index.shape).astype(np.float32), user, rows, 4, index, duser, drows)
assert (drows[:, :4] == 7.0).all(), "the columns before the candidates are not written"
print(ht._C.num_threads(), hashlib.sha256(out.tobytes() + duser.tobytes() + drows.tobytes()).hexdigest())
"""


def test_candidate_kernels_give_the_same_bits_on_any_thread_count():
    """hetu's thread count is read once per process: a process per count."""
    import os
    import subprocess
    import sys
    digests = set()
    for threads in (1, 2, 3):
        env = dict(os.environ, HETU_NUM_THREADS=str(threads), OMP_NUM_THREADS="1")
        run = subprocess.run([sys.executable, "-c", _CANDIDATES_DIGEST], env=env, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        count, digest = run.stdout.split()
        assert int(count) == threads
        digests.add(digest)
    assert len(digests) == 1


def test_candidate_index_outside_the_candidates_is_refused():
    user = np.zeros((1, 2, 3), np.float32)
    rows = np.zeros((1, 5, 3), np.float32)
    out = np.empty((1, 2, 2), np.float32)
    with pytest.raises(ValueError, match="index 3 at flat position 2 is outside"):
        ht._C.candidate_logits(user, rows, 2, np.array([[[0, 1], [3, 0]]]), out)
    with pytest.raises(ValueError, match="takes user"):
        ht._C.candidate_logits(user, rows[:, :, :2], 2, np.zeros((1, 2, 2), np.int64), out)
