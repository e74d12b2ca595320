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


def _run(ids, workers, batch, capacity, policy, allocator, threads, steps, ranks):
    """Everything the planners of `ranks` answer over `steps` iterations, and their valid masks."""
    planners = [_C.Planner(workers, rank, batch, policy, capacity, allocator=allocator, threads=threads)
                for rank in ranks]
    assert all(p.threads == threads for p in planners)
    out = []
    for t in range(steps):
        glob = ids[t * workers * batch:(t + 1) * workers * batch]
        for p in planners:
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
