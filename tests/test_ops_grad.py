"""A numerical gradient check for every op with a gradient."""
import numpy as np
import pytest

import hetu as ht
from gradcheck import check_gradients

rng = np.random.default_rng(42)


def f32(*shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape).astype(np.float32)


def away_from_zero(*shape):
    x = f32(*shape)
    return (np.sign(x) * (np.abs(x) + 0.2)).astype(np.float32)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul(ta, tb):
    a = f32(*((4, 3) if ta else (3, 4)))
    b = f32(*((5, 4) if tb else (4, 5)))
    check_gradients(lambda x, y: ht.matmul_op(x, y, trans_A=ta, trans_B=tb), [a, b])


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, True)])
def test_matmul_of_stacks(ta, tb):
    a = f32(*((2, 4, 3) if ta else (2, 3, 4)))
    b = f32(*((2, 5, 4) if tb else (2, 4, 5)))
    check_gradients(lambda x, y: ht.matmul_op(x, y, trans_A=ta, trans_B=tb), [a, b])


def test_lower_triangle_is_dlrms_pairs():
    x = f32(3, 4, 4)
    got = ht.Executor([ht.lower_triangle_op(ht.Variable("x", value=x))]).run(convert_to_numpy_ret_vals=True)[0]
    want = np.stack([[m[i, j] for i in range(4) for j in range(i)] for m in x])
    np.testing.assert_array_equal(got, want)
    check_gradients(lambda v: ht.lower_triangle_op(ht.matmul_op(v, v, trans_B=True)), [f32(2, 5, 3)])


@pytest.mark.parametrize("op", [ht.add_op, ht.minus_op, ht.mul_op])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4))])
def test_binary_broadcast(op, shapes):
    check_gradients(op, [f32(*shapes[0]), f32(*shapes[1])])


def test_div():
    check_gradients(ht.div_op, [f32(3, 4), f32(3, 4, low=0.5, high=2.0)])


def test_const_ops_and_overloads():
    check_gradients(lambda x: ht.addbyconst_op(x, 2.0) * 3.0 - x, [f32(3, 4)])
    check_gradients(lambda x: ht.div_const_op(2.0, x), [f32(3, 4, low=0.5, high=2.0)])
    check_gradients(lambda x, y: -(x / y) + 1.0 - (2.0 * x), [f32(2, 3), f32(2, 3, low=0.5, high=2)])
    check_gradients(lambda x: 1.0 / x, [f32(2, 3, low=0.5, high=2)])


@pytest.mark.parametrize("fn", [ht.exp_op, ht.log_op, ht.sqrt_op, lambda x: ht.power_op(x, 3)])
def test_unary_math(fn):
    check_gradients(fn, [f32(3, 4, low=0.5, high=2.0)])


@pytest.mark.parametrize("fn", [ht.relu_op, lambda x: ht.leaky_relu_op(x, 0.1), ht.sigmoid_op, ht.tanh_op,
                                ht.gelu_op, ht.softmax_op])
def test_activations(fn):
    check_gradients(fn, [away_from_zero(3, 5)])


@pytest.mark.parametrize("axes,keepdims", [(None, False), (0, False), (1, True), ([0, 2], False)])
@pytest.mark.parametrize("fn", [ht.reduce_sum_op, ht.reduce_mean_op])
def test_reductions(fn, axes, keepdims):
    check_gradients(lambda x: fn(x, axes, keepdims=keepdims), [f32(2, 3, 4)])


def test_broadcasts():
    check_gradients(lambda x, y: ht.broadcastto_op(x, y) * y, [f32(4), f32(3, 4)])
    check_gradients(lambda x: ht.broadcast_shape_op(x, (2, 3, 4)), [f32(3, 1)])


def test_shape_ops():
    check_gradients(lambda x, y: ht.concat_op(x, y, axis=1), [f32(3, 2), f32(3, 4)])
    check_gradients(lambda x, y, z: ht.concatenate_op([x, y, z], axis=0), [f32(1, 3), f32(2, 3), f32(2, 3)])
    check_gradients(lambda x: ht.array_reshape_op(x, (-1, 6)), [f32(2, 3, 2)])
    check_gradients(lambda x: ht.slice_op(x, (1, 0), (2, -1)), [f32(4, 3)])
    check_gradients(lambda x: ht.transpose_op(x, (1, 2, 0)), [f32(2, 3, 4)])
    check_gradients(lambda x: ht.transpose_op(x), [f32(2, 3)])


def test_slices_of_one_input_sum_their_gradients_in_one_buffer():
    """The gradient of several slices of one x (disjoint, overlapping, one axis and two) is one
    SlicesGradOp, numerically right and with the bits of the SliceGradOps summed by a SumOp."""
    from hetu.ops.shape import SliceGradOp, SlicesGradOp
    slices = [((0, 0, 0), (-1, -1, 3)), ((0, 0, 3), (-1, -1, 2)), ((0, 1, 2), (-1, 2, 4)), ((1, 0, 0), (1, -1, 8))]

    def f(x):
        parts = [ht.slice_op(x, b, n) for b, n in slices]
        return ht.sum_op([ht.reduce_sum_op(p * p, axes=[0, 1, 2]) for p in parts])
    check_gradients(f, [f32(2, 3, 8)])
    x = ht.Variable("x", value=f32(2, 3, 8) - np.float32(0.5))
    parts = [ht.slice_op(x, b, n) for b, n in slices]
    loss = ht.sum_op([ht.reduce_sum_op(p * p * p, axes=[0, 1, 2]) for p in parts])
    (grad,) = ht.gradients(loss, [x])
    assert isinstance(grad, SlicesGradOp)
    separate = ht.sum_op([SliceGradOp(g, x, fwd) for g, fwd in zip(grad.inputs[:-1], grad.fwds)])
    got, want = ht.Executor([grad, separate]).run(convert_to_numpy_ret_vals=True)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_where():
    cond = (rng.uniform(size=(3, 4)) > 0.5).astype(np.float32)
    check_gradients(lambda c, a, b: ht.where_op(c, a, b), [cond, f32(3, 4), f32(3, 4)], wrt=[1, 2])


