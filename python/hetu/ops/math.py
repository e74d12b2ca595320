"""Arithmetic: elementwise ops with broadcasting, constants, matmul, reductions, broadcasting."""
import numpy as np

from .. import _C, cuda
from ..context import array_module_of
from ..graph import Op
from ..threads import BlasThreads
from .activation import ActivationGradOp, relu, relu_gradient
from .common import ShapeError, broadcast_shape, normalize_axes, sum_to_shape

__all__ = [
    "add_op", "minus_op", "mul_op", "div_op", "addbyconst_op", "mul_byconst_op", "div_const_op", "opposite_op",
    "matmul_op", "linear_op", "reduce_sum_op", "reduce_mean_op", "broadcastto_op", "broadcast_shape_op", "sum_op",
    "oneslike_op", "zeroslike_op", "sum_to_shape_op", "sqrt_op", "exp_op", "log_op", "power_op",
]


def _xp(x):
    return array_module_of(x)


def _ufunc(ufunc, x):
    """The ufunc of x's array library (NumPy's, or CuPy's of the same name)."""
    xp = array_module_of(x)
    return ufunc if xp is np else getattr(xp, ufunc.__name__)


class _Elementwise(Op):
    """Binary op with NumPy broadcasting; writes into a reused output buffer."""
    ufunc = None
    onnx_type = None   # the ONNX op of the same broadcasting

    def to_onnx(self, b, x):
        return b.node(self.onnx_type, x)

    def infer_shape(self, s):
        return broadcast_shape(self, s[0], s[1])

    def compute(self, vals, state):
        a, b = vals
        out = state.buffer(self, np.broadcast_shapes(a.shape, b.shape), np.result_type(a.dtype, b.dtype))
        return _ufunc(type(self).ufunc, a)(a, b, out=out)


class AddOp(_Elementwise):
    ufunc = np.add
    onnx_type = "Add"

    def gradient(self, g):
        return [sum_to_shape_op(g, self.inputs[0]), sum_to_shape_op(g, self.inputs[1])]


class MinusOp(_Elementwise):
    ufunc = np.subtract
    onnx_type = "Sub"

    def gradient(self, g):
        return [sum_to_shape_op(g, self.inputs[0]), sum_to_shape_op(opposite_op(g), self.inputs[1])]


class MulOp(_Elementwise):
    ufunc = np.multiply
    onnx_type = "Mul"

    def gradient(self, g):
        a, b = self.inputs
        return [sum_to_shape_op(mul_op(g, b), a), sum_to_shape_op(mul_op(g, a), b)]


class DivOp(_Elementwise):
    ufunc = np.divide
    onnx_type = "Div"

    def gradient(self, g):
        a, b = self.inputs
        return [sum_to_shape_op(div_op(g, b), a),
                sum_to_shape_op(opposite_op(div_op(mul_op(g, self), b)), b)]


class _Unary(Op):
    def infer_shape(self, s):
        return s[0]

    def infer_dtype(self, d):
        return d[0]


class AddByConstOp(_Unary):
    def __init__(self, x, const, ctx=None):
        super().__init__(x, ctx=ctx)
        self.const = const

    def compute(self, vals, state):
        return _xp(vals[0]).add(vals[0], self.const, out=state.buffer(self, vals[0].shape, vals[0].dtype))

    def to_onnx(self, b, x):
        return b.node("Add", [x[0], b.const(np.float32(self.const))])

    def gradient(self, g):
        return [g]


class MulByConstOp(_Unary):
    def __init__(self, x, const, ctx=None):
        super().__init__(x, ctx=ctx)
        self.const = const

    def compute(self, vals, state):
        return _xp(vals[0]).multiply(vals[0], self.const, out=state.buffer(self, vals[0].shape, vals[0].dtype))

    def to_onnx(self, b, x):
        return b.node("Mul", [x[0], b.const(np.float32(self.const))])

    def gradient(self, g):
        return [mul_byconst_op(g, self.const)]


class DivConstOp(_Unary):
    """const / x."""

    def __init__(self, const, x, ctx=None):
        super().__init__(x, ctx=ctx)
        self.const = const

    def compute(self, vals, state):
        return _xp(vals[0]).divide(self.const, vals[0], out=state.buffer(self, vals[0].shape, vals[0].dtype))

    def to_onnx(self, b, x):
        return b.node("Div", [b.const(np.float32(self.const)), x[0]])

    def gradient(self, g):
        x = self.inputs[0]
        return [opposite_op(div_op(mul_op(g, self), x))]


