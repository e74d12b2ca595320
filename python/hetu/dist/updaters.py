"""How a distributed parameter is updated after the backward pass. Each updater replaces the
local step of one parameter (OptimizerOp.updaters)."""
import time

from ..ops.embedding import IndexedSlices
from ..optim import local_update


class AllReduceUpdater:
    """Sums the gradient over workers, then every worker applies the same local step, so the
    replicas stay identical. Sparse gradients travel as (ids, rows), never densified. The time
    spent summing goes to `counters` (dense_sync_seconds)."""

    def __init__(self, comm, optimizer, counters):
        self.comm, self.optimizer, self.counters = comm, optimizer, counters

    def update(self, state, param, grad, lr):
        started = time.perf_counter()
        if isinstance(grad, IndexedSlices):
            ids, rows = self.comm.allgather_rows(grad.indices, grad.values)
            grad = IndexedSlices(ids, rows, grad.dense_shape)
        else:
            grad = self.comm.allreduce_sum(grad)
        self.counters.add(dense_sync_seconds=time.perf_counter() - started)
        local_update(state, self.optimizer, param, grad, lr)
