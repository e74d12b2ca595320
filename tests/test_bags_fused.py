"""A bag's backward fused with the optimizer step (hetu._C.bag_gradient_step, what a table this
process owns is stepped by) against the unfused path (bag_gradient, unique_sum, apply_rows): the
same table, optimizer state and step counts, bit for bit, after several steps, for every
optimizer kind and storage type; and through the executor against a plain lookup's unfused step."""
import zlib

import numpy as np
import pytest

import hetu as ht
from hetu import _C
from hetu.optim import EMBEDDING_DTYPES, KINDS, config

ROWS, WIDTH, SAMPLES = 3000, 24, 200
SLOTS = (5, 1, 7, 2)
EDGES = np.concatenate([[0], np.cumsum(SLOTS)]).astype(np.int64)
# l2reg, and AdamW's decay, so that every term of every rule is exercised
SETTINGS = {"l2reg": 0.01, "weight_decay": 0.02, "momentum": 0.8, "beta1": 0.8, "beta2": 0.99}


def batches(seed, steps):
    """Bags of skewed ids (hot ids repeat within and across bags; long runs cross the threads'
    chunks), some slots empty, and their upstream gradients."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = (rng.zipf(1.2, size=(SAMPLES, EDGES[-1])) % ROWS).astype(np.int64)
        for k in range(len(SLOTS)):
            length = rng.integers(0, SLOTS[k] + 1, size=SAMPLES)
            bag = ids[:, EDGES[k]:EDGES[k + 1]]
            bag[np.arange(SLOTS[k])[None, :] >= length[:, None]] = -1
        out.append((ids, rng.standard_normal((SAMPLES, len(SLOTS), WIDTH)).astype(np.float32)))
    return out


def start(kind, dtype):
    """A table (rounded to its storage type), its optimizer state and step counts, and the config."""
    c = config(kind, **{k: v for k, v in SETTINGS.items() if k in KINDS[kind]["hyperparameters"]})
    c.storage = EMBEDDING_DTYPES[dtype]
    table = np.random.default_rng(1).standard_normal((ROWS, WIDTH)).astype(np.float32)
    _C.round_to_storage(table, c.storage)
    state = np.zeros(ROWS * _C.optim_state_width(c.kind, WIDTH), np.float32)
    return c, table, state, np.zeros(ROWS, np.int64)


@pytest.mark.parametrize("dtype", sorted(EMBEDDING_DTYPES))
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_the_fused_step_equals_sum_then_step_bit_for_bit(kind, dtype, mode):
    c, table, state, steps = start(kind, dtype)
    fused = [table.copy(), state.copy(), steps.copy()]
    for ids, g in batches(seed=zlib.crc32(f"{kind} {dtype} {mode}".encode()), steps=4):
        uniq, summed = _C.bag_gradient(ids, EDGES, mode == "mean", g)
        uniq, summed = _C.unique_sum(uniq, summed)   # what Optimizer.step_rows does with them
        _C.apply_rows(c, 0.05, table, state, steps, uniq, summed)
        assert _C.bag_gradient_step(ids, EDGES, mode == "mean", g, c, 0.05, *fused) is None
    np.testing.assert_array_equal(fused[0], table)
    np.testing.assert_array_equal(fused[1], state)
    np.testing.assert_array_equal(fused[2], steps)
    assert steps.any() and (fused[0] != np.random.default_rng(1).standard_normal((ROWS, WIDTH)).astype(np.float32)).any()


def test_a_bad_id_steps_nothing_and_is_named():
    c, table, state, steps = start("adam", "fp32")
    ids, g = batches(seed=3, steps=1)[0]
    ids[7, 3] = ROWS
    before = table.copy()
    assert _C.bag_gradient_step(ids, EDGES, False, g, c, 0.05, table, state, steps) == (7 * EDGES[-1] + 3, ROWS)
    np.testing.assert_array_equal(table, before)
    assert not steps.any()


@pytest.mark.parametrize("optimizer", [lambda: ht.optim.RowwiseAdaGradOptimizer(0.05, l2reg=0.01),
                                       lambda: ht.optim.AdamOptimizer(0.01, embedding_dtype="bf16"),
                                       lambda: ht.optim.SGDOptimizer(0.1)])
def test_an_executor_steps_bags_fused_as_a_lookup_steps_its_rows(optimizer):
    """Bags of one slot each pool as a lookup reads; both tables are stepped by the fused kernel,
    the bags' with -1 an empty slot, the lookup's as bags of one (tests/test_lookup_fused.py holds
    it against unique_sum and apply_rows): the trained tables are the same."""
    table0 = np.random.default_rng(2).standard_normal((ROWS, 8)).astype(np.float32)
    ids = (np.random.default_rng(3).zipf(1.3, size=(64, 4)) % ROWS).astype(np.int64)

    def train(bagged):
        t = ht.Variable("t", value=table0.copy())
        i = ht.Variable("i", dtype=np.int64)
        rows = ht.embedding_bag_op(t, i, (1, 1, 1, 1)) if bagged else ht.embedding_lookup_op(t, i)
        loss = ht.reduce_mean_op(ht.reduce_sum_op(ht.array_reshape_op(rows, (-1, 32)) * 1.5, [1]), [0])
        ex = ht.Executor([loss, optimizer().minimize(loss)], seed=0)
        for step in range(3):
            ex.run(feed_dict={i: np.roll(ids, step, axis=0)})
        return ex.parameters()["t"]

    np.testing.assert_array_equal(train(True), train(False))