def test_embedding_lookup_sparse_gradient_sums_duplicates():
    table = f32(6, 3)
    ids = np.array([[0, 2], [2, 5], [0, 0]], dtype=np.int64)
    check_gradients(lambda t, i: ht.embedding_lookup_op(t, i), [table, ids], wrt=[0])


def test_embedding_gradient_is_sparse():
    table = ht.Variable("table", value=np.zeros((1000, 4), np.float32))
    ids = ht.Variable("ids", dtype=np.int64)
    loss = ht.reduce_sum_op(ht.embedding_lookup_op(table, ids))
    (g,) = ht.gradients(loss, [table])
    assert getattr(g, "produces_sparse", False)
    ex = ht.Executor([g])
    val = ex.run(feed_dict={ids: np.array([3, 3, 7], np.int64)})[0]
    assert val.values.shape == (3, 4) and list(val.indices.asnumpy()) == [3, 3, 7]


def test_embedding_id_out_of_range_names_op_and_size():
    table = ht.Variable("table", value=np.zeros((10, 2), np.float32))
    ids = ht.Variable("ids", dtype=np.int64)
    out = ht.embedding_lookup_op(table, ids)
    ex = ht.Executor([out])
    with pytest.raises(IndexError, match=r"EmbeddingLookup_\d+: id 12 .*10 rows"):
        ex.run(feed_dict={ids: np.array([1, 12], np.int64)})


def test_losses():
    p = f32(4, 1, low=0.1, high=0.9)
    y = (rng.uniform(size=(4, 1)) > 0.5).astype(np.float32)
    check_gradients(ht.binarycrossentropy_op, [p, y], wrt=[0])
    check_gradients(ht.binarycrossentropywithlogits_op, [f32(4, 1, low=-3, high=3), y], wrt=[0])
    onehot = np.eye(5, dtype=np.float32)[[0, 3, 1, 4]]
    check_gradients(ht.softmaxcrossentropy_op, [f32(4, 5), onehot], wrt=[0])
    labels = np.array([0, 3, 1, 4], np.int64)
    check_gradients(ht.softmaxcrossentropy_sparse_op, [f32(4, 5), labels], wrt=[0])


def test_bce_with_logits_is_finite_for_large_logits():
    x = ht.Variable("x")
    y = ht.Variable("y")
    ex = ht.Executor([ht.binarycrossentropywithlogits_op(x, y)])
    out = ex.run(feed_dict={x: np.array([[1000.0], [-1000.0]], np.float32), y: np.array([[0.0], [1.0]], np.float32)},
                 convert_to_numpy_ret_vals=True)[0]
    np.testing.assert_allclose(out, [[1000.0], [1000.0]])


@pytest.mark.parametrize("training", [True, False])
def test_norms(training):
    check_gradients(lambda x, s, b: ht.batch_normalization_op(x, s, b, eps=0.01),
                    [f32(6, 3), f32(3, low=0.5, high=1.5), f32(3)], rtol=5e-2, atol=5e-3, training=training)
    check_gradients(lambda x, s, b: ht.layer_normalization_op(x, s, b, eps=0.01),
                    [f32(4, 5), f32(5, low=0.5, high=1.5), f32(5)], rtol=5e-2, atol=5e-3)


def test_one_hot_values():
    x = ht.Variable("x", dtype=np.int64)
    ex = ht.Executor([ht.one_hot_op(x, 4)])
    out = ex.run(feed_dict={x: np.array([2, 0], np.int64)}, convert_to_numpy_ret_vals=True)[0]
    np.testing.assert_array_equal(out, np.eye(4, dtype=np.float32)[[2, 0]])


def test_dropout_seeded_and_gradient_uses_mask():
    x = ht.Variable("x")
    w = ht.Variable("w", value=np.ones((1, 8), np.float32))
    y = ht.dropout_op(ht.mul_op(x, w), 0.5)
    loss = ht.reduce_sum_op(y)
    train = ht.optim.SGDOptimizer(1.0).minimize(loss)
    ex = ht.Executor([y, train], seed=3)
    ones = np.ones((1, 8), np.float32)
    out = ex.run(feed_dict={x: ones}, convert_to_numpy_ret_vals=True)[0]
    assert set(np.unique(out)) <= {0.0, 2.0}
    # d loss / d w = x * mask / keep: the update is exactly the forward output.
    np.testing.assert_allclose(ex.parameters()["w"], 1.0 - out)
    ex2 = ht.Executor([y, train], seed=3)
    np.testing.assert_array_equal(ex2.run(feed_dict={x: ones}, convert_to_numpy_ret_vals=True)[0], out)
