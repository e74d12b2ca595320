"""A server saves and loads its shards without a second copy of the table, and counts what it
wrote and read (the checkpoint rates a job prints)."""
import os

import pytest

from ps_helpers import cluster_fixture

cluster = pytest.fixture(cluster_fixture)

ROUND_TRIP = """
def hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
c = ps.client()
R, Wd = ARGS["rows"], ARGS["width"]
t = c.init_table("emb", R, Wd, init=("uniform", -1, 1), seed=3, optimizer=("sgd", {}), bsp=True)
keys = np.arange(0, R, 97)
t.push(keys, np.ones((len(keys), Wd), np.float32), lr=0.5).wait()
before = t.pull(np.arange(R)).wait()
table_bytes = R * Wd * 4
base = hwm(ARGS["server_pid"])      # the table is allocated and written: all of it is resident
t.save(ARGS["dir"]).wait()
t.clear().wait()
t.load(ARGS["dir"]).wait()
grown = hwm(ARGS["server_pid"]) - base
assert grown < table_bytes // 4, f"the server's peak RSS grew by {grown} bytes in a save and load of {table_bytes}"
assert np.array_equal(t.pull(np.arange(R)).wait(), before)
[s] = ps.server_stats()
size = os.path.getsize(os.path.join(ARGS["dir"], "emb.shard0-of-1.bin"))
assert (s["checkpoint_saves"], s["checkpoint_loads"]) == (1, 1), s
assert s["checkpoint_saved_bytes"] == size, (s, size)
# a load reads the shard's sections, not the header
assert size - 100 < s["checkpoint_loaded_bytes"] <= size, (s, size)
assert s["checkpoint_save_seconds"] > 0 and s["checkpoint_load_seconds"] > 0, s
ps.finalize()
"""


@pytest.mark.timeout(120)
def test_save_and_load_need_no_second_copy_of_the_table(cluster, tmp_path):
    # 256 MB of rows: a load into a fresh copy (then swapped in) would grow the peak by as much.
    c = cluster(1, 1)
    c.start_servers()
    pid = c.procs["server0"][0].pid
    c.start_workers(ROUND_TRIP, dict(rows=1 << 20, width=64, dir=str(tmp_path / "ckpt"), server_pid=pid))
    codes = c.wait(c.worker_names() + c.server_names(), 110)
    assert not any(codes.values()), f"exits {codes}; logs:\n{c.logs()}"
