"""Herald's embedding scheduler (DESIGN.md section 7).

Every worker runs the same Scheduler on the same sample stream and computes the same plan, in a
background thread, `lookahead` iterations ahead. The work is done by the C++ planner
(hetu._C.Planner, src/herald/planner.cpp) with the GIL released: it keeps a model of every
worker's cache (the CachePolicy that the real caches use, plus which cached rows are valid and
which are dirty) and, per iteration:

1. allocates the global batch, b samples per worker (src/herald/allocate.cpp). "greedy" is the
   rule of DESIGN.md: score(s, w) = rows of sample s valid in w's cache, each sample to its
   best-scoring worker with room. "colocate" (the default) places samples in the same order
   but on the worker where each adds the fewest row transmissions, which also counts rows that
   worker already reads this iteration (a row read by one worker only is stepped there and
   moves nothing), then trades pairs of samples while that saves rows;
2. plans, for this worker: the rows to pull (not cached or invalidated), the rows it steps
   itself (used by no other worker: owner-computes), the rows whose gradients go to the servers
   (used by several workers), the cached rows to invalidate (updated elsewhere), and the rows
   to write back at the end of the iteration (dirty rows another worker reads next iteration,
   evicted dirty rows, owner rows that bypassed a full cache).

The write-back of iteration t depends on who reads what at t+1, so plan(t) is final once
iteration t+1 is allocated: the lookahead is at least 1."""
import atexit
import threading
import time

import numpy as np

from .. import _C


ALLOCATORS = ("colocate", "greedy", "none")


class Plan:
    """One iteration of this worker. Arrays over `keys` (its distinct rows, ascending):
    `hit` (resident before this iteration, per the policy), `pull` (must be fetched), `owner`
    (stepped here); key lists: `invalidate` (cached here, updated elsewhere), `writeback`."""
    __slots__ = ("iteration", "samples", "keys", "hit", "pull", "owner", "invalidate", "writeback",
                 "scheduler_seconds")

    def __init__(self, iteration, samples, keys, hit, pull, owner, invalidate, writeback, seconds):
        self.iteration, self.samples, self.keys = iteration, samples, keys
        self.hit, self.pull, self.owner = hit, pull, owner
        self.invalidate, self.writeback = invalidate, writeback
        self.scheduler_seconds = seconds


class Scheduler:
    def __init__(self, sparse, loader, num_workers, rank, batch_size, capacity, policy="lru", lookahead=2,
                 allocator="colocate", pin_threshold=8):
        if lookahead < 1:
            raise ValueError(f"Herald needs --lookahead >= 1 (got {lookahead}): the write-back plan of iteration t "
                             f"depends on which worker reads which rows at t+1")
        if allocator not in ALLOCATORS:
            raise ValueError(f"unknown allocator {allocator!r}: expected one of {', '.join(ALLOCATORS)}")
        if capacity < 1:
            raise ValueError(f"Herald: cache capacity {capacity} rows; it must hold at least one row")
        if loader.batch_num < 1:
            raise ValueError(f"Herald: {len(loader.data)} samples make no global batch of "
                             f"{num_workers} x {batch_size}")
        # The planner gathers each global batch's ids itself, without the GIL: it needs the
        # whole id table as one int64 [samples, fields] array (a memory map is not copied).
        sparse = np.asarray(sparse)
        if sparse.dtype != np.int64 or sparse.ndim != 2:
            raise TypeError(f"Herald: sparse ids must be an int64 [samples, fields] array, got {sparse.dtype} "
                            f"{sparse.shape}")
        self.sparse, self.loader = np.ascontiguousarray(sparse), loader
        self.lookahead = lookahead
        self._planner = _C.Planner(num_workers, rank, batch_size, policy, capacity, pin_threshold,
                                   allocator=allocator)
        self._seconds = {}   # iteration -> planner time
        self._alloc, self._plans = {}, {}
        self._next = 0
        self._consumed = -1
        self._requested = 0
        self._error = None
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="herald-scheduler", daemon=True)
        self._thread.start()
        # A daemon thread still inside a C++ call when the interpreter finalises is unwound
        # through noexcept frames, which aborts the process: stop it first.
        atexit.register(self.close)

    # --- consumers ----------------------------------------------------------------------------
    def samples(self, t):
        """Positions within global batch t of the samples this worker trains (dataloader plan)."""
        out = self._wait(lambda: t in self._alloc, t, lambda: self._alloc[t], requested=t)
        with self._cond:  # plans nobody consumes (the allocator-only ablation) must not pile up
            for old in [k for k in self._plans if k < t - 2 * self.lookahead - 8]:
                del self._plans[old]
        return out

    def plan(self, t):
        """Blocks until plan t is final; returns (plan, seconds waited)."""
        start = time.perf_counter()
        plan = self._wait(lambda: t in self._plans, t, lambda: self._plans[t], requested=t + 1)
        with self._cond:
            if t > self._consumed:
                self._consumed = t
                for old in [k for k in self._plans if k < t - 2]:
                    del self._plans[old]
                for old in [k for k in self._alloc if k < t - 2 * self.lookahead - 8]:
                    del self._alloc[old]
                self._cond.notify_all()
        return plan, time.perf_counter() - start

    def _wait(self, ready, t, get, requested, timeout=600.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            if requested > self._requested:
                self._requested = requested
                self._cond.notify_all()
            while not ready():
                if self._error is not None:
                    raise RuntimeError(f"Herald scheduler failed: {self._error!r}") from self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"Herald scheduler produced nothing for iteration {t} in {timeout:.0f} s")
                self._cond.wait(min(left, 1.0))
            return get()

    def close(self):
        """Stops the planning thread (waits for the iteration it is computing)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    # --- the planning thread ------------------------------------------------------------------
    def _run(self):
        try:
            while True:
                with self._cond:
                    while not self._stop and self._next > max(self._consumed + self.lookahead + 1, self._requested):
                        self._cond.wait()
                    if self._stop:
                        return
                    t = self._next
                self._advance(t)
                with self._cond:
                    self._next = t + 1
                    self._cond.notify_all()
        except BaseException as e:  # surfaced to the consumers
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _advance(self, t):
        start = time.perf_counter()
        samples, finished = self._planner.advance_samples(self.sparse, self.loader.global_indices(t), t)
        self._seconds[t] = time.perf_counter() - start
        with self._cond:
            self._alloc[t] = samples
            if finished is not None:
                it = finished[0]
                self._plans[it] = Plan(*finished, self._seconds.pop(it))
            self._cond.notify_all()
