"""Herald's embedding scheduler (docs/design.md section 7).

Every worker runs the same Scheduler on the same sample stream and computes the same plan,
`lookahead` iterations ahead, on a C++ thread of its own that never takes the GIL
(hetu._C.PlanningThread, src/herald/planning_thread.h), with a second that prepares each batch
(its distinct ids and each sample's rows) while the first plans the batch before
(src/herald/batch_preparer.h): this class only hands them each global batch's sample positions
and takes the answers. The C++ planner (hetu._C.Planner,
src/herald/planner.cpp) keeps a model of every worker's cache (the CachePolicy that the real
caches use, plus which cached rows are valid and which are dirty) and, per iteration:

1. allocates the global batch, b samples per worker (src/herald/allocate.cpp, placement.cpp, trades.cpp). "greedy" is the
   rule of docs/design.md: score(s, w) = rows of sample s valid in w's cache, each sample to its
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
iteration t+1 is allocated: the lookahead is at least 1.

A dynamic table (hetu.dynamic) is planned by its slots. The planner runs ahead of training, so it
keeps a key directory of its own, stepped on each global batch as it is submitted, which gives the
slots the training replica gives at that step (the same rule on the same batches). Before an
iteration is planned, the slots it re-assigns are forgotten by every modelled cache (Planner.forget),
as the real caches forget them before the step's lookup (HeraldTable.begin_step): their old keys'
rows are discarded, never written back.

One planner per host (planners="host", the default with several workers on a host): the host's
first worker (lowest rank) plans for all of the host's workers, on as many threads as the host
has workers (at most its cores) unless told otherwise, and sends each of the others its samples and plans over a
Unix socket (src/herald/plan_link.h); they receive them on a C++ thread (hetu._C.PlanReceiver).
The host then plans once per iteration instead of once per worker, and the plans are the same
bit for bit. The host's workers are found with MPI (MPI_COMM_TYPE_SHARED)."""
import atexit
import functools
import threading
import time

import numpy as np

from .. import _C
from ..dataloader import SamplePlan
from ..dynamic import STEP_AHEAD, TableKeys
from .options import HeraldOptions


_NOTHING_TO_FORGET = np.zeros(0, np.int64)


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


def host_workers(comm):
    """(the communicator of this host's workers, their ranks ascending): MPI's shared-memory
    split, which puts the processes of one host together."""
    local = comm.comm.Split_type(comm.MPI.COMM_TYPE_SHARED, key=comm.rank)
    return local, local.allgather(comm.rank)


