"""Herald with dynamic tables (docs/design.md section 13): the planner plans a dynamic table's slots
from a key directory of its own, and a slot re-assigned to another key is forgotten by every
modelled cache and by the real caches alike, so the plans stay exact: equal to the single process
parameter by parameter."""
import re
import sys

import numpy as np
import pytest

import hetu as ht
import jobs
from dist_harness import assert_same_parameters, run_cluster, run_single
from hetu import _C
from hetu.dynamic import DynamicTable, TableKeys
from hetu.herald import Scheduler
from test_dist_equivalence import OPTIMIZERS

WIDTH, LR = 3, 0.5
HERALD = ["--comm", "PS", "--cache", "lru", "--bound", "0", "--bsp", "0", "--cache-limit-ratio", "0.2"]


@pytest.fixture(scope="module")
def hashed_data(tmp_path_factory):
    """Criteo-shaped synthetic data whose ids are 64-bit hashed keys (hetu.data.keys)."""
    out = tmp_path_factory.mktemp("hashed") / "data"
    jobs.run([sys.executable, "-m", "hetu.data.prepare", "synthetic", "--output", str(out), "--rows", "6000",
              "--ids", "hashed", "--scale", "0.001"], check=True, timeout=120)
    return str(out)


def _moves(stdout):
    """(admitted, evicted) summed over worker 0's counter lines, one per server."""
    lines = re.findall(r"\[worker 0\] table embedding server \d+: \d+ resident of \d+, (\d+) admitted, (\d+) evicted",
                       stdout)
    assert lines, stdout[-2000:]
    return tuple(sum(int(line[i]) for line in lines) for i in (0, 1))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers,servers,opt,flags,herald_only", [
    # 10 steps: at 20, Sandybridge's OpenBLAS kernel parts this run from the single process (4.8x
    # the bound: docs/results/exactness.md, "Rounding").
    (2, 1, "sgd", ["--table-capacity", "512", "--iters-per-epoch", "10"], []),
    (3, 2, "adam", ["--table-capacity", "512", "--admit-after", "3", "--evict-ttl", "2"], []),
    (2, 2, "rowwise_adagrad", ["--table-capacity", "1024", "--evict-ttl", "2"], []),
    (3, 1, "sgd", ["--table-capacity", "512", "--admit-after", "3"], ["--planners", "worker"]),
    # Caches flushed for validation between epochs, the plans running on across the epoch's end.
    # (9 steps an epoch: at this data's 20th step a sample's hidden unit sits within float rounding
    # of ReLU's kink, and the GEMM row Herald gives the sample rounds it to the other side.)
    (3, 2, "sgd", ["--table-capacity", "512", "--evict-ttl", "2", "--nepoch", "2", "--iters-per-epoch", "9",
                   "--val"], []),
])
def test_herald_with_a_dynamic_table_equals_single_process(tmp_path, data_home, hashed_data, workers, servers, opt,
                                                          flags, herald_only):
    """Keys are evicted and admitted again while cached (the table holds fewer rows than the
    data's keys); a host's planner (the default) or every worker's own plans them."""
    args = ["--model", "wdl_criteo", "--data-dir", hashed_data, *flags, *OPTIMIZERS[opt]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=48)
    got, out = run_cluster(tmp_path, data_home, "run_laia.py", [*HERALD, *herald_only, *args], workers, servers,
                           48 // workers)
    admitted, evicted = _moves(out)
    assert evicted > 0 and admitted > evicted   # keys left their rows, and others took them
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


def _key_batches(steps, samples, fields, distinct, seed=0):
    """Global batches of int64 keys, skewed so that some keys return after their eviction."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(1, 2**62, size=distinct)
    return [keys[rng.zipf(1.4, size=(samples, fields)) % distinct] for _ in range(steps)]


def _initial_rows(keys):
    return np.repeat(((keys % 97) / 97.0).astype(np.float32)[:, None], WIDTH, axis=1)


def _gradients(values, slots, samples):
    """Summed per distinct slot over `samples` (rows of `slots`; -1 has no row): a sample's
    gradient of a row depends on the row's value, so a stale or reset row shows."""
    flat, weight = slots[samples].reshape(-1), np.repeat(samples.astype(np.float32) + 1, slots.shape[1])
    filled = flat >= 0
    uniq, inverse = np.unique(flat[filled], return_inverse=True)
    summed = np.zeros((len(uniq), WIDTH), np.float32)
    np.add.at(summed, inverse, 0.01 * values(uniq)[inverse] + weight[filled][:, None])
    return uniq, summed


def _single_process(batches, table):
    """The reference: one table of slots, each admitted slot reset, every gradient applied."""
    keys, rows = TableKeys(table, "reference"), np.zeros((table.capacity, WIDTH), np.float32)
    for t, batch in enumerate(batches):
        slots = keys.train(t, batch, batch)
        rows[keys.current.admitted_slots] = _initial_rows(keys.current.admitted_keys)
        uniq, summed = _gradients(lambda s: rows[s], slots, np.arange(len(batch)))
        rows[uniq] -= LR * summed
    return rows, keys


def _herald(batches, table, workers, per_worker, capacity, real_caches_forget=True):
    """Herald without processes: one planner for every worker, planning from a directory of its
    own stepped at submission, the real caches (PlanCache) driven by its plans, the servers a
    table of slots. Trains every batch but the last (which makes the plan before it final).
    Returns (the servers' rows after a final flush, None) or (None, the first mismatch a real
    cache reported)."""
    planner = _C.Planner(workers, list(range(workers)), per_worker, "lru", capacity, allocator="colocate")
    planner_keys, training_keys = TableKeys(table, "planner"), TableKeys(table, "training")
    caches = [_C.PlanCache("lru", capacity, WIDTH, ht.optim.SGDOptimizer(LR).config) for _ in range(workers)]
    servers = np.zeros((table.capacity, WIDTH), np.float32)
    plans = {}   # iteration -> each worker's final plan
    for t in range(len(batches)):
        # Plan t, which makes plan t-1 final.
        slots = planner_keys.train(t, batches[t], batches[t])
        planner.forget(planner_keys.current.reassigned_slots())
        for _, finished in planner.advance_all(slots, t):
            if finished is not None:
                plans.setdefault(t - 1, []).append(finished)
        if t == 0:
            continue
        s = t - 1   # train step s
        slots = training_keys.train(s, batches[s], batches[s])
        step = training_keys.current
        servers[step.admitted_slots] = _initial_rows(step.admitted_keys)   # the admit, once
        pushed = []
        for w, plan in enumerate(plans.pop(s)):
            _, samples, keys, hit, pull, owner, invalidate, writeback = plan
            if real_caches_forget:
                caches[w].forget(step.reassigned_slots())
            n = len(keys)
            vals, state, steps = np.empty((n, WIDTH), np.float32), np.empty((n, 0), np.float32), np.empty(n, np.int64)
            error, _, _ = caches[w].begin(keys, hit, pull, vals, state, steps)
            if error:
                return None, f"worker {w}, step {s}: {error}"
            vals[pull] = servers[keys[pull]]
            uniq, summed = _gradients(lambda k: vals[np.searchsorted(keys, k)], slots, samples)
            np.testing.assert_array_equal(uniq, keys)
            error, (wb_keys, wb_vals, _, _) = caches[w].finish(keys, owner, summed, LR, vals, state, steps,
                                                               invalidate, writeback)
            if error:
                return None, f"worker {w}, step {s}: {error}"
            pushed.append((wb_keys, wb_vals, keys[~owner], summed[~owner]))
        for wb_keys, wb_vals, _, _ in pushed:   # write-backs first, then the shared rows' gradients
            servers[wb_keys] = wb_vals
        for _, _, keys, summed in pushed:
            np.subtract.at(servers, keys, LR * summed)
    for cache in caches:
        wb_keys, wb_vals, _, _ = cache.drain()
        servers[wb_keys] = wb_vals
    return servers, None


@pytest.mark.parametrize("workers,admit_after,ttl", [(2, 1, 0), (3, 3, 0), (3, 1, 4)])
def test_planned_caches_forget_reassigned_slots_and_stay_exact(workers, admit_after, ttl):
    table = DynamicTable(32, admit_after=admit_after, ttl=ttl, buckets=8)
    batches = _key_batches(40, workers * 4, 3, 150)
    want, keys = _single_process(batches[:-1], table)
    admitted, evicted = keys.counters()["admitted"], keys.counters()["evicted"]
    assert evicted > 0 and admitted > table.capacity   # slots were re-assigned
    got, error = _herald(batches, table, workers, 4, capacity=10)
    assert error is None, error
    _, resident = keys.resident()
    np.testing.assert_allclose(got[resident], want[resident], rtol=1e-5, atol=1e-6)


def test_real_caches_that_keep_reassigned_slots_disagree_with_the_plan():
    # The check above can fail: caches that keep a re-assigned slot's old row serve it (or write
    # it back) where the plan pulls the new key's row.
    table = DynamicTable(32, buckets=8)
    batches = _key_batches(40, 8, 3, 150)
    want, keys = _single_process(batches[:-1], table)
    got, error = _herald(batches, table, 2, 4, capacity=10, real_caches_forget=False)
    _, resident = keys.resident()
    assert error is not None or not np.allclose(got[resident], want[resident], rtol=1e-5, atol=1e-6)


def test_planning_thread_plans_submitted_ids_forgetting_rows_first():
    rng = np.random.default_rng(3)
    direct = _C.Planner(2, 0, 4, "lru", 6)
    thread = _C.PlanningThread(_C.Planner(2, 0, 4, "lru", 6), None, history=8)
    try:
        batches = [rng.integers(-1, 20, size=(8, 3)) for _ in range(8)]   # -1: no row
        forgets = [np.unique(rng.integers(0, 20, size=3)) for _ in batches]
        for t, (ids, forget) in enumerate(zip(batches, forgets)):
            thread.submit_ids(t, ids, forget)
        for t, (ids, forget) in enumerate(zip(batches, forgets)):
            direct.forget(forget)
            want_samples, want_plan = direct.advance(ids, t)
            np.testing.assert_array_equal(thread.samples(t, 10.0), want_samples)
            if want_plan is None:
                continue
            got_plan = thread.plan(t - 1, 10.0)
            assert -1 not in got_plan[2]
            for got, want in zip(got_plan, want_plan):
                np.testing.assert_array_equal(got, want)
        with pytest.raises(ValueError, match="no id table to gather iteration 8 from"):
            thread.submit(8, np.arange(8))
        with pytest.raises(ValueError, match="with 0 fields per sample"):
            thread.submit_ids(8, np.zeros((8, 0), np.int64), np.empty(0, np.int64))
        thread.submit_ids(8, np.zeros((7, 3), np.int64), np.empty(0, np.int64))   # a sample short
        with pytest.raises(ValueError, match="21 ids given, 8 samples of 3 fields expected"):
            thread.samples(8, 10.0)
    finally:
        thread.close()


def test_a_forgotten_row_is_pulled_and_never_written_back():
    planner = _C.Planner(1, 0, 1, "lru", 4)
    cache = _C.PlanCache("lru", 4, 1, ht.optim.SGDOptimizer(1.0).config)
    _, first = planner.advance(np.array([[5]], np.int64), 0)
    planner.forget(np.array([5], np.int64))
    _, plan0 = planner.advance(np.array([[5]], np.int64), 1)
    _, plan1 = planner.advance(np.array([[6]], np.int64), 2)
    assert first is None and plan1[3].tolist() == [True] and plan1[4].tolist() == [True]   # hit, but pulled
    assert planner.valid_masks(np.array([5], np.int64)).tolist() == [1]   # stepped at 1: valid again
    vals, state, steps = np.zeros((1, 1), np.float32), np.empty((1, 0), np.float32), np.zeros(1, np.int64)
    keys, one = np.array([5], np.int64), np.ones((1, 1), np.float32)
    assert cache.begin(keys, plan0[3], plan0[4], vals, state, steps)[0] == ""
    assert cache.finish(keys, plan0[5], one, 1.0, vals, state, steps, plan0[6], plan0[7])[0] == ""
    cache.forget(keys)   # row 5 dirty, then forgotten: nothing to drain
    assert len(cache.drain()[0]) == 0
    assert cache.begin(keys, plan1[3], plan1[4], vals, state, steps)[0] == ""   # pulled, as planned
    with pytest.raises(RuntimeError, match="between a step's begin and finish"):
        cache.forget(keys)


def test_a_resumed_scheduler_plans_from_the_training_directory():
    """start_at(step) restarts the planner's directory from the training replica, which has taken
    steps 0 to step-1 (a checkpoint restores it): the plans are those of a planner that starts
    there with empty caches, fed the training replica's slots."""
    table = DynamicTable(32, buckets=8)
    sparse = np.concatenate(_key_batches(12, 8, 3, 150))
    loader = ht.Dataloader(sparse, 4, "train")
    loader.set_worker(0, 2)
    training = TableKeys(table, "embedding")
    scheduler = Scheduler(sparse, loader.batches, 2, 0, 4, 10, table_keys=training)
    try:
        for t in range(5):
            batch = sparse[loader.batches.indices(t)]
            training.train(t, batch, batch)
        fresh = TableKeys(table, "fresh")
        fresh.train(5, sparse[loader.batches.indices(5)], sparse[loader.batches.indices(5)])
        scheduler.start_at(5)
        direct = _C.Planner(2, 0, 4, "lru", 10)
        for t in range(5, 10):
            batch = sparse[loader.batches.indices(t)]
            slots = training.train(t, batch, batch)
            if t == 5:   # a directory started afresh would plan other slots
                assert not np.array_equal(fresh.current.slots, training.current.slots)
            direct.forget(training.current.reassigned_slots())
            want_samples, want = direct.advance(slots, t - 5)
            np.testing.assert_array_equal(scheduler.samples(t), want_samples)
            if want is None:
                continue
            got, _ = scheduler.plan(t - 1)
            assert got.iteration == t - 1
            for i, field in enumerate(("samples", "keys", "hit", "pull", "owner", "invalidate", "writeback"), 1):
                np.testing.assert_array_equal(getattr(got, field), want[i], err_msg=f"{field}, step {t - 1}")
    finally:
        scheduler.close()
