"""Herald's planner on several threads (hetu._C.Planner(threads=N), HETU_PLANNER_THREADS) plans
exactly what it plans on one: the same allocation, the same pull, hit, owner, invalidate and
write-back lists, the same keys, and the same model of every worker's cache (its valid masks),
for every rank, iteration after iteration."""
import os

import numpy as np
import pytest

from hetu import _C

THREADS = (1, 2, 3, 8)
FIELDS = ("iteration", "samples", "keys", "hit", "pull", "owner", "invalidate", "writeback")


def _batches(seed, workers, batch, fields, ids_per_field, steps):
    """Criteo-like global batches: skewed ids, one id range per field."""
    rng = np.random.default_rng(seed)
    ids = (rng.zipf(1.15, size=(steps * workers * batch, fields)) % ids_per_field).astype(np.int64)
    return ids + ids_per_field * np.arange(fields, dtype=np.int64)


def _run(ids, workers, batch, capacity, policy, allocator, threads, steps, ranks, pipelined=False):
    """Everything the planners of `ranks` answer over `steps` iterations, and their valid masks.
    pipelined: each planner's batches prepared by a BatchPreparer, batch t + 1 queued before batch t
    is planned (as PlanningThread runs them)."""
    planners = [_C.Planner(workers, rank, batch, policy, capacity, allocator=allocator, threads=threads)
                for rank in ranks]
    assert all(p.threads == threads for p in planners)
    preparers = [_C.BatchPreparer(p) for p in planners] if pipelined else []
    queued = [prep.prepare(ids[:workers * batch]) for prep in preparers]
    out = []
    for t in range(steps):
        glob = ids[t * workers * batch:(t + 1) * workers * batch]
        following = ids[(t + 1) * workers * batch:(t + 2) * workers * batch]
        for i, p in enumerate(planners):
            if pipelined:
                now = queued[i]
                if t + 1 < steps:
                    queued[i] = preparers[i].prepare(following)
                samples, finished = p.advance(now, t)
            else:
                samples, finished = p.advance(glob, t)
            out.append(("samples", t, np.asarray(samples)))
            if finished is not None:
                out.extend((field, t, np.asarray(value)) for field, value in zip(FIELDS, finished))
        out.append(("valid masks", t, planners[0].valid_masks(np.unique(glob))))
    return out


# (workers, batch, fields, ids per field, capacity, policy, allocator, steps). Large enough that
# every parallel step of a plan splits its work (plans of fewer than 16,384 ids run on one
# thread; the distinct-row sort splits from 65,536).
CONFIGS = [
    (16, 256, 16, 20000, 4000, "lru", "colocate", 5),
    (8, 512, 26, 5000, 600, "lfu", "colocate", 5),    # a cache smaller than a batch's rows
    (3, 1500, 16, 30000, 20000, "lfuopt", "colocate", 5),
    (5, 700, 20, 8000, 3000, "lru", "greedy", 5),
    (4, 1024, 16, 10000, 2000, "lru", "none", 4),
    (64, 32, 8, 2000, 300, "lru", "colocate", 5),     # every bit of the worker masks
    (1, 4096, 16, 20000, 5000, "lru", "colocate", 4),
]


@pytest.mark.parametrize("workers,batch,fields,ids_per_field,capacity,policy,allocator,steps", CONFIGS)
def test_plans_are_identical_whatever_the_thread_count(workers, batch, fields, ids_per_field, capacity, policy,
                                                        allocator, steps):
    ids = _batches(workers * 31 + batch, workers, batch, fields, ids_per_field, steps)
    ranks = sorted({0, workers // 2, workers - 1}) if workers > 8 else range(workers)
    want = _run(ids, workers, batch, capacity, policy, allocator, 1, steps, ranks)
    for part in ("pull", "writeback") + (("invalidate",) if allocator == "colocate" and workers > 1 and capacity >= 2000 else ()):
        assert any(name == part and value.any() for name, _, value in want), part   # plans with every part
    for threads in THREADS[1:]:
        got = _run(ids, workers, batch, capacity, policy, allocator, threads, steps, ranks)
        assert len(got) == len(want)
        for (name, t, g), (_, _, w) in zip(got, want):
            assert g.dtype == w.dtype, (name, t, threads)
            np.testing.assert_array_equal(g, w, err_msg=f"{name} at iteration {t}, {threads} threads")


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[1], CONFIGS[3], CONFIGS[4]],
                         ids=["colocate", "small-cache", "greedy", "none"])
def test_pipelined_plans_are_the_plans(config, threads):
    """Batches prepared on a BatchPreparer's thread, the next while one is planned, plan exactly
    as batches given whole to advance; bags with padding (-1) included."""
    workers, batch, fields, ids_per_field, capacity, policy, allocator, steps = config
    ids = _batches(workers * 17 + batch, workers, batch, fields, ids_per_field, steps)
    ids[::7, -2:] = -1  # empty bag slots
    ranks = [0, workers - 1]
    want = _run(ids, workers, batch, capacity, policy, allocator, threads, steps, ranks)
    got = _run(ids, workers, batch, capacity, policy, allocator, threads, steps, ranks, pipelined=True)
    assert len(got) == len(want) > 0
    for (name, t, g), (_, _, w) in zip(got, want):
        assert g.dtype == w.dtype, (name, t)
        np.testing.assert_array_equal(g, w, err_msg=f"{name} at iteration {t}, pipelined")


