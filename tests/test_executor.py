"""Executor behaviour: compile-time checks, feeding, errors, save/load, initializers, layers."""
import os

import numpy as np
import pytest

import hetu as ht
from hetu import _C


def small_model(seed_name=""):
    x = ht.Variable("x")
    y = ht.Variable("y")
    w = ht.init.random_normal((4, 3), stddev=0.1, name=f"w{seed_name}")
    h = ht.relu_op(ht.matmul_op(x, w))
    v = ht.init.xavier_uniform((3, 1), name=f"v{seed_name}")
    logit = ht.matmul_op(h, v)
    loss = ht.reduce_mean_op(ht.binarycrossentropywithlogits_op(logit, y), [0])
    return x, y, loss


def batch(seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((16, 4)).astype(np.float32)
    return X, (X[:, :1] > 0).astype(np.float32)


def test_shape_mismatch_at_compile_time_names_ops_and_shapes():
    a = ht.init.zeros((4, 3), name="a")
    b = ht.init.zeros((5, 2), name="b")
    with pytest.raises(ht.ShapeError, match=r"MatMul_\d+: inner dimensions differ: a \(4, 3\) and b \(5, 2\)"):
        ht.Executor([ht.matmul_op(a, b)])


def test_broadcast_mismatch_names_both():
    a = ht.init.zeros((4, 3), name="a")
    b = ht.init.zeros((4, 2), name="b")
    with pytest.raises(ht.ShapeError, match=r"cannot broadcast a of shape \(4, 3\) with b of shape \(4, 2\)"):
        ht.Executor([a + b])


def test_wrong_dtype_fed_names_placeholder():
    ids = ht.Variable("user_ids", dtype=np.int64)
    table = ht.init.zeros((10, 2), name="table")
    ex = ht.Executor([ht.embedding_lookup_op(table, ids)])
    with pytest.raises(TypeError, match="placeholder user_ids expects int64 values, was fed float32"):
        ex.run(feed_dict={ids: np.array([1.0, 2.0], np.float32)})


def test_unfed_placeholder_is_named():
    x, y, loss = small_model()
    ex = ht.Executor([loss])
    with pytest.raises(ValueError, match="placeholder y .* was not fed"):
        ex.run(feed_dict={x: batch(0)[0]})


def test_nan_loss_stops_with_iteration():
    x, y, loss = small_model()
    ex = ht.Executor([loss, ht.optim.SGDOptimizer(0.1).minimize(loss)], seed=0)
    X, Y = batch(0)
    ex.run(feed_dict={x: X, y: Y})
    before = ex.parameters()
    X[3, 1] = np.nan
    with pytest.raises(FloatingPointError, match="at iteration 1"):
        ex.run(feed_dict={x: X, y: Y})
    for name, value in ex.parameters().items():
        np.testing.assert_array_equal(value, before[name])  # no update applied


def test_duplicate_parameter_names_rejected():
    a = ht.init.zeros((2,), name="same")
    b = ht.init.ones((2,), name="same")
    with pytest.raises(ValueError, match="two parameters are named 'same'"):
        ht.Executor([a + b])


def test_initializers_are_reproducible_and_sliceable():
    init = ht.init.random_normal((100, 8), mean=0.5, stddev=2.0, name="t").initializer
    stream = _C.name_stream("t")
    whole = init.value(7, stream)
    np.testing.assert_array_equal(whole, init.value(7, stream))
    assert not np.array_equal(whole, init.value(8, stream))
    np.testing.assert_array_equal(init.fill(7, stream, 30, 55), whole[30:55])
    assert abs(whole.mean() - 0.5) < 0.2 and abs(whole.std() - 2.0) < 0.2
    trunc = ht.init.truncated_normal((1000, 4), stddev=1.0, name="tn").initializer.value(1, 5)
    assert np.abs(trunc).max() <= 2.0
    uni = ht.init.random_uniform((1000,), -3, -1, name="u").initializer.value(1, 5)
    assert uni.min() >= -3 and uni.max() <= -1
    lim = np.sqrt(6 / (30 + 20))
    xav = ht.init.xavier_uniform((30, 20), name="xa").initializer.value(1, 5)
    assert np.abs(xav).max() <= lim and np.abs(xav).max() > 0.9 * lim


def test_same_seed_same_parameters_different_seed_different():
    def params(seed):
        x, y, loss = small_model()
        return ht.Executor([loss], seed=seed).parameters()
    a, b, c = params(1), params(1), params(2)
    np.testing.assert_array_equal(a["w"], b["w"])
    assert not np.array_equal(a["w"], c["w"])


def test_save_load_round_trip_continues_identically(tmp_path):
    def train(ex, x, y, steps, start):
        for i in range(steps):
            X, Y = batch(start + i)
            ex.run(feed_dict={x: X, y: Y})

    x, y, loss = small_model()
    ex = ht.Executor([loss, ht.optim.AdamOptimizer(0.05).minimize(loss)], seed=3)
    train(ex, x, y, 4, 0)
    ex.save(str(tmp_path / "ckpt"))
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]   # no temporary folder left behind
    train(ex, x, y, 4, 4)
    expected = ex.parameters()

    x2, y2, loss2 = small_model()
    ex2 = ht.Executor([loss2, ht.optim.AdamOptimizer(0.05).minimize(loss2)], seed=99)
    ex2.load(str(tmp_path / "ckpt"))
    train(ex2, x2, y2, 4, 4)
    for name, value in expected.items():
        np.testing.assert_array_equal(ex2.parameters()[name], value)


