"""BSP / SSP / ASP timing semantics: who waits for whom, and per-worker message order."""
import pytest

from ps_helpers import cluster_fixture

cluster = pytest.fixture(cluster_fixture)

SYNC = """
c = ps.client()
r = ps.rank()
bsp = c.init_table("bsp", 10, 2, init=("constant", 1.0))
ssp = c.init_table("ssp", 10, 2, init=("constant", 1.0), staleness=1)
keys = np.array([0, 9])
g = np.ones((2, 2))
ps.barrier()
if r == 1:
    time.sleep(3.0)  # the slow worker: the fast one's unblocked calls get 2 s on a loaded machine
    for t in (bsp, ssp):
        t.push(keys, g, iteration=0, lr=0.25).wait()
    ps.barrier()
else:
    bsp.push(keys, g, iteration=0, lr=0.25).wait()
    ssp.push(keys, g, iteration=0, lr=0.25).wait()
    start = time.time()
    try:  # one push per worker and iteration: a second one is refused, the first stays
        bsp.push(keys, g, iteration=0, lr=0.25).wait()
        raise AssertionError("a second push for iteration 0 was accepted")
    except RuntimeError as e:
        assert "'bsp'" in str(e) and "twice" in str(e), e
    # no iteration: no wait, and worker 0's buffered push is not applied yet
    assert (bsp.pull(keys).wait() == 1.0).all()
    # SSP with staleness 1: a pull for iteration 1 need not wait for iteration 0
    assert (ssp.pull(keys, iteration=1).wait() == 1.0).all()
    assert time.time() - start < 2.0, time.time() - start
    # BSP: the pull for iteration 1 waits until worker 1's push of iteration 0 arrived;
    # the assign sent after it is held back behind it (per-worker order)
    h = bsp.pull(keys, iteration=1)
    hs = bsp.pull_stale(keys, np.zeros(2), bound=0, iteration=1)
    hw = bsp.pull_with_state(keys, iteration=1)
    a = bsp.assign(np.array([0]), np.full((1, 2), 7.0), version_add=0)
    assert time.time() - start < 2.0, "issuing a deferred pull must not block"
    assert not h.done() and not hs.done() and not hw.done() and not a.done()
    pos, rows, versions = hs.wait()
    assert pos.tolist() == [0, 1] and (rows == 0.5).all() and versions.tolist() == [2, 2], (pos, rows, versions)
    rows, _, steps, versions = hw.wait()
    assert (rows == 0.5).all() and steps.tolist() == [1, 1] and versions.tolist() == [2, 2]
    got = h.wait()
    waited = time.time() - start
    a.wait()
    assert waited > 1.0, waited
    assert (got == 0.5).all(), got
    assert (bsp.pull(keys).wait() == [[7, 7], [0.5, 0.5]]).all()
    ps.barrier()
    # SSP pull for iteration 2 needs iteration 0 applied: it is by now
    assert (ssp.pull(keys, iteration=2).wait() == 0.5).all()
ps.finalize()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("servers", [1, 2])
def test_bsp_pull_waits_for_slow_worker_ssp_and_asp_do_not(cluster, servers):
    cluster(servers, 2).run(SYNC, env_per_worker={w: {"DMLC_WORKER_ID": str(w)} for w in range(2)})