class OppositeOp(_Unary):
    def to_onnx(self, b, x):
        return b.node("Neg", x)

    def compute(self, vals, state):
        return _xp(vals[0]).negative(vals[0], out=state.buffer(self, vals[0].shape, vals[0].dtype))

    def gradient(self, g):
        return [opposite_op(g)]


class SqrtOp(_Unary):
    def to_onnx(self, b, x):
        return b.node("Sqrt", x)

    def compute(self, vals, state):
        return _xp(vals[0]).sqrt(vals[0])

    def gradient(self, g):
        return [div_op(mul_byconst_op(g, 0.5), self)]


class ExpOp(_Unary):
    def to_onnx(self, b, x):
        return b.node("Exp", x)

    def compute(self, vals, state):
        return _xp(vals[0]).exp(vals[0])

    def gradient(self, g):
        return [mul_op(g, self)]


class LogOp(_Unary):
    def to_onnx(self, b, x):
        return b.node("Log", x)

    def compute(self, vals, state):
        return _xp(vals[0]).log(vals[0])

    def gradient(self, g):
        return [div_op(g, self.inputs[0])]


class PowerOp(_Unary):
    def __init__(self, x, p, ctx=None):
        super().__init__(x, ctx=ctx)
        self.p = p

    def compute(self, vals, state):
        return _xp(vals[0]).power(vals[0], self.p).astype(vals[0].dtype, copy=False)

    def to_onnx(self, b, x):
        return b.node("Pow", [x[0], b.const(np.float32(self.p))])

    def gradient(self, g):
        x = self.inputs[0]
        return [mul_op(g, mul_byconst_op(power_op(x, self.p - 1), self.p))]


BLAS_THREADS = BlasThreads()   # the process's OpenBLAS, one thread for small products (and the profile's bare calls)


def _matrix_product(a, b, trans_A, trans_B, out):
    """op(a) @ op(b) of two matrices into out ([m, n] float32): cuBLAS on a GPU, else the BLAS."""
    if cuda.is_device_array(a):
        # cuBLAS through hetu's own handle, which a CUDA graph can capture (hetu.cuda.Cublas).
        cp = cuda.cupy()
        return cuda.Cublas.get().matmul(cp.ascontiguousarray(a, dtype=np.float32),
                                        cp.ascontiguousarray(b, dtype=np.float32), trans_A, trans_B, out)
    k = a.shape[0] if trans_A else a.shape[1]
    if k == 1:
        # An outer product (a [batch, 1] gradient times a layer's one-output weight): NumPy's
        # matmul leaves such a pair to its own loop when the [n, 1] operand is transposed, 10-20x
        # slower than the BLAS. Each element is one product, rounded once, as the BLAS rounds it.
        return np.multiply(a.reshape(-1, 1), b.reshape(1, -1), out=out)
    BLAS_THREADS.for_product(out.size * k)
    return np.matmul(a.T if trans_A else a, b.T if trans_B else b, out=out)


