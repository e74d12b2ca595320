"""A single-id lookup's backward fused with the optimizer step (LookupGradient.step_into:
hetu._C.bag_gradient_step over bags of one slot, what a table this process owns is stepped by)
against the unfused path (unique_sum of the occurrences, apply_rows): the same table, optimizer
state and step counts, bit for bit, after several steps, for every optimizer kind and storage
type; a bad id; and through the executor against a lookup whose gradient is summed unfused."""
import zlib

import numpy as np
import pytest

import hetu as ht
from hetu import _C
from hetu.ops.embedding import EmbeddingLookupGradOp, LookupGradient
from hetu.optim import EMBEDDING_DTYPES, KINDS
from test_bags_fused import ROWS, WIDTH, start   # the same table, settings and state to start from

OCCURRENCES = 1500


def batches(seed, steps):
    """Skewed ids (hot ids repeat, long runs cross the threads' chunks) and their gradient rows."""
    rng = np.random.default_rng(seed)
    return [((rng.zipf(1.2, size=OCCURRENCES) % ROWS).astype(np.int64),
             rng.standard_normal((OCCURRENCES, WIDTH)).astype(np.float32)) for _ in range(steps)]


@pytest.mark.parametrize("dtype", sorted(EMBEDDING_DTYPES))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_fused_step_equals_unique_sum_then_step_bit_for_bit(kind, dtype):
    c, table, state, steps = start(kind, dtype)
    fused = [table.copy(), state.copy(), steps.copy()]
    for ids, g in batches(seed=zlib.crc32(f"{kind} {dtype}".encode()), steps=4):
        _C.apply_rows(c, 0.05, table, state, steps, *_C.unique_sum(ids, g))
        LookupGradient(ids, g, (ROWS, WIDTH)).step_into("lookup", c, 0.05, *fused)
    np.testing.assert_array_equal(fused[0], table)
    np.testing.assert_array_equal(fused[1], state)
    np.testing.assert_array_equal(fused[2], steps)
    assert steps.any() and (fused[0] != np.random.default_rng(1).standard_normal((ROWS, WIDTH)).astype(np.float32)).any()


def test_distinct_ascending_ids_step_as_unique_sum_copies_them():
    """unique_sum's shortcut (ids already distinct and ascending: each sum is 0 + its row, -0
    becomes +0) and the fused sum agree."""
    c, table, state, steps = start("adam", "fp32")
    fused = [table.copy(), state.copy(), steps.copy()]
    ids = np.arange(0, ROWS, 3, dtype=np.int64)
    g = np.random.default_rng(4).standard_normal((ids.size, WIDTH)).astype(np.float32)
    g[::5] = -0.0
    _C.apply_rows(c, 0.05, table, state, steps, *_C.unique_sum(ids, g))
    LookupGradient(ids, g, (ROWS, WIDTH)).step_into("lookup", c, 0.05, *fused)
    for a, b in zip(fused, (table, state, steps)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad_id", [ROWS, -1, -7])
def test_a_bad_id_steps_nothing_and_is_named(bad_id):
    """-1 is an empty slot in a bag, but a bad id in a lookup."""
    c, table, state, steps = start("adam", "fp32")
    ids, g = batches(seed=3, steps=1)[0]
    ids[11] = bad_id
    before = table.copy()
    with pytest.raises(IndexError, match=rf"emb_lookup: id {bad_id} \(position 11\) outside the table of {ROWS} rows"):
        LookupGradient(ids, g, (ROWS, WIDTH)).step_into("emb_lookup", c, 0.05, table, state, steps)
    np.testing.assert_array_equal(table, before)
    assert not steps.any()


@pytest.mark.parametrize("optimizer", [lambda: ht.optim.AdamOptimizer(0.01, embedding_dtype="bf16"),
                                       lambda: ht.optim.RowwiseAdaGradOptimizer(0.05, l2reg=0.01),
                                       lambda: ht.optim.SGDOptimizer(0.1)])
def test_an_executor_steps_a_lookup_fused_as_the_unfused_sum_steps_it(optimizer):
    """One lookup of all the ids (its gradient a LookupGradient, stepped fused) against two lookups
    of the samples' halves (their gradients concatenated by the fan-in, a plain IndexedSlices,
    stepped through unique_sum and apply_rows: the occurrences in the same order): the trained
    tables are the same."""
    table0 = np.random.default_rng(2).standard_normal((ROWS, 8)).astype(np.float32)
    ids = (np.random.default_rng(3).zipf(1.3, size=(64, 4)) % ROWS).astype(np.int64)

    def train(fused):
        t = ht.Variable("t", value=table0.copy())
        i = ht.Variable("i", dtype=np.int64)
        if fused:
            rows = ht.embedding_lookup_op(t, i)
        else:
            head = ht.slice_op(i, (0, 0), (32, 4))
            tail = ht.slice_op(i, (32, 0), (32, 4))
            rows = ht.concat_op(ht.embedding_lookup_op(t, head), ht.embedding_lookup_op(t, tail), axis=0)
        loss = ht.reduce_mean_op(ht.reduce_sum_op(ht.array_reshape_op(rows, (-1, 32)) * 1.5, [1]), [0])
        ex = ht.Executor([loss, optimizer().minimize(loss)], seed=0)
        for step in range(3):
            ex.run(feed_dict={i: np.roll(ids, step, axis=0)})
        return ex.parameters()["t"]

    fused = train(True)
    np.testing.assert_array_equal(fused, train(False))
    assert (fused != table0).any()


def test_a_lookup_gradient_on_the_host_is_read_as_its_occurrences():
    """The servers, the cache and a fan-in read the occurrences (ids repeated, in order), not sums."""
    t = ht.Variable("t", value=np.zeros((10, 2), np.float32))
    op = EmbeddingLookupGradOp(ht.Variable("g"), ht.Variable("i", dtype=np.int64), t)
    ids = np.array([[3, 1], [3, 7]], np.int64)
    g = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    grad = op.compute([g, ids], None)
    assert isinstance(grad, LookupGradient)
    np.testing.assert_array_equal(grad.indices, [3, 1, 3, 7])
    np.testing.assert_array_equal(grad.values, g.reshape(4, 2))
