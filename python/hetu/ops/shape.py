"""Shape ops: concat, reshape, slice, lower triangle, transpose, one_hot, where."""
import numpy as np

from ..context import array_module_of
from ..graph import Op
from .common import ShapeError

__all__ = ["concat_op", "concatenate_op", "array_reshape_op", "slice_op", "lower_triangle_op", "transpose_op",
           "one_hot_op", "where_op"]


class ConcatOp(Op):
    def __init__(self, *nodes, axis=0, ctx=None):
        super().__init__(*nodes, ctx=ctx)
        self.axis = axis

    def infer_shape(self, s):
        ax = self.axis % len(s[0])
        for i, x in enumerate(s[1:], 1):
            if len(x) != len(s[0]) or any(a != b for k, (a, b) in enumerate(zip(x, s[0])) if k != ax):
                raise ShapeError(f"{self.name}: cannot concatenate {self.inputs[0].name} {s[0]} and "
                                 f"{self.inputs[i].name} {x} on axis {self.axis}")
        out = list(s[0])
        out[ax] = sum(x[ax] for x in s)
        return tuple(out)

    def compute(self, vals, state):
        shape = list(vals[0].shape)
        ax = self.axis % len(shape)
        shape[ax] = sum(v.shape[ax] for v in vals)
        return array_module_of(vals[0]).concatenate(vals, axis=ax, out=state.buffer(self, tuple(shape), vals[0].dtype))

    def to_onnx(self, b, x):
        return b.node("Concat", x, axis=self.axis)

    def gradient(self, g):
        return [ConcatGradOp(g, self, i) for i in range(len(self.inputs))]


class ConcatGradOp(Op):
    """The part of a concat's gradient that belongs to input `index`."""

    def __init__(self, g, concat, index):
        super().__init__(g, *concat.inputs, ctx=concat.ctx)
        self.axis, self.index = concat.axis, index

    def infer_shape(self, s):
        return s[1 + self.index]

    def compute(self, vals, state):
        g, parts = vals[0], vals[1:]
        ax = self.axis % g.ndim
        begin = sum(p.shape[ax] for p in parts[:self.index])
        idx = [slice(None)] * g.ndim
        idx[ax] = slice(begin, begin + parts[self.index].shape[ax])
        return g[tuple(idx)]