class MatMulOp(Op):
    """a @ b of matrices, or of stacks of them with the same leading dims ([..., m, k] @
    [..., k, n]: DLRM's dot interaction [batch, m, k], attention's [batch, heads, L, d]);
    trans_A / trans_B transpose each matrix (the last two axes). On CPU a stack runs through
    _C.batched_matmul, its leading dims as one (its products are too small for a BLAS call each;
    the same bits on every CPU and thread count), a matrix through the BLAS."""

    def __init__(self, a, b, trans_A=False, trans_B=False, ctx=None):
        super().__init__(a, b, ctx=ctx)
        self.trans_A, self.trans_B = trans_A, trans_B

    def infer_shape(self, s):
        a, b = s
        if not (len(a) == len(b) >= 2 and tuple(a[:-2]) == tuple(b[:-2])):
            raise ShapeError(f"{self.name}: matmul takes 2-D inputs or stacks of as many matrices (equal leading "
                             f"dims), got {self.inputs[0].name} {a} and {self.inputs[1].name} {b}")
        m, k = (a[-1], a[-2]) if self.trans_A else a[-2:]
        k2, n = (b[-1], b[-2]) if self.trans_B else b[-2:]
        if k != k2:
            raise ShapeError(f"{self.name}: inner dimensions differ: {self.inputs[0].name} {a}"
                             f"{' (transposed)' if self.trans_A else ''} and {self.inputs[1].name} {b}"
                             f"{' (transposed)' if self.trans_B else ''}")
        return tuple(a[:-2]) + (m, n)

    def compute(self, vals, state):
        a, b = vals
        m = a.shape[-1] if self.trans_A else a.shape[-2]
        n = b.shape[-2] if self.trans_B else b.shape[-1]
        out = state.buffer(self, a.shape[:-2] + (m, n), np.float32)
        if a.ndim >= 3:
            xp = array_module_of(a)
            if xp is np:   # hetu's kernel: NumPy would call the BLAS once per small product of the stack
                count = int(np.prod(a.shape[:-2]))

                def stack(x):
                    return np.ascontiguousarray(x, dtype=np.float32).reshape((count,) + x.shape[-2:])
                _C.batched_matmul(stack(a), stack(b), self.trans_A, self.trans_B, out.reshape((count, m, n)))
                return out
            return xp.matmul(a.swapaxes(-1, -2) if self.trans_A else a, b.swapaxes(-1, -2) if self.trans_B else b,
                             out=out)
        return _matrix_product(a, b, self.trans_A, self.trans_B, out)

    def to_onnx(self, b, x):
        def maybe_transposed(name, transposed, node):
            if not transposed:
                return name
            ndim = len(b.shape_of(node))
            return b.node("Transpose", [name], perm=list(range(ndim - 2)) + [ndim - 1, ndim - 2])
        return b.node("MatMul", [maybe_transposed(x[0], self.trans_A, self.inputs[0]),
                                 maybe_transposed(x[1], self.trans_B, self.inputs[1])])

    def gradient(self, g):
        a, b = self.inputs
        tA, tB = self.trans_A, self.trans_B
        if not tA and not tB:
            return [matmul_op(g, b, False, True), matmul_op(a, g, True, False)]
        if not tA and tB:
            return [matmul_op(g, b, False, False), matmul_op(g, a, True, False)]
        if tA and not tB:
            return [matmul_op(b, g, False, True), matmul_op(a, g, False, False)]
        return [matmul_op(b, g, True, True), matmul_op(g, a, True, True)]


class LinearOp(Op):
    """relu(x @ w + bias), or x @ w + bias (relu False), or x @ w (bias None): ht.layers.Linear as
    one op. x [batch, in], w [in, out], bias [out]. The product is written into the op's output
    and the bias and ReLU applied there in place: one array where matmul, broadcastto, add and
    relu wrote four, the same values bit for bit (the same BLAS call, then the same float adds
    and maximum). The gradient takes ReLU's mask from the output (relu_gradient) and the bias's
    sum as the unfused graph does (sum_to_shape_op)."""

    def __init__(self, x, w, bias=None, relu=False, ctx=None):
        super().__init__(*((x, w) if bias is None else (x, w, bias)), ctx=ctx)
        self.has_bias, self.relu = bias is not None, relu

    def infer_shape(self, s):
        x, w = s[0], s[1]
        if len(x) != 2 or len(w) != 2 or x[1] != w[0]:
            raise ShapeError(f"{self.name}: takes x [batch, in] and w [in, out], got {self.inputs[0].name} {x} and "
                             f"{self.inputs[1].name} {w}")
        if self.has_bias and tuple(s[2]) != (w[1],):
            raise ShapeError(f"{self.name}: bias {self.inputs[2].name} {s[2]} is not [{w[1]}]")
        return (x[0], w[1])

    def compute(self, vals, state):
        x, w = vals[0], vals[1]
        out = _matrix_product(x, w, False, False, state.buffer(self, (x.shape[0], w.shape[1]), np.float32))
        xp = array_module_of(out)
        if self.has_bias:
            xp.add(out, vals[2], out=out)
        return relu(xp, out, out) if self.relu else out

    def backward(self, xp, g, x, y, out):
        """ActivationGradOp's call: the ReLU's gradient, from the output y."""
        return relu_gradient(xp, g, y, out)

    def to_onnx(self, b, x):
        y = b.node("MatMul", x[:2])
        if self.has_bias:
            y = b.node("Add", [y, x[2]])
        return b.node("Relu", [y]) if self.relu else y

    def gradient(self, g):
        x, w = self.inputs[0], self.inputs[1]
        dz = ActivationGradOp(g, self, self) if self.relu else g
        grads = [matmul_op(dz, w, False, True), matmul_op(x, dz, True, False)]
        return grads + [sum_to_shape_op(dz, self.inputs[2])] if self.has_bias else grads


