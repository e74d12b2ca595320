"""Attention for sequential recommenders (SASRec, HSTU): the attention weights over a batch's
scores, masked by padding and causality (SASRec's softmax, HSTU's pointwise SiLU), and HSTU's
learned biases of relative position and time gap, with the buckets they are read at.

Scores are [batch, ..., Lq, Lk] (e.g. [batch, heads, L, L]); a mask is float32 [batch, Lk], 1
where the key position holds an item and 0 where it is padding. Key j is allowed for query i iff
mask[batch, j] != 0 and, when causal, j <= i; every weight of a key not allowed is exactly 0. On
CPU the weights run through hetu._C (threaded over rows, each row on one thread in a fixed
order: the same bits on every thread count), elsewhere (CuPy) through the array functions below."""
import functools
import math

import numpy as np

from .. import _C
from ..context import array_module_of
from ..graph import Op
from .activation import sigmoid, silu_derivative
from .common import ShapeError

__all__ = ["masked_softmax_op", "pointwise_attention_op", "relative_bias_op", "time_bucket_op",
           "relative_position_buckets", "time_buckets"]

# HSTU's time buckets: floor(log(max(|dt|, 1)) / 0.301).
TIME_BUCKET_DIVISOR = 0.301
# What a key not allowed scores in the ONNX softmax: exp of it less any allowed score is 0.
_ONNX_LEFT_OUT = np.float32(-1e30)


def _f32(x):
    return np.ascontiguousarray(x, dtype=np.float32)


def allowed_keys(xp, shape, mask, causal):
    """bool, broadcastable to scores of `shape` [batch, ..., Lq, Lk]: key j allowed for query i."""
    lq, lk = shape[-2:]
    allowed = xp.tri(lq, lk, dtype=bool) if causal else xp.ones((lq, lk), dtype=bool)
    if mask is not None:
        allowed = allowed & (mask != 0).reshape((shape[0],) + (1,) * (len(shape) - 2) + (lk,))
    return allowed


# --- the weights as array functions (NumPy or CuPy): what hetu._C computes on CPU ---------------
def masked_softmax(xp, scores, mask, causal, scale, out):
    """Softmax over the allowed keys of scale * scores into out; a row without one is zeros."""
    if out.size == 0:
        return out
    z = xp.where(allowed_keys(xp, scores.shape, mask, causal), scores * np.float32(scale), np.float32(-np.inf))
    top = z.max(axis=-1, keepdims=True)
    z -= xp.where(top == -np.inf, np.float32(0), top)   # a row without an allowed key: exp(-inf) = 0
    xp.exp(z, out=out)
    total = out.sum(axis=-1, keepdims=True)
    out /= xp.where(total > 0, total, np.float32(1))
    return out


def masked_softmax_gradient(xp, g, y, mask, causal, scale, out):
    """d scores from g and the weights y: scale * y * (g - <g, y>) (0 wherever y is)."""
    xp.subtract(g, (g * y).sum(axis=-1, keepdims=True), out=out)
    out *= y
    out *= np.float32(scale)
    return out


def pointwise_attention(xp, scores, mask, causal, scale, out):
    """silu(scale * scores) / Lk on the allowed keys, else 0, into out."""
    z = scores * np.float32(scale)
    sigmoid(xp, z, out)
    out *= z
    out /= np.float32(scores.shape[-1])
    out *= allowed_keys(xp, scores.shape, mask, causal)
    return out


def pointwise_attention_gradient(xp, g, scores, mask, causal, scale, out):
    """d scores from g and the scores: g * scale * silu'(scale * scores) / Lk on the allowed keys."""
    silu_derivative(xp, scores * np.float32(scale), out)
    out *= np.float32(scale)
    xp.multiply(g, out, out=out)
    out /= np.float32(scores.shape[-1])
    out *= allowed_keys(xp, scores.shape, mask, causal)
    return out


