"""Row placement (PS_ROW_PLACEMENT, docs/design.md section 5): row r of an embedding table on server
r mod S at local slot r div S (strided, the default), or contiguous ranges. Each test fails
under a placement other than the one it names: servers serve, hold and save exactly their
share of the rows, every row starts at the single-process table's value, and checkpoints move
between server counts and placements."""
import os
import sys

import numpy as np
import pytest

import jobs
from ps_helpers import Cluster, cluster_fixture, free_port

cluster = pytest.fixture(cluster_fixture)

R, WD = 40, 4  # 40 rows on 3 servers: strided 14, 13, 13; contiguous 14, 14, 12


def held_rows(placement, rows, servers):
    """The rows each server holds, in slot order."""
    if placement == "strided":
        return [list(range(s, rows, servers)) for s in range(servers)]
    per = -(-rows // servers)
    return [list(range(min(rows, s * per), min(rows, (s + 1) * per))) for s in range(servers)]


SHARE = """
from hetu import _C
c = ps.client()
R, Wd, S = ARGS["rows"], ARGS["width"], ps.num_servers()
t = c.init_table("emb", R, Wd, init=("normal", 0.0, 1.0), seed=3, optimizer=("adam", {}), bsp=False)
want = np.empty((R, Wd), np.float32); _C.init_fill(2, 0.0, 1.0, 3, _C.name_stream("emb"), 0, want)
before = [s["rows"] for s in ps.server_stats()]
keys = np.concatenate([np.arange(R), np.arange(10)])   # every row once, the first ten twice
assert np.array_equal(t.pull(keys).wait(), want[keys])   # each row its single-process initial value
served = [s["rows"] - b for s, b in zip(ps.server_stats(), before)]
assert served == ARGS["served"], (served, ARGS["served"])
# a push of sorted keys (each server's part is not a contiguous run of them) and its exact step
rng = np.random.default_rng(1)
pk = np.sort(rng.choice(R, 25, replace=False)); g = rng.standard_normal((25, Wd)).astype(np.float32)
t.push(pk, g, lr=0.1).wait()
state = np.zeros((R, 2 * Wd), np.float32); steps = np.zeros(R, np.int64)
cfg = _C.OptimConfig(); cfg.kind = 4
_C.apply_rows(cfg, np.float32(0.1), want, state, steps, pk, g)
rows, st, sp, ver = t.pull_with_state(np.arange(R)).wait()
assert np.array_equal(rows, want) and np.array_equal(st, state) and np.array_equal(sp, steps)
t.save(ARGS["dir"]).wait()
ps.finalize()
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("placement", ["strided", "contiguous"])
def test_each_server_serves_and_saves_its_share_of_the_rows(cluster, tmp_path, placement):
    held = held_rows(placement, R, 3)
    served = [len(h) + sum(1 for k in range(10) if k in h) for h in held]
    env = {} if placement == "strided" else {"PS_ROW_PLACEMENT": placement}
    cluster(3, 1, env=env).run(SHARE, dict(rows=R, width=WD, served=served, dir=str(tmp_path / "ckpt")))
    # A saved shard: 96 bytes of header, then per row its values, Adam's state, step and version.
    for s in range(3):
        size = os.path.getsize(tmp_path / "ckpt" / f"emb.shard{s}-of-3.bin")
        assert size == 96 + len(held[s]) * (WD * 4 + 2 * WD * 4 + 16), (s, size)


SAVE = """
from hetu import _C
c = ps.client()
R, Wd = ARGS["rows"], ARGS["width"]
t = c.init_table("emb", R, Wd, init=("uniform", -1.0, 1.0), seed=5, optimizer=("adagrad", {}), bsp=False)
d = c.init_dense("dense", (3, 7), init=("normal", 0.0, 1.0), seed=5, optimizer=("adam", {}))
rng = np.random.default_rng(7)
for step in range(3):
    k = rng.integers(0, R, 30)
    t.push(k, rng.standard_normal((30, Wd)).astype(np.float32), lr=0.1, counts=rng.integers(1, 3, 30)).wait()
    d.dense_push(rng.standard_normal((3, 7)).astype(np.float32), lr=0.1).wait()
t.save(ARGS["dir"]).wait()
d.save(ARGS["dir"]).wait()
np.savez(OUT + ".npz", *t.pull_with_state(np.arange(R)).wait(), dense=d.dense_pull().wait())
ps.finalize()
"""

LOAD = """
c = ps.client()
R, Wd = ARGS["rows"], ARGS["width"]
t = c.init_table("emb", R, Wd, init=("uniform", -1.0, 1.0), seed=5, optimizer=("adagrad", {}), bsp=False)
d = c.init_dense("dense", (3, 7), init=("normal", 0.0, 1.0), seed=5, optimizer=("adam", {}))
t.load(ARGS["dir"]).wait()
d.load(ARGS["dir"]).wait()
np.savez(OUT + ".npz", *t.pull_with_state(np.arange(R)).wait(), dense=d.dense_pull().wait())
ps.finalize()
"""


def as_older_version(folder, servers, version):
    """Rewrites a save of float32 rows as an older version wrote it: version 2 (before rows had a
    storage type) without the header's last field (storage), version 1 (a contiguous save, before
    rows could be strided) without its last three (placement, stride, storage)."""
    for s in range(servers):
        for table in ("emb", "dense"):
            path = folder / f"{table}.shard{s}-of-{servers}.bin"
            data = path.read_bytes()
            assert data[:8] == b"HETUPS03" and data[88:96] == bytes(8)   # storage 0: float32
            path.write_bytes(b"HETUPS0%d" % version + data[8:72 if version == 1 else 88] + data[96:])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("saved, loaded", [
    (("strided", 2), ("strided", 3)),
    (("strided", 2), ("contiguous", 3)),
    (("contiguous", 3), ("strided", 2)),
    (("strided", 3), ("strided", 1)),
    (("contiguous", 2), ("strided", 4)),
    (("contiguous", 3), ("contiguous", 2)),
    (("version 1", 2), ("strided", 3)),
    (("version 2", 3), ("contiguous", 2)),
])
def test_a_checkpoint_loads_under_another_server_count_and_placement(tmp_path, saved, loaded):
    rows = 41  # a multiple of no server count: shards of different sizes
    args = dict(rows=rows, width=3, dir=str(tmp_path / "ckpt"))
    jobs = []
    for (placement, servers), code in [(saved, SAVE), (loaded, LOAD)]:
        folder = tmp_path / ("save" if code is SAVE else "load")  # each job's logs and outputs
        folder.mkdir()
        env = {"PS_ROW_PLACEMENT": "strided" if placement in ("strided", "version 2") else "contiguous"}
        c = Cluster(folder, servers, 1, env=env)
        jobs.append(c)
        try:
            c.run(code, args)
        finally:
            c.close()
        if placement.startswith("version"):
            as_older_version(tmp_path / "ckpt", servers, int(placement[-1]))
    a, b = (np.load(c.tmp / "worker0.npz") for c in jobs)
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:   # rows, optimizer state, steps, versions; the dense tensor
        assert np.array_equal(a[name], b[name]), name


@pytest.mark.timeout(60)
def test_a_bad_placement_is_refused_at_start():
    env = dict(os.environ, DMLC_ROLE="worker", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
               PS_ROW_PLACEMENT="hashed", PS_START_TIMEOUT="5")
    p = jobs.run([sys.executable, "-c", "import hetu.ps as ps; ps.start()"], env=env, capture_output=True,
                 text=True, timeout=30)
    assert p.returncode != 0
    assert "PS_ROW_PLACEMENT='hashed': expected strided (row r on server r mod S) or contiguous" in p.stderr, p.stderr


DISAGREE = """
import os
c = ps.client()
def init():
    try:
        c.init_table("emb", 10, 2)
        return "ok"
    except RuntimeError as e:
        return str(e)
# The strided worker creates the table first. (Not by ps.rank(): the scheduler numbers workers
# in the order they connect, not as the test started them.)
strided = os.environ.get("PS_ROW_PLACEMENT", "strided") == "strided"
result = init() if strided else None
ps.barrier("workers")
if not strided:
    result = init()
open(OUT, "w").write(result)
ps.finalize()
"""


@pytest.mark.timeout(60)
def test_workers_that_place_rows_differently_are_refused(cluster, tmp_path):
    cluster(2, 2).run(DISAGREE, env_per_worker={1: {"PS_ROW_PLACEMENT": "contiguous"}})
    assert (tmp_path / "worker0").read_text() == "ok"
    err = (tmp_path / "worker1").read_text()
    assert "table 'emb' already exists with strided row placement, not contiguous" in err, err