def test_prepared_batches_are_checked():
    ids = _batches(5, 4, 64, 8, 500, 3)
    planner = _C.Planner(4, 0, 64, "lru", 100)
    preparer = _C.BatchPreparer(planner)
    short = preparer.prepare(ids[:200])
    with pytest.raises(ValueError, match="1600 ids given, 256 samples of 8 fields expected"):
        planner.advance(short, 0)
    first = preparer.prepare(ids[:256])
    with pytest.raises(ValueError, match="iteration 1 given, 0 expected"):
        planner.advance(first, 1)
    with pytest.raises(ValueError, match="planned already"):
        planner.advance(first, 0)  # a failed advance took it too
    again = preparer.prepare(ids[:256])
    planner.advance(again, 0)
    with pytest.raises(ValueError, match="planned already"):
        again.wait()
    # A batch prepared for a planner of other settings is refused by its sample count.
    other = _C.BatchPreparer(_C.Planner(4, 0, 32, "lru", 100)).prepare(ids[256:384])
    with pytest.raises(ValueError, match="a batch of 128 samples prepared for iteration 1, 256 expected"):
        planner.advance(other, 1)
    with pytest.raises(ValueError, match=r"ids must be \[samples, fields\]"):
        preparer.prepare(ids[0])


def test_planning_thread_plans_the_same_with_a_threaded_planner():
    ids = _batches(7, 4, 512, 16, 5000, 6)
    table = np.ascontiguousarray(ids)
    direct = _C.Planner(4, 2, 512, "lru", 3000, threads=1)
    thread = _C.PlanningThread(_C.Planner(4, 2, 512, "lru", 3000, threads=3), table, history=4)
    try:
        for t in range(6):
            thread.submit(t, np.arange(t * 2048, (t + 1) * 2048))
        for t in range(6):
            want_samples, want_plan = direct.advance(table[t * 2048:(t + 1) * 2048], t)
            np.testing.assert_array_equal(thread.samples(t, 30.0), want_samples)
            if want_plan is not None:
                got_plan = thread.plan(t - 1, 30.0)
                for got, want in zip(got_plan, want_plan):
                    np.testing.assert_array_equal(got, want)
    finally:
        thread.close()


def test_thread_count_comes_from_the_argument_or_the_environment(monkeypatch):
    monkeypatch.delenv("HETU_PLANNER_THREADS", raising=False)
    assert _C.Planner(2, 0, 4, "lru", 10).threads == 1
    assert _C.Planner(2, 0, 4, "lru", 10, threads=4).threads == 4
    # A host's planner: one thread per worker it plans for, at most the cores; planner_threads
    # says the same without building a planner (what a host's other workers report).
    cores = len(os.sched_getaffinity(0))
    assert _C.Planner(4, [0, 1, 2], 4, "lru", 10).threads == _C.planner_threads(0, 3) == min(3, cores)
    assert _C.planner_threads(5, 3) == 5
    monkeypatch.setenv("HETU_PLANNER_THREADS", "3")
    assert _C.Planner(2, 0, 4, "lru", 10).threads == 3
    assert _C.Planner(2, 0, 4, "lru", 10, threads=2).threads == 2
    assert _C.Planner(4, [0, 1], 4, "lru", 10).threads == _C.planner_threads(0, 2) == 3
    with pytest.raises(ValueError, match="threads must be >= 0"):
        _C.Planner(2, 0, 4, "lru", 10, threads=-1)


def test_planner_profile_accounts_for_its_plans():
    ids = _batches(3, 4, 256, 8, 3000, 3)
    p = _C.Planner(4, 0, 256, "lru", 1000, threads=2)
    for t in range(3):
        p.advance(ids[t * 1024:(t + 1) * 1024], t)
    prof = p.profile()
    assert prof["plans"] == 3
    parts = sum(prof[k] for k in ("ids", "scores", "trades", "readers", "workers", "masks"))
    assert 0 < parts <= prof["total"] * 1.001


@pytest.mark.parametrize("threads", [1, 3])
def test_plans_do_not_depend_on_how_the_ids_are_numbered(threads):
    """A batch's distinct ids are numbered through a bitmap of their range when it is dense, by a
    radix sort when it is not: ids spread 1,000 times wider plan the same, their keys scaled."""
    workers, batch, steps = 8, 512, 4
    ids = _batches(11, workers, batch, 16, 5000, steps)
    dense = _run(ids, workers, batch, 3000, "lru", "colocate", threads, steps, range(workers))
    spread = _run(ids * 1000, workers, batch, 3000, "lru", "colocate", threads, steps, range(workers))
    assert len(dense) == len(spread)
    for (name, t, d), (_, _, s) in zip(dense, spread):
        if name in ("keys", "invalidate", "writeback"):
            s = s // 1000
        np.testing.assert_array_equal(s, d, err_msg=f"{name} at iteration {t}")
