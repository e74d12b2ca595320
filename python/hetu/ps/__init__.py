"""hetu.ps: the parameter-server client and node life cycle (Python front end of ``hetu._ps``).

Every process of a job is one node whose role comes from ``DMLC_ROLE``: one scheduler
(rendezvous, barriers, heartbeats), ``DMLC_NUM_SERVER`` servers (hold the tables) and
``DMLC_NUM_WORKER`` workers (call the operations below). Scheduler and servers are normally
run by ``python -m hetu.launcher``; a worker does::

    import hetu.ps as ps
    ps.start()                                   # reads DMLC_*; returns once all nodes are up
    c = ps.client()
    emb = c.init_table("emb", rows=1000, width=16, init=("normal", 0.0, 0.01), seed=0,
                       optimizer=("adam", dict(beta1=0.9)), bsp=True)
    rows = emb.pull(keys, iteration=t).wait()    # (len(keys), 16) float32
    emb.push(keys, grads, iteration=t, lr=0.01).wait()
    ps.finalize()

Conventions
-----------
* keys are int64 row ids (any order, repeats allowed), values float32, one row per key.
* Every operation returns a :class:`Handle` at once; ``h.wait(timeout=None)`` blocks with the
  GIL released and returns the result, or raises ``RuntimeError`` naming the table and key
  (bad input), or the peer (no answer within the timeout -- default ``PS_WAIT_TIMEOUT``,
  600 s -- or a node declared dead after ``PS_HEARTBEAT_TIMEOUT`` seconds without heartbeat).
  Arrays passed in must not be modified before the handle is done (they are sent without
  copying).
* Embedding tables are spread over the servers by ``PS_ROW_PLACEMENT``: ``strided`` (the
  default) puts row r on server r mod S, so the hot first ids of every field are shared by all
  servers; ``contiguous`` gives server s rows [s*ceil(R/S), (s+1)*ceil(R/S)). Dense tensors are
  always split in contiguous ranges (they are pulled whole). Every worker of a job must use the
  same placement; checkpoints load under either placement and any server count.
* Synchronisation (table created with ``bsp=True``): a push with ``iteration=t`` is buffered;
  when all W workers' pushes for t have reached a server, it sums them per row in worker-rank
  order (so the result is bit-identical whatever the arrival order) and applies one optimizer
  step per touched row. Every worker must push for every iteration (an empty push is fine:
  ``push(empty_keys, empty_grads, iteration=t)``) -- a BSP push reaches every server. A pull
  with ``iteration=t`` waits until no iteration <= t-1-staleness is pending on the server, i.e.
  it sees the table after iteration t-1. ``iteration=None`` (or a table made with
  ``bsp=False``) applies a push on arrival and pulls without waiting (ASP).
* Messages from one worker to one server are handled in send order; a deferred pull holds
  back that worker's later messages for the same table. To make ``assign`` (owner-computes
  write-back) of iteration t visible to every pull of t+1, send it before the push of t.
* A row's version counts gradient contributions applied to it: by default one per distinct
  key per push (duplicates within one push are summed, in order, and count once); ``counts``
  gives per-key contributions instead. Servers keep versions and step counts in 32 bits until
  one could pass 2^31 - 1, then in 64; the counts are the same either way.
* ``init_table(..., storage="bf16"|"fp16")``: the servers store the rows, and send them, in 16
  bits. Rows still come and go here as float32 (widened exactly; rounded to nearest even on the
  way out), gradients and optimizer state stay float32, and every step rounds the row.
"""
import collections
import os

import numpy as np

from hetu import _C, _ps

__all__ = [
    "pick_root_port", "start", "finalize", "scheduler_init", "server_init", "worker_init", "scheduler_finish",
    "server_finish", "worker_finish", "wait_for_end", "rank", "role", "num_workers",
    "num_servers", "barrier", "client", "Client", "Table", "Handle", "INITIALIZERS", "OPTIMIZERS",
    "server_stats", "own_server_stats", "served_line", "write_server_stats", "JobFailed", "DiskTier",
]

