"""Every op family, forward and backward, on the GPU against the CPU's NumPy and C++ kernels on
the same inputs; the project's own device kernels (gather, unique-and-sum, fused losses,
optimizer steps) against their host twins. Skipped without CuPy and a GPU."""
import numpy as np
import pytest

import hetu as ht
from hetu import _C
from gpu_harness import requires_gpu, same_on_gpu

pytestmark = requires_gpu
rng = np.random.default_rng(3)


def f32(*shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape).astype(np.float32)


# --- math -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [ht.add_op, ht.minus_op, ht.mul_op, ht.div_op])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4))])
def test_binary_broadcast(op, shapes):
    same_on_gpu(op, [f32(*shapes[0]), f32(*shapes[1], low=0.5, high=2.0)])


def test_const_ops():
    same_on_gpu(lambda x: ht.addbyconst_op(x, 2.0) * 3.0 - x + ht.div_const_op(2.0, x) - (-x),
                [f32(3, 4, low=0.5, high=2.0)])


@pytest.mark.parametrize("fn", [ht.exp_op, ht.log_op, ht.sqrt_op, lambda x: ht.power_op(x, 3)])
def test_unary_math(fn):
    same_on_gpu(fn, [f32(5, 7, low=0.5, high=2.0)])


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul(ta, tb):
    a = f32(*((40, 30) if ta else (30, 40)))
    b = f32(*((50, 40) if tb else (40, 50)))
    # cuBLAS and the host's BLAS add the 40 products in different orders
    same_on_gpu(lambda x, y: ht.matmul_op(x, y, trans_A=ta, trans_B=tb), [a, b], atol=1e-5)


@pytest.mark.parametrize("axes,keepdims", [(None, False), (0, False), (1, True), ([0, 2], False)])
@pytest.mark.parametrize("fn", [ht.reduce_sum_op, ht.reduce_mean_op])
def test_reductions(fn, axes, keepdims):
    same_on_gpu(lambda x: fn(x, axes, keepdims=keepdims), [f32(4, 5, 6)])


def test_broadcasts_and_fan_in():
    same_on_gpu(lambda x, y: ht.broadcastto_op(y, x) * x + ht.broadcast_shape_op(y, (3, 4)) + x * x,
                [f32(3, 4), f32(4)])
    same_on_gpu(lambda x: ht.sum_op([x, x * 2.0, ht.exp_op(x)]), [f32(3, 4)])


# --- activations ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [ht.relu_op, lambda x: ht.leaky_relu_op(x, 0.1), ht.sigmoid_op, ht.tanh_op,
                                ht.gelu_op, ht.softmax_op])
def test_activations(fn):
    x = f32(16, 9)
    x = np.sign(x) * (np.abs(x) + 0.1)
    same_on_gpu(fn, [x.astype(np.float32)])


# --- shape ----------------------------------------------------------------------------------------
def test_shape_ops():
    same_on_gpu(lambda x, y: ht.concat_op(x, y, axis=1), [f32(3, 4), f32(3, 2)])
    same_on_gpu(lambda x: ht.array_reshape_op(x, (-1, 6)) * 2.0, [f32(4, 3, 2)])
    same_on_gpu(lambda x: ht.slice_op(x, (1, 0, 1), (2, -1, 2)), [f32(4, 3, 5)])
    same_on_gpu(lambda x: ht.transpose_op(x, (2, 0, 1)) * 1.0, [f32(2, 3, 4)])
    same_on_gpu(lambda c, a, b: ht.where_op(c, a, b), [(f32(3, 4) > 0).astype(np.float32), f32(3, 4), f32(3, 4)])
    same_on_gpu(lambda ids, x: ht.one_hot_op(ids, 5) * x, [np.array([0, 4, 2, 2], np.int64), f32(4, 5)])


# --- normalisation --------------------------------------------------------------------------------
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(training):
    scale, bias = ht.init.ones((4,), name="bn_scale"), ht.init.zeros((4,), name="bn_bias")
    same_on_gpu(lambda x: ht.batch_normalization_op(x, scale, bias), [f32(8, 4, 3)], rtol=1e-4, atol=1e-5,
                training=training)


