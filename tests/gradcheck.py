"""Numerical gradient checking shared by the op tests."""
import numpy as np

import hetu as ht
from hetu.autodiff import SparseToDenseOp


def check_gradients(build, inputs, wrt=None, eps=1e-2, rtol=2e-2, atol=2e-3, seed=0, training=None):
    """build(*placeholders) -> output node. Compares the analytic gradient of
    sum(output * R) (R random, fixed) with central differences, for every input in `wrt`."""
    rng = np.random.default_rng(seed)
    placeholders = [ht.Variable(f"in{i}", dtype=x.dtype) for i, x in enumerate(inputs)]
    out = build(*placeholders)
    probe = ht.Executor([out], seed=0)
    out_val = probe.run(feed_dict=dict(zip(placeholders, inputs)), convert_to_numpy_ret_vals=True)[0]
    weights = ht.Variable("probe_weights", value=rng.standard_normal(out_val.shape).astype(np.float32),
                          trainable=False)
    loss = ht.reduce_sum_op(ht.mul_op(out, weights))
    wrt = list(range(len(inputs))) if wrt is None else wrt
    grads = ht.gradients(loss, [placeholders[i] for i in wrt])
    grads = [SparseToDenseOp(g) if getattr(g, "produces_sparse", False) else g for g in grads]
    ex = ht.Executor([loss] + grads, seed=0)

    def loss_at(values):
        return float(ex.run(feed_dict=dict(zip(placeholders, values)), convert_to_numpy_ret_vals=True,
                            eval_node_list=[loss], training=training)[0])

    analytic = ex.run(feed_dict=dict(zip(placeholders, inputs)), convert_to_numpy_ret_vals=True,
                      training=training)[1:]
    for k, i in enumerate(wrt):
        x = inputs[i].astype(np.float64)
        numeric = np.zeros_like(x)
        for j in range(x.size):
            vals = [v.copy() for v in inputs]
            flat = vals[i].reshape(-1)
            flat[j] = x.reshape(-1)[j] + eps
            up = loss_at(vals)
            flat[j] = x.reshape(-1)[j] - eps
            down = loss_at(vals)
            numeric.reshape(-1)[j] = (up - down) / (2 * eps)
        np.testing.assert_allclose(analytic[k], numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i} of {out.name}")
