"""The ops of sequential recommenders (hetu.ops.attention, silu_op, l2_normalize_op, matmul_op
of stacks with any leading dims) against PyTorch autograd (in float64) and finite differences,
forward and backward; the C++ attention kernels against the array functions CuPy runs and on any
thread count; and their ONNX mappings against their forwards."""
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import hetu as ht
from gpu_harness import requires_gpu, same_on_gpu
from gradcheck import check_gradients
from hetu import _C
from hetu.ops import attention
from hetu.ops.common import ShapeError

TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def padding_mask(rng, batch, length, empty=(1,)):
    """float32 [batch, length]: left-aligned histories of random lengths, the samples `empty` fully padded."""
    lengths = rng.integers(1, length + 1, batch)
    lengths[list(empty)] = 0
    return (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)


def hetu_forward_backward(build, inputs, wrt=(0,), seed=0):
    """build(*placeholders)'s value and the gradients of sum(out * R) (R random) w.r.t. inputs `wrt`,
    and R."""
    placeholders = [ht.Variable(f"in{i}", dtype=x.dtype) for i, x in enumerate(inputs)]
    out = build(*placeholders)
    feed = dict(zip(placeholders, inputs))
    shape = ht.Executor([out]).run(feed_dict=feed, convert_to_numpy_ret_vals=True)[0].shape
    upstream = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    loss = ht.reduce_sum_op(out * ht.Variable("upstream", value=upstream, trainable=False))
    grads = ht.gradients(loss, [placeholders[i] for i in wrt])
    values = ht.Executor([out] + grads).run(feed_dict=feed, convert_to_numpy_ret_vals=True)
    return values[0], values[1:], upstream


def torch_forward_backward(torch, fn, inputs, upstream, wrt=(0,)):
    """fn(*tensors) and its autograd gradients in float64 (float inputs), as NumPy arrays."""
    tensors = [torch.tensor(x.astype(np.float64) if x.dtype == np.float32 else x, requires_grad=i in wrt)
               for i, x in enumerate(inputs)]
    out = fn(*tensors)
    (out * torch.tensor(upstream.astype(np.float64))).sum().backward()
    return out.detach().numpy(), [tensors[i].grad.numpy() for i in wrt]


def torch_allowed(torch, shape, mask, causal):
    lq, lk = shape[-2:]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    if mask is not None:
        allowed = allowed & (mask != 0).reshape((shape[0],) + (1,) * (len(shape) - 2) + (lk,))
    return allowed


def torch_masked_softmax(torch, scores, mask, causal, scale):
    allowed = torch_allowed(torch, scores.shape, mask, causal)
    return torch.nan_to_num(torch.softmax((scale * scores).masked_fill(~allowed, float("-inf")), dim=-1), nan=0.0)


def torch_pointwise(torch, scores, mask, causal, scale):
    allowed = torch_allowed(torch, scores.shape, mask, causal)
    weights = torch.nn.functional.silu(scale * scores) / scores.shape[-1]
    return torch.where(allowed, weights, torch.zeros_like(weights))


# (scores shape, with a mask, causal, scale): 3-D and 4-D, fully padded samples, Lq != Lk.
WEIGHT_CASES = [((3, 5, 5), True, True, 0.5), ((3, 5, 5), True, False, 1.0), ((4, 2, 6, 6), True, True, 0.25),
                ((4, 2, 6, 6), False, True, 1.0), ((4, 2, 6, 6), False, False, 2.0), ((3, 2, 4, 7), True, False, 0.7),
                ((2, 3, 2, 4, 4), True, True, 1.0)]
WEIGHT_OPS = [(ht.masked_softmax_op, torch_masked_softmax), (ht.pointwise_attention_op, torch_pointwise)]


