"""Herald: every run must equal the single-process reference row by row (docs/design.md section 7);
every worker computes the same plan; the real caches hit exactly where the scheduler predicted
(a HeraldTable raises PlanMismatch on the first disagreement, so a finished run proves it)."""
import csv
import hashlib
import json
import os
import re
import sys

import numpy as np
import pytest

import hetu as ht
import jobs
from conftest import REPO
from dist_harness import assert_same_parameters, run_cluster, run_single
from herald_reference import ReferencePlanner
from ps_helpers import needs_ucx
from hetu import _C
from hetu.herald import Scheduler

OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--learning-rate", "0.02"],
              "adagrad": ["--optimizer", "adagrad", "--learning-rate", "0.001"],
              "adam": ["--optimizer", "adam", "--learning-rate", "0.001"],
              "rowwise_adagrad": ["--optimizer", "rowwise_adagrad", "--learning-rate", "0.001"]}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("model", ["wdl_criteo", "dcn_criteo"])
@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("ratio", ["0.01", "0.1"])
def test_herald_equals_single_process(tmp_path, data_home, model, workers, opt, ratio):
    # 10 steps, measured under every OpenBLAS kernel (bench/exactness_envelope.py --suite): at most
    # 0.083 of the tensor bound and 0.44 of a row bound (SGD, a near-zero element of DCN's cross
    # weights). At 40, DCN's output bias passes near zero (1.5e-4) and its rounding of 1e-9 is 1.26x
    # the bound; at 20 an Adam embedding element whose gradient cancels near eps reaches 0.51.
    args = ["--model", model, "--iters-per-epoch", "10", *OPTIMIZERS[opt]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, out = run_cluster(tmp_path, data_home, "run_laia.py",
                           ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0",
                            "--cache-limit-ratio", ratio, *args], workers, 1, 64 // workers)
    assert "embedding transmissions" in out
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


def _rows_moved(stdout):
    return sum(int(x) for x in re.findall(r"\[worker \d+\] embedding transmissions: (\d+) rows", stdout))


@pytest.mark.timeout(600)
def test_herald_moves_fewer_rows_than_het(tmp_path, data_home):
    common = ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0", "--cache-limit-ratio", "0.1",
              "--model", "wdl_criteo", "--optimizer", "sgd", "--learning-rate", "0.02", "--iters-per-epoch", "60"]
    _, het = run_cluster(tmp_path, data_home, "run_hetu.py", common, 2, 1, 128)
    _, herald = run_cluster(tmp_path, data_home, "run_laia.py", common, 2, 1, 128)
    # HET's own cache hits the rows only one worker updated; Herald moves 0.785 of its rows here.
    assert _rows_moved(herald) < 0.85 * _rows_moved(het), (_rows_moved(herald), _rows_moved(het))


def _counters(stdout):
    found = {int(r): json.loads(c)["counters"] for r, c in re.findall(r"\[worker (\d+)\] summary (\{.*\})", stdout)}
    assert found, stdout[-3000:]
    return found


@pytest.mark.timeout(600)
def test_het_protocol_on_herald_allocation_pulls_exactly_what_herald_pulls(tmp_path, data_home):
    """With the same allocation and cache, HET's own protocol and Herald's plan keep the same
    copies valid (a row another worker updated is re-read, one only this worker updated is
    not), so every worker pulls the same rows; Herald saves on pushes only."""
    common = ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0", "--cache-limit-ratio", "0.01",
              "--model", "wdl_criteo", *OPTIMIZERS["adam"], "--iters-per-epoch", "40"]
    _, herald = run_cluster(tmp_path, data_home, "run_laia.py", common, 3, 1, 32)
    _, het = run_cluster(tmp_path, data_home, "run_laia.py", [*common, "--protocol", "het"], 3, 1, 32)
    herald, het = _counters(herald), _counters(het)
    assert sorted(herald) == sorted(het) == [0, 1, 2]
    for w in herald:
        assert herald[w]["rows_pulled"] == het[w]["rows_pulled"], (w, herald[w], het[w])
        assert herald[w]["evictions"] == het[w]["evictions"] > 0, (w, herald[w], het[w])
        assert herald[w]["rows_pushed"] < het[w]["rows_pushed"], (w, herald[w], het[w])