class ReduceOp(Op):
    def __init__(self, x, axes=None, keepdims=False, mean=False, ctx=None):
        super().__init__(x, ctx=ctx)
        self.axes, self.keepdims, self.mean = axes, keepdims, mean

    def infer_shape(self, s):
        axes = normalize_axes(self.axes, len(s[0]))
        if self.keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(s[0]))
        return tuple(d for i, d in enumerate(s[0]) if i not in axes)

    def compute(self, vals, state):
        x = vals[0]
        axes = normalize_axes(self.axes, x.ndim)
        r = x.mean(axis=axes, keepdims=self.keepdims) if self.mean else x.sum(axis=axes, keepdims=self.keepdims)
        return r.astype(x.dtype, copy=False)

    def to_onnx(self, b, x):
        axes = list(normalize_axes(self.axes, len(b.shape_of(self.inputs[0]))))
        keepdims = int(bool(self.keepdims))
        if self.mean:   # opset 17: ReduceMean's axes are an attribute, ReduceSum's an input
            return b.node("ReduceMean", x, axes=axes, keepdims=keepdims)
        return b.node("ReduceSum", [x[0], b.const(np.array(axes, np.int64))], keepdims=keepdims)

    def gradient(self, g):
        return [ReduceGradOp(g, self.inputs[0], self.axes, self.keepdims, self.mean)]


class ReduceGradOp(Op):
    """Spreads the gradient of a sum (or mean) back over the reduced axes of x."""

    def __init__(self, g, x, axes, keepdims, mean, ctx=None):
        super().__init__(g, x, ctx=ctx)
        self.axes, self.keepdims, self.mean = axes, keepdims, mean

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        g, x = vals
        axes = normalize_axes(self.axes, x.ndim)
        if not self.keepdims:
            g = g.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
        out = state.buffer(self, x.shape, np.float32)
        out[...] = g
        if self.mean:
            out *= np.float32(1.0 / max(1, int(np.prod([x.shape[a] for a in axes]))))
        return out

    def gradient(self, g):
        return [ReduceOp(g, self.axes, self.keepdims, self.mean), None]


class BroadcastToOp(Op):
    """Broadcasts x to the shape of `like` (Hetu's broadcastto_op)."""

    def __init__(self, x, like, ctx=None):
        super().__init__(x, like, ctx=ctx)

    def infer_shape(self, s):
        if broadcast_shape(self, s[0], s[1]) != tuple(s[1]):
            raise ShapeError(f"{self.name}: {self.inputs[0].name} {s[0]} does not broadcast to "
                             f"{self.inputs[1].name} {s[1]}")
        return s[1]

    def compute(self, vals, state):
        if cuda.is_device_array(vals[0]):
            # A view: the op that reads it broadcasts in its own kernel, no copy is written.
            return cuda.cupy().broadcast_to(vals[0], vals[1].shape)
        out = state.buffer(self, vals[1].shape, vals[0].dtype)
        out[...] = vals[0]
        return out

    def to_onnx(self, b, x):
        return b.node("Expand", [x[0], b.node("Shape", [x[1]])])

    def gradient(self, g):
        return [sum_to_shape_op(g, self.inputs[0]), None]


class BroadcastShapeOp(_Unary):
    def __init__(self, x, shape, ctx=None):
        super().__init__(x, ctx=ctx)
        self.shape = tuple(shape)

    def infer_shape(self, s):
        try:
            np.broadcast_shapes(s[0], self.shape)
        except ValueError:
            raise ShapeError(f"{self.name}: {self.inputs[0].name} {s[0]} does not broadcast to {self.shape}") from None
        return self.shape

    def compute(self, vals, state):
        xp = _xp(vals[0])
        return xp.ascontiguousarray(xp.broadcast_to(vals[0], self.shape))

    def to_onnx(self, b, x):
        return b.node("Expand", [x[0], b.const(np.array(self.shape, np.int64))])

    def gradient(self, g):
        return [sum_to_shape_op(g, self.inputs[0])]