@pytest.mark.parametrize("op,reference", WEIGHT_OPS, ids=["masked_softmax", "pointwise"])
@pytest.mark.parametrize("shape,masked,causal,scale", WEIGHT_CASES)
def test_attention_weights_against_pytorch(op, reference, shape, masked, causal, scale):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    scores = f32(rng, *shape) * 3
    inputs = [scores] + ([padding_mask(rng, shape[0], shape[-1])] if masked else [])
    got, (dscores,), upstream = hetu_forward_backward(
        lambda s, *m: op(s, m[0] if m else None, causal=causal, scale=scale), inputs)
    want, (dwant,) = torch_forward_backward(
        torch, lambda s, *m: reference(torch, s, m[0] if m else None, causal, scale), inputs, upstream)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dscores, dwant, rtol=1e-4, atol=1e-6)
    allowed = attention.allowed_keys(np, shape, inputs[1] if masked else None, causal)
    assert np.all(np.broadcast_to(~allowed, shape) <= ((got == 0) & (dscores == 0)))   # exactly 0
    if masked:   # a fully padded sample: zeros and no gradient; the others are not all zero
        assert not got[1].any() and not dscores[1].any()
        assert got[0].any() and dscores[0].any()


@pytest.mark.parametrize("op", [ht.masked_softmax_op, ht.pointwise_attention_op])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_weights_finite_differences(op, causal):
    rng = np.random.default_rng(2)
    mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0]], np.float32)   # padding, and a fully padded sample
    check_gradients(lambda s, m: op(s, m, causal=causal, scale=0.8), [f32(rng, 2, 2, 3, 4), mask], wrt=[0])
    check_gradients(lambda s: op(s, causal=causal), [f32(rng, 2, 3, 3)])


@pytest.mark.parametrize("kernel", ["masked_softmax", "pointwise_attention"])
@pytest.mark.parametrize("shape,masked,causal,scale", WEIGHT_CASES)
def test_kernels_equal_the_array_functions(kernel, shape, masked, causal, scale):
    """The C++ kernels (CPU) and the array functions (what CuPy runs) agree, forward and backward."""
    rng = np.random.default_rng(3)
    scores, g = f32(rng, *shape) * 3, f32(rng, *shape)
    mask = padding_mask(rng, shape[0], shape[-1]) if masked else None
    forward = getattr(attention, kernel)
    backward = getattr(attention, kernel + "_gradient")
    y, want = np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
    getattr(_C, kernel)(scores, mask, causal, scale, y)
    forward(np, scores, mask, causal, scale, want)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
    saved = y if kernel == "masked_softmax" else scores
    dx, dwant = np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
    getattr(_C, kernel + "_grad")(g, saved, mask, causal, scale, dx)
    backward(np, g, saved, mask, causal, scale, dwant)
    np.testing.assert_allclose(dx, dwant, rtol=1e-5, atol=1e-6)   # g - <g, y>: cancellation, ~|g| eps


def test_attention_weights_shapes_are_checked():
    s = ht.Variable("s", shape=(2, 3, 4, 4))
    with pytest.raises(ShapeError, match=r"MaskedSoftmax_\d+: mask m \(2, 5\) is not \[batch, Lk\] \(2, 4\)"):
        ht.masked_softmax_op(s, ht.Variable("m", shape=(2, 5))).infer_shape([(2, 3, 4, 4), (2, 5)])
    with pytest.raises(ShapeError, match=r"PointwiseAttention_\d+: scores s \(4,\) are not"):
        ht.pointwise_attention_op(s).infer_shape([(4,)])
    with pytest.raises(ValueError, match="mask must be \\[2, 4\\]"):
        _C.masked_softmax(np.zeros((2, 3, 4), np.float32), np.ones((3, 4), np.float32), True, 1.0,
                          np.zeros((2, 3, 4), np.float32))


_DIGEST = """
import hashlib
import numpy as np
from hetu import _C
rng = np.random.default_rng(5)
h = hashlib.sha256()
for shape in [(8, 2, 64, 64), (5, 3, 33, 40), (3, 200, 200)]:
    scores, g = (rng.standard_normal(shape).astype(np.float32) * 4 for _ in range(2))
    mask = (rng.random((shape[0], shape[-1])) < 0.8).astype(np.float32)
    mask[1] = 0
    for kernel in ("masked_softmax", "pointwise_attention"):
        for causal in (True, False):
            y, dx = np.empty_like(scores), np.empty_like(scores)
            getattr(_C, kernel)(scores, mask, causal, 0.3, y)
            getattr(_C, kernel + "_grad")(g, y if kernel == "masked_softmax" else scores, mask, causal, 0.3, dx)
            assert np.isfinite(y).all() and np.isfinite(dx).all() and y.any() and dx.any()
            h.update(y.tobytes())
            h.update(dx.tobytes())
print(_C.num_threads(), h.hexdigest())
"""