@pytest.mark.timeout(600)
def test_one_planner_per_host_plans_what_every_worker_would(tmp_path, data_home):
    """Four workers on this host: by default worker 0 plans for all four and sends the others
    their plans; with --planners worker each plans for itself. Same plans, so every worker moves
    the same rows either way, and both runs equal the single-process reference."""
    args = ["--model", "wdl_criteo", *OPTIMIZERS["adam"], "--iters-per-epoch", "40"]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    common = ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0", "--cache-limit-ratio", "0.05", *args]
    host, host_out = run_cluster(tmp_path, data_home, "run_laia.py", common, 4, 1, 16)
    own, own_out = run_cluster(tmp_path, data_home, "run_laia.py", [*common, "--planners", "worker"], 4, 1, 16)
    planners = {int(r): json.loads(c)["planner"] for r, c in re.findall(r"\[worker (\d+)\] summary (\{.*\})", host_out)}
    threads = min(4, len(os.sched_getaffinity(0)))   # one per worker planned for, at most the cores
    assert planners == {r: {"rank": r, "host_ranks": [0, 1, 2, 3], "plans_here": r == 0, "threads": threads}
                        for r in range(4)}
    planners = {int(r): json.loads(c)["planner"] for r, c in re.findall(r"\[worker (\d+)\] summary (\{.*\})", own_out)}
    assert planners == {r: {"rank": r, "host_ranks": [r], "plans_here": True, "threads": 1} for r in range(4)}
    moved = ("rows_pulled", "rows_pushed", "hits", "misses", "evictions")
    host_counts, own_counts = _counters(host_out), _counters(own_out)
    for w in range(4):
        assert {k: host_counts[w][k] for k in moved} == {k: own_counts[w][k] for k in moved}, w
    assert_same_parameters(reference, host, exact_rows=False)
    assert_same_parameters(reference, own, exact_rows=False)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("extra,workers,van", [(["--allocator", "none"], 2, "zmq"), (["--allocator", "greedy"], 4, "zmq"),
                                               (["--lookahead", "1"], 2, "zmq"), (["--cache", "lfu"], 2, "zmq"),
                                               ([], 1, "zmq"), (["--comm", "PS"], 2, "zmq"),
                                               (["--planner-threads", "3"], 4, "zmq"),
                                               pytest.param([], 4, "ucx", marks=needs_ucx)])
def test_herald_variants_stay_exact(tmp_path, data_home, extra, workers, van):
    args = ["--model", "wdl_criteo", *OPTIMIZERS["adam"]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, "run_laia.py",
                         ["--comm", "Hybrid", "--cache", "lru", "--bsp", "0", "--cache-limit-ratio", "0.05",
                          *args, *extra], workers, 1, 64 // workers, van=van)
    assert_same_parameters(reference, got, exact_rows=False)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers,batch,servers,model,opt,lr,ratio,cache,comm,extra", [
    # five workers, two servers, a cache smaller than one worker's rows, pulls sent a step early
    (5, 13, 2, "dcn_criteo", "adam", "0.001", "0.002", "lfu", "PS", ["--prefetch"]),
    # three workers, odd batch, LFU-opt pinning, plans three steps ahead, the greedy allocator
    (3, 16, 2, "dfm_criteo", "momentum", "0.002", "0.01", "lfuopt", "Hybrid", ["--lookahead", "3", "--allocator", "greedy"]),
])
def test_herald_stays_exact_in_mixed_settings(tmp_path, data_home, workers, batch, servers, model, opt, lr, ratio,
                                              cache, comm, extra):
    args = ["--model", model, "--optimizer", opt, "--learning-rate", lr, "--iters-per-epoch", "40"]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=workers * batch)
    got, _ = run_cluster(tmp_path, data_home, "run_laia.py",
                         ["--comm", comm, "--cache", cache, "--bound", "0", "--bsp", "0", "--cache-limit-ratio", ratio,
                          *extra, *args], workers, servers, batch)
    assert_same_parameters(reference, got, exact_rows=False)


@pytest.mark.timeout(300)
def test_herald_with_validation_between_epochs_stays_exact(tmp_path, data_home):
    """Validation flushes the caches mid-training, between prefetched steps; the steps' pulls
    are sent during the step before (all but the first after a start or a flush). The
    per-iteration CSV (--cache-perf) adds up to the summary."""
    args = ["--model", "wdl_criteo", *OPTIMIZERS["adam"], "--nepoch", "2", "--val", "--iters-per-epoch", "20"]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    csv_dir = tmp_path / "csv"
    got, out = run_cluster(tmp_path, data_home, "run_laia.py",
                           ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0",
                            "--cache-limit-ratio", "0.1", "--prefetch", "--cache-perf", "--csv-dir", str(csv_dir),
                            *args], 2, 1, 32)
    assert_same_parameters(reference, got, exact_rows=False)
    summaries = {int(rank): json.loads(m)["counters"]
                 for rank, m in re.findall(r"\[worker (\d+)\] summary (\{.*\})", out)}
    assert sorted(summaries) == [0, 1], out[-3000:]
    for rank, c in summaries.items():
        # All but the first step and the first step after the flush were prefetched.
        assert 0 < c["rows_prefetched"] <= c["rows_pulled"], c
        assert c["rows_pulled"] - c["rows_prefetched"] < c["rows_pulled"] / 5, c
        with open(csv_dir / f"wdl_criteo-herald-Hybrid-lru-worker{rank}.csv") as f:
            rows = list(csv.DictReader(f))
        assert [r["iteration"] for r in rows] == [str(i) for i in range(40)] + ["end"]
        # The final flush writes back the dirty rows and moves nothing else.
        assert int(rows[-1]["rows_pushed"]) > 0 and int(rows[-1]["rows_pulled"]) == 0, rows[-1]
        assert all(float(r["step_seconds"]) > 0 for r in rows[:-1])
        assert float(rows[-1]["step_seconds"]) == 0
        for field, total in c.items():
            assert sum(float(r[field]) for r in rows) == pytest.approx(total, rel=1e-9), field
        assert c["plan_wait_seconds"] < c["step_seconds"], c
        # Where the steps' time went: rows in, gradients out (with --prefetch the next step's
        # plan is waited for there), the dense AllReduce, each a part of the steps' wall time.
        assert c["plan_wait_seconds"] <= c["pull_seconds"] + c["push_seconds"], c
        parts = c["pull_seconds"] + c["push_seconds"] + c["dense_sync_seconds"]
        assert all(c[f] > 0 for f in ("pull_seconds", "push_seconds", "dense_sync_seconds")), c
        assert parts < c["step_seconds"], c