class SumToShapeOp(Op):
    """Sums g (a broadcast gradient) down to the shape of `like`."""

    def __init__(self, g, like, ctx=None):
        super().__init__(g, like, ctx=ctx)

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        g, like = vals
        k = _leading_reduction(g, like.shape) if cuda.is_device_array(g) else None
        if k:
            # A sum over the leading axes (a bias gradient) as ones[1, m] @ g[m, c] through
            # cuBLAS: CuPy's column reductions are many times slower, and this one is capturable.
            m = int(np.prod(g.shape[:k]))
            out = state.buffer(self, (1, g.size // m), np.float32)
            rows = cuda.cupy().ascontiguousarray(g).reshape(m, g.size // m)
            return cuda.Cublas.get().matmul(cuda.ones_row(m), rows, False, False, out).reshape(like.shape)
        return sum_to_shape(array_module_of(g), g, like.shape)

    def gradient(self, g):
        return [broadcastto_op(g, self.inputs[0]), None]


def _leading_reduction(g, shape):
    """k > 0 where summing float32 g down to `shape` sums exactly its first k axes, else None."""
    if g.dtype != np.float32 or g.ndim < 2:
        return None
    full = (1,) * (g.ndim - len(shape)) + tuple(shape)
    k = 0
    while k < g.ndim and full[k] == 1 and g.shape[k] != 1:
        k += 1
    return k if k and full[k:] == g.shape[k:] else None


class SumOp(Op):
    """Sum of several same-shaped nodes (gradient fan-in)."""

    def infer_shape(self, s):
        for i, x in enumerate(s[1:], 1):
            if tuple(x) != tuple(s[0]):
                raise ShapeError(f"{self.name}: {self.inputs[0].name} {s[0]} and {self.inputs[i].name} {x} differ")
        return s[0]

    def compute(self, vals, state):
        out = state.buffer(self, vals[0].shape, vals[0].dtype)
        xp = _xp(vals[0])
        xp.add(vals[0], vals[1], out=out) if len(vals) > 1 else xp.copyto(out, vals[0])
        for v in vals[2:]:
            out += v
        return out

    def to_onnx(self, b, x):
        return b.node("Sum", x)

    def gradient(self, g):
        return [g] * len(self.inputs)


class FillLikeOp(_Unary):
    def __init__(self, x, value, ctx=None):
        super().__init__(x, ctx=ctx)
        self.value = value

    def infer_dtype(self, d):
        return np.float32

    def compute(self, vals, state):
        out = state.buffer(self, vals[0].shape, np.float32)
        out.fill(self.value)
        return out

    def gradient(self, g):
        return [None]


def add_op(a, b, ctx=None):
    return AddOp(a, b, ctx=ctx)


def minus_op(a, b, ctx=None):
    return MinusOp(a, b, ctx=ctx)


def mul_op(a, b, ctx=None):
    return MulOp(a, b, ctx=ctx)


def div_op(a, b, ctx=None):
    return DivOp(a, b, ctx=ctx)


def addbyconst_op(x, const, ctx=None):
    return AddByConstOp(x, const, ctx=ctx)


def mul_byconst_op(x, const, ctx=None):
    return MulByConstOp(x, const, ctx=ctx)


def div_const_op(const, x, ctx=None):
    return DivConstOp(const, x, ctx=ctx)


def opposite_op(x, ctx=None):
    return OppositeOp(x, ctx=ctx)


def sqrt_op(x, ctx=None):
    return SqrtOp(x, ctx=ctx)


def exp_op(x, ctx=None):
    return ExpOp(x, ctx=ctx)


def log_op(x, ctx=None):
    return LogOp(x, ctx=ctx)


def power_op(x, p, ctx=None):
    return PowerOp(x, p, ctx=ctx)


def matmul_op(a, b, trans_A=False, trans_B=False, ctx=None):
    return MatMulOp(a, b, trans_A, trans_B, ctx=ctx)


def linear_op(x, w, bias=None, relu=False, ctx=None):
    return LinearOp(x, w, bias, relu, ctx=ctx)


def reduce_sum_op(x, axes=None, keepdims=False, ctx=None):
    return ReduceOp(x, axes, keepdims, mean=False, ctx=ctx)


def reduce_mean_op(x, axes=None, keepdims=False, ctx=None):
    return ReduceOp(x, axes, keepdims, mean=True, ctx=ctx)


def broadcastto_op(x, like, ctx=None):
    return BroadcastToOp(x, like, ctx=ctx)


def broadcast_shape_op(x, shape, ctx=None):
    return BroadcastShapeOp(x, shape, ctx=ctx)


def sum_to_shape_op(g, like, ctx=None):
    return SumToShapeOp(g, like, ctx=ctx)


def sum_op(nodes, ctx=None):
    return SumOp(*nodes, ctx=ctx)


def oneslike_op(x, ctx=None):
    return FillLikeOp(x, 1.0, ctx=ctx)


def zeroslike_op(x, ctx=None):
    return FillLikeOp(x, 0.0, ctx=ctx)