class _AttentionWeights(Op):
    """scores [batch, ..., Lq, Lk] and a mask [batch, Lk] (or none) -> weights of the scores' shape,
    0 where a key is not allowed. A subclass names its hetu._C kernel (and `kernel`_grad), its array
    functions, and what its backward reads: its output (saves_output) or its scores."""
    kernel = None
    saves_output = False

    def __init__(self, scores, mask=None, causal=True, scale=1.0, ctx=None):
        super().__init__(*((scores,) if mask is None else (scores, mask)), ctx=ctx)
        self.has_mask, self.causal, self.scale = mask is not None, bool(causal), np.float32(scale)

    def infer_shape(self, s):
        scores = tuple(s[0])
        if len(scores) < (3 if self.has_mask else 2):
            raise ShapeError(f"{self.name}: scores {self.inputs[0].name} {scores} are not [batch, ..., Lq, Lk]")
        if self.has_mask and tuple(s[1]) != (scores[0], scores[-1]):
            raise ShapeError(f"{self.name}: mask {self.inputs[1].name} {tuple(s[1])} is not [batch, Lk] "
                             f"{(scores[0], scores[-1])} of scores {self.inputs[0].name} {scores}")
        return scores

    def compute(self, vals, state):
        scores, mask = vals[0], vals[1] if self.has_mask else None
        out = state.buffer(self, scores.shape, np.float32)
        xp = array_module_of(scores)
        if xp is not np:
            return type(self).forward(xp, scores, mask, self.causal, self.scale, out)
        getattr(_C, self.kernel)(_f32(scores), None if mask is None else _f32(mask), self.causal, float(self.scale),
                                 out)
        return out

    def gradient(self, g):
        return [AttentionWeightsGradOp(g, self)] + [None] * self.has_mask

    def onnx_allowed(self, b, x):
        """The bool tensor of allowed keys (broadcast over the scores), or None where all are."""
        shape = b.shape_of(self.inputs[0])
        allowed = b.const(np.tri(*shape[-2:], dtype=bool)) if self.causal else None
        if self.has_mask:
            valid = b.node("Not", [b.node("Equal", [x[1], b.const(np.float32(0))])])
            valid = b.node("Unsqueeze", [valid, b.const(np.arange(1, len(shape) - 1, dtype=np.int64))])
            allowed = valid if allowed is None else b.node("And", [allowed, valid])
        return allowed


class AttentionWeightsGradOp(Op):
    """d scores of masked_softmax or pointwise_attention (the mask has none)."""

    def __init__(self, g, fwd):
        saved = fwd if fwd.saves_output else fwd.inputs[0]
        super().__init__(g, saved, *fwd.inputs[1:], ctx=fwd.ctx)
        self.fwd = fwd

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        fwd = self.fwd
        g, saved, mask = vals[0], vals[1], vals[2] if fwd.has_mask else None
        out = state.buffer(self, saved.shape, np.float32)
        xp = array_module_of(g)
        if xp is not np:
            return type(fwd).backward(xp, g, saved, mask, fwd.causal, fwd.scale, out)
        getattr(_C, fwd.kernel + "_grad")(_f32(g), _f32(saved), None if mask is None else _f32(mask), fwd.causal,
                                          float(fwd.scale), out)
        return out


class MaskedSoftmaxOp(_AttentionWeights):
    """SASRec's attention weights: softmax over the allowed keys of scale * scores; a query with
    no allowed key (a padded row under a causal mask, a fully padded sample) is all zeros, and so
    is its gradient."""
    kernel = "masked_softmax"
    saves_output = True
    forward = staticmethod(masked_softmax)
    backward = staticmethod(masked_softmax_gradient)

    def to_onnx(self, b, x):
        z = b.node("Mul", [x[0], b.const(self.scale)])
        allowed = self.onnx_allowed(b, x)
        if allowed is None:
            return b.node("Softmax", [z], axis=-1)
        weights = b.node("Softmax", [b.node("Where", [allowed, z, b.const(_ONNX_LEFT_OUT)])], axis=-1)
        return b.node("Where", [allowed, weights, b.const(np.float32(0))])