def test_layer_norm_and_dropout():
    scale, bias = ht.init.ones((6,), name="ln_scale"), ht.init.zeros((6,), name="ln_bias")
    same_on_gpu(lambda x: ht.layer_normalization_op(x, scale, bias), [f32(5, 6)], rtol=1e-4, atol=1e-5)
    # The mask comes from the executor's seed, the op's name and the step: the same on both.
    def dropout(x):
        op = ht.dropout_op(x, 0.7)
        op.name = "dropout"   # the mask's stream is drawn from the name, the same in both graphs
        return op
    same_on_gpu(dropout, [f32(20, 30)], training=True)


# --- losses (fused kernels on the device) ---------------------------------------------------------
def test_losses():
    labels = (f32(64, 1) > 0).astype(np.float32)
    same_on_gpu(lambda x, y: ht.binarycrossentropywithlogits_op(x, y), [f32(64, 1, low=-30, high=30), labels])
    same_on_gpu(lambda p, y: ht.binarycrossentropy_op(p, y), [f32(64, 1, low=0.01, high=0.99), labels])
    soft = np.abs(f32(32, 10)) + 0.01
    soft = (soft / soft.sum(axis=1, keepdims=True)).astype(np.float32)
    same_on_gpu(lambda x, y: ht.softmaxcrossentropy_op(x, y), [f32(32, 10, low=-20, high=20), soft])
    classes = rng.integers(0, 10, size=32).astype(np.int64)
    classes[::5] = -1   # ignored
    same_on_gpu(lambda x, y: ht.softmaxcrossentropy_sparse_op(x, y), [f32(32, 10, low=-20, high=20), classes])


def test_sparse_softmax_label_out_of_range_is_named():
    x, y = ht.Variable("x", dtype=np.float32), ht.Variable("y", dtype=np.int64)
    loss = ht.softmaxcrossentropy_sparse_op(x, y)
    ex = ht.Executor([loss], ctx=ht.gpu(0))
    with pytest.raises(IndexError, match=r"label 12 \(row 2\) outside \[0, 10\)"):
        ex.run(feed_dict={x: f32(4, 10), y: np.array([1, 2, 12, 3], np.int64)})


# --- embedding: gather, sparse gradient, unique-and-sum --------------------------------------------
def test_embedding_lookup_and_sparse_gradient():
    table = ht.Variable("table", value=f32(50, 8))
    ids = rng.integers(0, 50, size=(16, 3)).astype(np.int64)
    ids[0, :] = 7   # repeated ids sum their rows

    def build(x, ids_in):
        return ht.embedding_lookup_op(table, ids_in) * ht.array_reshape_op(x, (16, 3, 1))
    same_on_gpu(build, [f32(16, 3), ids])


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bags_and_their_sparse_gradient(mode):
    """Bags of 3, 1 and 2 slots, each holding 0 to all of its slots (-1 after its ids), repeats
    allowed: pooled rows and the gradient summed per id as the host computes them."""
    from hetu.ops.embedding import Bags, DeviceRows
    import cupy as cp
    slots = (3, 1, 2)
    ids = rng.integers(0, 20, size=(32, 6)).astype(np.int64)
    for begin, size in ((0, 3), (3, 1), (4, 2)):
        length = rng.integers(0, size + 1, size=32)
        ids[:, begin:begin + size][np.arange(size)[None, :] >= length[:, None]] = -1
    table = ht.Variable("table", value=f32(20, 8))
    same_on_gpu(lambda x, i: ht.embedding_bag_op(table, i, slots, mode) * ht.array_reshape_op(x, (32, 3, 1)),
                [f32(32, 3), ids])
    # The device's rows per slot, summed per id on the device, against the host's summed kernel.
    bags, g = Bags(slots, mode), f32(32, 3, 8)
    host_ids, host_rows = bags.gradient(ids, g, 8)
    dev_ids, dev_rows = DeviceRows.sum_of(*bags.gradient(cp.asarray(ids), cp.asarray(g), 8)).exact()
    np.testing.assert_array_equal(cp.asnumpy(dev_ids), host_ids)
    np.testing.assert_allclose(cp.asnumpy(dev_rows), host_rows, rtol=1e-6, atol=1e-7)


def test_embedding_id_outside_table_is_named():
    table = ht.Variable("table", value=f32(10, 4))
    ids = ht.Variable("ids", dtype=np.int64)
    ex = ht.Executor([ht.embedding_lookup_op(table, ids)], ctx=ht.gpu(0))
    with pytest.raises(IndexError, match=r"id 10 \(position 3\) outside the table of 10 rows"):
        ex.run(feed_dict={ids: np.array([0, 1, 9, 10], np.int64)})