INITIALIZERS = {"constant": 0, "uniform": 1, "normal": 2, "truncated_normal": 3}
# The optimizer kinds by name, and every hyperparameter with OptimConfig's default: the registry
# of src/common/optim_rules.h (a table made by kind name alone takes these defaults).
OPTIMIZERS = {k["name"]: k["kind"] for k in _C.optimizer_kinds()}
_OPTIM_DEFAULTS = _C.optimizer_hyperparameters()
_GROUPS = {"workers": _ps.WORKERS, "servers": _ps.SERVERS, "all": _ps.ALL}


# ---- node life cycle -------------------------------------------------------------------

def start():
    """Starts this process's node (role from DMLC_ROLE); returns once every node is connected."""
    _ps.start()


def finalize():
    """Worker: tells the scheduler it is done (the job ends when all workers are). Stops the node."""
    _ps.finalize()


def _start_as(expected):
    def init():
        role = os.environ.get("DMLC_ROLE")
        if role != expected:
            raise RuntimeError(f"{expected}_init() called with DMLC_ROLE={role!r}")
        start()
    init.__name__ = f"{expected}_init"
    init.__doc__ = f"start() for a {expected}; checks DMLC_ROLE."
    return init


scheduler_init, server_init, worker_init = (_start_as(r) for r in ("scheduler", "server", "worker"))
scheduler_finish = server_finish = worker_finish = finalize


def pick_root_port(host="", tries=200, seed=None):
    """A free TCP port on `host` for DMLC_PS_ROOT_PORT, chosen below the kernel's ephemeral
    range. A port from that range (what binding port 0 returns) is free again once probed, and
    can be handed to another node's own bind(port 0) or outgoing connection before the scheduler
    binds it; that node then talks to itself and the job waits in silence."""
    import random
    import socket
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    lo, hi = (10000, low - 1) if low > 11000 else (low // 2, low - 1)
    rng = random.Random(seed)
    for _ in range(tries):
        port = rng.randint(lo, hi)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{lo}, {hi}] on {host or 'this host'} after {tries} tries")


def wait_for_end(timeout=None):
    """Scheduler/server: blocks until the job ends. Returns '' if every worker finished, else the
    reason the job failed (e.g. a dead node); None if `timeout` seconds passed first."""
    return _ps.wait_for_end(0.0 if timeout is None else float(timeout))


def server_stats(timeout=None):
    """Worker: what every server has served so far, one dict per server in rank order: requests,
    rows (embedding rows: the keys of sparse requests), bytes (data both ways) and busy_seconds
    (handling requests)."""
    return _ps.server_stats().wait(timeout)


def own_server_stats():
    """Server: what this server has served so far (as server_stats())."""
    return _ps.own_server_stats()


def served_line(server, stats):
    """The line a server's counters are reported in at the end of a job."""
    line = (f"server {server}: {stats['requests']} requests, {stats['rows']} rows, {stats['bytes']} bytes served, "
            f"{stats['busy_seconds']:.3f} s busy")
    looked = stats.get("tier_hits", 0) + stats.get("tier_misses", 0)
    if looked:   # a table on disk: its cache and its file
        mib = 1 << 20
        line += (f"; disk tier: {stats['tier_hits'] / looked:.3f} of {looked} rows in cache, "
                 f"{stats['tier_reads']} read ({stats['tier_read_bytes'] / mib:.1f} MiB, "
                 f"{stats['tier_read_seconds']:.3f} s), {stats['tier_writes']} written "
                 f"({stats['tier_written_bytes'] / mib:.1f} MiB, {stats['tier_write_seconds']:.3f} s)")
    return line


