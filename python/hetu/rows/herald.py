"""A worker's cache of one embedding table, driven by Herald's plan instead of the HET protocol.

Each step it (1) runs its own CachePolicy on the step's rows and checks that hits and pulls are
exactly what the scheduler predicted, (2) pulls the planned rows (with optimizer state for the
rows it will step itself), (3) after the backward pass steps its owner rows locally, invalidates,
and sends the gradients of shared rows to the servers together with the planned write-back of
dirty rows (values, optimizer state and step counts), which the servers write before they take
the push in, so every other worker's next pull sees them. One message each way per step, as in
HET. The rows and the per-row bookkeeping of (1) and (3) are hetu._C.PlanCache
(src/herald/plan_cache.h); this class sends and receives.

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
from . import RowSource


class PlanMismatch(RuntimeError):
    """The real cache disagreed with the scheduler's model of it: the plan would be wrong."""


class HeraldTable(RowSource):
    """Herald's RowSource: a worker's cache of one RemoteTable (servers.py), run by the plans of
    `scheduler` (hetu.herald.Scheduler)."""

    def __init__(self, remote, scheduler, capacity, policy, optimizer, primary=True, pin_threshold=8,
                 prefetch=False):
        super().__init__(remote)
        rows, width = remote.param.shape
        self.scheduler, self.width = scheduler, width
        self.primary = primary  # the table that records per-iteration scheduler figures
        # The rows themselves, their policy, valid and dirty flags: src/herald/plan_cache.h.
        self.store = _C.PlanCache(policy, int(min(capacity, rows)), width, optimizer.config, pin_threshold)
        self.state_width = self.store.state_width
        self.t = 0
        self._step = None
        self.prefetch = prefetch
        self._prefetched = None        # the pull of iteration self.t, sent after the last push

    def _mismatch(self, what):
        return PlanMismatch(f"{self.remote.param.name}, iteration {self.t}: {what}")

    # --- forward ------------------------------------------------------------------------------
    def begin_step(self, step, uniq):
        """A dynamic table's step: the copies of the slots it re-assigns are dropped here, as the
        scheduler's model drops them before planning the step (so neither writes them back nor
        reads them), then the servers take the admissions."""
        self.store.forget(np.ascontiguousarray(step.reassigned_slots(), np.int64))
        super().begin_step(step, uniq)

    def lookup(self, uniq):
        plan, waited = self.scheduler.plan(self.t)
        if not np.array_equal(uniq, plan.keys):
            raise self._mismatch(f"the batch's rows differ from the rows Herald planned ({len(uniq)} vs "
                                 f"{len(plan.keys)}): data and plan are out of step")
        # Working copies of this step's rows: from the cache where valid, else pulled.
        n = len(uniq)
        vals = np.empty((n, self.width), np.float32)
        state = np.empty((n, self.state_width), np.float32)
        steps = np.empty(n, np.int64)
        error, served, evictions = self.store.begin(uniq, plan.hit, plan.pull, vals, state, steps,
                                                    catch_up_to=self.remote.catch_up_to())
        if error:
            raise self._mismatch(error)
        fetch, self._prefetched = self._prefetched, None
        prefetched = fetch is not None and fetch.key == (self.t, self.remote.clock)
        if not prefetched:
            self._drop(fetch)
            fetch = self._request(plan)
        if fetch.handle is not None:
            own = fetch.pulled[fetch.with_state]
            vals[fetch.pulled], state[own], steps[own], _ = fetch.handle.wait()
        self._step = (plan, uniq, vals, state, steps)
        pulled = len(fetch.pulled)
        owned = int(np.count_nonzero(fetch.with_state))
        self.counters.add(rows_pulled=pulled,
                          bytes_pulled=owned * (self.remote.row_bytes + self.state_width * 4 + 24) +
                          (pulled - owned) * (self.remote.row_bytes + 8),
                          hits=served, misses=n - served, evictions=evictions,
                          rows_prefetched=pulled if prefetched else 0)
        if self.primary:
            self.counters.add(scheduler_seconds=plan.scheduler_seconds, plan_wait_seconds=waited + fetch.plan_wait)
        return vals

    def _request(self, plan, plan_wait=0.0):
        """Sends the pull of `plan` (not waited for): values of the planned rows, and optimizer
        state of those this worker will step itself."""
        pulled = np.flatnonzero(plan.pull)
        with_state = plan.owner[pulled].astype(bool)
        handle = None
        if len(pulled):
            handle = self.remote.pull_with_state(plan.keys[pulled], with_state)
        return _Fetch((plan.iteration, self.remote.clock), pulled, with_state, handle, plan_wait)

    @staticmethod
    def _drop(fetch):
        """Waits for a pull whose rows are not wanted (a flush came in between): its arrays must
        outlive the request, and an error in it still surfaces."""
        if fetch is not None and fetch.handle is not None:
            fetch.handle.wait()

    # --- backward -----------------------------------------------------------------------------
    def update(self, uniq, summed, lr):
        plan, keys, vals, state, steps = self._step
        if not np.array_equal(uniq, keys):
            raise self._mismatch("gradient rows differ from the lookup")
        summed = np.ascontiguousarray(summed, np.float32)
        error, (wb_keys, wb_vals, wb_state, wb_steps) = self.store.finish(
            keys, plan.owner, summed, lr, vals, state, steps, plan.invalidate, plan.writeback)
        if error:
            raise self._mismatch(error)
        # The write-back travels with the push and is written first: every other worker's pull
        # for the next iteration waits for this push.
        shared = ~plan.owner
        self.remote.push(keys[shared], np.ascontiguousarray(summed[shared]), lr,
                         write_back=(wb_keys, wb_vals, wb_state, wb_steps, 1) if len(wb_keys) else None)
        self.count_push(int(np.count_nonzero(shared)), len(wb_keys), len(wb_keys) * self._row_bytes())
        self._step = None
        self.t += 1
        if self.prefetch:
            plan, waited = self.scheduler.plan(self.t)
            self._prefetched = self._request(plan, waited)
        else:
            plan = self.scheduler.plan_if_ready(self.t) if self.remote.hints else None
        if plan is not None:
            # A table on disk: the servers read the next step's pulled rows while this step ends.
            self.remote.prefetch(plan.keys[plan.pull])

    def _row_bytes(self):
        """A written-back row: key, values, optimizer state, step count and version increment."""
        return self.remote.row_bytes + self.state_width * 4 + 16

    def restore(self, state, step):
        """The next lookup is step `step` of a resumed run, nothing cached yet (the scheduler
        restarts its plans there too)."""
        if self._step is not None or self.t != 0:
            raise RuntimeError(f"{self.remote.param.name}: a resumed table must not have trained (at step {self.t})")
        super().restore(state, step)
        self.t = int(step)

    def flush(self, lr):
        """Writes every dirty row back with one (possibly empty) push that every worker sends, so
        the next pulls of any worker see the written rows."""
        # The next lookup pulls anew, after the rows written here (see Prefetch above).
        self._drop(self._prefetched)
        self._prefetched = None
        keys, vals, state, steps = self.store.drain()
        self.count_push(0, len(keys), len(keys) * self._row_bytes())
        self.remote.push(np.empty(0, np.int64), np.empty((0, self.width), np.float32), lr,
                         write_back=(keys, vals, state, steps, 1) if len(keys) else None)


class _Fetch:
    """The pull of one iteration in flight: `key` (iteration, clock) it was sent for, the
    positions pulled, which of them come with optimizer state (the rows this worker steps), the
    handle (None when nothing is pulled) and the time spent waiting for the plan that named
    them."""
    __slots__ = ("key", "pulled", "with_state", "handle", "plan_wait")

    def __init__(self, key, pulled, with_state, handle, plan_wait):
        self.key, self.pulled, self.with_state = key, pulled, with_state
        self.handle, self.plan_wait = handle, plan_wait
