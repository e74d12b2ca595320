"""Parameters that live on the parameter server (hetu.ps): the lookup op that pulls rows, and the
updaters that push gradients. Iteration tags carry the BSP/SSP protocol: a push of step t is
applied once every worker's push of t arrived; a pull for step t sees the table after t-1."""
import atexit
import os
import time

import numpy as np

from .. import _C, cuda
from ..graph import Op
from ..ops.embedding import DeviceRows, IndexedSlices, gather, unique_sum
from ..rows import RowSource

_started = False


def launched_as_ps_worker():
    """Whether python/runner.py started this process as a worker of a job with servers."""
    return os.environ.get("DMLC_ROLE") == "worker" and int(os.environ.get("DMLC_NUM_SERVER", "0")) >= 1


def start_worker():
    """Starts this process's PS node once (environment from python/runner.py)."""
    global _started
    if _started:
        return
    if not launched_as_ps_worker():
        raise RuntimeError("parameters on the parameter server need a PS job: launch with "
                           "python/runner.py -s N (or a cluster file with servers), which sets DMLC_ROLE=worker")
    import hetu.ps as ps
    ps.start()
    atexit.register(ps.finalize)
    _started = True


class SyncMode:
    """--bsp: 0 BSP, k > 0 SSP with staleness k, -1 ASP (no iteration tags)."""

    def __init__(self, bsp):
        self.bsp = int(bsp)

    @property
    def synchronous(self):
        return self.bsp >= 0

    @property
    def staleness(self):
        return max(0, self.bsp)

    def tag(self, iteration):
        return iteration if self.synchronous else None


def init_spec(param):
    if param.initializer is None:
        raise ValueError(f"parameter {param.name} is placed on the parameter server but has an explicit value; "
                         f"give it an initializer (ht.init.*) so the servers can create it")
    return param.initializer.spec()


class _OnServers:
    """A parameter created on the servers. `clock` counts its pushes. Every worker pushes once
    per training step and once per flush, in the same order, so the clocks agree across workers
    and serve as the BSP iteration tags: a push carries the clock, a pull for clock c sees every
    push before c applied."""

    def __init__(self, param, sync, table):
        self.param, self.sync, self.table = param, sync, table
        self.clock = 0

    # Checkpoints (hetu.checkpoint): the servers write and read their shards; the clock, which
    # the loaded tables continue, is recorded beside them.
    def save(self, folder):
        self.table.save(folder).wait()

    def load(self, folder):
        self.table.load(folder).wait()

    def state(self):
        return self.clock

    def restore(self, state, step):
        self.clock = state


class RemoteTable(_OnServers, RowSource):
    """An embedding table on the servers: the plain-PS RowSource, which pulls every row a step
    reads and pushes every gradient row, and the table behind the caches."""

    def __init__(self, client, param, optimizer, seed, sync, counters):
        rows, width = param.shape
        super().__init__(param, sync, client.init_table(param.name, rows, width, init=init_spec(param), seed=seed,
                                                        stream=_C.name_stream(param.name),
                                                        optimizer=_server_rule(optimizer.rule()),
                                                        bsp=sync.synchronous, staleness=sync.staleness,
                                                        storage=optimizer.embedding_dtype))
        self.counters = counters
        # Bytes of a row as it moves (its storage type); gradients always move as float32.
        self.row_bytes, self.grad_bytes = self.table.row_bytes, width * 4

    def pull(self, keys):
        return self.table.pull(keys, iteration=self.sync.tag(self.clock)).wait()

    def pull_stale(self, keys, versions, bound, with_state=False):
        """A handle to (positions, rows, versions[, state, steps]) of the keys whose server
        version is more than `bound` ahead of `versions`, as of the next step (clock: every push
        so far applied)."""
        return self.table.pull_stale(keys, versions, bound, iteration=self.sync.tag(self.clock),
                                     with_state=with_state)

    def push(self, keys, grads, lr, counts=None, write_back=None):
        """The step's push (and a write-back of rows, written first: hetu.ps.Table.push)."""
        self.table.push(keys, grads, iteration=self.sync.tag(self.clock), lr=lr, counts=counts,
                        write_back=write_back).wait()
        self.clock += 1

    # --- RowSource ---------------------------------------------------------------------------
    def lookup(self, uniq):
        self.counters.add(rows_pulled=len(uniq), bytes_pulled=len(uniq) * (self.row_bytes + 8), misses=len(uniq))
        return self.pull(uniq)

    def update(self, uniq, summed, lr):
        self.counters.add(rows_pushed=len(uniq), bytes_pushed=len(uniq) * (self.grad_bytes + 8))
        self.push(uniq, summed, lr)

    read = pull

    def fetch(self, chunk=1 << 16):
        """The whole table (for checks and checkpoints) after every push so far."""
        rows = self.param.shape[0]
        return np.concatenate([self.pull(np.arange(b, min(rows, b + chunk), dtype=np.int64))
                               for b in range(0, rows, chunk)])


