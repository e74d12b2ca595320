"""Optimizer steps against their closed forms, dense and row-wise sparse; lr schedules."""
import numpy as np
import pytest

import hetu as ht

STEPS = 3


def reference_step(kind, w, g, state, t, lr, hp):
    """One step in float64, written from the textbook formulas."""
    g = g + hp.get("l2reg", 0.0) * w if kind != "adamw" else g
    if kind == "sgd":
        return w - lr * g
    if kind in ("momentum", "nesterov"):
        v = state.setdefault("v", np.zeros_like(w))
        v[...] = hp["momentum"] * v + g
        return w - lr * (g + hp["momentum"] * v if kind == "nesterov" else v)
    if kind == "adagrad":
        acc = state.setdefault("acc", np.zeros_like(w))
        acc += g * g
        return w - lr * g / (np.sqrt(acc) + hp["eps"])
    if kind == "rowwise_adagrad":   # one accumulator for the whole row
        acc = state.setdefault("acc", np.zeros(1))
        acc += np.mean(g * g)
        return w - lr * g / (np.sqrt(acc) + hp["eps"])
    m = state.setdefault("m", np.zeros_like(w))
    v = state.setdefault("v", np.zeros_like(w))
    if kind == "adamw":
        w = w - lr * hp["weight_decay"] * w
    m[...] = hp["beta1"] * m + (1 - hp["beta1"]) * g
    v[...] = hp["beta2"] * v + (1 - hp["beta2"]) * g * g
    mhat = m / (1 - hp["beta1"] ** t)
    vhat = v / (1 - hp["beta2"] ** t)
    return w - lr * mhat / (np.sqrt(vhat) + hp["eps"])


CASES = {
    "sgd": (lambda: ht.optim.SGDOptimizer(0.1, l2reg=0.01), {"l2reg": 0.01}),
    "momentum": (lambda: ht.optim.MomentumOptimizer(0.1, momentum=0.8), {"momentum": 0.8}),
    "nesterov": (lambda: ht.optim.MomentumOptimizer(0.1, momentum=0.8, nesterov=True), {"momentum": 0.8}),
    "adagrad": (lambda: ht.optim.AdaGradOptimizer(0.1, eps=1e-7), {"eps": 1e-7}),
    "adam": (lambda: ht.optim.AdamOptimizer(0.1, beta1=0.9, beta2=0.99, epsilon=1e-7),
             {"beta1": 0.9, "beta2": 0.99, "eps": 1e-7}),
    "adamw": (lambda: ht.optim.AdamWOptimizer(0.1, beta1=0.9, beta2=0.99, epsilon=1e-7, weight_decay=0.05),
              {"beta1": 0.9, "beta2": 0.99, "eps": 1e-7, "weight_decay": 0.05}),
    "rowwise_adagrad": (lambda: ht.optim.RowwiseAdaGradOptimizer(0.1, eps=1e-7, l2reg=0.01),
                        {"eps": 1e-7, "l2reg": 0.01}),
}
# The rule that steps dense tensors where it is not the optimizer's own (row-wise kinds).
DENSE_KIND = {"rowwise_adagrad": "adagrad"}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_dense_step_matches_closed_form(kind):
    make, hp = CASES[kind]
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((5, 3)).astype(np.float32)
    coef = rng.standard_normal((5, 3)).astype(np.float32)
    w = ht.Variable("w", value=w0)
    c = ht.Variable("c", value=coef, trainable=False)
    loss = ht.reduce_sum_op(ht.mul_op(w, c))  # d loss / d w = c
    ex = ht.Executor([make().minimize(loss)], seed=0)
    ref, state = w0.astype(np.float64), {}
    for t in range(1, STEPS + 1):
        ex.run()
        ref = reference_step(DENSE_KIND.get(kind, kind), ref, coef.astype(np.float64), state, t, 0.1, hp)
    np.testing.assert_allclose(ex.parameters()["w"], ref, rtol=1e-5, atol=1e-6)


def test_rowwise_adagrad_steps_dense_tensors_exactly_as_adagrad():
    """Row-wise AdaGrad's dense rule is AdaGrad's, bit for bit and with AdaGrad's state, while
    the table's rows keep one accumulator each and step differently."""
    rng = np.random.default_rng(2)
    w0, table0 = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((9, 4)).astype(np.float32)
    batch = np.array([2, 5, 2, 8], np.int64)
    x, wts = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)

    def train(optimizer):
        # Two terms: w's gradient does not depend on the table, which the two rules step apart.
        w, table = ht.Variable("w", value=w0), ht.Variable("table", value=table0)
        ids, feats = ht.Variable("ids", dtype=np.int64), ht.Variable("feats", dtype=np.float32)
        weights = ht.Variable("weights", dtype=np.float32)
        dense = ht.matmul_op(feats, w)
        loss = ht.add_op(ht.reduce_sum_op(ht.mul_op(dense, dense)),
                         ht.reduce_sum_op(ht.mul_op(ht.embedding_lookup_op(table, ids), weights)))
        train_op = optimizer.minimize(loss)
        ex = ht.Executor([train_op], seed=0)
        for _ in range(STEPS):
            ex.run(feed_dict={ids: batch, feats: x, weights: wts})
        return ex.parameters(), {p.name: ex.params.opt_states[p.id][0] for p in train_op.params}

    rowwise, rowwise_state = train(ht.optim.RowwiseAdaGradOptimizer(0.1, eps=1e-6, l2reg=0.01))
    adagrad, adagrad_state = train(ht.optim.AdaGradOptimizer(0.1, eps=1e-6, l2reg=0.01))
    assert np.array_equal(rowwise["w"].view(np.uint32), adagrad["w"].view(np.uint32))
    assert np.array_equal(rowwise_state["w"], adagrad_state["w"]) and rowwise_state["w"].size == w0.size
    assert rowwise_state["table"].shape == (9, 1) and adagrad_state["table"].shape == (9, 4)
    assert not np.allclose(rowwise["table"][batch], adagrad["table"][batch])