class Scheduler(SamplePlan):
    """Reads the global batches (hetu.dataloader.GlobalBatches) and hands out plans: to the
    dataloader which samples this worker trains (SamplePlan.samples), to the HeraldTables which
    rows move (plan)."""

    def __init__(self, sparse, batches, num_workers, rank, batch_size, capacity, policy="lru",
                 lookahead=HeraldOptions.lookahead, allocator=HeraldOptions.allocator, pin_threshold=8, timeout=600.0,
                 planner_threads=HeraldOptions.planner_threads, comm=None, planners=HeraldOptions.planners,
                 table_keys=None, global_rows=None):
        HeraldOptions(lookahead, allocator, planners=planners, planner_threads=planner_threads)   # checks them
        if capacity < 1:
            raise ValueError(f"Herald: cache capacity {capacity} rows; it must hold at least one row")
        # A stream (hetu.streaming.StreamFeed) has no id table and no known length: each global
        # batch's keys are submitted as they arrive (a dynamic table's: streams are hashed).
        self._stream = batches if batches.batch_num is None else None
        if self._stream is not None and table_keys is None:
            raise ValueError("Herald on a stream plans a dynamic table's keys: the stream needs --table-capacity")
        if self._stream is None and batches.batch_num < 1:
            raise ValueError(f"Herald: {batches.samples} samples make no global batch of "
                             f"{num_workers} x {batch_size}")
        # The planning thread gathers each global batch's ids itself, without the GIL: it needs
        # the whole id table as one int64 [samples, fields] array (a memory map is not copied).
        sparse = np.zeros((0, 1), np.int64) if self._stream is not None else np.asarray(sparse)
        if sparse.dtype != np.int64 or sparse.ndim != 2:
            raise TypeError(f"Herald: sparse ids must be an int64 [samples, fields] array, got {sparse.dtype} "
                            f"{sparse.shape}")
        self.batches, self.lookahead, self.timeout = batches, lookahead, timeout
        self.rank = rank
        # The workers that share this worker's planner: all of the host's (the first plans), or
        # this worker alone.
        self._local, self.host_ranks = None, [rank]
        if comm is not None and planners == "host":
            local, ranks = host_workers(comm)
            if len(ranks) > 1:
                self._local, self.host_ranks = local, ranks
            else:
                local.Free()
        self.plans_here = self.host_ranks[0] == rank
        # planner_threads: the planner's own threads (0: HETU_PLANNER_THREADS, else one per
        # worker it plans for, at most the cores); the plans are the same whatever the count.
        self.planner_threads = _C.planner_threads(planner_threads, len(self.host_ranks))
        self._new_planner = functools.partial(_C.Planner, num_workers, self.host_ranks, batch_size, policy, capacity,
                                              pin_threshold, allocator=allocator, threads=planner_threads)
        self._ids = np.ascontiguousarray(sparse)
        # `global_rows(step)`: a global batch's ids where the loader computes them per step (a
        # sequence model's negatives, hetu.dataloader's `columns`): each batch is submitted with
        # its ids, every row its samples read, instead of gathered from the stored table.
        self._global_rows = global_rows
        # A dynamic table's ids are keys (`table_keys`: the training replica of its directory, a
        # hetu.dynamic.TableKeys): the planner's own replica turns each batch's into slots.
        self._training_keys = table_keys
        self._planner_keys = None
        self._keys_ahead = None   # (step, global keys) of the step the planner's replica took ahead
        if table_keys is not None and self.plans_here:
            self._planner_keys = TableKeys(table_keys.table, f"{table_keys.name} (Herald's planner)")
        self._lock = threading.Lock()   # submissions come from the training and the loader threads
        self._thread = None
        # A stream is read from its first batch (a resumed job's source continues after its
        # checkpoint: StreamFeed.start_at), and not yet: its look-ahead starts with the first plan
        # asked for, or with a checkpoint's load, once the source is positioned.
        self.start_at(0 if self._stream is None else self._stream.first, read_ahead=self._stream is None)
        # The thread reads the id table: stop it before the interpreter tears the table down.
        atexit.register(self.close)

    def start_at(self, step, read_ahead=True):
        """Plans from global batch `step` on, every cache empty: a new run starts at 0, a run
        resumed from a checkpoint (whose caches were flushed, so that its rows are all on the
        servers) at the checkpoint's step. All workers call it with the same step. `read_ahead`:
        the batches of the look-ahead are submitted now (those there, on a stream), else with
        the first plan asked for."""
        if self._thread is not None:
            self._thread.close()
        if self._planner_keys is not None:
            # The training replica has taken exactly the steps before `step` (a new run: none; a
            # resumed one: those its checkpoint restored).
            self._planner_keys.restore(self._training_keys.state(), step)
            self._keys_ahead = None
        # Data loaders ask for allocations up to a few steps behind the plans taken.
        history = 2 * self.lookahead + 8
        # A batch submitted with its ids (a dynamic table's slots, or ids its loader computes)
        # needs no id table to gather from.
        table = self._ids if self._planner_keys is None and self._global_rows is None else None
        if len(self.host_ranks) == 1:
            self._thread = _C.PlanningThread(self._new_planner(), table, history=history)
        elif self.plans_here:
            # The host's other workers connect to this worker's planner, which sends them their plans.
            listener = _C.PlanListener()
            self._local.bcast(listener.name, root=0)
            followers = listener.accept(self.host_ranks[1:], self.timeout)
            self._thread = _C.PlanningThread(self._new_planner(), table, history=history, followers=followers,
                                             send_timeout=self.timeout)
        else:
            name = self._local.bcast(None, root=0)
            self._thread = _C.PlanReceiver(name, self.rank, self.host_ranks[0], history, self.timeout)
        # The planner counts its iterations from 0: global batch `step` is its iteration 0.
        self._first = self._submitted = int(step)
        if read_ahead:
            self._submit(step + self.lookahead, wait=False)

    # --- consumers ----------------------------------------------------------------------------
    def samples(self, t):
        """Positions within global batch t of the samples this worker trains (dataloader plan)."""
        self._submit(t)
        return self._answer(self._thread.samples, t)

    def plan(self, t):
        """Blocks until plan t is final; returns (plan, seconds waited)."""
        self._submit(t + 1)   # plan t is final once t+1 is allocated (in training, long submitted)
        start = time.perf_counter()
        plan = Plan(*self._answer(self._thread.plan, t))
        waited = time.perf_counter() - start
        # The look-ahead is submitted after the timer: on busy cores the planning thread, woken
        # here, may take this thread's core for a plan's time, which is the planner's cost
        # ("sched s"), not a wait for this plan.
        self._submit(t + self.lookahead + 1, wait=False)
        plan.iteration += self._first
        return plan, waited

    def plan_if_ready(self, t):
        """Plan t if it is final already, else None: nothing is waited for (a stream's batches
        neither), for hints that must never hold training up."""
        if t < self._first:
            return None
        self._submit(t + 1, wait=False)
        try:
            plan = Plan(*self._thread.plan(t - self._first, 0.0))
        except TimeoutError:
            return None
        plan.iteration += self._first
        return plan

    def close(self):
        """Stops the planning thread (after the iteration it is computing)."""
        self._thread.close()

    def _submit(self, last, wait=True):
        """Hands the planning thread the global batches up to `last`: a plan taken asks for
        `lookahead` more, so that the thread works ahead of training. (A worker that takes its
        host's plans submits nothing: the host's planner follows its own worker's steps, which
        synchronous training keeps within a step of this one's.) A stream's batches not there yet
        are waited for if `wait`, else left to a later call."""
        if last < self._submitted or not self.plans_here:   # the loaders' usual case: handed over, no lock
            return
        with self._lock:
            while self._submitted <= last:
                step = self._submitted
                if self._global_rows is not None and self._planner_keys is None:
                    self._thread.submit_ids(step - self._first, np.ascontiguousarray(self._global_rows(step), np.int64),
                                            _NOTHING_TO_FORGET)
                elif self._planner_keys is None:
                    self._thread.submit(step - self._first, self.batches.indices(step))
                else:
                    ahead, self._keys_ahead = self._keys_ahead, None
                    global_keys = ahead[1] if ahead is not None and ahead[0] == step else self._global_keys(step, wait)
                    if global_keys is None:
                        return
                    slots = self._planner_keys.train(step, global_keys, global_keys)
                    self._thread.submit_ids(step - self._first, slots,
                                            self._planner_keys.current.reassigned_slots())
                    # The next step's decisions, taken on a thread until it is submitted; its keys
                    # kept for it (a sequence model's are computed, negatives drawn: once).
                    following = self._global_keys(step + 1, wait=False) if STEP_AHEAD else None
                    if following is not None:
                        self._keys_ahead = step + 1, following
                        self._planner_keys.step_ahead(step + 1, following)
                self._submitted += 1

    def _global_keys(self, step, wait):
        if self._stream is not None:
            return self._stream.global_rows(step, wait)
        if self._global_rows is not None:   # keys the loader computes (a sequence's targets, negatives)
            return np.ascontiguousarray(self._global_rows(step), np.int64)
        return self._ids[self.batches.indices(step)]

    def _answer(self, wait, t):
        if t < self._first:
            raise ValueError(f"Herald scheduler: step {t} comes before the first planned step, {self._first}")
        try:
            return wait(t - self._first, self.timeout)
        except TimeoutError as e:
            if self._first:
                raise TimeoutError(f"{e} (planner iteration 0 is step {self._first} of the resumed run)") from None
            raise
        except Exception as e:
            raise RuntimeError(f"Herald scheduler failed: {e}") from e