def test_kernels_give_the_same_bits_on_any_thread_count():
    """hetu's thread count is read once per process: a process per count."""
    digests = {}
    for threads in (1, 2, 3):
        env = dict(os.environ, HETU_NUM_THREADS=str(threads), OMP_NUM_THREADS="1")
        run = subprocess.run([sys.executable, "-c", _DIGEST], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        count, digest = run.stdout.split()
        assert int(count) == threads
        digests[threads] = digest
    assert len(set(digests.values())) == 1, digests


# --- silu, l2_normalize ---------------------------------------------------------------------------
def test_silu_against_pytorch_and_finite_differences():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x = np.concatenate([f32(rng, 3, 5) * 4, np.array([[-1e4, -100, -88, 88, 100], [1e4, 0, -20, 20, 1e-3],
                                                      [-3e38, 3e38, -1, 1, 0.5]], np.float32)])
    with np.errstate(over="raise", invalid="raise", divide="raise"):   # finite and no overflow, however large |x|
        got, (dx,), upstream = hetu_forward_backward(ht.silu_op, [x])
    want, (dwant,) = torch_forward_backward(torch, torch.nn.functional.silu, [x], upstream)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(dx, dwant, rtol=1e-5, atol=1e-30)
    check_gradients(ht.silu_op, [f32(rng, 3, 4)])


def test_silu_same_bits_in_every_version_within_an_ulp_of_float64():
    """_C.silu's AVX-512, AVX2 and baseline versions (and any tail length) give the same bits, its
    forward within one float32 ulp of SiLU computed in float64 (NumPy's exp) and rounded, and
    the gradient the same; infinities and NaN as x * sigmoid(x) gives them (a NaN's sign aside)."""
    from hetu import _C
    rng = np.random.default_rng(7)
    edges = [0.0, -0.0, 1e-30, -1e-30, 88, -88, 700, -700, 708, -708, 709, -709, 745, -745, 746, -746, 1e4,
             -1e4, 3e38, -3e38, np.inf, -np.inf, np.nan]
    x = np.concatenate([(rng.standard_normal(100_003) * 8).astype(np.float32), np.array(edges, np.float32)])
    g = rng.standard_normal(x.size).astype(np.float32)
    versions = []
    for v in _C.MATMUL_VARIANTS:
        try:
            if _C.matmul_variant(v) == v:
                versions.append(v)
        except ValueError:
            pass
    assert "default" in versions
    outs = {}
    with np.errstate(all="ignore"):
        for v in versions:
            for n in (x.size, 5):   # a tail shorter than any vector
                f, b = np.empty(n, np.float32), np.empty(n, np.float32)
                _C.silu(x[:n], None, f, v)
                _C.silu(x[:n], g[:n], b, v)
                outs[v, n] = f, b
        for (v, n), pair in outs.items():
            for got, want in zip(pair, outs["default", n]):   # a NaN's sign bit is no value's
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=v)
                number = ~np.isnan(want)
                np.testing.assert_array_equal(got[number].view(np.int32), want[number].view(np.int32), err_msg=v)
        f, b = outs["default", x.size]
        xd, gd = x.astype(np.float64), g.astype(np.float64)
        e = np.exp(-np.abs(xd))
        s = np.where(xd >= 0, 1.0, e) / (e + 1.0)
        for got, want in ((f, (s * xd).astype(np.float32)), (b, (s * ((1 - s) * xd + 1) * gd).astype(np.float32))):
            finite = np.isfinite(x)
            ulps = np.abs(got[finite].view(np.int32).astype(np.int64) - want[finite].view(np.int32).astype(np.int64))
            assert ulps.max() <= 1, ulps.max()
            np.testing.assert_array_equal(got[~finite], want[~finite])


