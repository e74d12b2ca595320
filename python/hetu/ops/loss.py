"""Losses. Each returns one loss per sample (or element); models reduce them."""
import numpy as np

from ..context import array_module_of
from ..graph import Op
from .common import ShapeError

__all__ = ["binarycrossentropy_op", "binarycrossentropywithlogits_op", "softmaxcrossentropy_op",
           "softmaxcrossentropy_sparse_op"]

_EPS = np.float32(1e-7)


def _same_shape(op, s):
    if tuple(s[0]) != tuple(s[1]):
        raise ShapeError(f"{op.name}: prediction {op.inputs[0].name} {s[0]} and label {op.inputs[1].name} {s[1]} differ")
    return s[0]


class Loss(Op):
    """loss = forward(x, label); d loss / d x = backward(x, label) * g. Labels get no gradient."""

    def compute(self, vals, state):
        return self.forward(array_module_of(vals[0]), *vals)

    def gradient(self, g):
        return [LossGradOp(g, self), None]


class LossGradOp(Op):
    def __init__(self, g, loss):
        super().__init__(g, *loss.inputs, ctx=loss.ctx)
        self.loss = loss

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        g, x, label = vals
        return self.loss.backward(array_module_of(x), g, x, label)


class BinaryCrossEntropyOp(Loss):
    """On probabilities, clipped to [eps, 1 - eps] so log never sees 0."""

    def infer_shape(self, s):
        return _same_shape(self, s)

    def forward(self, xp, p, y):
        p = xp.clip(p, _EPS, 1 - _EPS)
        return -(y * xp.log(p) + (1 - y) * xp.log(1 - p))

    def backward(self, xp, g, p, y):
        p = xp.clip(p, _EPS, 1 - _EPS)
        return g * (p - y) / (p * (1 - p))


class BinaryCrossEntropyWithLogitsOp(Loss):
    """max(x, 0) - x y + log(1 + exp(-|x|)): finite for any logit."""

    def infer_shape(self, s):
        return _same_shape(self, s)

    def forward(self, xp, x, y):
        return xp.maximum(x, 0) - x * y + xp.log1p(xp.exp(-xp.abs(x)))

    def backward(self, xp, g, x, y):
        e = xp.exp(-xp.abs(x))
        sig = xp.where(x >= 0, 1 / (1 + e), e / (1 + e))
        return g * (sig - y)


def _log_softmax(xp, x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))


class SoftmaxCrossEntropyOp(Loss):
    """Logits [N, C] and one-hot (or soft) labels [N, C] -> [N]."""

    def infer_shape(self, s):
        return _same_shape(self, s)[:-1]

    def forward(self, xp, x, y):
        return -(y * _log_softmax(xp, x)).sum(axis=-1)

    def backward(self, xp, g, x, y):
        return (xp.exp(_log_softmax(xp, x)) - y) * g[..., None]


class SoftmaxCrossEntropySparseOp(Loss):
    """Logits [N, C] and integer labels [N] -> [N]; labels equal to ignored_index give 0."""

    def __init__(self, logits, labels, ignored_index=-1, ctx=None):
        super().__init__(logits, labels, ctx=ctx)
        self.ignored_index = ignored_index

    def infer_shape(self, s):
        if tuple(s[0][:-1]) != tuple(s[1]):
            raise ShapeError(f"{self.name}: logits {self.inputs[0].name} {s[0]} and labels "
                             f"{self.inputs[1].name} {s[1]} do not match")
        return s[1]

    def infer_dtype(self, d):
        return np.float32

    def _picked(self, xp, x, labels):
        ids = labels.astype(np.int64)
        keep = ids != self.ignored_index
        safe = xp.where(keep, ids, 0)
        if safe.size and (safe.min() < 0 or safe.max() >= x.shape[-1]):
            raise IndexError(f"{self.name}: label outside [0, {x.shape[-1]})")
        return safe, keep

    def forward(self, xp, x, labels):
        safe, keep = self._picked(xp, x, labels)
        lsm = _log_softmax(xp, x)
        picked = xp.take_along_axis(lsm, safe[..., None], axis=-1)[..., 0]
        return xp.where(keep, -picked, 0).astype(np.float32)

    def backward(self, xp, g, x, labels):
        safe, keep = self._picked(xp, x, labels)
        grad = xp.exp(_log_softmax(xp, x))
        xp.put_along_axis(grad, safe[..., None], xp.take_along_axis(grad, safe[..., None], axis=-1) - 1, axis=-1)
        return grad * (g * keep)[..., None]


def binarycrossentropy_op(pred, label, ctx=None):
    return BinaryCrossEntropyOp(pred, label, ctx=ctx)


def binarycrossentropywithlogits_op(logits, label, ctx=None):
    return BinaryCrossEntropyWithLogitsOp(logits, label, ctx=ctx)


def softmaxcrossentropy_op(logits, label, ctx=None):
    return SoftmaxCrossEntropyOp(logits, label, ctx=ctx)


def softmaxcrossentropy_sparse_op(logits, label, ignored_index=-1, ctx=None):
    return SoftmaxCrossEntropySparseOp(logits, label, ignored_index, ctx=ctx)