@pytest.mark.parametrize("n,width,distinct", [(1, 4, 1), (31, 5, 3), (33, 5, 40), (1000, 16, 37),
                                              (50000, 128, 20000), (70000, 3, 2)])
def test_unique_sum_equals_the_host_kernel_and_repeats_exactly(n, width, distinct):
    """The device's distinct ids are the host's; its sums equal the host's to float rounding
    (runs longer than 32 rows are added in pieces) and are the same bits run after run."""
    import cupy as cp
    from hetu.ops.embedding import DeviceRows
    ids = rng.integers(0, distinct, size=n).astype(np.int64) * 1_000_003 + 2**40   # ids beyond 2^32
    ids[: n // 3] = ids[0]   # one hot id with a long run across many pieces
    values = rng.standard_normal((n, width)).astype(np.float32)
    uniq, summed = _C.unique_sum(ids, values)
    first = DeviceRows.sum_of(cp.asarray(ids), cp.asarray(values)).exact()
    again = DeviceRows.sum_of(cp.asarray(ids), cp.asarray(values)).exact()
    np.testing.assert_array_equal(first[0].get(), uniq)
    np.testing.assert_allclose(first[1].get(), summed, rtol=1e-5, atol=1e-5 * np.sqrt(n))
    np.testing.assert_array_equal(first[1].get(), again[1].get())
    if n <= 32:   # one piece per run: the host's order of additions exactly
        np.testing.assert_array_equal(first[1].get(), summed)


# --- optimizer steps --------------------------------------------------------------------------------
OPTIMIZERS = {
    "sgd": lambda: ht.optim.SGDOptimizer(0.1, l2reg=0.01),
    "momentum": lambda: ht.optim.MomentumOptimizer(0.1, momentum=0.9, l2reg=0.01),
    "nesterov": lambda: ht.optim.MomentumOptimizer(0.1, momentum=0.9, nesterov=True),
    "adagrad": lambda: ht.optim.AdaGradOptimizer(0.1, eps=1e-7),
    "adam": lambda: ht.optim.AdamOptimizer(0.01, l2reg=0.001),
    "adamw": lambda: ht.optim.AdamWOptimizer(0.01, weight_decay=0.01),
    "rowwise_adagrad": lambda: ht.optim.RowwiseAdaGradOptimizer(0.1, eps=1e-7, l2reg=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_equal_the_host_rules(name):
    """Dense and row-wise steps on the device (compiled without fused multiply-adds) against the
    C++ rules of src/common/optim_rules.h: equal within a few ulp over several steps."""
    import cupy as cp
    from hetu.ops.embedding import IndexedSlices
    opt = OPTIMIZERS[name]()
    # dense
    w = f32(300, 7)
    state = np.zeros(opt.state_width(w.size, dense=True), np.float32)
    steps = np.zeros(1, np.int64)
    dw, dstate, dsteps = cp.asarray(w), cp.asarray(state), cp.asarray(steps)
    for _ in range(4):
        g = f32(300, 7)
        opt.step_dense(0.05, w, state, steps, g)
        opt.step_dense(0.05, dw, dstate, dsteps, cp.asarray(g))
    np.testing.assert_array_max_ulp(dw.get(), w, maxulp=4)
    np.testing.assert_array_max_ulp(dstate.get(), state, maxulp=4)
    assert dsteps.get()[0] == steps[0] == 4
    # row-wise, with repeated ids
    table = f32(40, 6)
    rstate = np.zeros((40, opt.state_width(6)), np.float32)
    rsteps = np.zeros(40, np.int64)
    dt, drs, drsteps = cp.asarray(table), cp.asarray(rstate), cp.asarray(rsteps)
    for _ in range(4):
        ids = rng.integers(0, 40, size=60).astype(np.int64)
        g = f32(60, 6)
        opt.step_rows(0.05, table, rstate, rsteps, IndexedSlices(ids, g, table.shape))
        opt.step_rows(0.05, dt, drs, drsteps, IndexedSlices(cp.asarray(ids), cp.asarray(g), table.shape))
    np.testing.assert_array_max_ulp(dt.get(), table, maxulp=4)
    np.testing.assert_array_max_ulp(drs.get(), rstate, maxulp=4)
    np.testing.assert_array_equal(drsteps.get(), rsteps)