def test_l2_normalize_against_pytorch_and_finite_differences():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x = f32(rng, 2, 4, 6)
    x[0, 1] *= 1e-8   # a norm under eps: divided by eps, its gradient g / eps
    for eps in (1e-6, 1e-1):
        got, (dx,), upstream = hetu_forward_backward(lambda v: ht.l2_normalize_op(v, eps=eps), [x])
        want, (dwant,) = torch_forward_backward(
            torch, lambda v: torch.nn.functional.normalize(v, dim=-1, eps=eps), [x], upstream)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(dx, dwant, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(dx[0, 1], upstream[0, 1] / np.float32(eps), rtol=1e-6)
    zero = np.zeros((2, 3), np.float32)
    got, (dx,), upstream = hetu_forward_backward(ht.l2_normalize_op, [zero])
    assert not got.any()
    np.testing.assert_array_equal(dx, upstream / np.float32(1e-6))
    check_gradients(ht.l2_normalize_op, [f32(rng, 3, 4)])


# --- matmul of stacks with any leading dims ---------------------------------------------------
def operands(rng, lead, m, n, k, trans_a, trans_b):
    a = f32(rng, *lead, *((k, m) if trans_a else (m, k)))
    b = f32(rng, *lead, *((n, k) if trans_b else (k, n)))
    return a, b


def torch_matmul(torch, trans_a, trans_b):
    return lambda a, b: torch.matmul(a.transpose(-1, -2) if trans_a else a, b.transpose(-1, -2) if trans_b else b)


@pytest.mark.parametrize("trans_a,trans_b", TRANSPOSES)
def test_matmul_of_stacks_with_leading_dims(trans_a, trans_b):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    for lead in [(2, 3), (2, 1, 3)]:   # [batch, heads, L, d], and one more axis
        a, b = operands(rng, lead, 5, 4, 6, trans_a, trans_b)
        build = lambda x, y: ht.matmul_op(x, y, trans_A=trans_a, trans_B=trans_b)  # noqa: E731
        got, grads, upstream = hetu_forward_backward(build, [a, b], wrt=(0, 1))
        want, wants = torch_forward_backward(torch, torch_matmul(torch, trans_a, trans_b), [a, b], upstream, (0, 1))
        assert got.shape == lead + (5, 4)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        for g, w in zip(grads, wants):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        # The same bits as the 3-D stack of the leading dims as one.
        flat = ht.matmul_op(ht.Variable("a", value=a.reshape((-1,) + a.shape[-2:])),
                            ht.Variable("b", value=b.reshape((-1,) + b.shape[-2:])), trans_A=trans_a, trans_B=trans_b)
        stacked = ht.Executor([flat]).run(convert_to_numpy_ret_vals=True)[0]
        np.testing.assert_array_equal(got, stacked.reshape(got.shape))
    small = [x * np.float32(0.5) for x in operands(rng, (2, 2), 2, 3, 2, trans_a, trans_b)]
    check_gradients(lambda x, y: ht.matmul_op(x, y, trans_A=trans_a, trans_B=trans_b), small)


def test_matmul_leading_dims_must_match():
    a, b = ht.Variable("a", shape=(2, 3, 4, 5)), ht.Variable("b", shape=(2, 2, 5, 4))
    with pytest.raises(ShapeError, match=r"MatMul_\d+: .*equal leading dims.* a \(2, 3, 4, 5\) and b \(2, 2, 5, 4\)"):
        ht.matmul_op(a, b).infer_shape([(2, 3, 4, 5), (2, 2, 5, 4)])
    with pytest.raises(ShapeError, match="inner dimensions differ"):
        ht.matmul_op(a, b).infer_shape([(2, 3, 4, 5), (2, 3, 4, 4)])


# --- relative biases and their buckets --------------------------------------------------------
def test_relative_position_buckets():
    got = attention.relative_position_buckets(3)
    np.testing.assert_array_equal(got, [[2, 3, 4], [1, 2, 3], [0, 1, 2]])
    assert got.dtype == np.int64
    big = attention.relative_position_buckets(50)
    assert big.min() == 0 and big.max() == 98 and big[10, 13] == 3 + 49


def test_time_buckets_are_hstus_log_buckets():
    times = np.array([[0, 1, 2, 10, 1000, 10 ** 9]], np.int64)
    got = attention.time_buckets(times, times, 20)
    gap = np.abs(times[0][:, None] - times[0][None, :]).astype(np.float64)
    want = np.clip(np.floor(np.log(np.maximum(gap, 1)) / 0.301), 0, 19).astype(np.int64)
    np.testing.assert_array_equal(got[0], want)
    # by hand: |dt| <= 1 -> 0; 2 -> floor(0.693 / 0.301) = 2; 10 -> 7; 998 -> 22, clipped to 19
    assert got[0, 0, 1] == 0 and got[0, 1, 0] == 0 and got[0, 0, 2] == 2 and got[0, 3, 0] == 7 and got[0, 4, 2] == 19
    assert got.dtype == np.int64 and got.shape == (1, 6, 6)
    queries, keys = np.array([[5, 6]]), np.array([[5, 8, 105]])
    np.testing.assert_array_equal(attention.time_buckets(queries, keys, 100)[0], [[0, 3, 15], [0, 2, 15]])
    node = ht.time_bucket_op(ht.Variable("t", dtype=np.int64), 20)
    out = ht.Executor([node]).run(feed_dict={node.inputs[0]: times}, convert_to_numpy_ret_vals=True)[0]
    np.testing.assert_array_equal(out, got)
    assert node.infer_shape([(4, 6)]) == (4, 6, 6) and node.infer_dtype([np.int64]) == np.int64


@pytest.mark.parametrize("num_buckets", [8, 128])
def test_the_time_bucket_kernel_is_the_definition_at_every_boundary(num_buckets):
    """_C.time_buckets (each bucket's least gap, stepped to from the previous key's bucket) against
    time_buckets' logarithm: every bucket's first gap and the gap before it, gaps past the last
    bucket, padding's zeros, times in order and out of it."""
    edges = attention.bucket_thresholds(num_buckets)
    assert len(edges) == num_buckets - 1 and (np.diff(edges) >= 0).all()
    gaps = np.unique(np.r_[0, 1, edges - 1, edges, edges + 1, 10 ** 9, 2 ** 62])
    times = np.zeros((3, len(gaps) + 3), np.int64)
    times[0, :len(gaps)] = gaps                       # every gap from 0, and from one another
    times[1, 3:] = 10 ** 12 - gaps[::-1]              # a later start; zeros (padding) before it
    times[2, :len(gaps)] = np.random.default_rng(num_buckets).permutation(gaps)   # out of time order
    node = ht.time_bucket_op(ht.Variable("t", dtype=np.int64), num_buckets)
    got = ht.Executor([node]).run(feed_dict={node.inputs[0]: times}, convert_to_numpy_ret_vals=True)[0]
    np.testing.assert_array_equal(got, attention.time_buckets(times, times, num_buckets))
    assert got.min() == 0 and got.max() == num_buckets - 1


def test_the_bias_gradient_has_bincounts_bits():
    rng = np.random.default_rng(11)
    w = ht.Variable("w", value=f32(rng, 64))
    i = ht.Variable("i", dtype=np.int64)
    index = rng.integers(0, 64, (3, 50, 50))
    upstream = (rng.standard_normal((3, 50, 50)) * 10.0 ** rng.integers(-6, 6, (3, 50, 50))).astype(np.float32)
    bias = ht.relative_bias_op(w, i)
    (dw,) = ht.gradients(ht.reduce_sum_op(bias * ht.Variable("up", value=upstream, trainable=False)), [w])
    got = ht.Executor([dw]).run(feed_dict={i: index}, convert_to_numpy_ret_vals=True)[0]
    want = np.bincount(index.reshape(-1), weights=upstream.reshape(-1), minlength=64).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_relative_bias_against_pytorch_and_finite_differences():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    L = 5
    weights = f32(rng, 2 * L - 1)
    for index in [attention.relative_position_buckets(L), rng.integers(0, 2 * L - 1, (3, L, L))]:
        got, (dw,), upstream = hetu_forward_backward(ht.relative_bias_op, [weights, index])
        want, (dwant,) = torch_forward_backward(torch, lambda w, i: w[i], [weights, index], upstream)
        np.testing.assert_array_equal(got, weights[index])
        np.testing.assert_allclose(dw, dwant, rtol=1e-6, atol=1e-6)
        assert dw.dtype == np.float32 and dw.shape == weights.shape
    check_gradients(ht.relative_bias_op, [weights, rng.integers(0, 2 * L - 1, (2, 3, 4))], wrt=[0])


def test_relative_bias_of_time_buckets_in_a_graph():
    """time_bucket_op's buckets read the bias; its gradient sums each bucket's entries."""
    rng = np.random.default_rng(10)
    times = np.sort(rng.integers(0, 10 ** 6, (2, 6)), axis=1)
    weights = f32(rng, 8)
    t = ht.Variable("times", dtype=np.int64)
    w = ht.Variable("w", value=weights)
    bias = ht.relative_bias_op(w, ht.time_bucket_op(t, 8))
    upstream = f32(rng, 2, 6, 6)
    (dw,) = ht.gradients(ht.reduce_sum_op(bias * ht.Variable("up", value=upstream, trainable=False)), [w])
    got, grad = ht.Executor([bias, dw]).run(feed_dict={t: times}, convert_to_numpy_ret_vals=True)
    buckets = attention.time_buckets(times, times, 8)
    np.testing.assert_array_equal(got, weights[buckets])
    want = np.zeros(8, np.float64)
    np.add.at(want, buckets.reshape(-1), upstream.reshape(-1).astype(np.float64))
    np.testing.assert_allclose(grad, want, rtol=1e-6, atol=1e-6)


def test_relative_bias_checks_shapes_and_buckets():
    w = ht.Variable("w", value=np.zeros(4, np.float32))
    with pytest.raises(ShapeError, match=r"RelativeBias_\d+: weights w \(4, 1\) are not \[n_buckets\]"):
        ht.relative_bias_op(w, ht.Variable("i", dtype=np.int64)).infer_shape([(4, 1), (3, 3)])
    i = ht.Variable("i", dtype=np.int64)
    for bad in ([[0, 4]], [[-1, 0]]):
        with pytest.raises(IndexError, match="outside the 4"):
            ht.Executor([ht.relative_bias_op(w, i)]).run(feed_dict={i: np.array(bad)})
    f = ht.Variable("f", dtype=np.float32)
    with pytest.raises(TypeError, match=r"RelativeBias_\d+: index f is float32, not integers"):
        ht.Executor([ht.relative_bias_op(w, f)]).run(feed_dict={f: np.zeros(2, np.float32)})


# --- ONNX mappings --------------------------------------------------------------------------------
def onnx_forward(out, feeds, dtype):
    """out's value (of `dtype`) from its ONNX mappings under onnxruntime, the fed placeholders its inputs."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper
    from hetu.serve.onnx_graph import OPSET, ONNXBuilder

    shapes, names, inputs = {}, {}, []
    b = ONNXBuilder(shapes, {})
    for n in ht.topo_sort([out]):
        if n in feeds:
            shapes[n.id], names[n.id] = feeds[n].shape, n.name
            inputs.append(helper.make_tensor_value_info(n.name, helper.np_dtype_to_tensor_dtype(feeds[n].dtype),
                                                        feeds[n].shape))
        elif isinstance(n, ht.Variable):
            shapes[n.id], names[n.id] = n.shape, b.const(n.value, name=n.name)
        else:
            shapes[n.id] = n.infer_shape([shapes[x.id] for x in n.inputs])
            names[n.id] = n.to_onnx(b, [names[x.id] for x in n.inputs])
    result = helper.make_tensor_value_info(names[out.id], helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)
    graph = helper.make_graph(b.nodes, "attention", inputs, [result], initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {n.name: v for n, v in feeds.items()})[0]


def onnx_cases(rng):
    s4, s3 = ht.Variable("s4", dtype=np.float32), ht.Variable("s3", dtype=np.float32)
    m, x = ht.Variable("m", dtype=np.float32), ht.Variable("x", dtype=np.float32)
    t, p = ht.Variable("t", dtype=np.int64), ht.Variable("p", dtype=np.int64)
    feeds = {s4: f32(rng, 3, 2, 5, 5) * 3, s3: f32(rng, 3, 5, 5) * 3, m: padding_mask(rng, 3, 5),
             x: f32(rng, 3, 2, 5, 4) * 2, t: np.sort(rng.integers(0, 10 ** 7, (3, 5)), axis=1),
             p: attention.relative_position_buckets(5)}
    w = ht.Variable("w", value=f32(rng, 9))
    tw = ht.Variable("tw", value=f32(rng, 16))
    cases = {
        "masked_softmax causal masked": ht.masked_softmax_op(s4, m, causal=True, scale=0.5),
        "masked_softmax masked": ht.masked_softmax_op(s3, m, causal=False),
        "masked_softmax causal": ht.masked_softmax_op(s3, causal=True, scale=2.0),
        "masked_softmax plain": ht.masked_softmax_op(s4, causal=False),
        "pointwise causal masked": ht.pointwise_attention_op(s4, m, causal=True, scale=0.3),
        "pointwise plain": ht.pointwise_attention_op(s3, causal=False),
        "silu": ht.silu_op(s4),
        "l2_normalize": ht.l2_normalize_op(x),
        "matmul 4-D": ht.matmul_op(x, ht.matmul_op(s4, x), trans_A=True),
        "matmul 4-D transposed": ht.matmul_op(x, x, trans_B=True),
        "relative position bias": ht.relative_bias_op(w, p),
        "time buckets": ht.time_bucket_op(t, 16),
        "time bias": ht.relative_bias_op(tw, ht.time_bucket_op(t, 16)),
    }
    return cases, feeds


@pytest.mark.parametrize("name", sorted(onnx_cases(np.random.default_rng(0))[0]))
def test_onnx_mapping_computes_the_forward(name):
    cases, feeds = onnx_cases(np.random.default_rng(11))
    out = cases[name]
    needed = {n: v for n, v in feeds.items() if n in set(ht.topo_sort([out]))}
    want = ht.Executor([out]).run(feed_dict=needed, convert_to_numpy_ret_vals=True, training=False)[0]
    got = onnx_forward(out, needed, want.dtype)
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype == np.int64:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * max(1, np.abs(want).max()))
        if name.startswith(("masked_softmax", "pointwise")):   # the entries left out are exactly 0 in both
            np.testing.assert_array_equal(got == 0, want == 0)


# --- on a GPU: the array functions through CuPy against the CPU's kernels ---------------------------
GPU_CASES = {
    "masked_softmax": lambda s, m: ht.masked_softmax_op(s, m, causal=True, scale=0.5),
    "masked_softmax unmasked": lambda s, m: ht.masked_softmax_op(s, causal=False),
    "pointwise": lambda s, m: ht.pointwise_attention_op(s, m, causal=True, scale=0.5),
    "silu": lambda s, m: ht.silu_op(s * 10.0),
    "l2_normalize": lambda s, m: ht.l2_normalize_op(s),
    "matmul 4-D": lambda s, m: ht.matmul_op(s, s, trans_A=True) + ht.matmul_op(s, s, trans_B=True),
}


@requires_gpu
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_same_on_gpu(name):
    rng = np.random.default_rng(12)
    same_on_gpu(GPU_CASES[name], [f32(rng, 4, 2, 6, 6), padding_mask(rng, 4, 6)], atol=1e-5)


@requires_gpu
def test_relative_biases_same_on_gpu():
    rng = np.random.default_rng(13)
    times = np.sort(rng.integers(0, 10 ** 6, (3, 6)), axis=1)
    same_on_gpu(lambda w, t: ht.relative_bias_op(w, ht.time_bucket_op(t, 12)), [f32(rng, 12), times])
    same_on_gpu(ht.relative_bias_op, [f32(rng, 11), attention.relative_position_buckets(6)])