class PointwiseAttentionOp(_AttentionWeights):
    """HSTU's attention weights: silu(scale * scores) / Lk on the allowed keys, Lk the padded
    length (HSTU divides by the longest sequence's)."""
    kernel = "pointwise_attention"
    forward = staticmethod(pointwise_attention)
    backward = staticmethod(pointwise_attention_gradient)

    def to_onnx(self, b, x):
        z = b.node("Mul", [x[0], b.const(self.scale)])
        lk = b.shape_of(self.inputs[0])[-1]
        weights = b.node("Div", [b.node("Mul", [z, b.node("Sigmoid", [z])]), b.const(np.float32(lk))])
        allowed = self.onnx_allowed(b, x)
        return weights if allowed is None else b.node("Where", [allowed, weights, b.const(np.float32(0))])


# --- HSTU's biases ------------------------------------------------------------------------------
def relative_position_buckets(length):
    """int64 [L, L]: (j - i) + L - 1 for query i and key j, in [0, 2L - 1)."""
    positions = np.arange(length, dtype=np.int64)
    return positions[None, :] - positions[:, None] + (length - 1)


def time_buckets(query_times, key_times, num_buckets):
    """int64 [batch, Lq, Lk] of timestamps [batch, Lq] and [batch, Lk]: HSTU's log bucket
    floor(log(max(|tq - tk|, 1)) / 0.301) (in float64) clipped to [0, num_buckets - 1]."""
    xp = array_module_of(query_times)
    gap = xp.abs(query_times[..., :, None] - key_times[..., None, :])
    logs = xp.log(xp.maximum(gap, 1).astype(np.float64)) / TIME_BUCKET_DIVISOR
    return xp.clip(xp.floor(logs), 0, num_buckets - 1).astype(np.int64)


@functools.lru_cache(maxsize=None)
def bucket_thresholds(num_buckets):
    """int64 [num_buckets - 1]: the least gap of each bucket k >= 1 by time_buckets (ascending), so
    that a gap's bucket is the number of thresholds at or below it (what _C.time_buckets counts,
    a binary search instead of a logarithm per pair)."""
    def bucket(gap):
        return int(time_buckets(np.array([gap], np.int64), np.array([0], np.int64), num_buckets)[0, 0])
    out = []
    for k in range(1, num_buckets):
        gap = max(int(math.ceil(math.exp(TIME_BUCKET_DIVISOR * k))), out[-1] if out else 1)
        while gap > 1 and bucket(gap - 1) >= k:
            gap -= 1
        while bucket(gap) < k:
            gap += 1
        out.append(gap)
    out = np.array(out, np.int64)
    out.flags.writeable = False
    return out


class RelativeBiasOp(Op):
    """weights [n_buckets] read at index (int64, any shape) -> float32 of index's shape: a learned
    bias per bucket of relative position or time gap. The weights' gradient is dense, each
    bucket's sum of the gradient at its entries (np.bincount: in float64, in index order)."""

    def __init__(self, weights, index, ctx=None):
        super().__init__(weights, index, ctx=ctx)

    def infer_shape(self, s):
        if len(s[0]) != 1:
            raise ShapeError(f"{self.name}: weights {self.inputs[0].name} {tuple(s[0])} are not [n_buckets]")
        return tuple(s[1])

    def compute(self, vals, state):
        weights, index = vals
        xp = array_module_of(weights)
        if index.dtype.kind not in "iu":
            raise TypeError(f"{self.name}: index {self.inputs[1].name} is {index.dtype}, not integers")
        if xp is np and index.size and (index.min() < 0 or index.max() >= weights.shape[0]):
            raise IndexError(f"{self.name}: index {self.inputs[1].name} holds buckets in [{index.min()}, "
                             f"{index.max()}], outside the {weights.shape[0]} of {self.inputs[0].name}")
        return xp.take(weights, index, out=state.buffer(self, index.shape, np.float32))

    def to_onnx(self, b, x):
        return b.node("Gather", x, axis=0)

    def gradient(self, g):
        return [RelativeBiasGradOp(g, self), None]