class ReshapeOp(Op):
    def __init__(self, x, shape, ctx=None):
        super().__init__(x, ctx=ctx)
        self.shape = tuple(shape)

    def _resolve(self, in_shape):
        size = int(np.prod(in_shape))
        known = int(np.prod([d for d in self.shape if d != -1]))
        if self.shape.count(-1) > 1 or (self.shape.count(-1) == 0 and known != size) or (
                known == 0 or size % known):
            raise ShapeError(f"{self.name}: cannot reshape {self.inputs[0].name} {tuple(in_shape)} to {self.shape}")
        return tuple(size // known if d == -1 else d for d in self.shape)

    def infer_shape(self, s):
        return self._resolve(s[0])

    def infer_dtype(self, d):
        return d[0]

    def compute(self, vals, state):
        return vals[0].reshape(self._resolve(vals[0].shape))

    def to_onnx(self, b, x):
        # A dimension of 0 would mean "copy" to ONNX; _resolve refuses 0, so none is given.
        return b.node("Reshape", [x[0], b.const(np.array(self.shape, np.int64))])

    def gradient(self, g):
        return [ReshapeLikeOp(g, self.inputs[0])]


class ReshapeLikeOp(Op):
    def __init__(self, x, like, ctx=None):
        super().__init__(x, like, ctx=ctx)

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        return vals[0].reshape(vals[1].shape)

    def gradient(self, g):
        return [ReshapeLikeOp(g, self.inputs[0]), None]


class SliceOp(Op):
    """x[begin : begin + size] per axis; a size of -1 runs to the end."""

    def __init__(self, x, begin, size, ctx=None):
        super().__init__(x, ctx=ctx)
        self.begin, self.size = tuple(begin), tuple(size)

    def _index(self, shape):
        if len(self.begin) != len(shape) or len(self.size) != len(shape):
            raise ShapeError(f"{self.name}: begin {self.begin} / size {self.size} do not match "
                             f"{self.inputs[0].name} {tuple(shape)}")
        idx = []
        for b, n, d in zip(self.begin, self.size, shape):
            e = d if n == -1 else b + n
            if b < 0 or e > d or e < b:
                raise ShapeError(f"{self.name}: slice [{b}:{e}] outside axis of size {d} of {self.inputs[0].name}")
            idx.append(slice(b, e))
        return tuple(idx)

    def infer_shape(self, s):
        return tuple(sl.stop - sl.start for sl in self._index(s[0]))

    def compute(self, vals, state):
        return vals[0][self._index(vals[0].shape)]

    def to_onnx(self, b, x):
        ends = [np.iinfo(np.int64).max if n == -1 else begin + n for begin, n in zip(self.begin, self.size)]
        return b.node("Slice", [x[0], b.const(np.array(self.begin, np.int64)), b.const(np.array(ends, np.int64)),
                                b.const(np.arange(len(self.begin), dtype=np.int64))])

    def gradient(self, g):
        return [SliceGradOp(g, self.inputs[0], self)]


class GradIntoZerosOp(Op):
    """Inputs (g, ..., x): the gradients written into one buffer of zeros shaped like x where the
    forward op (or ops) took them from (`write(out, *grads)`): the gradient of an op that picks
    some of x's elements."""

    def infer_shape(self, s):
        return s[-1]

    def compute(self, vals, state):
        *grads, x = vals
        out = state.buffer(self, x.shape, np.float32)
        out.fill(0)
        self.write(out, *grads)
        return out


class SliceGradOp(GradIntoZerosOp):
    def __init__(self, g, x, fwd):
        super().__init__(g, x, ctx=fwd.ctx)
        self.fwd = fwd

    def write(self, out, g):
        out[self.fwd._index(out.shape)] = g


class SlicesGradOp(GradIntoZerosOp):
    """Inputs (g_1, ..., g_n, x): the sum of the gradients of n slices of one x (HSTU's u, v, q
    and k of one projection), each g added into its place. The sum of their SliceGradOps (a
    buffer of zeros each, then a SumOp) had the same bits at n times the memory traffic
    (autodiff's fan-in sums choose this one)."""

    def __init__(self, grads, x, fwds):
        super().__init__(*grads, x, ctx=fwds[0].ctx)
        self.fwds = tuple(fwds)

    def write(self, out, *grads):
        for fwd, g in zip(self.fwds, grads):
            out[fwd._index(out.shape)] += g


class TransposeOp(Op):
    def __init__(self, x, perm=None, ctx=None):
        super().__init__(x, ctx=ctx)
        self.perm = None if perm is None else tuple(perm)

    def _perm(self, ndim):
        return tuple(reversed(range(ndim))) if self.perm is None else self.perm

    def infer_shape(self, s):
        p = self._perm(len(s[0]))
        if sorted(p) != list(range(len(s[0]))):
            raise ShapeError(f"{self.name}: {p} is not a permutation of the axes of {self.inputs[0].name} {s[0]}")
        return tuple(s[0][i] for i in p)

    def compute(self, vals, state):
        return vals[0].transpose(self._perm(vals[0].ndim))

    def to_onnx(self, b, x):
        return b.node("Transpose", x, perm=list(self._perm(len(b.shape_of(self.inputs[0])))))

    def gradient(self, g):
        # Reversing the axes is its own inverse; an explicit permutation is undone by its argsort.
        return [TransposeOp(g, None if self.perm is None else tuple(int(i) for i in np.argsort(self.perm)))]


class OneHotOp(Op):
    capturable = False   # checks its class ids on the host
    def __init__(self, x, num_classes, ctx=None):
        super().__init__(x, ctx=ctx)
        self.num_classes = int(num_classes)

    def infer_shape(self, s):
        return tuple(s[0]) + (self.num_classes,)

    def compute(self, vals, state):
        x = vals[0]
        xp = array_module_of(x)
        ids = x.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_classes):
            raise IndexError(f"{self.name}: class id {int(ids.max() if ids.max() >= self.num_classes else ids.min())}"
                             f" outside [0, {self.num_classes})")
        return (ids[..., None] == xp.arange(self.num_classes)).astype(np.float32)

    def gradient(self, g):
        return [None]