def write_server_stats(path, stats):
    """server_stats() as a CSV (one line per server), written beside and renamed into place."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("server,requests,rows,bytes,busy_seconds\n")
        for i, s in enumerate(stats):
            f.write(f"{i},{s['requests']},{s['rows']},{s['bytes']},{s['busy_seconds']:.6f}\n")
    os.replace(tmp, path)


def rank():
    """This node's rank within its role (workers: DMLC_WORKER_ID when set, e.g. the MPI rank)."""
    return _ps.rank()


def role():
    return _ps.role()


def num_workers():
    return _ps.num_workers()


def num_servers():
    return _ps.num_servers()


def barrier(group="workers", timeout=600.0):
    """Blocks until every node of `group` ('workers', 'servers' or 'all') has called barrier."""
    with _job_failure():
        _ps.barrier(_GROUPS[group], float(timeout))


class JobFailed(RuntimeError):
    """The job is over for this node: a peer is dead or lost (no heartbeat, a lost connection) or
    the scheduler ended the job. The message names the node; where the call was is of no use."""


class TableRefused(RuntimeError):
    """A server refused to create a table: an invalid spec, a table of that name and another
    shape, or a shard its host has not the memory for. The message says which and why."""


class _job_failure:
    """Turns the RuntimeError of an operation into JobFailed when this node's job has failed."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, _traceback):
        if kind is not None and issubclass(kind, RuntimeError) and not isinstance(value, JobFailed) \
                and _ps.failure():
            raise JobFailed(str(value)) from None
        return False


# ---- operations ------------------------------------------------------------------------

class Handle:
    """An operation in flight. ``wait(timeout=None)`` returns its result (see the operation)."""

    __slots__ = ("_h", "_post")

    def __init__(self, h, post=None):
        self._h, self._post = h, post

    def wait(self, timeout=None):
        with _job_failure():
            r = self._h.wait(timeout)
        return self._post(r) if self._post else r

    def done(self):
        return self._h.done()


def _keys(keys):
    return np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)


def _f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _iter(iteration):
    if iteration is None:
        return -1
    if iteration < 0:
        raise ValueError("iteration must be >= 0 (or None for no synchronisation)")
    return int(iteration)


def _lr(lr):
    if lr is None:
        raise ValueError("push needs lr= (sent with every push so schedules work)")
    return float(lr)


class Table:
    """A table on the servers. Embedding tables use the row operations; dense tensors (made by
    :meth:`Client.init_dense`) use ``dense_pull``/``dense_push``/``dense_push_pull``."""

    def __init__(self, name, rows, width, optimizer="sgd", dense=False, shape=None, storage="fp32"):
        self.name, self.rows, self.width, self.dense = name, int(rows), int(width), bool(dense)
        self.optimizer, self.storage = optimizer, storage
        self.state_width = _ps.optim_state_width(OPTIMIZERS[optimizer], self.width)  # state floats per row
        self.shape = tuple(shape) if shape is not None else (self.rows, self.width)
        self._t = _ps.Table(name=name, rows=self.rows, width=self.width, dense=self.dense,
                            state_width=self.state_width, storage=storage)
        # bytes of a row as the servers store and send it (rows come and go here as float32)
        self.row_bytes = self._t.row_bytes

    def __repr__(self):
        kind = "dense" if self.dense else "embedding"
        return (f"Table({self.name!r}, {kind}, shape={self.shape}, optimizer={self.optimizer!r}, "
                f"storage={self.storage!r})")

    def _sparse(self):
        if self.dense:
            raise ValueError(f"table {self.name!r} is dense: use dense_pull/dense_push")

    def _dense(self):
        if not self.dense:
            raise ValueError(f"table {self.name!r} is an embedding table, not dense: use pull/push")

    # rows
    def pull(self, keys, iteration=None, catch_up_to=0):
        """Rows of `keys` -> (n, width) float32. With `iteration=t` (BSP table) the rows as they
        are after iteration t-1 was applied. `catch_up_to`: a catch-up optimizer's rows come
        brought to that step (hetu.optim, adam_catchup), and every method that reads or steps
        rows takes it too."""
        self._sparse()
        return Handle(self._t.pull(keys=_keys(keys), iteration=_iter(iteration), catch_up_to=int(catch_up_to)))

    def prefetch(self, keys):
        """A table on disk (:class:`DiskTier`): the servers read the rows of `keys` into their
        caches now, ahead of the reads that follow (a hint: no row changes). Result: None."""
        self._sparse()
        return Handle(self._t.prefetch(_keys(keys)))

    def push(self, keys, grads, iteration=None, lr=None, counts=None, write_back=None, catch_up_to=0):
        """Sends gradients (n, width) of `keys`. Result: None. `counts`: per-key contributions
        added to the rows' versions (default: 1 per distinct key). `write_back`: (keys, values,
        state, steps, version_add) as for :meth:`assign`, written in the same message just
        before the push is taken in (one message instead of an assign and a push)."""
        return self._push(keys, grads, iteration, lr, counts, False, write_back, catch_up_to)

    def push_pull(self, keys, grads, iteration=None, lr=None, counts=None, catch_up_to=0):
        """push, then the rows of `keys` as they are once this push's iteration is applied."""
        return self._push(keys, grads, iteration, lr, counts, True, catch_up_to=catch_up_to)

    def _push(self, keys, grads, iteration, lr, counts, pull, write_back=None, catch_up_to=0):
        self._sparse()
        c = None if counts is None else _keys(counts)
        wb = None if write_back is None else self._assignment(*write_back)
        return Handle(self._t.push(keys=_keys(keys), grads=_f32(grads), counts=c, iteration=_iter(iteration),
                                   lr=_lr(lr), pull=pull, write_back=wb, catch_up_to=int(catch_up_to)))

    def pull_stale(self, keys, versions, bound=0, iteration=None, with_state=False, catch_up_to=0):
        """Rows whose server version exceeds the given local version by more than `bound`.
        Result: (positions into keys (sorted), rows (m, width), server versions (m,)), and with
        `with_state` also their optimizer state (m, state_width) and step counts (m,). With
        `iteration=t` (BSP table) it waits like a pull for t: versions as of iteration t-1."""
        self._sparse()
        return Handle(self._t.pull_stale(keys=_keys(keys), versions=_keys(versions), bound=int(bound),
                                         iteration=_iter(iteration), with_state=bool(with_state),
                                         catch_up_to=int(catch_up_to)))

    def pull_with_state(self, keys, iteration=None, with_state=None, catch_up_to=0):
        """Result: (rows (n, width), optimizer state (n, state_width), steps (n,), versions (n,)).
        With `iteration=t` (BSP table) it waits like a pull for t. With `with_state` (n bools)
        the state, steps and versions are those of the marked keys only, in key order (m rows);
        the rows are every key's."""
        self._sparse()
        mask = None if with_state is None else np.ascontiguousarray(with_state, dtype=np.uint8).reshape(-1)
        return Handle(self._t.pull_with_state(keys=_keys(keys), iteration=_iter(iteration), state_mask=mask,
                                              catch_up_to=int(catch_up_to)))

    def assign(self, keys, values, state=None, steps=None, version_add=1):
        """Writes rows, their optimizer state (n, state_width) and step counts (owner-computes
        write-back) and adds `version_add` (scalar or per key) to their versions. Result: None."""
        self._sparse()
        k, v, s, st, va = self._assignment(keys, values, state, steps, version_add)
        return Handle(self._t.assign(keys=k, values=v, state=s, steps=st, version_add=va))

    def admit(self, slots, keys, rows=None, iteration=None, catch_up_to=0):
        """Dynamic tables (docs/design.md section 13): the row at each of `slots` becomes the initial
        row of the key admitted into it (``hetu._C.key_rows`` with the table's initializer, seed
        and stream, rounded to its storage type; `rows`: those rows, float32 [len(keys), width],
        drawn by the caller, else by the servers), with zero optimizer state and steps and a newer
        version. Result: None. With `iteration=t` (BSP table) it lands after every push of t-1
        and before any push of t, once per slot however many workers send it; send it before
        the push of t. A catch-up optimizer's admitted rows start at step `catch_up_to`."""
        self._sparse()
        if rows is not None:
            rows = np.ascontiguousarray(rows, np.float32)
        return Handle(self._t.admit(slots=_keys(slots), keys=_keys(keys), rows=rows, iteration=_iter(iteration),
                                    catch_up_to=int(catch_up_to)))

    def _assignment(self, keys, values, state=None, steps=None, version_add=1):
        """The arrays of an assignment (assign, or a push's write-back), defaults filled in."""
        k = _keys(keys)
        n = len(k)
        state = np.zeros((n, self.state_width), np.float32) if state is None else state
        steps = np.zeros(n, np.int64) if steps is None else steps
        vadd = np.broadcast_to(np.asarray(version_add, np.int64), (n,))
        return k, _f32(values), _f32(state), _keys(steps), _keys(vadd)

    # dense tensors
    def dense_pull(self, iteration=None):
        """The whole tensor, in its shape."""
        self._dense()
        return Handle(self._t.pull(iteration=_iter(iteration)), self._reshape)

    def dense_push(self, grad, iteration=None, lr=None):
        """Sends the gradient of the whole tensor (same BSP/ASP rules as push). Result: None."""
        self._dense()
        return Handle(self._t.push(grads=_f32(grad), iteration=_iter(iteration), lr=_lr(lr)))

    def dense_push_pull(self, grad, iteration=None, lr=None):
        """dense_push, then the tensor once this push's iteration is applied."""
        self._dense()
        return Handle(self._t.push(grads=_f32(grad), iteration=_iter(iteration), lr=_lr(lr), pull=True),
                      self._reshape)

    def _reshape(self, flat):
        return flat.reshape(self.shape)

    # whole table
    def save(self, directory, mark=0):
        """Every server writes its shard (values, optimizer state, steps, versions) to
        directory/<name>.shard<s>-of-<S>.bin (temp file + atomic rename). Call with no pushes
        in flight (e.g. after a barrier): buffered BSP pushes are not saved. A `mark` > 0 is
        recorded with every row's version: save_delta(base=mark) writes the rows changed since."""
        return Handle(self._t.save(path=os.path.abspath(directory), mark=int(mark)))

    def load(self, directory, mark=0):
        """Reads what save() wrote; the table must have the same shape, optimizer and server count.
        A `mark` > 0 is recorded as save()'s is."""
        return Handle(self._t.load(path=os.path.abspath(directory), mark=int(mark)))

    def save_delta(self, directory, base, mark):
        """Every server writes the rows whose version changed since the save (or load) marked
        `base` to directory/<name>.delta<s>-of-<S>.bin (a dense tensor: its whole shard) and
        records `mark`; refused where the rows' last mark is not `base`."""
        return Handle(self._t.save_delta(path=os.path.abspath(directory), base=int(base), mark=int(mark)))

    def load_delta(self, directory, mark=0):
        """Applies what save_delta() wrote (by any server count) on top of the rows: a load of
        its base, then of each delta before it, in order."""
        return Handle(self._t.load_delta(path=os.path.abspath(directory), mark=int(mark)))

    def clear(self):
        """Back to the initializer's values; optimizer state, steps, versions and the BSP
        iteration counter are reset."""
        return Handle(self._t.clear())