class RelativeBiasGradOp(Op):
    """On a GPU CuPy's bincount reads the largest bucket back to the host (and sums with float64
    atomics, in no fixed order; the sums then rounded to float32)."""
    capturable = False

    def __init__(self, g, fwd):
        super().__init__(g, fwd.inputs[1], fwd.inputs[0], ctx=fwd.ctx)

    def infer_shape(self, s):
        return s[2]

    def compute(self, vals, state):
        g, index, weights = vals
        xp = array_module_of(g)
        if xp is not np:
            return xp.bincount(index.reshape(-1), weights=g.reshape(-1), minlength=weights.shape[0]).astype(np.float32)
        # np.bincount's sums (in double, in index order) in one C++ pass, with no float64 copy of g.
        index = np.ascontiguousarray(index, np.int64).reshape(-1)
        out = state.buffer(self, weights.shape, np.float32)
        bad = _C.bucket_sums(index, np.ascontiguousarray(g, np.float32).reshape(-1), out)
        if bad >= 0:
            raise IndexError(f"{self.name}: bucket {int(index[bad])} outside the {weights.shape[0]} buckets")
        return out


class TimeBucketOp(Op):
    """times int64 [batch, L] -> int64 [batch, L, L]: time_buckets of the gaps |t_i - t_j| of
    query i and key j."""

    def __init__(self, times, num_buckets, ctx=None):
        super().__init__(times, ctx=ctx)
        self.num_buckets = int(num_buckets)

    def infer_shape(self, s):
        if len(s[0]) != 2:
            raise ShapeError(f"{self.name}: times {self.inputs[0].name} {tuple(s[0])} are not [batch, L]")
        return (s[0][0], s[0][1], s[0][1])

    def infer_dtype(self, d):
        return np.int64

    def compute(self, vals, state):
        times = vals[0]
        if array_module_of(times) is not np:
            return time_buckets(times, times, self.num_buckets)
        out = state.buffer(self, (times.shape[0], times.shape[1], times.shape[1]), np.int64)
        _C.time_buckets(np.ascontiguousarray(times, np.int64), bucket_thresholds(self.num_buckets), out)
        return out

    def to_onnx(self, b, x):
        gap = b.node("Abs", [b.node("Sub", [b.node("Unsqueeze", [x[0], b.const(np.array([2], np.int64))]),
                                            b.node("Unsqueeze", [x[0], b.const(np.array([1], np.int64))])])])
        gap = b.node("Cast", [b.node("Max", [gap, b.const(np.array(1, np.int64))])], to=11)   # float64
        logs = b.node("Div", [b.node("Log", [gap]), b.const(np.float64(TIME_BUCKET_DIVISOR))])
        top = b.const(np.float64(self.num_buckets - 1))
        return b.node("Cast", [b.node("Min", [b.node("Floor", [logs]), top])], to=7)   # int64; logs >= 0

    def gradient(self, g):
        return [None]


def masked_softmax_op(scores, mask=None, causal=True, scale=1.0, ctx=None):
    return MaskedSoftmaxOp(scores, mask, causal, scale, ctx=ctx)


def pointwise_attention_op(scores, mask=None, causal=True, scale=1.0, ctx=None):
    return PointwiseAttentionOp(scores, mask, causal, scale, ctx=ctx)


def relative_bias_op(weights, index, ctx=None):
    return RelativeBiasOp(weights, index, ctx=ctx)


def time_bucket_op(times, num_buckets, ctx=None):
    return TimeBucketOp(times, num_buckets, ctx=ctx)
