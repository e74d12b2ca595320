"""The disk tier (docs/design.md, "Disk tier"): a table whose servers keep its rows in a file
with a small cache of them in memory trains bit for bit as the same table in memory, with real
scheduler, server and worker processes on loopback."""
import json

import numpy as np
import pytest

import test_ps_ops as ops
from ps_helpers import cluster_fixture

cluster = pytest.fixture(cluster_fixture)

# The table of test_ps_ops, its servers keeping it on disk: ARGS["tier"] = (dir, cache MiB).
# The worker of rank 0 writes the servers' disk-tier counters beside its rows.
TRAIN = ops.TRAIN.replace('storage=ARGS["storage"])',
                          'storage=ARGS["storage"], tier=ps.DiskTier(*ARGS["tier"]))').replace(
    "ps.finalize()", '''
if r == 0:
    import json, os
    json.dump(ps.server_stats(), open(os.path.join(os.path.dirname(OUT), "stats.json"), "w"))
ps.finalize()''')
assert TRAIN.count("DiskTier") == 1 and TRAIN.count("stats.json") == 1


def line_mb(lines, opt, storage="fp32"):
    """A cache of about `lines` rows of the test table (TierLines' count of a line's bytes)."""
    from hetu import _C
    state = _C.optim_state_width(ops.optim_config(opt).kind, ops.WIDTH)
    return lines * (ops.WIDTH * (4 if storage == "fp32" else 2) + state * 4 + 40) / 2 ** 20


@pytest.mark.timeout(120)
@pytest.mark.parametrize("servers,workers,opt,storage,lines", [
    (1, 1, "sgd", "fp32", 3), (3, 4, "adam", "fp32", 2), (2, 3, "rowwise_adagrad", "fp32", 1),
    (2, 4, "adagrad", "bf16", 4), (3, 2, "adam", "bf16", 1000)])
def test_disk_tier_trains_as_memory_bit_for_bit(cluster, tmp_path, servers, workers, opt, storage, lines):
    """Every pull, push and push-pull of test_ps_ops's BSP run, with a cache of a few lines (far
    fewer than a step's rows: each request's rows are evicted and read back many times) or one
    holding the whole shard: the rows, state, step counts and versions of the NumPy model."""
    tier = tmp_path / "tier"
    tier.mkdir()
    c = cluster(servers, workers)
    c.run(TRAIN, dict(rows=ops.ROWS, width=ops.WIDTH, iters=ops.ITERS, opt=opt, dense_opt=ops.DENSE_RULE.get(opt, opt),
                      kw=ops.OPT_KW[opt], workers=workers, storage=storage,
                      tier=(str(tier), line_mb(lines, opt, storage))), timeout=90)
    history, dhistory, table, state, steps, versions = ops.model(workers, opt, ops.OPT_KW[opt], storage)
    for w in range(workers):
        got = np.load(tmp_path / f"worker{w}.npz")
        for t in range(ops.ITERS):
            assert np.array_equal(got["pulled"][t], history[t]), f"worker {w}, rows after iteration {t}"
        assert np.array_equal(got["rows"], table)
        assert np.array_equal(got["state"], state)
        assert np.array_equal(got["steps"], steps)
        assert np.array_equal(got["versions"], versions)
    stats = json.loads((tmp_path / "stats.json").read_text())
    # The rows went through the disk: with a few lines, most rows are read back from the file.
    assert all(s["tier_misses"] > 0 for s in stats), stats
    if lines < 10:
        assert all(s["tier_reads"] > 0 and s["tier_writes"] > 0 for s in stats), stats
    else:
        assert all(s["tier_reads"] == 0 for s in stats), stats   # the cache held the whole shard
