"""Bags (multi-hot fields): ht.embedding_bag_op against a NumPy transcription of docs/design.md
section 3, its numerical gradient, and a single-hot field as a bag of one."""
import numpy as np
import pytest

import hetu as ht
from gradcheck import check_gradients

rng = np.random.default_rng(7)

# Two samples, bags of 3, 1 and 2 slots: an empty bag, a repeated id, a full bag, a bag of one.
IDS = np.array([[4, 4, 1, 0, -1, -1],
                [2, -1, -1, 5, 3, 5]], np.int64)
SLOTS = (3, 1, 2)


def pooled_by_numpy(table, ids, slots, mode):
    """[samples, bags, width]: each bag's rows (-1 skipped) summed in slot order, or their mean."""
    edges = np.concatenate([[0], np.cumsum(slots)])
    out = np.zeros((ids.shape[0], len(slots), table.shape[1]), np.float32)
    for s in range(ids.shape[0]):
        for k in range(len(slots)):
            bag = [i for i in ids[s, edges[k]:edges[k + 1]] if i >= 0]
            if not bag:
                continue
            acc = table[bag[0]].copy()
            for i in bag[1:]:
                acc += table[i]
            out[s, k] = acc / np.float32(len(bag)) if mode == "mean" and len(bag) > 1 else acc
    return out


def run(table, ids, slots, mode):
    t = ht.Variable("table", value=table)
    i = ht.Variable("ids", dtype=np.int64)
    return ht.Executor([ht.embedding_bag_op(t, i, slots, mode)]).run(
        feed_dict={i: ids}, convert_to_numpy_ret_vals=True)[0]


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bags_pool_as_the_rule_says(mode):
    table = rng.standard_normal((6, 5)).astype(np.float32)
    got = run(table, IDS, SLOTS, mode)
    np.testing.assert_array_equal(got, pooled_by_numpy(table, IDS, SLOTS, mode))
    assert not got[0, 2].any()   # sample 0's last bag is empty: zeros


def test_one_bag_of_all_slots_pools_to_samples_by_width():
    table = rng.standard_normal((6, 3)).astype(np.float32)
    got = run(table, IDS, None, "sum")
    assert got.shape == (2, 3)
    np.testing.assert_array_equal(got, pooled_by_numpy(table, IDS, (6,), "sum")[:, 0])


@pytest.mark.parametrize("slots", [SLOTS, None])
def test_no_samples_pool_to_an_empty_batch(slots):
    """A worker's part of the last validation batch can hold no sample."""
    table = rng.standard_normal((6, 1)).astype(np.float32)
    got = run(table, IDS[:0], slots, "sum")
    assert got.shape == ((0, len(SLOTS), 1) if slots else (0, 1))


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bag_gradient(mode):
    table = rng.standard_normal((6, 4)).astype(np.float32)
    check_gradients(lambda t, i: ht.embedding_bag_op(t, i, SLOTS, mode), [table, IDS], wrt=[0])


def test_bag_gradient_is_summed_per_id_as_one_row_per_filled_slot_would_be():
    table = ht.Variable("table", value=np.zeros((6, 2), np.float32))
    ids = ht.Variable("ids", dtype=np.int64)
    pooled = ht.embedding_bag_op(table, ids, SLOTS, "mean")
    (g,) = ht.gradients(ht.reduce_sum_op(pooled * 3.0), [table])
    val = ht.Executor([g]).run(feed_dict={ids: IDS})[0]
    # mean: each id of a bag of n gets 1/n of the bag's gradient, a repeated id once per
    # occurrence; the rows of one id are added in sample and slot order.
    per_slot = {4: [1, 1], 1: [1], 0: [3], 2: [3], 5: [3, 1.5], 3: [1.5]}
    assert list(val.indices.asnumpy()) == sorted(per_slot)
    for row, i in zip(val.values.asnumpy(), sorted(per_slot)):
        total = np.float32(0)
        for part in per_slot[i]:
            total += np.float32(part)
        assert (row == total).all(), (i, row, total)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_the_summed_bag_gradient_is_unique_sum_of_its_slot_rows_bit_for_bit(mode):
    """The C++ kernel never writes a row per slot; what it returns must be exactly what summing
    those rows (in sample and slot order) gives."""
    from hetu import _C
    slots = (5, 1, 7, 2)
    ids = (rng.zipf(1.3, size=(300, 15)) % 40).astype(np.int64)
    edges = np.concatenate([[0], np.cumsum(slots)])
    for k in range(len(slots)):
        length = rng.integers(0, slots[k] + 1, size=300)
        bag = ids[:, edges[k]:edges[k + 1]]
        bag[np.arange(slots[k])[None, :] >= length[:, None]] = -1
    g = rng.standard_normal((300, len(slots), 9)).astype(np.float32)
    slot_ids, slot_rows = [], []
    for s in range(300):
        for k in range(len(slots)):
            bag = [i for i in ids[s, edges[k]:edges[k + 1]] if i >= 0]
            for i in bag:
                slot_ids.append(i)
                slot_rows.append(g[s, k] / np.float32(len(bag)) if mode == "mean" and len(bag) > 1 else g[s, k])
    want_ids, want_rows = _C.unique_sum(np.array(slot_ids, np.int64), np.array(slot_rows, np.float32))
    got_ids, got_rows = _C.bag_gradient(ids, edges.astype(np.int64), mode == "mean", g)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_rows, want_rows)


def test_a_single_hot_field_is_a_bag_of_one():
    """Lookup and bags of one give the same rows, gradients and trained table, bit for bit."""
    table0 = rng.standard_normal((50, 8)).astype(np.float32)
    ids = rng.integers(0, 50, size=(16, 3)).astype(np.int64)

    def train(bagged):
        t = ht.Variable("t", value=table0.copy())
        i = ht.Variable("i", dtype=np.int64)
        rows = ht.embedding_bag_op(t, i, (1, 1, 1)) if bagged else ht.embedding_lookup_op(t, i)
        loss = ht.reduce_mean_op(ht.reduce_sum_op(ht.array_reshape_op(rows, (-1, 24)) * 1.5, [1]), [0])
        ex = ht.Executor([loss, ht.optim.AdamOptimizer(0.01).minimize(loss)], seed=0)
        for step in range(3):
            out = ex.run(feed_dict={i: np.roll(ids, step, axis=0)}, convert_to_numpy_ret_vals=True)
        return out[0], ex.parameters()["t"]

    loss_lookup, table_lookup = train(False)
    loss_bag, table_bag = train(True)
    assert loss_lookup == loss_bag
    np.testing.assert_array_equal(table_lookup, table_bag)


def test_bad_ids_and_shapes_are_named():
    table = rng.standard_normal((6, 2)).astype(np.float32)
    with pytest.raises(IndexError, match=r"EmbeddingBag_\d+: id 6 \(position 2\) outside the table of 6 rows"):
        run(table, np.array([[1, 2, 6]], np.int64), (3,), "sum")
    with pytest.raises(IndexError, match=r"id -2 .*outside the table of 6 rows"):
        run(table, np.array([[1, -2, 0]], np.int64), (3,), "sum")
    with pytest.raises(ht.ShapeError, match=r"bags of \[3, 1, 2\] slots need 6 id columns, got 5"):
        run(table, np.zeros((2, 5), np.int64), SLOTS, "sum")
    with pytest.raises(ValueError, match="bag mode 'max'"):
        ht.embedding_bag_op(ht.Variable("t", value=table), ht.Variable("i", dtype=np.int64), SLOTS, "max")
