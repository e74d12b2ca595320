"""LinearOp (ht.layers.Linear's product, bias and ReLU as one op) against the unfused graph
(matmul_op, broadcastto_op, add_op, relu_op): the same forward values, gradients and trained
parameters bit for bit, and its gradients numerically."""
import numpy as np
import pytest

import hetu as ht
from gradcheck import check_gradients
from hetu import layers

WIDTHS = (13, 32, 16, 1)   # an MLP: 13 inputs, two ReLU layers, a logit


def initial_values(seed=0):
    """Each layer's weight and bias; biases away from zero so that they matter."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((w_in, w_out)).astype(np.float32) * np.float32(0.3),
             rng.standard_normal(w_out).astype(np.float32) * np.float32(0.1))
            for w_in, w_out in zip(WIDTHS[:-1], WIDTHS[1:])]


def unfused_linear(x, w, b, relu):
    product = ht.matmul_op(x, w)
    y = ht.add_op(product, ht.broadcastto_op(b, product))
    return ht.relu_op(y) if relu else y


def mlp(x, values, fused, last_activation=None):
    """The MLP's logit over x: its parameters Variables holding copies of `values`."""
    params = []
    for i, (w0, b0) in enumerate(values):
        w, b = ht.Variable(f"fc{i}_weight", value=w0.copy()), ht.Variable(f"fc{i}_bias", value=b0.copy())
        params += [w, b]
        relu = i < len(values) - 1
        if fused:
            layer = layers.Linear(1, 1, activation=ht.relu_op if relu else None, name=f"fc{i}")
            layer.weight, layer.bias = w, b
            x = layer(x)
        else:
            x = unfused_linear(x, w, b, relu)
    if last_activation is not None:
        x = last_activation(x)
    return x, params


def batch(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((64, WIDTHS[0])).astype(np.float32), (rng.random((64, 1)) < 0.3).astype(np.float32)


def test_the_layer_builds_one_op():
    x = ht.placeholder_op("x")
    out = layers.Linear(4, 3, activation=ht.relu_op)(x)
    assert type(out).__name__ == "LinearOp" and out.relu and out.has_bias
    assert type(layers.Linear(4, 3, activation=ht.sigmoid_op)(x)).__name__ == "SigmoidOp"
    assert len(layers.Linear(4, 3, bias=False)(x).inputs) == 2


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_trains_as_the_unfused_graph_bit_for_bit(optimizer):
    values = initial_values()
    outcomes = []
    for fused in (True, False):
        x, y = ht.placeholder_op("x"), ht.placeholder_op("y")
        logit, params = mlp(x, values, fused)
        loss = ht.reduce_mean_op(ht.binarycrossentropywithlogits_op(logit, y), [0])
        grads = ht.gradients(loss, params)
        opt = (ht.optim.SGDOptimizer(learning_rate=0.1) if optimizer == "sgd"
               else ht.optim.AdamOptimizer(learning_rate=0.01))
        train = opt.minimize(loss)
        ex = ht.Executor([logit, loss, *grads, train], seed=0)
        steps = []
        for step in range(4):
            xb, yb = batch(step)
            steps.append(ex.run(feed_dict={x: xb, y: yb}, convert_to_numpy_ret_vals=True)[:-1])
        outcomes.append((steps, ex.parameters()))
    (fused_steps, fused_params), (plain_steps, plain_params) = outcomes
    for fused_vals, plain_vals in zip(fused_steps, plain_steps):
        for a, b in zip(fused_vals, plain_vals):   # logit, loss, and every parameter's gradient
            assert np.array_equal(a, b)
    assert fused_params.keys() == plain_params.keys()
    for name in fused_params:
        assert np.array_equal(fused_params[name], plain_params[name]), name
    assert not np.array_equal(fused_params["fc0_weight"], initial_values()[0][0])   # it did train


def test_another_activation_follows_the_op():
    values = initial_values(1)
    xb, _ = batch(7)
    got = []
    for fused in (True, False):
        x = ht.placeholder_op("x")
        out, _ = mlp(x, values, fused, last_activation=ht.sigmoid_op)
        got.append(ht.Executor([out]).run(feed_dict={x: xb}, convert_to_numpy_ret_vals=True)[0])
    assert np.array_equal(got[0], got[1])


@pytest.mark.parametrize("bias,relu", [(True, True), (True, False), (False, True)])
def test_gradients_numerically(bias, relu):
    """Inputs whose pre-activations all sit 0.1 or more from ReLU's kink, which the differences would straddle."""
    for seed in range(100):
        rng = np.random.default_rng(seed)
        inputs = [rng.uniform(-1, 1, (5, 4)).astype(np.float32), rng.uniform(-1, 1, (4, 3)).astype(np.float32)]
        if bias:
            inputs.append(rng.uniform(-0.5, 0.5, 3).astype(np.float32))
        if np.abs(inputs[0] @ inputs[1] + (inputs[2] if bias else 0)).min() > 0.1:
            break
    check_gradients(lambda *v: ht.linear_op(v[0], v[1], v[2] if bias else None, relu=relu), inputs)


def test_shapes_are_checked_by_name():
    x, w = ht.Variable("x", value=np.ones((2, 3), np.float32)), ht.Variable("w", value=np.ones((4, 5), np.float32))
    with pytest.raises(Exception, match="w \\(4, 5\\)"):
        ht.Executor([ht.linear_op(x, w)]).run()


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_products_over_one_inner_element_are_each_element_rounded_once(ta, tb):
    # An outer product (a [batch, 1] gradient times a one-output layer's weight, transposed) is
    # not left to NumPy's slow loop; each element must still be the one float product the BLAS gives.
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1, 37) if ta else (37, 1)).astype(np.float32)
    b = rng.standard_normal((29, 1) if tb else (1, 29)).astype(np.float32)
    x, y = ht.Variable("a", value=a), ht.Variable("b", value=b)
    out, = ht.Executor([ht.matmul_op(x, y, trans_A=ta, trans_B=tb)], ctx=ht.cpu(0)).run(
        convert_to_numpy_ret_vals=True)
    exact = (a.astype(np.float64).reshape(-1, 1) * b.astype(np.float64).reshape(1, -1)).astype(np.float32)
    np.testing.assert_array_equal(out, exact)
    np.testing.assert_array_equal(out, np.matmul(np.ascontiguousarray(a.T if ta else a),
                                                 np.ascontiguousarray(b.T if tb else b)))