def test_a_rowwise_rule_is_refused_for_a_dense_tensor():
    from hetu import _C
    opt = ht.optim.RowwiseAdaGradOptimizer(0.1)
    w, g = np.ones(8, np.float32), np.ones(8, np.float32)
    with pytest.raises(ValueError, match="a row-wise optimizer steps embedding rows"):
        _C.apply_dense(opt.config, 0.1, w, np.zeros(1, np.float32), np.zeros(1, np.int64), g)
    opt.step_dense(0.1, w, np.zeros(opt.state_width(8, dense=True), np.float32), np.zeros(1, np.int64), g)
    np.testing.assert_allclose(w, 1 - 0.1 / (1 + 1e-7))


@pytest.mark.parametrize("kind", sorted(CASES))
def test_sparse_rows_step_matches_closed_form_and_leaves_other_rows(kind):
    make, hp = CASES[kind]
    rng = np.random.default_rng(1)
    table0 = rng.standard_normal((10, 4)).astype(np.float32)
    table = ht.Variable("table", value=table0)
    ids = ht.Variable("ids", dtype=np.int64)
    weights = ht.Variable("weights", dtype=np.float32)
    loss = ht.reduce_sum_op(ht.mul_op(ht.embedding_lookup_op(table, ids), weights))
    ex = ht.Executor([make().minimize(loss)], seed=0)
    batch = np.array([1, 4, 1, 7], np.int64)          # row 1 twice: its gradients are summed
    wts = rng.standard_normal((4, 4)).astype(np.float32)
    ref, states = table0.astype(np.float64), {}
    for t in range(1, STEPS + 1):
        ex.run(feed_dict={ids: batch, weights: wts})
        for row in np.unique(batch):
            g = wts[batch == row].astype(np.float64).sum(axis=0)
            ref[row] = reference_step(kind, ref[row], g, states.setdefault(row, {}), t, 0.1, hp)
    got = ex.parameters()["table"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    untouched = [r for r in range(10) if r not in batch]
    np.testing.assert_array_equal(got[untouched], table0[untouched])


def test_rows_count_their_own_adam_steps():
    """A row first touched at step 3 gets Adam's bias correction of its own first step."""
    table = ht.Variable("table", value=np.zeros((4, 2), np.float32))
    ids = ht.Variable("ids", dtype=np.int64)
    loss = ht.reduce_sum_op(ht.embedding_lookup_op(table, ids))
    ex = ht.Executor([ht.optim.AdamOptimizer(0.1).minimize(loss)])
    ex.run(feed_dict={ids: np.array([0], np.int64)})
    ex.run(feed_dict={ids: np.array([0], np.int64)})
    ex.run(feed_dict={ids: np.array([1], np.int64)})
    p = ex.parameters()["table"]
    # With a constant gradient, every Adam step moves by lr * 1/(1+eps) regardless of t.
    np.testing.assert_allclose(p[1], [-0.1, -0.1], rtol=1e-5)
    np.testing.assert_allclose(p[0], [-0.2, -0.2], rtol=1e-5)


def test_learning_rate_schedules():
    assert ht.lr.FixedScheduler(0.5).get(100) == 0.5
    step = ht.lr.StepScheduler(1.0, step_size=10, gamma=0.5)
    assert [step.get(t) for t in (0, 9, 10, 25)] == [1.0, 1.0, 0.5, 0.25]
    multi = ht.lr.MultiStepScheduler(1.0, milestones=[2, 5], gamma=0.1)
    assert [multi.get(t) for t in (0, 2, 4, 5)] == pytest.approx([1.0, 0.1, 0.1, 0.01])
    assert ht.lr.ExponentialScheduler(2.0, 0.5).get(3) == 0.25


def test_schedule_drives_the_optimizer():
    w = ht.Variable("w", value=np.zeros(1, np.float32))
    loss = ht.reduce_sum_op(w)   # gradient 1
    ex = ht.Executor([ht.optim.SGDOptimizer(ht.lr.StepScheduler(1.0, 1, 0.5)).minimize(loss)])
    for _ in range(3):
        ex.run()
    np.testing.assert_allclose(ex.parameters()["w"], [-(1 + 0.5 + 0.25)])


@pytest.mark.parametrize("ids", [
    np.array([5, 3, 5, 9], np.int64),                                     # tiny: comparison sort
    np.random.default_rng(0).zipf(1.3, 5000).astype(np.int64) % 300_000,  # skewed, as CTR ids
    np.random.default_rng(1).integers(0, 2**40, 3000),                    # range past three digits
    np.random.default_rng(2).integers(2**62, 2**62 + 2**30, 70_001),      # large ids, narrow range, odd count
], ids=["tiny", "zipf", "wide", "offset"])
def test_sparse_gradient_rows_are_summed_per_id_in_order(ids):
    # The sparse step's unique-and-sum: ascending ids, each id's rows added in occurrence order
    # (so the float sums are those of a sequential loop, whatever the sort does inside).
    from hetu import _C
    grads = np.random.default_rng(3).standard_normal((len(ids), 3)).astype(np.float32)
    uniq, summed = _C.unique_sum(ids, grads)
    want_ids = np.unique(ids)
    np.testing.assert_array_equal(uniq, want_ids)
    want = np.zeros((len(want_ids), 3), np.float32)
    for i, at in enumerate(np.searchsorted(want_ids, ids)):
        want[at] += grads[i]
    np.testing.assert_array_equal(summed, want)
