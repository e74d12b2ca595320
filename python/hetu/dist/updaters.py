"""How a distributed parameter is updated after the backward pass. Each updater replaces the
local step of one parameter (OptimizerOp.updaters)."""
from ..ops.embedding import IndexedSlices
from ..optim import local_update


class AllReduceUpdater:
    """Sums the gradient over workers, then every worker applies the same local step, so the
    replicas stay identical. Sparse gradients travel as (ids, rows), never densified."""

    def __init__(self, comm, optimizer):
        self.comm, self.optimizer = comm, optimizer

    def update(self, state, param, grad, lr):
        if isinstance(grad, IndexedSlices):
            ids, rows = self.comm.allgather_rows(grad.indices, grad.values)
            grad = IndexedSlices(ids, rows, grad.dense_shape)
        else:
            grad = self.comm.allreduce_sum(grad)
        local_update(state, self.optimizer, param, grad, lr)