class WhereOp(Op):
    def __init__(self, cond, a, b, ctx=None):
        super().__init__(cond, a, b, ctx=ctx)

    def infer_shape(self, s):
        try:
            return tuple(np.broadcast_shapes(*s))
        except ValueError:
            raise ShapeError(f"{self.name}: condition {s[0]}, {self.inputs[1].name} {s[1]} and "
                             f"{self.inputs[2].name} {s[2]} do not broadcast") from None

    def compute(self, vals, state):
        c, a, b = vals
        return array_module_of(a).where(c.astype(bool), a, b).astype(np.float32, copy=False)

    def to_onnx(self, b, x):
        from onnx import TensorProto
        return b.node("Where", [b.node("Cast", [x[0]], to=TensorProto.BOOL), x[1], x[2]])

    def gradient(self, g):
        from .math import sum_to_shape_op, zeroslike_op
        zero = zeroslike_op(g)
        c, a, b = self.inputs
        return [None, sum_to_shape_op(WhereOp(c, g, zero), a), sum_to_shape_op(WhereOp(c, zero, g), b)]


class LowerTriangleOp(Op):
    """The strict lower triangle of each matrix of a stack [batch, n, n], row by row:
    [batch, n * (n - 1) / 2] (DLRM's pairwise interactions: entry (i, j) for i > j)."""

    def infer_shape(self, s):
        x = s[0]
        if len(x) != 3 or x[1] != x[2]:
            raise ShapeError(f"{self.name}: takes a stack of square matrices [batch, n, n], got "
                             f"{self.inputs[0].name} {tuple(x)}")
        return (x[0], x[1] * (x[1] - 1) // 2)

    def compute(self, vals, state):
        x = vals[0]
        positions = triangle_positions(array_module_of(x), x.shape[1])
        out = state.buffer(self, (x.shape[0], len(positions)), np.float32)
        return array_module_of(x).take(x.reshape(x.shape[0], -1), positions, axis=1, out=out)

    def to_onnx(self, b, x):
        n = b.shape_of(self.inputs[0])[1]
        flat = b.node("Reshape", [x[0], b.const(np.array([-1, n * n], np.int64))])
        return b.node("Gather", [flat, b.const(triangle_positions(np, n).astype(np.int64))], axis=1)

    def gradient(self, g):
        return [LowerTriangleGradOp(g, self.inputs[0], ctx=self.ctx)]


class LowerTriangleGradOp(GradIntoZerosOp):
    """g [batch, pairs] written back into the strict lower triangles of zeros like x."""

    def write(self, out, g):
        out.reshape(out.shape[0], -1)[:, triangle_positions(array_module_of(out), out.shape[1])] = g


_TRIANGLES = {}


def triangle_positions(xp, n):
    """Where the strict lower triangle of an n x n matrix lies in its flattened form, row by row;
    made once per array module and n (a device copy made during a CUDA graph's capture would break
    it)."""
    key = (xp.__name__, n)
    if key not in _TRIANGLES:
        rows, cols = np.tril_indices(n, -1)
        _TRIANGLES[key] = xp.asarray(rows * n + cols)
    return _TRIANGLES[key]


def concat_op(a, b, axis=0, ctx=None):
    return ConcatOp(a, b, axis=axis, ctx=ctx)


def concatenate_op(nodes, axis=0, ctx=None):
    return ConcatOp(*nodes, axis=axis, ctx=ctx)


def array_reshape_op(x, shape, ctx=None):
    return ReshapeOp(x, shape, ctx=ctx)


def slice_op(x, begin, size, ctx=None):
    return SliceOp(x, begin, size, ctx=ctx)


def lower_triangle_op(x, ctx=None):
    return LowerTriangleOp(x, ctx=ctx)


def transpose_op(x, perm=None, ctx=None):
    return TransposeOp(x, perm, ctx=ctx)


def one_hot_op(x, num_classes, ctx=None):
    return OneHotOp(x, num_classes, ctx=ctx)


def where_op(cond, a, b, ctx=None):
    return WhereOp(cond, a, b, ctx=ctx)