class DiskTier(collections.namedtuple("DiskTier", "dir cache_mb")):
    """Where a table's servers keep its rows when they live on disk: `dir`, a folder each
    server writes its shard's row file in, and `cache_mb`, the memory of rows each keeps."""

    @property
    def cache_bytes(self):
        return int(float(self.cache_mb) * (1 << 20))


class Client:
    """A worker's entry point to the tables (get it with :func:`client`)."""

    def init_table(self, name, rows, width, init=("normal", 0.0, 0.01), seed=0, stream=None,
                   optimizer=("sgd", {}), bsp=True, staleness=0, dense=False, storage="fp32", timeout=None,
                   tier=None, _shape=None):
        """Creates the table on every server (idempotent for the same shape; an error for a
        different one) and returns its :class:`Table`. Blocks until all servers answered.

        init: (kind, a, b): ('constant', value), ('uniform', low, high), ('normal', mean, std),
            ('truncated_normal', mean, std) -- drawn with hetu's counter-based RNG from
            (seed, stream, element index), so the values equal ``hetu._C.init_fill`` of the table.
        stream: defaults to ``name_stream(name)``, as hetu's local initializers use.
        optimizer: 'sgd' | 'momentum' | 'nesterov' | 'adagrad' | 'adam' | 'adamw' |
            'rowwise_adagrad' (embedding tables only), a pair (kind, dict of momentum, beta1,
            beta2, eps, l2reg, weight_decay), or an Optimizer.rule() ({"kind": kind, setting:
            value}). lr comes with each push.
        bsp: buffer iteration-tagged pushes and apply each iteration once (see module doc);
            staleness k > 0 lets a pull for t proceed once t-1-k is applied (SSP).
        storage: 'fp32' | 'bf16' | 'fp16', the type the rows are stored and moved in (embedding
            tables; docs/design.md section 5). Rows come and go as float32: a pull widens them,
            an assign rounds them; every step computes in float32 and rounds the row to it.
        tier: a :class:`DiskTier` (embedding tables): each server keeps its shard's rows in a
            file under ``tier.dir`` (a folder on the server's own disk) with about
            ``tier.cache_mb`` MiB of them in memory; every operation works as in memory, bit
            for bit (docs/design.md, "Disk tier").
        """
        kind, a, b = (tuple(init) + (0.0, 0.0))[:3]
        if isinstance(optimizer, str):
            opt, cfg = optimizer, {}
        elif isinstance(optimizer, dict):   # hetu.optim's Optimizer.rule(): {"kind": name, setting: value}
            opt, cfg = optimizer["kind"], {k: v for k, v in optimizer.items() if k != "kind"}
        else:
            opt, cfg = optimizer
        unknown = set(cfg) - set(_OPTIM_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown optimizer settings {sorted(unknown)}")
        c = dict(_OPTIM_DEFAULTS, **cfg)
        stream = _ps.name_stream(name) if stream is None else int(stream)
        table = Table(name, rows, width, opt, dense, _shape, storage)
        with _job_failure():   # a dead peer stays JobFailed
            try:
                table._t.init(init_kind=INITIALIZERS[kind], init_a=float(a), init_b=float(b), seed=int(seed),
                              stream=stream, optimizer=dict(c, kind=OPTIMIZERS[opt]), bsp=bool(bsp),
                              staleness=int(staleness), tier_dir=tier.dir if tier else "",
                              tier_cache_bytes=tier.cache_bytes if tier else 0).wait(timeout)
            except RuntimeError as e:
                raise TableRefused(str(e)) from None
        return table

    def init_dense(self, name, shape, init=("constant", 0.0), **kwargs):
        """A dense tensor of `shape`, split over servers by elements; same options as init_table."""
        shape = tuple(int(s) for s in np.atleast_1d(shape))
        size = int(np.prod(shape))
        return self.init_table(name, size, 1, init=init, dense=True, _shape=shape, **kwargs)

    def table(self, name, rows, width, optimizer="sgd", dense=False, storage="fp32"):
        """A handle to a table some other worker initialises (no server call)."""
        return Table(name, rows, width, optimizer, dense, storage=storage)


_client = None


def client():
    """The worker's :class:`Client` (after start())."""
    global _client
    if _ps.role() != "worker":
        raise RuntimeError("hetu.ps.client() is for workers")
    if _client is None:
        _client = Client()
    return _client
