"""Embedding lookup. Its gradient is sparse: the looked-up ids and one gradient row per id
(duplicates kept; the optimizer sums them), never a table-sized dense array."""
import numpy as np

from .. import _C
from ..context import array_module_of
from ..graph import Op
from .common import ShapeError

__all__ = ["embedding_lookup_op", "IndexedSlices"]


class IndexedSlices:
    """A sparse gradient: rows `values[i]` belong to row `indices[i]` of a dense_shape tensor."""
    __slots__ = ("indices", "values", "dense_shape")

    def __init__(self, indices, values, dense_shape):
        self.indices, self.values, self.dense_shape = indices, values, tuple(dense_shape)

    def to_dense(self):
        xp = array_module_of(self.values)
        out = xp.zeros(self.dense_shape, dtype=np.float32)
        if xp is np:
            np.add.at(out, self.indices, self.values)
        else:
            import cupyx
            cupyx.scatter_add(out, self.indices, self.values)
        return out


def gather(op_name, table, ids, out):
    """out = table[ids] with a bounds check that names the op, the id and the table size."""
    xp = array_module_of(table)
    flat = ids.reshape(-1)
    if xp is np:
        bad = _C.gather_rows(table, flat, out.reshape(flat.size, table.shape[1]))
        if bad is not None:
            raise IndexError(f"{op_name}: id {bad[1]} (position {bad[0]}) outside the table of {table.shape[0]} rows")
        return out
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= table.shape[0]):
        raise IndexError(f"{op_name}: id {int(flat.max())} outside the table of {table.shape[0]} rows")
    xp.take(table, flat, axis=0, out=out.reshape(flat.size, table.shape[1]))
    return out


class EmbeddingLookupOp(Op):
    def __init__(self, table, ids, ctx=None):
        super().__init__(table, ids, ctx=ctx)

    def infer_shape(self, s):
        table, ids = s
        if len(table) != 2:
            raise ShapeError(f"{self.name}: table {self.inputs[0].name} must be 2-D, got {table}")
        return tuple(ids) + (table[1],)

    def compute(self, vals, state):
        table, ids = vals
        if ids.dtype != np.int64:
            raise TypeError(f"{self.name}: ids {self.inputs[1].name} are {ids.dtype}, expected int64")
        out = state.buffer(self, ids.shape + (table.shape[1],), np.float32)
        return gather(self.name, table, ids, out)

    def gradient(self, g):
        return [EmbeddingLookupGradOp(g, self.inputs[1], self.inputs[0]), None]


class EmbeddingLookupGradOp(Op):
    """Reads only the table's shape, never its value (the table may live on the servers); a fed
    table of unknown static shape is an input so its shape is known at run time."""
    produces_sparse = True

    def __init__(self, g, ids, table, ctx=None):
        extra = (table,) if getattr(table, "shape", None) is None else ()
        super().__init__(g, ids, *extra, ctx=ctx)
        self.table = table

    def infer_shape(self, s):
        return s[2] if len(s) > 2 else self.table.shape

    def compute(self, vals, state):
        g, ids = vals[:2]
        shape = vals[2].shape if len(vals) > 2 else self.table.shape
        return IndexedSlices(ids.reshape(-1), g.reshape(-1, shape[1]), shape)


class SparseSumOp(Op):
    """Fan-in of sparse gradients (a table looked up more than once): concatenates the rows."""
    produces_sparse = True

    def infer_shape(self, s):
        return s[0]

    def compute(self, vals, state):
        xp = array_module_of(vals[0].values)
        return IndexedSlices(xp.concatenate([v.indices for v in vals]), xp.concatenate([v.values for v in vals]),
                             vals[0].dense_shape)


def embedding_lookup_op(table, ids, ctx=None):
    return EmbeddingLookupOp(table, ids, ctx=ctx)
