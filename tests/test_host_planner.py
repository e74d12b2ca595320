"""One Herald planner per host (src/herald/plan_link.h): the host's first worker plans for all of
the host's workers and sends the others their samples and plans over Unix sockets. Each worker
must get exactly what a planner of its own would compute, and every way the link can fail must
end in an error that names the worker or planner at fault, not a hang."""
import threading

import numpy as np
import pytest

from hetu import _C

FIELDS = ("iteration", "samples", "keys", "hit", "pull", "owner", "invalidate", "writeback")


def _table(seed, samples, fields, ids):
    rng = np.random.default_rng(seed)
    return (rng.zipf(1.2, size=(samples, fields)) % ids).astype(np.int64)


def _host(workers, ranks, batch, capacity, table, history=6, threads=1, allocator="colocate"):
    """A host's planner for `ranks` (the first plans) and a receiver for each other rank."""
    listener = _C.PlanListener()
    receivers = [_C.PlanReceiver(listener.name, r, ranks[0], history, 10.0) for r in ranks[1:]]
    followers = listener.accept(ranks[1:], 10.0)
    planner = _C.Planner(workers, ranks, batch, "lru", capacity, allocator=allocator, threads=threads)
    assert planner.ranks == ranks
    thread = _C.PlanningThread(planner, table, history=history, followers=followers, send_timeout=10.0)
    return thread, dict(zip(ranks, [thread, *receivers]))


def _close(sources):
    for s in sources.values():
        s.close()


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("allocator", ["colocate", "greedy"])
def test_each_worker_of_a_host_gets_the_plans_its_own_planner_makes(threads, allocator):
    workers, batch, steps = 5, 32, 12
    ranks = [1, 0, 3, 4]   # rank 2 is on another host
    table = _table(1, 2000, 6, 400)
    rng = np.random.default_rng(2)
    batches = [rng.permutation(len(table))[:workers * batch] for _ in range(steps + 1)]
    own = {r: _C.Planner(workers, r, batch, "lru", 60, allocator=allocator) for r in ranks}
    thread, sources = _host(workers, ranks, batch, 60, table, threads=threads, allocator=allocator)
    try:
        for t, samples in enumerate(batches):
            thread.submit(t, samples)
        for t, samples in enumerate(batches):
            for r in ranks:
                want_samples, want_plan = own[r].advance(table[samples], t)
                np.testing.assert_array_equal(sources[r].samples(t, 10.0), want_samples, err_msg=f"rank {r}, {t}")
                if want_plan is None:
                    continue
                got = sources[r].plan(t - 1, 10.0)
                assert len(got) == len(FIELDS) + 1 and got[-1] > 0.0   # ... and the host planner's seconds
                for field, g, w in zip(FIELDS, got, want_plan):
                    np.testing.assert_array_equal(g, w, err_msg=f"{field} of rank {r}, iteration {t - 1}")
        # The receivers' answers are theirs alone: rank 0's plan is not rank 3's.
        assert not np.array_equal(sources[0].plan(steps - 1, 10.0)[2], sources[3].plan(steps - 1, 10.0)[2])
    finally:
        _close(sources)


def test_advance_all_answers_for_each_rank_in_order():
    workers, batch = 3, 16
    table = _table(3, 48 * 8, 4, 150)
    host = _C.Planner(workers, [2, 0], batch, "lru", 40)
    own = {r: _C.Planner(workers, r, batch, "lru", 40) for r in (2, 0)}
    for t in range(8):
        glob = table[t * 48:(t + 1) * 48]
        answers = host.advance_all(glob, t)
        assert len(answers) == 2
        for r, (samples, plan) in zip((2, 0), answers):
            want_samples, want_plan = own[r].advance(glob, t)
            np.testing.assert_array_equal(samples, want_samples)
            assert (plan is None) == (want_plan is None)
            for g, w in zip(plan or (), want_plan or ()):
                np.testing.assert_array_equal(g, w)


