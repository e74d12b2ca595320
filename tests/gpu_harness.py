"""Shared by the GPU tests: skipping where there is no GPU, and running one graph on the CPU and
on the GPU with the same inputs."""
import numpy as np
import pytest

import hetu as ht
from hetu import cuda
from hetu.autodiff import SparseToDenseOp
from hetu.dataloader import DataloaderOp
from hetu.graph import Variable
from hetu.ops.embedding import IndexedSlices


def gpu_available():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:   # no CuPy, no driver, no device
        return False


requires_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a GPU")


def assert_device_values(executor):
    """Makes `executor` check that every op it computes returns device arrays (no op falls back
    to the host), except dataloaders, which read host data by design."""
    compute = executor._compute

    def checked(node, vals, host_vals):
        value = compute(node, vals, host_vals)
        if not isinstance(node, (Variable, DataloaderOp)) and value is not None:
            arrays = [value.indices, value.values] if isinstance(value, IndexedSlices) else [value]
            for a in arrays:
                assert cuda.is_device_array(a), f"{node.name} ({type(node).__name__}) returned {type(a)}"
        return value
    executor._compute = checked
    return executor


def forward_and_gradients(build, inputs, ctx, seed=0, training=None, weights=None):
    """Output of build(*placeholders) and the gradients of sum(output * weights) for every float
    input, on ctx."""
    placeholders = [ht.Variable(f"in{i}", dtype=x.dtype) for i, x in enumerate(inputs)]
    out = build(*placeholders)
    w = ht.Variable("probe_weights", value=weights, trainable=False)
    loss = ht.reduce_sum_op(ht.mul_op(out, w))
    wrt = [p for p, x in zip(placeholders, inputs) if x.dtype.kind == "f"]
    grads = [SparseToDenseOp(g) if getattr(g, "produces_sparse", False) else g
             for g in ht.gradients(loss, wrt) if g is not None]
    ex = ht.Executor([out, loss] + grads, ctx=ctx, seed=seed)
    if ctx.is_gpu:
        assert_device_values(ex)
    return ex.run(feed_dict=dict(zip(placeholders, inputs)), convert_to_numpy_ret_vals=True, training=training)


def same_on_gpu(build, inputs, rtol=1e-5, atol=1e-6, training=None):
    """Forward and backward of build on the GPU equal the CPU's (the NumPy and C++ kernels)."""
    placeholders = [ht.Variable(f"in{i}", dtype=x.dtype) for i, x in enumerate(inputs)]
    probe = ht.Executor([build(*placeholders)], seed=0)
    shape = probe.run(feed_dict=dict(zip(placeholders, inputs)), convert_to_numpy_ret_vals=True,
                      training=training)[0].shape
    weights = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    cpu = forward_and_gradients(build, inputs, ht.cpu(0), training=training, weights=weights)
    gpu = forward_and_gradients(build, inputs, ht.gpu(0), training=training, weights=weights)
    assert len(cpu) == len(gpu)
    for i, (c, g) in enumerate(zip(cpu, gpu)):
        np.testing.assert_allclose(g, c, rtol=rtol, atol=atol, err_msg=f"output {i} (0: forward, 1: loss, then gradients)")
    return cpu, gpu
