"""Reverse-mode autodiff over the graph: walks it backwards from the loss and sums fan-in
gradients. Embedding gradients stay sparse (IndexedSlices) all the way to the optimizer."""
import numpy as np

from .graph import Op, topo_sort
from .ops.embedding import SparseSumOp
from .ops.math import sum_op
from .ops.shape import SliceGradOp, SlicesGradOp


class GradientSeedOp(Op):
    """d(loss)/d(loss): ones, times `scale`. Distribution passes set the scale so that summing
    the workers' gradients gives the gradient of the global mean (docs/design.md section 4)."""

    def __init__(self, loss):
        super().__init__(loss, ctx=loss.ctx)
        self.scale = 1.0

    def infer_shape(self, s):
        return s[0]

    def compute(self, vals, state):
        out = state.buffer(self, vals[0].shape, np.float32)
        out.fill(self.scale)
        return out

    def gradient(self, g):
        return [None]


class SparseToDenseOp(Op):
    capturable = False   # sums rows by a sort
    def infer_shape(self, s):
        return s[0]

    def compute(self, vals, state):
        return vals[0].to_dense()


def _is_sparse(node):
    return getattr(node, "produces_sparse", False)


def _sum_gradients(grads):
    if len(grads) == 1:
        return grads[0]
    if all(_is_sparse(g) for g in grads):
        return SparseSumOp(*grads)
    if all(isinstance(g, SliceGradOp) for g in grads) and len({g.inputs[-1].id for g in grads}) == 1:
        return SlicesGradOp([g.inputs[0] for g in grads], grads[0].inputs[-1], [g.fwd for g in grads])
    return sum_op([SparseToDenseOp(g) if _is_sparse(g) else g for g in grads])


def gradients(output, node_list, insert_grad=None):
    """Nodes computing d(output)/d(node) for each node of node_list (None if it does not depend)."""
    seed = insert_grad if insert_grad is not None else GradientSeedOp(output)
    pending = {output.id: [seed]}
    computed = {}
    for node in reversed(topo_sort([output])):
        grads = pending.pop(node.id, None)
        if not grads:
            continue
        g = _sum_gradients(grads)
        computed[node.id] = g
        if not node.inputs:
            continue
        for inp, ig in zip(node.inputs, node.gradient(g)):
            if ig is not None:
                pending.setdefault(inp.id, []).append(ig)
    return [computed.get(n.id) for n in node_list]