def test_load_rejects_missing_checkpoint(tmp_path):
    x, y, loss = small_model()
    with pytest.raises(FileNotFoundError, match="not a hetu checkpoint"):
        ht.Executor([loss]).load(str(tmp_path))


def test_outputs_are_copies_not_reused_buffers():
    x = ht.Variable("x")
    out = ht.relu_op(x)
    ex = ht.Executor([out])
    first = ex.run(feed_dict={x: np.ones((2, 2), np.float32)}, convert_to_numpy_ret_vals=True)[0]
    ex.run(feed_dict={x: np.full((2, 2), 5, np.float32)})
    np.testing.assert_array_equal(first, np.ones((2, 2)))


def test_layers_compute_what_they_say():
    x = ht.Variable("x")
    lin = ht.layers.Linear(3, 2, name="lin")
    seq = ht.layers.Sequence(lin, ht.layers.Relu(), ht.layers.Identity())
    ex = ht.Executor([seq(x)], seed=0)
    X = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    got = ex.run(feed_dict={x: X}, convert_to_numpy_ret_vals=True)[0]
    p = ex.parameters()
    np.testing.assert_allclose(got, np.maximum(X @ p["lin_weight"] + p["lin_bias"], 0), rtol=1e-5)

    a, b = ht.Variable("a"), ht.Variable("b")
    cat = ht.layers.Concatenate(axis=1)(a, b)
    total = ht.layers.Sum()(a, a)
    resh = ht.layers.Reshape((-1,))(a)
    ex = ht.Executor([cat, total, resh])
    A, B = np.ones((2, 2), np.float32), np.zeros((2, 1), np.float32)
    c, t, r = ex.run(feed_dict={a: A, b: B}, convert_to_numpy_ret_vals=True)
    assert c.shape == (2, 3) and np.all(t == 2) and r.shape == (4,)


def test_batchnorm_layer_uses_running_stats_in_inference():
    x = ht.Variable("x")
    bn = ht.layers.BatchNorm(2, momentum=0.0, name="bn")
    out = bn(x)
    loss = ht.reduce_sum_op(out)
    ex = ht.Executor({"train": [out, ht.optim.SGDOptimizer(0.0).minimize(loss)], "eval": [out]})
    X = np.array([[1, 10], [3, 30]], np.float32)
    train_out = ex.run("train", feed_dict={x: X}, convert_to_numpy_ret_vals=True)[0]
    np.testing.assert_allclose(train_out.mean(axis=0), 0, atol=1e-5)
    eval_out = ex.run("eval", feed_dict={x: X}, convert_to_numpy_ret_vals=True)[0]
    np.testing.assert_allclose(eval_out, train_out, rtol=1e-4, atol=1e-4)  # momentum 0: running = batch


def test_dataloader_order_slicing_and_shuffle():
    data = np.arange(40, dtype=np.int64).reshape(20, 2)
    d = ht.Dataloader(data, 4, "train")
    assert d.batch_num == 5
    np.testing.assert_array_equal(d.next_batch(), data[0:4])
    np.testing.assert_array_equal(d.next_batch(), data[4:8])
    w1 = ht.Dataloader(data, 3, "train")
    w1.set_worker(1, 2)                       # global batch 6, worker 1 takes samples 3..5
    assert w1.batch_num == 3
    np.testing.assert_array_equal(w1.next_batch(), data[3:6])
    np.testing.assert_array_equal(w1.next_batch(), data[9:12])
    s1 = ht.Dataloader(data, 5, "train", shuffle=True, seed=4)
    s2 = ht.Dataloader(data, 5, "train", shuffle=True, seed=4)
    got = np.concatenate([s1.next_batch() for _ in range(4)])
    np.testing.assert_array_equal(got, np.concatenate([s2.next_batch() for _ in range(4)]))
    assert sorted(got[:, 0]) == list(range(0, 40, 2)) and not np.array_equal(got, data)
    # An epoch's order is drawn once and shared by loaders with the same seed (the dense, sparse
    # and label loaders), read-only; the next epoch draws a different one.
    assert s1.epoch_order(0) is s2.epoch_order(0) and not s1.epoch_order(0).flags.writeable
    assert not np.array_equal(s1.epoch_order(0), s1.epoch_order(1))
    np.testing.assert_array_equal(s1.epoch_order(1), np.random.default_rng([4, 1]).permutation(len(data)))


def test_dataloader_op_feeds_each_subgraph():
    train = np.arange(12, dtype=np.float32).reshape(6, 2)
    val = -np.arange(4, dtype=np.float32).reshape(2, 2)
    x = ht.dataloader_op([[train, 2, "train"], [val, 2, "validate"]])
    out = ht.relu_op(x) + x
    ex = ht.Executor({"train": [out], "validate": [out]})
    assert ex.get_batch_num("train") == 3 and ex.get_batch_num("validate") == 1
    np.testing.assert_array_equal(ex.run("train", convert_to_numpy_ret_vals=True)[0], 2 * train[:2])
    np.testing.assert_array_equal(ex.run("validate", convert_to_numpy_ret_vals=True)[0], val[:2])
    np.testing.assert_array_equal(ex.run("train", convert_to_numpy_ret_vals=True)[0], 2 * train[2:4])
