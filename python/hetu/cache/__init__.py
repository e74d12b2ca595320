"""HET-style embedding cache on each worker (DESIGN.md section 6).

A cached row has a local version (the server's version when it was pulled) and, with a
staleness bound k > 0, pending local updates. Each step: the batch's distinct rows go through
the replacement policy (hetu._C.CachePolicy, shared with Herald's model of the cache); one
versioned pull returns only the rows that are missing or whose server version is more than k
ahead; after the backward pass, rows whose pending updates exceed k (all of them when k = 0) are
pushed, and so are evicted rows with pending updates. k = 0 is exact.

Prefetch: when `next_ids` is set (the bind_cache pass points it at the training dataloader),
the next step's versioned pull is sent right after this step's push, so it travels, and waits
on the servers for the other workers' pushes, while this worker finishes the step. The servers
answer a pull tagged t+1 only after iteration t is applied, so the rows are the same as those
of a pull sent at the next lookup. Everything runs on the training thread; the cache is never
touched concurrently."""
import numpy as np

from .. import _C
from .counters import Counters

NEVER = np.iinfo(np.int64).min // 4   # a local version every server version is ahead of


class CachedTable:
    """A worker's cache in front of one RemoteTable (hetu.dist.ps)."""

    def __init__(self, remote, policy, capacity, bound, optimizer, counters=None, pin_threshold=8):
        rows, width = remote.param.shape
        if capacity < 1:
            raise ValueError(f"cache for {remote.param.name}: capacity {capacity} rows; it must hold at least 1 row "
                             f"(raise --cache-limit-ratio)")
        self.remote, self.bound, self.optimizer = remote, int(bound), optimizer
        self.width = width
        self.capacity = int(min(capacity, rows))
        self.policy = _C.CachePolicy(policy, self.capacity, pin_threshold)
        self.values = np.zeros((self.capacity, width), np.float32)
        self.versions = np.full(self.capacity, NEVER, np.int64)
        self.counters = counters or Counters()
        if self.bound > 0:
            slots = optimizer.slots
            self.pending = np.zeros(self.capacity, np.int64)
            self.pending_grad = np.zeros((self.capacity, width), np.float32)
            self.opt_state = np.zeros((self.capacity, slots * width), np.float32)
            self.opt_steps = np.zeros(self.capacity, np.int64)
        self._outbox = []   # (keys, grads, counts) to push with this iteration's push
        self.next_ids = None      # callable: the next training step's ids (see Prefetch above)
        self._prefetched = None   # a _request for the next step, sent after this step's push

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
        slots, hit, evicted_keys, evicted_slots = self.policy.access(uniq)
        self._write_back_evicted(evicted_keys, evicted_slots)
        cached = slots >= 0
        local = np.full(len(uniq), NEVER, np.int64)
        local[cached & hit] = self.versions[slots[cached & hit]]
        return uniq, slots, hit, self.remote.pull_stale(uniq, local, self.bound), len(evicted_keys)

    def _receive(self, fetch, prefetched=False):
        uniq, slots, hit, handle, evictions = fetch
        pos, rows, versions = handle.wait()
        cached = slots >= 0
        into_cache = cached[pos]
        self.values[slots[pos[into_cache]]] = rows[into_cache]
        self.versions[slots[pos[into_cache]]] = versions[into_cache]
        out = np.empty((len(uniq), self.width), np.float32)
        out[cached] = self.values[slots[cached]]
        bypass = pos[~into_cache]
        out[bypass] = rows[~into_cache]
        refreshed = int(np.count_nonzero(hit[pos]))
        served = int(np.count_nonzero(hit)) - refreshed
        self.counters.add(rows_pulled=len(pos), bytes_pulled=len(pos) * (self.width * 4 + 8) + len(uniq) * 16,
                          hits=served, misses=len(uniq) - served, evictions=evictions,
                          stale_refreshes=refreshed, rows_prefetched=len(pos) if prefetched else 0)
        return out

    # --- backward: the step's summed gradient rows ------------------------------------------------
    def update(self, uniq, summed, lr):
        if self.bound == 0:
            # Write-through: the servers step every touched row once with all workers' sum, so the
            # local copy is stale from now on.
            self.versions[self._slots_of(uniq)] = NEVER
            self._outbox.append((uniq, summed, None))
        else:
            self._update_bounded(uniq, summed, lr)
        self._flush_outbox(lr)
        if self.next_ids is not None:
            self._prefetched = self._request(np.unique(self.next_ids()))

    def _slots_of(self, keys):
        slots = self.policy.slots(keys)
        return slots[slots >= 0]

    def _update_bounded(self, uniq, summed, lr):
        slots = self.policy.slots(uniq)
        cached = slots >= 0
        s = slots[cached]
        # The local copy takes the step now (same rule as the servers, state cached beside it).
        _C.apply_rows(self.optimizer.config, lr, self.values, self.opt_state, self.opt_steps,
                      s, np.ascontiguousarray(summed[cached]))
        self.pending_grad[s] += summed[cached]
        self.pending[s] += 1
        due = s[self.pending[s] > self.bound]
        if len(due):
            keys = uniq[cached][self.pending[s] > self.bound]
            self._outbox.append((keys, self.pending_grad[due].copy(), self.pending[due].copy()))
            self.versions[due] += self.pending[due]
            self.pending[due] = 0
            self.pending_grad[due] = 0
        if not cached.all():
            self._outbox.append((uniq[~cached], summed[~cached], None))

    def _write_back_evicted(self, keys, slots):
        if self.bound == 0 or len(keys) == 0:
            return
        dirty = self.pending[slots] > 0
        if dirty.any():
            self._outbox.append((keys[dirty], self.pending_grad[slots[dirty]].copy(), self.pending[slots[dirty]].copy()))
        self.pending[slots] = 0
        self.pending_grad[slots] = 0
        self.opt_state[slots] = 0
        self.opt_steps[slots] = 0
        self.versions[slots] = NEVER

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
        self.counters.add(rows_pushed=len(keys), bytes_pushed=len(keys) * (self.width * 4 + 8))

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
        keys = np.sort(self.policy.keys())
        slots = self.policy.slots(keys)
        dirty = self.pending[slots] > 0
        if dirty.any():
            s = slots[dirty]
            self._outbox.append((keys[dirty], self.pending_grad[s].copy(), self.pending[s].copy()))
            self.versions[s] += self.pending[s]
            self.pending[s] = 0
            self.pending_grad[s] = 0
        self._flush_outbox(lr)