def _session_ratings(path, users=300, items=400, sessions=400, seed=0):
    """A u.data file of rating sessions: each session is one user rating 5-25 items, popular
    ones more often, within minutes; sessions are spread over a year and the lines shuffled,
    so only --time-order brings each session's ratings together."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, items + 1) ** 1.1
    lines = []
    for start in np.sort(rng.integers(0, 365 * 86400, sessions)):
        user = rng.integers(1, users + 1)
        count = rng.integers(5, 26)
        rated = rng.choice(items, size=count, replace=False, p=popularity / popularity.sum()) + 1
        for k, item in enumerate(rated):
            lines.append(f"{user}\t{item}\t{rng.integers(1, 6)}\t{880000000 + start + 60 * k}\n")
    rng.shuffle(lines)
    path.write_text("".join(lines))
    return path


@pytest.mark.timeout(600)
def test_herald_on_time_ordered_ratings_is_exact_and_keeps_rows_local(tmp_path, data_home):
    """Ratings read in the order they were given: most rows a worker reads it read recently, so
    Herald steps them in its cache and moves far fewer rows than HET; still exactly the
    reference, with NCF's two tables."""
    from hetu.data.movielens import prepare_movielens
    data = prepare_movielens(_session_ratings(tmp_path / "u.data"), tmp_path / "ratings", shuffle_seed=None,
                             time_order=True, progress=False)
    args = ["--model", "ncf_movielens", "--data-dir", str(data), "--iters-per-epoch", "60", *OPTIMIZERS["adam"]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    common = ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0", "--cache-limit-ratio", "0.2", *args]
    got, herald = run_cluster(tmp_path, data_home, "run_laia.py", common, 2, 1, 32)
    assert_same_parameters(reference, got, exact_rows=False)
    _, het = run_cluster(tmp_path, data_home, "run_hetu.py", common, 2, 1, 32)
    print("RATIO", _rows_moved(herald) / _rows_moved(het))
    # offline, the planner moves 0.36 of HET.s rows on this stream (0.48 shuffled)
    assert _rows_moved(herald) < 0.5 * _rows_moved(het), (_rows_moved(herald), _rows_moved(het))


@pytest.mark.timeout(300)
def test_cache_smaller_than_one_batch_still_exact(tmp_path, data_home):
    args = ["--model", "wdl_criteo", *OPTIMIZERS["sgd"]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, "run_laia.py",
                         ["--comm", "Hybrid", "--cache", "lru", "--bsp", "0", "--cache-limit-ratio", "0.0002",
                          *args], 2, 1, 32)
    assert_same_parameters(reference, got, exact_rows=True)


def _schedulers(sparse, workers, batch, capacity, allocator="greedy"):
    out = []
    for rank in range(workers):
        loader = ht.Dataloader(sparse, batch, "train")
        loader.set_worker(rank, workers)
        out.append(Scheduler(sparse, loader.batches, workers, rank, batch, capacity, "lru", 2, allocator))
    return out


def test_every_worker_computes_the_same_plan_and_the_plan_is_consistent():
    rng = np.random.default_rng(0)
    sparse = (rng.zipf(1.2, size=(4 * 16 * 12, 5)) % 300).astype(np.int64)
    workers, batch = 4, 16
    scheds = _schedulers(sparse, workers, batch, capacity=40)
    try:
        for t in range(10):
            plans = [s.plan(t)[0] for s in scheds]
            samples = [p.samples for p in plans]
            assert all(len(x) == batch for x in samples)
            assert sorted(np.concatenate(samples)) == list(range(workers * batch))   # a partition of B_t
            glob = sparse[t * workers * batch:(t + 1) * workers * batch]
            for w, p in enumerate(plans):
                np.testing.assert_array_equal(p.keys, np.unique(glob[p.samples]))
            # A row is stepped locally by exactly one worker, or on the servers by its several users.
            users = {}
            for w, p in enumerate(plans):
                for k in p.keys:
                    users.setdefault(int(k), []).append(w)
            for w, p in enumerate(plans):
                for k, own in zip(p.keys, p.owner):
                    assert own == (len(users[int(k)]) == 1)
                # Nothing is pulled that the worker could read from its own valid cache, and a
                # row it reads for the first time is always pulled.
                assert np.all(p.pull[~p.hit])
    finally:
        for s in scheds:
            s.close()


@pytest.mark.parametrize("workers,batch,capacity,policy,allocator", [
    (2, 16, 40, "lru", "colocate"), (4, 16, 40, "lru", "colocate"), (4, 8, 7, "lru", "colocate"),  # 7 < a batch's rows
    (3, 16, 200, "lfu", "colocate"), (4, 16, 60, "lfuopt", "colocate"), (2, 16, 40, "lru", "greedy"),
    (4, 16, 60, "lfuopt", "greedy"), (4, 16, 40, "lru", "none"), (1, 16, 30, "lru", "colocate"),
    (12, 8, 40, "lru", "colocate")])  # more than 8 workers: masks above one byte
def test_cpp_planner_equals_the_numpy_model(workers, batch, capacity, policy, allocator):
    rng = np.random.default_rng(workers * 1000 + capacity)
    steps, fields = 25, 5
    sparse = (rng.zipf(1.3, size=(steps * workers * batch, fields)) % 400).astype(np.int64)
    compare_planners(sparse, steps, workers, batch, capacity, policy, allocator)


def test_the_planner_takes_ids_spread_over_a_wide_range():
    """Ids far apart (a range many times their number) are numbered by a sort instead of a table
    over their range: the same plans."""
    rng = np.random.default_rng(11)
    steps, workers, batch, fields = 15, 3, 16, 5
    sparse = (rng.zipf(1.3, size=(steps * workers * batch, fields)) % 400).astype(np.int64) * 1_000_003 + 7
    compare_planners(sparse, steps, workers, batch, 40, "lru", "colocate")


@pytest.mark.parametrize("allocator", ["colocate", "greedy", "none"])
def test_the_planner_takes_a_samples_rows_from_its_bags(allocator):
    """Bags: empty slots (-1, trailing in a bag) name no row, a row a sample names twice is its row
    once, and a sample may read nothing."""
    rng = np.random.default_rng(5)
    steps, workers, batch = 20, 3, 12
    sparse = (rng.zipf(1.3, size=(steps * workers * batch, 7)) % 300).astype(np.int64)
    bag = sparse[:, 2:7]   # one bag of 5 slots: its first `length` slots filled
    length = rng.integers(0, 6, size=len(sparse))
    bag[np.arange(5)[None, :] >= length[:, None]] = -1
    sparse[::17, :] = -1   # samples that read nothing
    compare_planners(sparse, steps, workers, batch, 50, "lru", allocator)


def compare_planners(sparse, steps, workers, batch, capacity, policy, allocator):
    for rank in range(workers):
        cpp = _C.Planner(workers, rank, batch, policy, capacity, allocator=allocator)
        ref = ReferencePlanner(workers, rank, batch, policy, capacity, allocator=allocator)
        for t in range(steps):
            ids = sparse[t * workers * batch:(t + 1) * workers * batch]
            got_samples, got = cpp.advance(ids, t)
            want_samples, want = ref.advance(ids, t)
            np.testing.assert_array_equal(got_samples, want_samples)
            assert (got is None) == (want is None) == (t == 0)
            if want is None:
                continue
            assert got[0] == want["iteration"] == t - 1
            for i, field in enumerate(("samples", "keys", "hit", "pull", "owner", "invalidate", "writeback"), 1):
                np.testing.assert_array_equal(got[i], want[field], err_msg=f"{field}, rank {rank}, iteration {t - 1}")


def test_planning_thread_gathers_samples_and_plans_ahead():
    # The planning thread is handed the whole id table and each batch's sample positions; its
    # allocations and plans equal those of a planner given the gathered ids.
    rng = np.random.default_rng(5)
    table = (rng.zipf(1.3, size=(300, 4)) % 200).astype(np.int64)
    direct = _C.Planner(2, 1, 8, "lru", 30)
    thread = _C.PlanningThread(_C.Planner(2, 1, 8, "lru", 30), table, history=4)
    try:
        batches = [rng.permutation(len(table))[:16] for _ in range(7)]
        for t, samples in enumerate(batches):   # all submitted up front: the thread plans ahead
            thread.submit(t, samples)
        for t, samples in enumerate(batches):
            want_samples, want_plan = direct.advance(table[samples], t)
            np.testing.assert_array_equal(thread.samples(t, 10.0), want_samples)
            if want_plan is None:
                continue
            got_plan = thread.plan(t - 1, 10.0)
            assert len(got_plan) == len(want_plan) + 1 and got_plan[-1] > 0.0   # ... and planner seconds
            for got, want in zip(got_plan, want_plan):
                np.testing.assert_array_equal(got, want)
        # Having answered, the thread runs, under a name that top and /proc show apart.
        if sys.platform.startswith("linux"):
            names = {open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
            assert "herald-plan" in names
        with pytest.raises(RuntimeError, match="needs iteration 7, which was not submitted"):
            thread.plan(6, 1.0)
        with pytest.raises(ValueError, match="iteration 9 submitted, 7 expected"):
            thread.submit(9, batches[0])
        thread.submit(7, np.arange(285, 301))   # sample 300 is past the data
        with pytest.raises(IndexError, match="sample 300 of iteration 7 outside the 300 samples"):
            thread.samples(7, 10.0)
    finally:
        thread.close()


def test_planning_thread_waits_name_the_iteration():
    table = np.zeros((64, 3), np.int64)
    thread = _C.PlanningThread(_C.Planner(2, 0, 4, "lru", 10), table, history=4)
    thread.submit(0, np.arange(8))
    thread.submit(1, np.arange(8, 16))
    assert len(thread.plan(0, 10.0)[1]) == 4
    thread.close()
    # A wait that runs out says for what: planning 200,000 samples takes far longer than nothing.
    big = np.random.default_rng(0).integers(0, 10**6, size=(200_000, 26))
    slow = _C.PlanningThread(_C.Planner(2, 0, 100_000, "lru", 10**5), big, history=4)
    slow.submit(0, np.arange(200_000))
    with pytest.raises(TimeoutError, match="no allocation for iteration 0 in 0 s"):
        slow.samples(0, 0.0)
    slow.close()
    # Stopped: what was not planned yet fails at once instead of waiting out the timeout.
    thread.submit(2, np.arange(16, 24))
    thread.submit(3, np.arange(24, 32))
    with pytest.raises(RuntimeError, match="stopped before the plan of iteration 2"):
        thread.plan(2, 60.0)
    loader = ht.Dataloader(table, 4, "train")
    loader.set_worker(0, 2)
    sched = Scheduler(table, loader.batches, 2, 0, 4, 10, timeout=0.5)
    sched._thread.close()   # a planner that never answers
    with pytest.raises(RuntimeError, match="Herald scheduler failed.*stopped before the allocation of iteration 5"):
        sched.samples(5)


def test_plan_cache_follows_the_plan_and_refuses_a_wrong_one():
    opt = ht.optim.SGDOptimizer(0.5)
    cache = _C.PlanCache("lru", 2, 3, opt.config)
    keys = np.array([4, 9], np.int64)
    vals, state, steps = np.empty((2, 3), np.float32), np.empty((2, 0), np.float32), np.empty(2, np.int64)
    # First step: nothing resident, so both rows must be pulled; a plan saying otherwise is refused.
    error, served, evictions = cache.begin(keys, np.array([False, False]), np.array([True, False]), vals, state, steps)
    assert "rows to pull differ from the plan on 1 rows" in error
    cache = _C.PlanCache("lru", 2, 3, opt.config)
    assert cache.begin(keys, np.array([False, False]), np.array([True, True]), vals, state, steps) == ("", 0, 0)
    vals[:] = [[1, 1, 1], [2, 2, 2]]   # the pulled rows
    grads = np.ones((2, 3), np.float32)
    # Row 4 is this worker's alone (stepped and kept, dirty); row 9 is shared (stepped on the servers).
    error, (wb_keys, *_) = cache.finish(keys, np.array([True, False]), grads, 0.5, vals, state, steps,
                                        np.empty(0, np.int64), np.empty(0, np.int64))
    assert error == "" and len(wb_keys) == 0
    np.testing.assert_allclose(vals[0], [0.5, 0.5, 0.5])
    # Next step: row 4 is served from the cache, row 9 (dropped) is pulled again.
    error, served, _ = cache.begin(keys, np.array([True, True]), np.array([False, True]), vals, state, steps)
    assert (error, served) == ("", 1)
    np.testing.assert_allclose(vals[0], [0.5, 0.5, 0.5])
    # Both rows shared now: their copies are dropped, so invalidating row 4 loses nothing.
    error, _ = cache.finish(keys, np.array([False, False]), grads, 0.5, vals, state, steps,
                            np.array([4], np.int64), np.empty(0, np.int64))
    assert error == ""
    # Stepped here again and kept dirty, row 4 must not be invalidated: its update would be lost.
    keys2 = np.array([4], np.int64)
    v1, s1, st1 = np.empty((1, 3), np.float32), np.empty((1, 0), np.float32), np.empty(1, np.int64)
    assert cache.begin(keys2, np.array([True]), np.array([True]), v1, s1, st1)[0] == ""
    v1[:] = 7
    assert cache.finish(keys2, np.array([True]), np.ones((1, 3), np.float32), 1.0, v1, s1, st1,
                        np.empty(0, np.int64), np.empty(0, np.int64))[0] == ""
    assert cache.begin(keys2, np.array([True]), np.array([False]), v1, s1, st1)[0] == ""
    error, _ = cache.finish(keys2, np.array([True]), np.zeros((1, 3), np.float32), 1.0, v1, s1, st1,
                            np.array([4], np.int64), np.empty(0, np.int64))
    assert "a dirty row (4) would be invalidated" in error
    drained_keys, drained_vals, _, drained_steps = cache.drain()
    np.testing.assert_array_equal(drained_keys, [4])
    np.testing.assert_allclose(drained_vals, [[6, 6, 6]])
    assert len(cache.drain()[0]) == 0   # clean now


def test_plan_cache_keeps_one_accumulator_per_row_under_rowwise_adagrad():
    """A row stepped and kept here carries its one float of state into the next step and out
    with the write-back, stepped by the servers' rule."""
    opt = ht.optim.RowwiseAdaGradOptimizer(0.5, eps=1e-6, l2reg=0.01)
    cache = _C.PlanCache("lru", 2, 3, opt.config)
    assert cache.state_width == 1
    keys, none = np.array([4], np.int64), np.empty(0, np.int64)
    vals, state, steps = np.empty((1, 3), np.float32), np.empty((1, 1), np.float32), np.empty(1, np.int64)
    assert cache.begin(keys, np.array([False]), np.array([True]), vals, state, steps)[0] == ""
    vals[:], state[:], steps[:] = [[1, 2, 3]], 0.25, 2   # the pulled row, its accumulator and steps
    want = (vals.copy(), state.copy(), steps.copy())
    for grads in (np.array([[1, -2, 2]], np.float32), np.array([[0.5, 0, -1]], np.float32)):
        assert cache.finish(keys, np.array([True]), grads, 0.5, vals, state, steps, none, none)[0] == ""
        _C.apply_rows(opt.config, 0.5, *want, np.array([0], np.int64), grads)
        assert cache.begin(keys, np.array([True]), np.array([False]), vals, state, steps)[0] == ""   # served here
    drained_keys, drained_vals, drained_state, drained_steps = cache.drain()
    np.testing.assert_array_equal(drained_keys, [4])
    np.testing.assert_array_equal(drained_vals, want[0])
    np.testing.assert_array_equal(drained_state, want[1])
    np.testing.assert_array_equal(drained_steps, [4])
    assert drained_state.shape == (1, 1) and drained_state[0, 0] > 0.25


def test_planner_reports_which_cached_copies_are_valid():
    # allocator none: worker 0 trains samples 0-1 (rows 1, 2, 3), worker 1 samples 2-3 (rows 1, 4, 5, 6)
    planner = _C.Planner(2, 0, 2, "lru", 100, allocator="none")
    planner.advance(np.array([[1, 2], [1, 3], [1, 4], [5, 6]], np.int64), 0)
    masks = planner.valid_masks(np.arange(1, 8, dtype=np.int64))
    # row 1: stepped on the servers (both read it), valid nowhere; rows 2-3 stepped by worker 0,
    # rows 4-6 by worker 1, each valid (dirty) in its stepper's cache only; row 7 never read
    np.testing.assert_array_equal(masks, [0, 1, 1, 2, 2, 2, 0])
    planner.advance(np.array([[2, 4], [7, 7], [8, 8], [9, 9]], np.int64), 1)
    masks = planner.valid_masks(np.array([2, 4, 7], np.int64))
    # row 4, read by worker 0 alone now, is stepped there; worker 1's copy is invalidated
    np.testing.assert_array_equal(masks, [1, 1, 1])


def test_cpp_planner_rejects_bad_input():
    with pytest.raises(ValueError, match="1 to 64"):
        _C.Planner(65, 0, 8, "lru", 10)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        _C.Planner(2, 2, 8, "lru", 10)
    p = _C.Planner(2, 0, 4, "lru", 10)
    with pytest.raises(ValueError, match="iteration 1 given, 0 expected"):
        p.advance(np.zeros((8, 3), np.int64), 1)


def test_allocator_puts_samples_where_their_rows_are_cached():
    rng = np.random.default_rng(1)
    # Two communities of ids: greedy allocation should learn to keep each on one worker.
    a = rng.integers(0, 50, size=(400, 4))
    b = rng.integers(1000, 1050, size=(400, 4))
    sparse = np.empty((800, 4), np.int64)
    sparse[0::2], sparse[1::2] = a, b
    greedy = _schedulers(sparse, 2, 20, capacity=60)
    plain = _schedulers(sparse, 2, 20, capacity=60, allocator="none")
    try:
        def pulls(scheds):
            return sum(int(s.plan(t)[0].pull.sum()) for s in scheds for t in range(5, 15))
        assert pulls(greedy) < 0.5 * pulls(plain)
    finally:
        for s in greedy + plain:
            s.close()


def _row_cost(readers, valid):
    """Section 7's rows for one row in one iteration, written out independently of allocate.cpp."""
    if not readers:
        return 0
    cost = len(readers - valid)                            # pulls by readers without a valid copy
    if len(readers) >= 2:
        cost += len(readers)                               # gradient pushes of a shared row
    if len(valid) == 1 and valid != readers:
        cost += 1                                          # write-back of the single (dirty) holder
    return cost


def _estimate(rows, valid, assignment):
    readers = [set() for _ in valid]
    for s, sample_rows in enumerate(rows):
        for r in sample_rows:
            readers[r].add(int(assignment[s]))
    holders = [{w for w in range(64) if int(v) >> w & 1} for v in valid]
    return sum(_row_cost(readers[r], holders[r]) for r in range(len(valid)))


def _zipf_batch(rng, workers, batch, fields=8, ids=3000):
    sparse = (rng.zipf(1.2, size=(workers * batch, fields)) % ids).astype(np.int64) + \
        ids * np.arange(fields, dtype=np.int64)        # per-field id ranges, as in Criteo
    distinct, rows = np.unique(sparse, return_inverse=True)
    valid = rng.integers(0, 1 << workers, size=len(distinct), dtype=np.uint64)
    valid[rng.random(len(distinct)) < 0.6] = 0          # most rows cached nowhere
    return rows.reshape(sparse.shape).astype(np.int32), valid


@pytest.mark.parametrize("workers,batch", [(2, 64), (4, 64), (3, 40)])
def test_colocating_allocation_moves_fewer_rows_than_the_alternatives(workers, batch):
    rng = np.random.default_rng(workers * 7 + batch)
    for t in range(5):
        rows, valid = _zipf_batch(rng, workers, batch)
        got = _C.colocate_allocate(rows, valid, workers, batch, t)
        np.testing.assert_array_equal(got, _C.colocate_allocate(rows, valid, workers, batch, t))  # deterministic
        assert np.bincount(got, minlength=workers).tolist() == [batch] * workers
        scores = np.stack([((valid[rows] >> np.uint64(w)) & np.uint64(1)).sum(axis=1) for w in range(workers)],
                          axis=1).astype(np.int32)
        slices = np.repeat(np.arange(workers, dtype=np.int32), batch)
        estimate = {name: _estimate(rows, valid, a) for name, a in (
            ("colocate", got), ("greedy", _C.greedy_allocate(scores, batch, t)), ("slices", slices))}
        for name, a in (("colocate", got), ("slices", slices)):
            assert _C.estimated_rows(rows, valid, workers, a) == estimate[name]
        assert estimate["colocate"] < 0.95 * min(estimate["greedy"], estimate["slices"]), estimate


@pytest.mark.parametrize("workers,batch,every_row,default", [
    (2, 64, "106f42ce0b89d40c", "106f42ce0b89d40c"), (8, 256, "3cc2f7ff62692c27", "7e7adb0a8066078d"),
    (12, 100, "4d47018fe8cb3a7f", "c99d173218510a70"), (16, 256, "83cc086e827bc8b0", "56f3785b4f72997d"),
    (33, 40, "67b7d959c38c9dc8", "370f3d37c7f5de12"), (64, 16, "918c0eee6009a42b", "918c0eee6009a42b"),
    (2, 33000, "98dbdbb449cc7831", "aa85de370d15c4dc")])  # the last: more samples than 16-bit counts hold
def test_colocating_allocation_is_unchanged(workers, batch, every_row, default, monkeypatch):
    """The colocating allocator's answers, pinned: a faster allocator must allocate exactly as
    before (a different allocation is a new option, measured, never a silent change). With
    HETU_PLANNER_TRADE_SHARED=0 the trades score every row, as the allocator did before rows read
    by many samples per worker were left out of them (the default, 4). Pinned again when the pairs of
    workers came to trade in rounds of disjoint pairs (docs/results/planner.md compares the rows moved)."""
    for setting, digest in (("0", every_row), (None, default)):
        if setting is None:
            monkeypatch.delenv("HETU_PLANNER_TRADE_SHARED", raising=False)
        else:
            monkeypatch.setenv("HETU_PLANNER_TRADE_SHARED", setting)
        rng = np.random.default_rng(workers * 7 + batch)
        h = hashlib.sha256()
        for t in range(3):
            rows, valid = _zipf_batch(rng, workers, batch)
            h.update(_C.colocate_allocate(rows, valid, workers, batch, t).astype(np.int32).tobytes())
        assert h.hexdigest()[:16] == digest, f"HETU_PLANNER_TRADE_SHARED={setting}"


@pytest.mark.parametrize("workers,batch", [(8, 64), (16, 32), (33, 8)])
def test_samples_too_long_for_narrow_lanes_are_allocated_alike(workers, batch):
    """The allocator sums a sample's costs per worker in 16-bit lanes where every sample of the batch
    reads at most 4,095 rows, else in 32-bit ones. Rows that every sample reads and no worker
    caches change no cost: 4,096 of them added to every sample (wide lanes) leave the allocation
    as it is without them (narrow lanes)."""
    rng = np.random.default_rng(workers)
    for t in range(3):
        rows, valid = _zipf_batch(rng, workers, batch)
        common = np.broadcast_to(len(valid) + np.arange(4096, dtype=np.int32), (rows.shape[0], 4096))
        long_rows = np.ascontiguousarray(np.concatenate([rows, common], axis=1))
        long_valid = np.concatenate([valid, np.zeros(4096, np.uint64)])
        np.testing.assert_array_equal(_C.colocate_allocate(long_rows, long_valid, workers, batch, t),
                                      _C.colocate_allocate(rows, valid, workers, batch, t))


@pytest.mark.parametrize("workers,batch", [(8, 256), (16, 256), (33, 40)])
def test_trades_without_heavy_rows_move_as_few_rows(workers, batch, monkeypatch):
    """Leaving the rows that many samples per worker read out of the trades changes allocations
    (the pins above) but not what they cost: estimated rows within 1% of trades over every row,
    and more than the default changes when every row is heavy enough to leave out."""
    estimates = {}
    for setting in ("0", "4", "1"):
        monkeypatch.setenv("HETU_PLANNER_TRADE_SHARED", setting)
        rng = np.random.default_rng(workers * 7 + batch)
        estimates[setting] = sum(
            _C.estimated_rows(rows, valid, workers, _C.colocate_allocate(rows, valid, workers, batch, t))
            for t, (rows, valid) in enumerate(_zipf_batch(rng, workers, batch) for _ in range(3)))
    assert estimates["4"] <= 1.01 * estimates["0"], estimates
    assert estimates["1"] != estimates["0"], estimates  # the setting reaches the allocator


def test_trade_setting_must_be_a_count(monkeypatch):
    rows, valid = _zipf_batch(np.random.default_rng(0), 4, 64)
    for bad in ("four", "-1", "4x"):
        monkeypatch.setenv("HETU_PLANNER_TRADE_SHARED", bad)
        with pytest.raises(ValueError, match=f"HETU_PLANNER_TRADE_SHARED={bad}: expected a count"):
            _C.colocate_allocate(rows, valid, 4, 64, 0)


def test_colocating_allocation_separates_communities_with_a_cold_cache():
    # Two disjoint groups of ids, interleaved: with nothing cached, only co-location can keep each
    # group on one worker, and then no row is shared.
    rng = np.random.default_rng(3)
    sparse = np.empty((40, 4), np.int64)
    sparse[0::2] = rng.integers(0, 30, size=(20, 4))
    sparse[1::2] = rng.integers(100, 130, size=(20, 4))
    distinct, rows = np.unique(sparse, return_inverse=True)
    got = _C.colocate_allocate(rows.reshape(sparse.shape).astype(np.int32), np.zeros(len(distinct), np.uint64),
                               2, 20, 0)
    assert len(set(got[0::2])) == 1 and len(set(got[1::2])) == 1 and got[0] != got[1]


def test_colocating_allocation_rejects_bad_input():
    rows = np.zeros((8, 2), np.int32)
    with pytest.raises(ValueError, match="cannot give 3 workers"):
        _C.colocate_allocate(rows, np.zeros(1, np.uint64), 3, 4, 0)
    with pytest.raises(ValueError, match="row index 5 outside the 1 distinct rows"):
        _C.colocate_allocate(rows + 5, np.zeros(1, np.uint64), 2, 4, 0)
    with pytest.raises(ValueError, match="unknown Herald allocator 'best'"):
        _C.Planner(2, 0, 4, "lru", 10, allocator="best")


def test_bad_scheduler_settings_have_clear_messages():
    sparse = np.zeros((64, 3), np.int64)
    loader = ht.Dataloader(sparse, 8, "train")
    loader.set_worker(0, 2)
    with pytest.raises(ValueError, match="lookahead >= 1"):
        Scheduler(sparse, loader.batches, 2, 0, 8, 10, "lru", 0)
    with pytest.raises(ValueError, match="at least one row"):
        Scheduler(sparse, loader.batches, 2, 0, 8, 0, "lru", 2)
    short = ht.Dataloader(sparse[:10], 8, "train")
    short.set_worker(0, 2)
    with pytest.raises(ValueError, match="no global batch"):
        Scheduler(sparse[:10], short.batches, 2, 0, 8, 10, "lru", 2)


@pytest.mark.parametrize("flags,message", [
    ([], "--comm PS or Hybrid"),
    # Asynchronous or stale servers let a pull run ahead of another worker's push: the run would
    # finish with parameters that no synchronous run computes (seen with --comm PS --bsp -1).
    (["--comm", "PS", "--bsp", "-1"], "needs --bsp 0 and --bound 0 (got --bsp -1 --bound 0)"),
    (["--comm", "Hybrid", "--bsp", "2"], "needs --bsp 0 and --bound 0 (got --bsp 2 --bound 0)"),
    (["--comm", "Hybrid", "--cache", "lru", "--bound", "3"], "needs --bsp 0 and --bound 0 (got --bsp 0 --bound 3)")])
def test_run_laia_with_settings_herald_cannot_honour_is_rejected(data_home, flags, message):
    env = dict(os.environ, HETU_DATA_HOME=data_home)
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_laia.py"), "--rows", "20000", *flags],
                    capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("options", [{"bsp": -1}, {"bsp": 1}, {"cache_bound": 2}])
def test_executor_refuses_herald_without_synchronous_exact_training(options):
    ids = ht.dataloader_op([[np.zeros((16, 2), np.int64), 8, "train"]])
    table = ht.init.zeros((10, 2), name="table")
    loss = ht.reduce_mean_op(ht.embedding_lookup_op(table, ids), [0, 1])
    with pytest.raises(ValueError, match=r"Herald trains exactly synchronously: it needs bsp=0 and cache_bound=0"):
        ht.Executor({"train": [loss, ht.optim.SGDOptimizer(0.1).minimize(loss)]}, herald=True, **options)
