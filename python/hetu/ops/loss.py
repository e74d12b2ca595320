"""Losses. Each returns one loss per sample (or element); models reduce them."""
import numpy as np

from .. import cuda
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
    """loss = forward(x, label); d loss / d x = backward(x, label) * g. Labels get no gradient.
    A loss with fused device kernels defines gpu_forward(state, x, label) and
    gpu_backward(state, grad_op, g, x, label), writing
    into grad_op's buffers."""

    def compute(self, vals, state):
        if cuda.is_device_array(vals[0]) and hasattr(self, "gpu_forward"):
            return self.gpu_forward(state, *vals)
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
        if cuda.is_device_array(x) and hasattr(self.loss, "gpu_backward"):
            return self.loss.gpu_backward(state, self, g, x, label)
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

    # One fused kernel each way on the device, the same formulas.
    def gpu_forward(self, state, x, y):
        kernel = cuda.elementwise("hetu_bce_logits", "float32 x, Y y", "float32 out",
                                  "out = fmaxf(x, 0.0f) - x * (float)y + log1pf(expf(-fabsf(x)))")
        return kernel(x, y, state.buffer(self, x.shape, np.float32))

    def gpu_backward(self, state, grad_op, g, x, y):
        kernel = cuda.elementwise(
            "hetu_bce_logits_grad", "float32 g, float32 x, Y y", "float32 out",
            "float e = expf(-fabsf(x)); float sig = x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);"
            "out = g * (sig - (float)y)")
        return kernel(g, x, y, state.buffer(grad_op, x.shape, np.float32))


# Softmax cross-entropy on the device, one thread per row of C classes: the row's maximum, the log
# of its sum of exponentials, then the loss (forward) or softmax minus the label (backward).
# `label` is a row of C soft labels (dense) or one class id (sparse; `ignored` gives 0, an id
# outside [0, C) records the row in *bad).
_SOFTMAX_CE = r"""
__device__ void row_stats(const float* x, long long c, float* mx, float* lse) {
  float m = x[0];
  for (long long k = 1; k < c; ++k) m = fmaxf(m, x[k]);
  float s = 0.0f;
  for (long long k = 0; k < c; ++k) s += expf(x[k] - m);
  *mx = m; *lse = logf(s);
}

extern "C" __global__ void hetu_softmax_ce(const float* x, const float* y, long long n, long long c, float* loss) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* xi = x + i * c; const float* yi = y + i * c;
  float m, lse; row_stats(xi, c, &m, &lse);
  float acc = 0.0f;
  for (long long k = 0; k < c; ++k) acc += yi[k] * (xi[k] - m - lse);
  loss[i] = -acc;
}

extern "C" __global__ void hetu_softmax_ce_grad(const float* g, const float* x, const float* y, long long n,
                                                long long c, float* dx) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* xi = x + i * c; const float* yi = y + i * c;
  float m, lse; row_stats(xi, c, &m, &lse);
  for (long long k = 0; k < c; ++k) dx[i * c + k] = (expf(xi[k] - m - lse) - yi[k]) * g[i];
}

extern "C" __global__ void hetu_softmax_ce_sparse(const float* x, const long long* label, long long n, long long c,
                                                  long long ignored, float* loss, long long* bad) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  long long l = label[i];
  if (l == ignored) { loss[i] = 0.0f; return; }
  if (l < 0 || l >= c) {
    loss[i] = 0.0f;
    atomicCAS((unsigned long long*)bad, (unsigned long long)-1LL, (unsigned long long)i);
    return;
  }
  const float* xi = x + i * c;
  float m, lse; row_stats(xi, c, &m, &lse);
  loss[i] = -(xi[l] - m - lse);
}

extern "C" __global__ void hetu_softmax_ce_sparse_grad(const float* g, const float* x, const long long* label,
                                                       long long n, long long c, long long ignored, float* dx) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  long long l = label[i];
  bool keep = l != ignored && l >= 0 && l < c;
  const float* xi = x + i * c;
  float m, lse; row_stats(xi, c, &m, &lse);
  for (long long k = 0; k < c; ++k)
    dx[i * c + k] = keep ? (expf(xi[k] - m - lse) - (k == l ? 1.0f : 0.0f)) * g[i] : 0.0f;
}
"""


def _softmax_ce_kernel(name):
    return cuda.raw_kernel(name, _SOFTMAX_CE)


def _rows(x):
    """x as [rows, classes], contiguous float32."""
    return cuda.cupy().ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float32)


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

    def gpu_forward(self, state, x, y):
        n, c = int(np.prod(x.shape[:-1])), x.shape[-1]
        out = state.buffer(self, x.shape[:-1], np.float32)
        cuda.launch(_softmax_ce_kernel("hetu_softmax_ce"), n, (_rows(x), _rows(y), np.int64(n), np.int64(c), out))
        return out

    def gpu_backward(self, state, grad_op, g, x, y):
        n, c = int(np.prod(x.shape[:-1])), x.shape[-1]
        out = state.buffer(grad_op, x.shape, np.float32)
        cuda.launch(_softmax_ce_kernel("hetu_softmax_ce_grad"), n,
                    (cuda.cupy().ascontiguousarray(g, dtype=np.float32), _rows(x), _rows(y), np.int64(n),
                     np.int64(c), out))
        return out


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

    def gpu_forward(self, state, x, labels):
        cp = cuda.cupy()
        n, c = int(np.prod(x.shape[:-1])), x.shape[-1]
        ids = cp.ascontiguousarray(labels.reshape(-1), dtype=np.int64)
        bad = state.checks.slot(self.name, lambda row: IndexError(
            f"{self.name}: label {int(cuda.to_host(ids[row]))} (row {row}) outside [0, {c})"))
        out = state.buffer(self, x.shape[:-1], np.float32)
        cuda.launch(_softmax_ce_kernel("hetu_softmax_ce_sparse"), n,
                    (_rows(x), ids, np.int64(n), np.int64(c), np.int64(self.ignored_index), out, bad))
        return out

    def gpu_backward(self, state, grad_op, g, x, labels):
        cp = cuda.cupy()
        n, c = int(np.prod(x.shape[:-1])), x.shape[-1]
        out = state.buffer(grad_op, x.shape, np.float32)
        cuda.launch(_softmax_ce_kernel("hetu_softmax_ce_sparse_grad"), n,
                    (cp.ascontiguousarray(g, dtype=np.float32), _rows(x),
                     cp.ascontiguousarray(labels.reshape(-1), dtype=np.int64), np.int64(n), np.int64(c),
                     np.int64(self.ignored_index), out))
        return out


def binarycrossentropy_op(pred, label, ctx=None):
    return BinaryCrossEntropyOp(pred, label, ctx=ctx)


def binarycrossentropywithlogits_op(logits, label, ctx=None):
    return BinaryCrossEntropyWithLogitsOp(logits, label, ctx=ctx)


def softmaxcrossentropy_op(logits, label, ctx=None):
    return SoftmaxCrossEntropyOp(logits, label, ctx=ctx)


def softmaxcrossentropy_sparse_op(logits, label, ignored_index=-1, ctx=None):
    return SoftmaxCrossEntropySparseOp(logits, label, ignored_index, ctx=ctx)
