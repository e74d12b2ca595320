"""HET-style embedding cache on each worker (docs/design.md section 6), speaking HET's protocol as
HET's own code does.

The rows themselves live in hetu._C.RowCache (src/cache/row_cache.h): the replacement policy
(the same CachePolicy that Herald's scheduler uses to predict every worker's cache), and per
row the values, the optimizer state and step count, the local version and the pending local
updates. This class speaks the protocol with the servers. Each step:
- lookup: the batch's distinct rows go through the policy; one versioned pull carries every key
  with its local version and returns, with their optimizer state (when the optimizer keeps any)
  and the servers' version, only the rows that are missing or whose server version is more
  than the bound k ahead;
- update: the worker steps its copy of every cached row it read with its summed gradient, by
  the servers' rule, and counts the contribution as pending; rows with more than k pending
  updates (all of them at k = 0) are pushed with their counts, which both the local and the
  servers' versions take; evicted rows with pending updates go with the same push.
So at k = 0 a row that only this worker updated since it last read it is a hit on the next read
(its copy equals the servers' bit for bit: same rule, same state, same summed gradient), and a
row that another worker also updated is re-pulled: exact with any row-wise optimizer.

Prefetch (off by default; `ht.Executor(prefetch=True)`, `--prefetch`): when `next_ids` is set
(the bind_cache pass points it at the training dataloader), the next step's versioned pull is
sent right after this step's push, so it travels, and waits
on the servers for the other workers' pushes, while this worker finishes the step. The servers
answer a pull tagged t+1 only after iteration t is applied, so the rows are the same as those
of a pull sent at the next lookup. The row store is locked per call, so it would be safe to
prepare that pull from another thread; here it is sent from the training thread, right after
the push, which is where the overlap comes from. Measured, it gains 8% on loopback and loses
about half the throughput on links shaped to 1 Gbit/s, where the pull's answer arrives in the
middle of the dense AllReduce (README), hence off by default."""
import numpy as np

from .. import _C
from . import RowSource


class CachedTable(RowSource):
    """A worker's cache in front of one RemoteTable (servers.py): HET's RowSource."""

    def __init__(self, remote, policy, capacity, bound, optimizer, counters=None, pin_threshold=8):
        super().__init__(remote, counters)
        rows, width = remote.param.shape
        if capacity < 1:
            raise ValueError(f"cache for {remote.param.name}: capacity {capacity} rows; it must hold at least 1 row "
                             f"(raise --cache-limit-ratio)")
        self.bound, self.width = int(bound), width
        self.store = _C.RowCache(policy, int(min(capacity, rows)), width, self.bound, optimizer.config, pin_threshold)
        # Optimizer state travels with pulled rows only when the rule keeps any.
        self.with_state = self.store.state_width > 0
        self._outbox = []         # (keys, grads, counts or None) to push with this iteration's push
        self.next_ids = None      # callable: the next training step's ids (see Prefetch above)
        self._prefetched = None   # a _request for the next step, sent after this step's push

    @property
    def capacity(self):
        return self.store.capacity

    # --- forward: rows for this step's distinct ids ---------------------------------------------
    def lookup(self, uniq):
        fetch, self._prefetched = self._prefetched, None
        if fetch is not None:
            if np.array_equal(fetch[0], uniq):
                return self._receive(fetch, prefetched=True)
            self._receive(fetch)   # the batch was not the one peeked: keep what came, fetch again
        return self._receive(self._request(uniq))

    def _request(self, uniq):
        """Runs the policy on the step's rows and sends the versioned pull (not waited for)."""
        hit, local, evicted, evictions = self.store.prepare(uniq)
        if len(evicted[0]):
            self._outbox.append(evicted)
        return uniq, hit, self.remote.pull_stale(uniq, local, self.bound, self.with_state), evictions

    def _receive(self, fetch, prefetched=False):
        uniq, hit, handle, evictions = fetch
        pos, rows, versions, *state = handle.wait()
        out = self.store.fill(uniq, pos, rows, versions, *state, catch_up_to=self.remote.catch_up_to())
        refreshed = int(np.count_nonzero(hit[pos]))
        served = int(np.count_nonzero(hit)) - refreshed
        # Each key sent: itself and its local version. Each row back: its position, values and
        # version, and with state its optimizer state and step count.
        row_bytes = self.remote.row_bytes + self.store.state_width * 4 + (24 if self.with_state else 16)
        self.counters.add(rows_pulled=len(pos), bytes_pulled=len(pos) * row_bytes + len(uniq) * 16,
                          hits=served, misses=len(uniq) - served, evictions=evictions,
                          stale_refreshes=refreshed, rows_prefetched=len(pos) if prefetched else 0)
        return out

    # --- backward: the step's summed gradient rows ------------------------------------------------
    def update(self, uniq, summed, lr):
        summed = np.ascontiguousarray(summed, np.float32)
        due = self.store.step(uniq, summed, lr)
        if self.bound == 0:
            self._outbox.append((uniq, summed, None))   # every row, one contribution each
        elif len(due[0]):
            self._outbox.append(due)
        self._flush_outbox(lr)
        if self.next_ids is not None:
            ids = np.unique(self.next_ids())
            self.remote.prefetch(ids)   # a table on disk reads them in while the step ends
            self._prefetched = self._request(ids)

    def _flush_outbox(self, lr):
        """One push per step (BSP needs every worker's message for each iteration, even empty)."""
        if self._outbox:
            keys = np.concatenate([k for k, _, _ in self._outbox])
            grads = np.concatenate([g for _, g, _ in self._outbox])
            counts = None
            if any(c is not None for _, _, c in self._outbox):
                counts = np.concatenate([c if c is not None else np.ones(len(k), np.int64)
                                         for k, _, c in self._outbox])
            order = np.argsort(keys, kind="stable")
            keys, grads = keys[order], grads[order]
            counts = None if counts is None else counts[order]
        else:
            keys, grads, counts = np.empty(0, np.int64), np.empty((0, self.width), np.float32), None
        self._outbox = []
        self.remote.push(keys, grads, lr, counts)
        self.count_push(len(keys))

    def flush(self, lr):
        """Pushes every pending local update (before validation, a checkpoint or the end). With
        k = 0 nothing is ever pending and no message is sent."""
        if self.bound == 0:
            return
        if self._prefetched is not None:
            # Its rows predate the other workers' flushes: cache them with their versions (the
            # next lookup refreshes what is too stale) but fetch the next step anew.
            self._receive(self._prefetched)
            self._prefetched = None
        pending = self.store.drain()
        if len(pending[0]):
            self._outbox.append(pending)
        self._flush_outbox(lr)
