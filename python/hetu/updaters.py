"""How a distributed parameter is updated after the backward pass. Each updater replaces the
local step (hetu.optim.local_update) of one parameter (OptimizerOp.updaters): a sum over the
workers before it, or the servers' step instead of it."""
import time

import numpy as np

from . import cuda
from .ops.embedding import DeviceRows, IndexedSlices, unique_sum
from .optim import local_update


class AllReduceUpdater:
    """Sums the gradient over workers, then every worker applies the same local step, so the
    replicas stay identical. Sparse gradients travel as (ids, rows), never densified. The time
    spent summing goes to `counters` (dense_sync_seconds)."""

    def __init__(self, comm, optimizer, counters):
        self.comm, self.optimizer, self.counters = comm, optimizer, counters

    def update(self, state, param, grad, lr, step):
        started = time.perf_counter()
        if isinstance(grad, IndexedSlices):
            ids, rows = self.comm.allgather_rows(grad.indices, grad.values)
            grad = IndexedSlices(ids, rows, grad.dense_shape)
        else:
            grad = self.comm.allreduce_sum(grad)
        self.counters.add(dense_sync_seconds=time.perf_counter() - started)
        local_update(state, self.optimizer, param, grad, lr, step)


class PSSparseUpdater:
    """Sums this worker's rows per id (in sample order) and hands them to the table's RowSource:
    a push, or the worker's cache in front of the servers."""

    def __init__(self, source):
        self.source = source
        self._to_host = None   # hetu.cuda.DeviceToHost, on a GPU

    def update(self, state, param, grad, lr, step):
        started = time.perf_counter()
        if cuda.is_device_array(grad.values):
            uniq, summed = self._sum_on_device(grad)
        else:
            uniq, summed = unique_sum(grad.indices, grad.values)
        self.source.update(uniq, summed, lr)
        self.source.counters.add(push_seconds=time.perf_counter() - started)

    def _sum_on_device(self, grad):
        """Sums the rows per id on the device and brings the distinct ids and their sums to the
        host in one copy (after reading how many there are): pinned arrays valid until the next
        step's."""
        if self._to_host is None:
            self._to_host = cuda.DeviceToHost()
        n, width = grad.values.shape[0], self.source.param.shape[1]
        layout = cuda.Packed([((n,), np.int64), ((n, width), np.float32), ((1,), np.int64)])
        uniq, summed, count = self._to_host.device_views(layout)
        DeviceRows.sum_of(grad.indices, grad.values, out=(uniq, summed, count))
        u = int(count.get()[0])
        # uniq's n slots, then the u summed rows: one copy of the front of the buffer.
        host = self._to_host.receive(layout, layout.offsets[1] + u * width * 4)
        return host[0][:u], host[1][:u]


class PSDenseUpdater:
    """Pushes the gradient and takes back the tensor as the servers stepped it."""

    def __init__(self, remote):
        self.remote = remote

    def update(self, state, param, grad, lr, step):
        started = time.perf_counter()
        if isinstance(grad, IndexedSlices):
            grad = grad.to_dense()
        fresh = self.remote.push_pull(np.ascontiguousarray(cuda.to_host(grad), np.float32), lr)
        state.param_value(param)[...] = state.xp.asarray(fresh)
        self.remote.counters.add(dense_sync_seconds=time.perf_counter() - started)