def test_planner_rejects_bad_rank_lists():
    with pytest.raises(ValueError, match="rank 1 given twice"):
        _C.Planner(3, [1, 0, 1], 4, "lru", 10)
    with pytest.raises(ValueError, match="rank 3 of 3 workers"):
        _C.Planner(3, [0, 3], 4, "lru", 10)
    with pytest.raises(ValueError, match="no rank to plan for"):
        _C.Planner(3, [], 4, "lru", 10)
    with pytest.raises(ValueError, match="0 follower sockets for a planner of 2 ranks"):
        _C.PlanningThread(_C.Planner(3, [0, 1], 4, "lru", 10), np.zeros((24, 2), np.int64), history=4)


def test_a_missing_worker_is_named():
    listener = _C.PlanListener()
    receiver = _C.PlanReceiver(listener.name, 2, 0, 4, 5.0)
    with pytest.raises(TimeoutError, match=r"no plan connection from worker rank\(s\) 3 of this host in 0 s"):
        listener.accept([2, 3], 0.3)
    receiver.close()
    # Nobody listens at this address: the receiver says whose planner it could not reach.
    gone = _C.PlanListener().name
    with pytest.raises(RuntimeError, match="cannot reach the planner of worker rank 4 on this host"):
        _C.PlanReceiver(gone, 5, 4, 4, 0.2)


def test_an_unexpected_worker_is_refused():
    listener = _C.PlanListener()
    receiver = _C.PlanReceiver(listener.name, 7, 0, 4, 5.0)
    with pytest.raises(RuntimeError, match="unexpected plan connection from worker rank 7 \\(expected 1, 2\\)"):
        listener.accept([1, 2], 5.0)
    receiver.close()


def test_a_planner_that_ends_is_reported_by_its_receivers():
    table = _table(4, 400, 3, 100)
    thread, sources = _host(2, [0, 1], 8, 20, table)
    try:
        thread.submit(0, np.arange(16))
        thread.submit(1, np.arange(16, 32))
        assert len(sources[1].plan(0, 10.0)) == len(FIELDS) + 1
        # A wait that runs out names the planner it waits for.
        with pytest.raises(TimeoutError, match="Herald planner of worker rank 0 .* produced no plan for iteration 1 in 0 s"):
            sources[1].plan(1, 0.2)
        thread.close()
        # What was sent before the end is still there; what was not fails at once, saying why.
        np.testing.assert_array_equal(sources[1].samples(1, 10.0), sources[1].samples(1, 10.0))
        with pytest.raises(RuntimeError, match="planner of worker rank 0 on this host closed its plan connection"):
            sources[1].plan(1, 60.0)
    finally:
        _close(sources)


def test_a_worker_that_ends_is_reported_by_the_planner():
    table = _table(5, 400, 3, 100)
    thread, sources = _host(3, [0, 2, 1], 8, 20, table)
    try:
        thread.submit(0, np.arange(24))
        sources[1].samples(0, 10.0)
        sources[1].close()   # worker 1 goes away
        for t in range(1, 8):   # a closed socket may take a message or two before it refuses
            thread.submit(t, np.arange(24 * t, 24 * (t + 1)))
        with pytest.raises(RuntimeError, match="worker rank 1 closed its plan connection"):
            thread.plan(6, 10.0)
    finally:
        _close(sources)


def test_receivers_stop_at_once_when_closed():
    listener = _C.PlanListener()
    receiver = _C.PlanReceiver(listener.name, 1, 0, 4, 5.0)
    followers = listener.accept([1], 5.0)   # held open: the receiver must not see its planner end
    errors = []

    def wait():
        try:
            receiver.plan(0, 60.0)
        except Exception as e:   # noqa: BLE001 - the error is the result
            errors.append(e)
    waiter = threading.Thread(target=wait)
    waiter.start()
    receiver.close()
    waiter.join(10.0)
    assert not waiter.is_alive()
    assert len(errors) == 1 and "stopped before the plan of iteration 0" in str(errors[0])
    del followers
