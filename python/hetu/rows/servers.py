"""The worker's side of the parameter server (hetu.ps): joining the job, and RemoteTable, a
parameter's table on the servers as this worker sees it. Iteration tags carry the BSP/SSP
protocol: a push of step t is applied once every worker's push of t arrived; a pull for step t
sees the table after t-1."""
import atexit
import os

import numpy as np

from .. import _C

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


class RemoteTable:
    """A parameter created on the servers: an embedding table (row operations), or with `dense`
    a dense tensor (whole-tensor operations). The one object that sends its hetu.ps.Table's
    messages, each tagged with `clock`, which counts the pushes. Every worker pushes once per
    training step and once per flush, in the same order, so the clocks agree across workers and
    serve as the BSP iteration tags: a push carries the clock, a pull for clock c sees every push
    before c applied. `counters`: the worker's Counters, which the row sources in front of the
    table and the dense updater add to."""

    def __init__(self, client, param, optimizer, seed, sync, counters, dense=False, tier=None, tier_prefetch=True):
        self.param, self.sync, self.counters, self.dense = param, sync, counters, dense
        self.seed = seed
        self.clock = 0
        # Under a catch-up optimizer (hetu.optim: adam_catchup), the steps taken so far (a
        # callable: the stepping OptimizerOp's count, set by bind_ps): every read and push
        # carries it, and the servers bring the rows to that step first.
        self.steps_taken = None
        # Admits and prefetch hints sent and not yet answered (admit, prefetch): each is awaited
        # by the next request.
        self._admits = []
        # On disk (hetu.ps.DiskTier), the row sources that know the next step's rows send them
        # ahead (prefetch) unless told not to.
        self.hints = tier is not None and tier_prefetch
        settings = dict(init=init_spec(param), seed=seed, stream=_C.name_stream(param.name),
                        optimizer=optimizer.rule(dense=dense), bsp=sync.synchronous,
                        staleness=sync.staleness)
        if dense:
            self._table = client.init_dense(param.name, param.shape, **settings)
            return
        rows, width = param.shape
        self._table = client.init_table(param.name, rows, width, storage=optimizer.embedding_dtype, tier=tier,
                                        **settings)
        # Bytes of a row as it moves (its storage type); gradients always move as float32.
        self.row_bytes, self.grad_bytes = self._table.row_bytes, width * 4

    def _tag(self):
        return self.sync.tag(self.clock)

    def catch_up_to(self):
        """The step the servers bring a catch-up optimizer's rows to before they are read or
        stepped (0: the optimizer does not catch up)."""
        return 0 if self.steps_taken is None else self.steps_taken()

    # --- an embedding table's rows ----------------------------------------------------------------
    def _await_admits(self):
        while self._admits:
            self._admits.pop(0).wait()

    def _answered(self, handle):
        """`handle` (a request just sent), once the admits sent before it are answered: they
        were served first, so their answers come while the request is on its way."""
        self._await_admits()
        return handle

    def pull(self, keys):
        return self._answered(self._table.pull(keys, iteration=self._tag(), catch_up_to=self.catch_up_to())).wait()

    def pull_stale(self, keys, versions, bound, with_state=False):
        """A handle to (positions, rows, versions[, state, steps]) of the keys whose server
        version is more than `bound` ahead of `versions`, as of the next step (clock: every push
        so far applied)."""
        return self._answered(self._table.pull_stale(keys, versions, bound, iteration=self._tag(),
                                                     with_state=with_state, catch_up_to=self.catch_up_to()))

    def pull_with_state(self, keys, with_state):
        """A handle to (rows, optimizer state, steps, versions) of `keys` as of the next step, the
        state, steps and versions of the keys marked in `with_state` only (hetu.ps.Table)."""
        return self._answered(self._table.pull_with_state(keys, iteration=self._tag(), with_state=with_state,
                                                          catch_up_to=self.catch_up_to()))

    def push(self, keys, grads, lr, counts=None, write_back=None):
        """The step's push (and a write-back of rows, written first: hetu.ps.Table.push)."""
        self._answered(self._table.push(keys, grads, iteration=self._tag(), lr=lr, counts=counts,
                                        write_back=write_back, catch_up_to=self.catch_up_to())).wait()
        self.clock += 1

    def admit(self, slots, keys, rows=None):
        """Dynamic tables: `keys` start from their initial rows (`rows`, float32, drawn here by
        hetu.dynamic.initial_rows; None: the servers draw them) in `slots` as of this step (after
        every push before it, before this step's push). It does not advance the clock, and it is
        not awaited here: a server serves one worker's requests in the order sent (the van keeps
        each pair's order, the server's data thread its arrival order), so the step's pull that
        follows reads the admitted rows, and the admit's answer is awaited with that request's
        (docs/design.md section 13): one round trip, not two."""
        self._admits.append(self._table.admit(slots, keys, rows=rows, iteration=self._tag(),
                                              catch_up_to=self.catch_up_to()))

    def prefetch(self, keys):
        """A table on disk: the servers read these rows (the next step's) into their caches
        while the workers compute; nothing otherwise. Awaited with the next request, as admits."""
        if self.hints and len(keys):
            self._admits.append(self._table.prefetch(np.ascontiguousarray(keys, np.int64)))

    # --- a dense tensor ---------------------------------------------------------------------------
    def push_pull(self, grad, lr):
        """Pushes the gradient; returns the tensor as the servers stepped it."""
        fresh = self._table.dense_push_pull(grad, iteration=self._tag(), lr=lr).wait()
        self.clock += 1
        return fresh

    # --- the whole parameter --------------------------------------------------------------------
    def fetch(self, chunk=1 << 16):
        """The whole parameter (for checks, checkpoints and a dense one's local copy) after every
        push so far."""
        if self.dense:
            return self._table.dense_pull(iteration=self._tag()).wait()
        rows = self.param.shape[0]
        return np.concatenate([self.pull(np.arange(b, min(rows, b + chunk), dtype=np.int64))
                               for b in range(0, rows, chunk)])

    # Checkpoints (hetu.checkpoint): the servers write and read their shards; the clock, which
    # the loaded tables continue, is recorded beside them.
    def save(self, folder, mark=0):
        self._await_admits()
        self._table.save(folder, mark).wait()

    def load(self, folder, mark=0):
        self._table.load(folder, mark).wait()

    def save_delta(self, folder, base, mark):
        self._await_admits()
        self._table.save_delta(folder, base, mark).wait()

    def load_delta(self, folder, mark):
        self._table.load_delta(folder, mark).wait()

    def state(self):
        return self.clock

    def restore(self, state, step):
        self.clock = state

