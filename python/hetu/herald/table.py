"""A worker's cache of one embedding table, driven by Herald's plan instead of the HET protocol.

Each step it (1) runs its own CachePolicy on the step's rows and checks that hits and pulls are
exactly what the scheduler predicted, (2) pulls the planned rows (with optimizer state for the
rows it will step itself), (3) after the backward pass steps its owner rows locally, sends the
gradients of shared rows to the servers, invalidates, and writes back the planned dirty rows
(values, optimizer state and step counts) before its push, so every other worker's next pull
sees them.

Prefetch (off by default, as for the HET cache; `prefetch=True`): the plan of the next
iteration is known before its batch is read, so its pulls are sent right after this
iteration's push. The servers answer a pull tagged with the next clock
only once every worker's push of this iteration (and so every write-back sent before it) is
applied, so the rows are those a pull sent at the next lookup would get. A flush in between
writes back only rows that, by the plan, no other worker reads at the next step; the prefetched
rows are dropped and pulled again all the same, so that a pull always follows every message
this worker sent before it."""
import numpy as np

from .. import _C


class PlanMismatch(RuntimeError):
    """The real cache disagreed with the scheduler's model of it: the plan would be wrong."""


class HeraldTable:
    def __init__(self, remote, scheduler, capacity, policy, optimizer, counters, primary=True, pin_threshold=8,
                 prefetch=False):
        rows, width = remote.param.shape
        self.remote, self.scheduler, self.optimizer, self.counters = remote, scheduler, optimizer, counters
        self.width, self.nslots = width, optimizer.slots
        self.primary = primary  # the table that records per-iteration scheduler figures
        capacity = int(min(capacity, rows))
        self.policy = _C.CachePolicy(policy, capacity, pin_threshold)
        self.values = np.zeros((capacity, width), np.float32)
        self.state = np.zeros((capacity, self.nslots * width), np.float32)
        self.steps = np.zeros(capacity, np.int64)
        self.valid = np.zeros(capacity, bool)
        self.dirty = np.zeros(capacity, bool)
        self.slot_key = np.full(capacity, -1, np.int64)
        self.t = 0
        self._step = None
        self.prefetch = prefetch
        self._prefetched = None        # pulls of iteration self.t, sent after the last push
        self._write_back_sent = None   # handle of the last write-back, waited for one step later

    # --- forward ------------------------------------------------------------------------------
    def lookup(self, uniq):
        plan, waited = self.scheduler.plan(self.t)
        if not np.array_equal(uniq, plan.keys):
            raise PlanMismatch(f"{self.remote.param.name}, iteration {self.t}: the batch's rows differ from the "
                               f"rows Herald planned ({len(uniq)} vs {len(plan.keys)}): data and plan are out of step")
        slots, hit, ev_keys, ev_slots = self.policy.access(uniq)
        if not np.array_equal(hit, plan.hit):
            raise PlanMismatch(f"{self.remote.param.name}, iteration {self.t}: cache hits differ from the "
                               f"scheduler's prediction on {int(np.count_nonzero(hit != plan.hit))} rows")
        stash = self._stash_evicted(ev_keys, ev_slots)
        cached = slots >= 0
        self.slot_key[slots[cached]] = uniq[cached]
        valid_before = np.zeros(len(uniq), bool)
        resident = cached & hit
        valid_before[resident] = self.valid[slots[resident]]
        if not np.array_equal(~valid_before, plan.pull):
            raise PlanMismatch(f"{self.remote.param.name}, iteration {self.t}: rows to pull differ from the plan")
        fetch, self._prefetched = self._prefetched, None
        prefetched = fetch is not None and fetch[0] == (self.t, self.remote.clock)
        if not prefetched:
            self._drop(fetch)
            fetch = self._request(plan)
        # The pulls go out first: the servers apply this worker's messages in order, so they
        # see the last write-back whether or not its acknowledgement is back yet.
        self._settle_write_back()

        # Working copies of this step's rows: from the cache where valid, else pulled.
        n = len(uniq)
        vals = np.empty((n, self.width), np.float32)
        state = np.zeros((n, self.nslots * self.width), np.float32)
        steps = np.zeros(n, np.int64)
        from_cache = np.flatnonzero(valid_before)
        vals[from_cache] = self.values[slots[from_cache]]
        state[from_cache] = self.state[slots[from_cache]]
        steps[from_cache] = self.steps[slots[from_cache]]
        _, own_pull, shared_pull, h_own, h_shared, plan_wait = fetch
        if h_own is not None:
            vals[own_pull], state[own_pull], steps[own_pull], _ = h_own.wait()
        if h_shared is not None:
            vals[shared_pull] = h_shared.wait()
        self._step = (plan, uniq, slots, vals, state, steps, stash)
        served = len(from_cache)
        state_bytes = self.nslots * self.width * 4 + 8
        self.counters.add(rows_pulled=len(own_pull) + len(shared_pull),
                          bytes_pulled=len(own_pull) * (self.width * 4 + state_bytes + 16) + len(shared_pull) * (self.width * 4 + 8),
                          hits=served, misses=n - served, evictions=len(ev_keys),
                          rows_prefetched=len(own_pull) + len(shared_pull) if prefetched else 0)
        if self.primary:
            self.counters.add(scheduler_seconds=plan.scheduler_seconds, plan_wait_seconds=waited + plan_wait)
        return vals

    def _request(self, plan, plan_wait=0.0):
        """Sends the pulls of `plan` (not waited for): values and optimizer state of the rows this
        worker will step, values of the shared rows."""
        own_pull = np.flatnonzero(plan.pull & plan.owner)
        shared_pull = np.flatnonzero(plan.pull & ~plan.owner)
        tag = self.remote.sync.tag(self.remote.clock)
        table = self.remote.table
        h_own = table.pull_with_state(plan.keys[own_pull], iteration=tag) if len(own_pull) else None
        h_shared = table.pull(plan.keys[shared_pull], iteration=tag) if len(shared_pull) else None
        return (plan.iteration, self.remote.clock), own_pull, shared_pull, h_own, h_shared, plan_wait

    @staticmethod
    def _drop(fetch):
        """Waits for pulls whose rows are not wanted (a flush came in between): their arrays must
        outlive the requests, and an error in them still surfaces."""
        if fetch is not None:
            for h in fetch[3:5]:
                if h is not None:
                    h.wait()

    def _settle_write_back(self):
        handle, self._write_back_sent = self._write_back_sent, None
        if handle is not None:
            handle.wait()

    def _stash_evicted(self, keys, slots):
        """Values of evicted dirty rows, kept until this step's write-back."""
        order = np.argsort(keys)
        keys, slots = keys[order], slots[order]
        dirty = self.dirty[slots]
        stash = (keys[dirty], self.values[slots[dirty]].copy(), self.state[slots[dirty]].copy(),
                 self.steps[slots[dirty]].copy())
        self.valid[slots] = False
        self.dirty[slots] = False
        return stash

    # --- backward -----------------------------------------------------------------------------
    def update(self, uniq, summed, lr):
        plan, keys, slots, vals, state, steps, stash = self._step
        if not np.array_equal(uniq, keys):
            raise PlanMismatch(f"{self.remote.param.name}, iteration {self.t}: gradient rows differ from the lookup")
        owner = np.flatnonzero(plan.owner)
        shared = np.flatnonzero(~plan.owner)
        # Owner-computes: the row's only user steps it, optimizer state included.
        _C.apply_rows(self.optimizer.config, lr, vals, state, steps, owner, np.ascontiguousarray(summed[owner]))
        cached = slots >= 0
        keep = owner[cached[owner]]
        s = slots[keep]
        self.values[s], self.state[s], self.steps[s] = vals[keep], state[keep], steps[keep]
        self.valid[s] = True
        self.dirty[s] = True
        gone = slots[shared[cached[shared]]]
        self.valid[gone] = False
        self.dirty[gone] = False
        inv = self.policy.slots(plan.invalidate)
        inv = inv[inv >= 0]
        if self.dirty[inv].any():
            raise PlanMismatch(f"{self.remote.param.name}, iteration {self.t}: a dirty row would be invalidated")
        self.valid[inv] = False

        written, pending = self._write_back(plan.writeback, keys, slots, vals, state, steps, stash)
        # The write-back is sent before the push: every other worker's pull for the next
        # iteration waits for this push, and the server handles this worker's messages in order.
        self.remote.push(keys[shared], np.ascontiguousarray(summed[shared]), lr)
        # Its answer is only an acknowledgement: the server applies this worker's messages in
        # order, so the next lookup's pulls already see it.
        self._write_back_sent = pending
        self.counters.add(rows_pushed=len(shared) + written,
                          bytes_pushed=len(shared) * (self.width * 4 + 8) +
                          written * (self.width * 4 + self.nslots * self.width * 4 + 16))
        self._step = None
        self.t += 1
        if self.prefetch:
            plan, waited = self.scheduler.plan(self.t)
            self._prefetched = self._request(plan, waited)

    def _write_back(self, wb_keys, keys, slots, vals, state, steps, stash):
        """Sends the planned write-back; returns (rows sent, handle to wait for or None)."""
        if len(wb_keys) == 0:
            return 0, None
        parts = []
        st_keys, st_vals, st_state, st_steps = stash
        in_stash = np.isin(wb_keys, st_keys)
        if in_stash.any():
            idx = np.searchsorted(st_keys, wb_keys[in_stash])
            parts.append((st_keys[idx], st_vals[idx], st_state[idx], st_steps[idx]))
        rest = wb_keys[~in_stash]
        pos = np.searchsorted(keys, rest)
        in_step = (pos < len(keys)) & (keys[np.minimum(pos, len(keys) - 1)] == rest)
        bypass = pos[in_step][slots[pos[in_step]] < 0]
        if len(bypass):
            parts.append((keys[bypass], vals[bypass], state[bypass], steps[bypass]))
        resident = self.policy.slots(rest)
        s = resident[(resident >= 0)]
        s = s[self.dirty[s]]           # rows already clean (flushed) need nothing
        if len(s):
            parts.append((self.slot_key[s], self.values[s], self.state[s], self.steps[s]))
            self.dirty[s] = False
        if not parts:
            return 0, None
        k = np.concatenate([p[0] for p in parts])
        handle = self.remote.table.assign(k, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]),
                                          np.concatenate([p[3] for p in parts]), version_add=1)
        return len(k), handle

    def flush(self, lr):
        """Writes every dirty row back, then one (possibly empty) push that every worker sends, so
        the next pulls of any worker see the written rows."""
        self._settle_write_back()
        # The next lookup pulls anew, after the rows written here (see Prefetch above).
        self._drop(self._prefetched)
        self._prefetched = None
        s = np.flatnonzero(self.dirty)
        if len(s):
            self.remote.table.assign(self.slot_key[s], self.values[s], self.state[s], self.steps[s],
                                     version_add=1).wait()
            self.dirty[s] = False
            self.counters.add(rows_pushed=len(s), bytes_pushed=len(s) * (self.width * 4 + self.nslots * self.width * 4 + 16))
        self.remote.push(np.empty(0, np.int64), np.empty((0, self.width), np.float32), lr)