class RemoteDense(_OnServers):
    """A dense parameter on the servers; the worker keeps a copy that every step refreshes."""

    def __init__(self, client, param, optimizer, seed, sync):
        super().__init__(param, sync, client.init_dense(param.name, param.shape, init=init_spec(param), seed=seed,
                                                        stream=_C.name_stream(param.name),
                                                        optimizer=_server_rule(optimizer.rule(dense=True)),
                                                        bsp=sync.synchronous, staleness=sync.staleness))

    def fetch(self):
        return self.table.dense_pull(iteration=self.sync.tag(self.clock)).wait()

    def push_pull(self, grad, lr):
        fresh = self.table.dense_push_pull(grad, iteration=self.sync.tag(self.clock), lr=lr).wait()
        self.clock += 1
        return fresh


def _server_rule(rule):
    """An Optimizer.rule() as hetu.ps takes it: (kind, settings)."""
    return rule["kind"], {k: v for k, v in rule.items() if k != "kind"}


class PSEmbeddingLookupOp(Op):
    """table[ids] for a table on the servers, or, with `bags` (hetu.ops.embedding.Bags), the
    table's rows pooled per bag (-1: an empty slot, which reads nothing). Each distinct id is
    fetched once from `source`, the table's RowSource (hetu.rows): the servers, or the worker's
    cache in front of them. On a GPU the ids are read on the host and the distinct rows,
    with each id's position among them, reach the device in one pinned copy; the device expands
    them to the batch's rows or pools them."""
    capturable = False
    host_inputs = True

    def __init__(self, ids, source, bags=None, ctx=None):
        super().__init__(ids, ctx=ctx, name=None)
        self.source = source
        self.bags = bags
        self._to_device = None   # hetu.cuda.HostToDevice, on a GPU

    def infer_shape(self, s):
        return self._out_shape(tuple(s[0]))

    def _out_shape(self, ids_shape):
        width = self.source.param.shape[1]
        return self.bags.out_shape(ids_shape, width) if self.bags is not None else ids_shape + (width,)

    def compute(self, vals, state):
        ids = cuda.to_host(vals[0])
        if ids.dtype != np.int64:
            raise TypeError(f"{self.name}: ids are {ids.dtype}, expected int64")
        flat = ids.reshape(-1)
        rows = self.source.param.shape[0]
        lowest = -1 if self.bags is not None else 0
        if flat.size and (flat.min() < lowest or flat.max() >= rows):
            bad = int(flat.max() if flat.max() >= rows else flat.min())
            raise IndexError(f"{self.name}: id {bad} outside the table {self.source.param.name} of {rows} rows")
        if self.bags is not None:
            filled = flat >= 0
            uniq, inverse = np.unique(flat[filled], return_inverse=True)
            positions = np.full(ids.shape, -1, np.int64)
            positions.reshape(-1)[filled] = inverse
        else:
            uniq, positions = np.unique(flat, return_inverse=True)
        # Reads outside training (validation) go straight to the servers, after the executor
        # flushed every cache, and are not counted as training transmissions.
        if state.training:
            started = time.perf_counter()
            pulled = self.source.lookup(uniq)
            self.source.counters.add(pull_seconds=time.perf_counter() - started)
        else:
            pulled = self.source.read(uniq)
        width = pulled.shape[1]
        out = state.buffer(self, self._out_shape(ids.shape), np.float32)
        if state.xp is np:
            if self.bags is not None:
                return self.bags.pool(self.name, pulled, positions, out)
            np.take(pulled, positions, axis=0, out=out.reshape(flat.size, width))
            return out
        if self._to_device is None:
            self._to_device = cuda.HostToDevice()
        rows, positions = self._to_device.send([np.ascontiguousarray(pulled, np.float32),
                                                positions.reshape(ids.shape).astype(np.int64, copy=False)])
        if self.bags is not None:
            return self.bags.pool(self.name, rows, positions, out, state.checks)
        return gather(self.name, rows, positions.reshape(-1), out, state.checks)


class PSSparseUpdater:
    """Sums this worker's rows per id (in sample order) and hands them to the table's RowSource:
    a push, or the worker's cache in front of the servers."""

    def __init__(self, source):
        self.source = source
        self._to_host = None   # hetu.cuda.DeviceToHost, on a GPU

    def update(self, state, param, grad, lr):
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

    def __init__(self, remote, counters):
        self.remote, self.counters = remote, counters

    def update(self, state, param, grad, lr):
        started = time.perf_counter()
        if isinstance(grad, IndexedSlices):
            grad = grad.to_dense()
        fresh = self.remote.push_pull(np.ascontiguousarray(cuda.to_host(grad), np.float32), lr)
        state.param_value(param)[...] = state.xp.asarray(fresh)
        self.counters.add(dense_sync_seconds=time.perf_counter() - started)


def route_through_caches(graph):
    """Points every PS lookup and sparse updater at its table's worker-side cache (graph.caches:
    param id -> CachedTable or HeraldTable), where the table has one."""
    for order in graph.topo.values():
        for node in order:
            if isinstance(node, PSEmbeddingLookupOp) and node.source.param.id in graph.caches:
                node.source = graph.caches[node.source.param.id]
    for opt_op in graph.optimizer_ops:
        for updater in opt_op.updaters.values():
            if isinstance(updater, PSSparseUpdater) and updater.source.param.id in graph.caches:
                updater.source = graph.caches[updater.source.param.id]
