"""The disk tier (docs/design.md, "Disk tier"): a table whose servers keep its rows in a file
with a small cache of them in memory trains bit for bit as the same table in memory, with real
scheduler, server and worker processes on loopback."""
import json
import subprocess

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
    return lines * (ops.WIDTH * (4 if storage == "fp32" else 2) + state * 4 + 90) / 2 ** 20


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


FAULTS = """
import os
c = ps.client()
emb = c.init_table("emb", 400, 16, init=("normal", 0.0, 0.1), seed=7, optimizer=("adam", {}),
                   tier=ps.DiskTier(ARGS["dir"], ARGS["cache_mb"]))
keys = np.arange(400)
errors = []
def attempt(what, call):
    try:
        call()
        errors.append([what, ""])
    except RuntimeError as e:
        errors.append([what, str(e)])
for t in range(3):
    attempt("push", lambda: emb.push(keys, np.ones((400, 16), np.float32), iteration=t, lr=0.1).wait())
# A request of a few rows: the cache, grown for the pushes of every row, is back at its size,
# and the rows it held past that are written back, so that the file holds every row's record.
if ARGS["damage"]:
    attempt("pull", lambda: emb.pull(keys[:5], iteration=3).wait())
path = os.path.join(ARGS["dir"], "emb.shard0-of-1.rows")
if ARGS["damage"] == "flip":
    with open(path, "r+b") as f:   # one byte of every record that was written
        data = bytearray(f.read())
        for at in range(20, len(data), 64):
            data[at] ^= 0x40
        f.seek(0)
        f.write(data)
elif ARGS["damage"] == "truncate":
    os.truncate(path, 1000)
if ARGS["damage"]:
    attempt("pull", lambda: emb.pull(keys, iteration=3).wait())
json.dump(errors, open(OUT + ".json", "w"))
ps.finalize()
"""


def run_faults(cluster, tmp_path, folder, damage, cache_mb=0.002):
    c = cluster(1, 1)
    c.run("import json\n" + FAULTS, dict(dir=str(folder), cache_mb=cache_mb, damage=damage), timeout=60)
    return json.loads((tmp_path / "worker0.json").read_text())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("damage,says", [("flip", "its check does not match"), ("truncate", "truncated")])
def test_a_damaged_row_file_fails_the_request_naming_it(cluster, tmp_path, damage, says):
    """Records changed or cut off under the server: the read that meets one fails with one line
    naming the file and the record, and no row of it is served."""
    folder = tmp_path / "tier"
    folder.mkdir()
    errors = run_faults(cluster, tmp_path, folder, damage)
    assert [e for _, e in errors[:4]] == ["", "", "", ""], errors   # training went through the file
    what, error = errors[4]
    assert what == "pull" and says in error and str(folder / "emb.shard0-of-1.rows") in error, error
    assert "\n" not in error


@pytest.mark.timeout(90)
def test_a_full_disk_fails_the_push_naming_the_file(cluster, tmp_path):
    """A row file on a 64 KiB file system: the write-back that finds it full fails its request
    with one line naming the file (the rows stay in the cache, nothing is lost silently)."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        errors = run_faults(cluster, tmp_path, folder, "")
    finally:
        subprocess.run(["umount", "-l", str(folder)])
    failed = [e for _, e in errors if e]
    assert failed, errors
    assert "No space left on device" in failed[0] and str(folder / "emb.shard0-of-1.rows") in failed[0], failed


MEMORY = """
import json, time
c = ps.client()
with open(f"/proc/{ps.server_stats()[0]['pid']}/clear_refs", "w") as f:
    f.write("5")   # the server's peak resident memory starts again from now
before = ps.server_stats()[0]
rows, width, cache_mb = ARGS["rows"], ARGS["width"], ARGS["cache_mb"]
emb = c.init_table("emb", rows, width, init=("normal", 0.0, 0.1), seed=7, optimizer=("adam", {}),
                   tier=ps.DiskTier(ARGS["dir"], cache_mb))
grads = np.full((2048, width), 0.01, np.float32)
touched = np.arange(0, rows, ARGS["every"])
for t, start in enumerate(range(0, len(touched), 2048)):   # every row stepped once, a request at a time
    keys = touched[start:start + 2048]
    emb.push(keys, grads[:len(keys)], iteration=t, lr=0.1).wait()
last = emb.pull(np.arange(rows - 5, rows), iteration=t + 1).wait()
json.dump({"before": before, "after": ps.server_stats()[0], "last": last.tolist()}, open(OUT + ".json", "w"))
ps.finalize()
"""


@pytest.mark.timeout(120)
def test_a_server_holds_its_cache_not_its_table(cluster, tmp_path):
    """A table 100 times its cache, a tenth of its rows stepped (ten times the cache's rows) and
    written to the file: the server's peak resident memory grows by at most 1.2x the cache and
    the tier's fixed metadata (a bit a row); in memory the table alone would take 100 times the
    cache."""
    folder = tmp_path / "tier"
    folder.mkdir()
    rows, width, cache_mb, every = 4_400_000, 32, 16.0, 11
    row_bytes = width * 4 + 2 * width * 4 + 8   # the row, Adam's two moments, its step and version
    c = cluster(1, 1)
    c.run(MEMORY, dict(dir=str(folder), rows=rows, width=width, cache_mb=cache_mb, every=every), timeout=100)
    got = json.loads((tmp_path / "worker0.json").read_text())
    assert rows * row_bytes >= 100 * cache_mb * 2 ** 20
    after = got["after"]
    assert after["tier_writes"] >= rows / every - cache_mb * 2 ** 20 / row_bytes, after   # the rows went to disk
    assert np.all(np.isfinite(got["last"]))
    request = 2048 * width * 4 * 3   # a push's keys and gradients, as received and as summed
    assert got["before"]["peak_rss_bytes"] < got["before"]["rss_bytes"] + 2 ** 20   # the peak restarted
    grown = after["peak_rss_bytes"] - got["before"]["rss_bytes"]
    bound = 1.2 * (cache_mb * 2 ** 20 + rows / 8) + request
    assert grown <= bound, (grown, bound, rows * row_bytes)


REFUSED = """
import json
c = ps.client()
try:
    c.init_table("emb", 100, 4, tier=ps.DiskTier(ARGS["dir"], 1.0))
    said = ""
except ps.TableRefused as e:
    said = str(e)
json.dump(said, open(OUT + ".json", "w"))
ps.finalize()
"""


@pytest.mark.timeout(60)
def test_a_row_file_in_use_is_refused(cluster, tmp_path):
    """A row file another process holds (a second job given the same --table-dir): the table is
    refused in one line naming the file, and the holder's file is left as it was."""
    import fcntl
    folder = tmp_path / "tier"
    folder.mkdir()
    path = folder / "emb.shard0-of-1.rows"
    path.write_bytes(b"another server's rows")
    with open(path, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        cluster(1, 1).run(REFUSED, dict(dir=str(folder)), timeout=50)
    said = json.loads((tmp_path / "worker0.json").read_text())
    assert "in use by another server" in said and str(path) in said, said
    assert path.read_bytes() == b"another server's rows"
